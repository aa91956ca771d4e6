package nfs

import (
	"context"
	"errors"
	"log/slog"
	"syscall"

	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// errStatus is an NFS status carried as an error (a check of the gateway's
// own: permission, read-only export, bad handle).
type errStatus xdr.Nfsstat3

func (e errStatus) Error() string { return xdr.Nfsstat3(e).String() }

var errnoStatus = map[syscall.Errno]xdr.Nfsstat3{
	syscall.EPERM:        xdr.NFS3ERR_PERM,
	syscall.ENOENT:       xdr.NFS3ERR_NOENT,
	syscall.EIO:          xdr.NFS3ERR_IO,
	syscall.ENXIO:        xdr.NFS3ERR_NXIO,
	syscall.EACCES:       xdr.NFS3ERR_ACCES,
	syscall.EEXIST:       xdr.NFS3ERR_EXIST,
	syscall.EXDEV:        xdr.NFS3ERR_XDEV,
	syscall.ENODEV:       xdr.NFS3ERR_NODEV,
	syscall.ENOTDIR:      xdr.NFS3ERR_NOTDIR,
	syscall.EISDIR:       xdr.NFS3ERR_ISDIR,
	syscall.EINVAL:       xdr.NFS3ERR_INVAL,
	syscall.EFBIG:        xdr.NFS3ERR_FBIG,
	syscall.ENOSPC:       xdr.NFS3ERR_NOSPC,
	syscall.EROFS:        xdr.NFS3ERR_ROFS,
	syscall.EMLINK:       xdr.NFS3ERR_MLINK,
	syscall.ENAMETOOLONG: xdr.NFS3ERR_NAMETOOLONG,
	syscall.ENOTEMPTY:    xdr.NFS3ERR_NOTEMPTY,
	syscall.EDQUOT:       xdr.NFS3ERR_DQUOT,
	syscall.ESTALE:       xdr.NFS3ERR_STALE,
	syscall.EOPNOTSUPP:   xdr.NFS3ERR_NOTSUPP,
	syscall.EAGAIN:       xdr.NFS3ERR_JUKEBOX,
}

// expected are outcomes a client causes, logged at debug only.
var expected = map[xdr.Nfsstat3]bool{
	xdr.NFS3ERR_NOENT: true, xdr.NFS3ERR_EXIST: true, xdr.NFS3ERR_NOTEMPTY: true,
	xdr.NFS3ERR_ACCES: true, xdr.NFS3ERR_PERM: true, xdr.NFS3ERR_STALE: true,
	xdr.NFS3ERR_NOTDIR: true, xdr.NFS3ERR_ISDIR: true, xdr.NFS3ERR_INVAL: true,
	xdr.NFS3ERR_NAMETOOLONG: true, xdr.NFS3ERR_ROFS: true, xdr.NFS3ERR_NOT_SYNC: true,
	xdr.NFS3ERR_BADHANDLE: true, xdr.NFS3ERR_BAD_COOKIE: true,
}

// status turns an error into the NFS status the client gets, after
// logging its cause (as internal/fuse does for errno).
func (s *Server) status(op string, ino uint64, err error) xdr.Nfsstat3 {
	if err == nil {
		return xdr.NFS3_OK
	}
	var st errStatus
	var out xdr.Nfsstat3
	if errors.As(err, &st) {
		out = xdr.Nfsstat3(st)
	} else if en := rpc.ErrnoOf(err); errnoStatus[en] != 0 {
		out = errnoStatus[en]
	} else {
		out = xdr.NFS3ERR_IO
	}
	level := slog.LevelWarn
	if expected[out] {
		level = slog.LevelDebug
	}
	s.log.Log(context.Background(), level, "nfs op failed", "op", op, "ino", ino, "status", out, "err", err)
	return out
}

// staleIfGone: the inode a handle names does not exist (any more).
func staleIfGone(err error) error {
	if rpc.ErrnoOf(err) == syscall.ENOENT {
		return errStatus(xdr.NFS3ERR_STALE)
	}
	return err
}
