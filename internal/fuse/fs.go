package fuse

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/rpc"
)

// fileSystem implements gofuse.RawFileSystem over a client.Client. NodeId
// is the Strata inode number (root = 1); the kernel's lookup counts need
// no bookkeeping because inode numbers are never reused while a client may
// hold them, so Forget only drops the adapter's notes on the inode.
type fileSystem struct {
	gofuse.RawFileSystem // defaults: ENOSYS for what is not implemented here
	c                    *client.Client
	opts                 Options
	log                  *slog.Logger
	server               *gofuse.Server

	nextFh atomic.Uint64
	files  sync.Map // fh → *fileHandle
	dirs   sync.Map // fh → *dirHandle

	// notes: the size, mtime and st_blocks last told the kernel of each
	// regular file (notes.go).
	notes inodeNotes

	// lockOwners records, per inode, the POSIX lock owners that took
	// record locks through this mount, so that flush can release them
	// (POSIX: a process's locks go on any close of the file).
	lockMu     sync.Mutex
	lockOwners map[uint64]map[uint64]struct{}

	stale staleOpens // OPENs of removed inodes answered ESTALE (stale.go)
}

var _ gofuse.RawFileSystem = (*fileSystem)(nil)

func newFileSystem(c *client.Client, opts Options) *fileSystem {
	return &fileSystem{
		RawFileSystem: gofuse.NewDefaultRawFileSystem(),
		c:             c,
		opts:          opts,
		log:           slog.Default().With("pkg", "fuse"),
		lockOwners:    map[uint64]map[uint64]struct{}{},
	}
}

func (fs *fileSystem) String() string { return "strata" }

func (fs *fileSystem) Init(s *gofuse.Server) { fs.server = s }

// ctx is the context of calls made for the kernel. Calls are bounded by
// the client's IOTimeout; interrupts are honoured by lock waits only.
func (fs *fileSystem) ctx() context.Context { return context.Background() }

// errno turns an error into the status the kernel gets, after logging the
// real cause: expected outcomes (ENOENT, EEXIST, …) at debug, the rest at
// warn.
func (fs *fileSystem) errno(op string, ino uint64, err error) gofuse.Status {
	if err == nil {
		return gofuse.OK
	}
	var en syscall.Errno
	if !errors.As(err, &en) || en == 0 {
		en = syscall.EIO
	}
	switch en {
	case syscall.ENOENT, syscall.EEXIST, syscall.ENOTEMPTY, syscall.ENODATA, syscall.EAGAIN,
		syscall.ENOTDIR, syscall.EISDIR, syscall.ENAMETOOLONG, syscall.EINTR, syscall.EPERM,
		syscall.EACCES, syscall.EINVAL, syscall.EOPNOTSUPP, syscall.ERANGE, syscall.EXDEV, syscall.ENXIO, syscall.EFBIG:
		fs.log.Debug("fuse op failed", "op", op, "ino", ino, "errno", en, "err", err)
	default:
		fs.log.Warn("fuse op failed", "op", op, "ino", ino, "errno", en, "err", err)
	}
	return gofuse.Status(en)
}

func (fs *fileSystem) fillAttr(a *rpc.Attr, out *gofuse.Attr) {
	out.Ino = a.Ino
	out.Size = a.Size
	out.Blocks = (a.Size + 511) / 512 // as if dense, when the space is not known
	if a.BlocksKnown && a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		out.Blocks = a.Blocks // what the chunks take (du, sparse-aware copies)
	}
	out.Atime, out.Atimensec = splitNs(a.Atime)
	out.Mtime, out.Mtimensec = splitNs(a.Mtime)
	out.Ctime, out.Ctimensec = splitNs(a.Ctime)
	out.Mode = a.Mode // exactly as stored: 0000 stays 0000
	out.Nlink = a.Nlink
	out.Uid = a.Uid
	out.Gid = a.Gid
	out.Rdev = a.Rdev
	out.Blksize = 4096
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		if a.Layout.StripeSize != 0 {
			out.Blksize = min(a.Layout.StripeSize, 1<<20)
		}
		fs.notes.tell(a.Ino, reportedAttr{size: a.Size, mtime: a.Mtime}, a.Blocks, a.BlocksKnown)
	}
}

func splitNs(ns int64) (uint64, uint32) {
	if ns < 0 {
		return 0, 0
	}
	return uint64(ns / 1e9), uint32(ns % 1e9)
}

func (fs *fileSystem) fillEntry(a *rpc.Attr, out *gofuse.EntryOut) {
	out.NodeId = a.Ino
	out.Generation = 1
	out.SetEntryTimeout(fs.opts.EntryTimeout)
	out.SetAttrTimeout(fs.opts.AttrTimeout)
	fs.fillAttr(a, &out.Attr)
}

func (fs *fileSystem) fillAttrOut(a *rpc.Attr, out *gofuse.AttrOut) {
	out.SetTimeout(fs.opts.AttrTimeout)
	fs.fillAttr(a, &out.Attr)
}

func (fs *fileSystem) Lookup(cancel <-chan struct{}, h *gofuse.InHeader, name string, out *gofuse.EntryOut) gofuse.Status {
	a, err := fs.c.Lookup(fs.ctx(), h.NodeId, name)
	if err != nil {
		return fs.errno("lookup", h.NodeId, err)
	}
	fs.fillEntry(&a, out)
	return gofuse.OK
}

// Forget: the kernel evicted the inode, and with it whatever it cached;
// what the adapter remembered of what it told the kernel goes too, so that
// a scan of millions of files does not leave an entry per file behind.
func (fs *fileSystem) Forget(nodeid, nlookup uint64) {
	fs.notes.forget(nodeid)
	// No open file is left on it in this mount, so no lock through one:
	// the owners noted for its flushes (OFD owners, which no flush names,
	// stayed until now) go too.
	fs.lockMu.Lock()
	delete(fs.lockOwners, nodeid)
	fs.lockMu.Unlock()
}

func (fs *fileSystem) GetAttr(cancel <-chan struct{}, in *gofuse.GetAttrIn, out *gofuse.AttrOut) gofuse.Status {
	a, err := fs.c.GetAttr(fs.ctx(), in.NodeId)
	if err != nil {
		return fs.errno("getattr", in.NodeId, err)
	}
	fs.fillAttrOut(&a, out)
	return gofuse.OK
}

func (fs *fileSystem) SetAttr(cancel <-chan struct{}, in *gofuse.SetAttrIn, out *gofuse.AttrOut) gofuse.Status {
	var req rpc.SetAttrReq
	if m, ok := in.GetMode(); ok {
		req.Valid |= rpc.SetMode
		req.Mode = m & 07777
	}
	if u, ok := in.GetUID(); ok {
		req.Valid |= rpc.SetUid
		req.Uid = u
	}
	if g, ok := in.GetGID(); ok {
		req.Valid |= rpc.SetGid
		req.Gid = g
	}
	if s, ok := in.GetSize(); ok {
		req.Valid |= rpc.SetSize
		req.Size = s
	}
	if in.Valid&gofuse.FATTR_ATIME != 0 {
		if in.Valid&gofuse.FATTR_ATIME_NOW != 0 {
			req.Valid |= rpc.SetAtimeNow
		} else {
			req.Valid |= rpc.SetAtime
			req.Atime = int64(in.Atime)*1e9 + int64(in.Atimensec)
		}
	}
	if in.Valid&gofuse.FATTR_MTIME != 0 {
		if in.Valid&gofuse.FATTR_MTIME_NOW != 0 {
			req.Valid |= rpc.SetMtimeNow
		} else {
			req.Valid |= rpc.SetMtime
			req.Mtime = int64(in.Mtime)*1e9 + int64(in.Mtimensec)
		}
	}
	if in.Valid&gofuse.FATTR_KILL_SUIDGID != 0 && req.Valid&rpc.SetMode == 0 {
		// Only with HANDLE_KILLPRIV_V2, which we do not negotiate; be safe.
		a, err := fs.c.GetAttr(fs.ctx(), in.NodeId)
		if err != nil {
			return fs.errno("setattr", in.NodeId, err)
		}
		mode := a.Mode & 07777 &^ syscall.S_ISUID
		if mode&syscall.S_IXGRP != 0 {
			mode &^= syscall.S_ISGID
		}
		req.Valid |= rpc.SetMode
		req.Mode = mode
	}
	var a rpc.Attr
	var err error
	if req.Valid == 0 {
		a, err = fs.c.GetAttr(fs.ctx(), in.NodeId)
	} else {
		a, err = fs.c.SetAttr(fs.ctx(), in.NodeId, req)
	}
	if err != nil {
		return fs.errno("setattr", in.NodeId, err)
	}
	fs.fillAttrOut(&a, out)
	return gofuse.OK
}

func (fs *fileSystem) Mknod(cancel <-chan struct{}, in *gofuse.MknodIn, name string, out *gofuse.EntryOut) gofuse.Status {
	a, err := fs.c.Mknod(fs.ctx(), in.NodeId, name, in.Mode, in.Rdev, in.Uid, in.Gid)
	if err != nil {
		return fs.errno("mknod", in.NodeId, err)
	}
	fs.fillEntry(&a, out)
	return gofuse.OK
}

func (fs *fileSystem) Mkdir(cancel <-chan struct{}, in *gofuse.MkdirIn, name string, out *gofuse.EntryOut) gofuse.Status {
	a, err := fs.c.Mkdir(fs.ctx(), in.NodeId, name, in.Mode, in.Uid, in.Gid)
	if err != nil {
		return fs.errno("mkdir", in.NodeId, err)
	}
	fs.fillEntry(&a, out)
	return gofuse.OK
}

func (fs *fileSystem) Unlink(cancel <-chan struct{}, h *gofuse.InHeader, name string) gofuse.Status {
	_, err := fs.c.Unlink(fs.ctx(), h.NodeId, name)
	return fs.errno("unlink", h.NodeId, err)
}

func (fs *fileSystem) Rmdir(cancel <-chan struct{}, h *gofuse.InHeader, name string) gofuse.Status {
	return fs.errno("rmdir", h.NodeId, fs.c.Rmdir(fs.ctx(), h.NodeId, name))
}

// Linux renameat2 flags.
const (
	renameNoReplace = 1 << 0
	renameExchange  = 1 << 1
	renameWhiteout  = 1 << 2
)

func (fs *fileSystem) Rename(cancel <-chan struct{}, in *gofuse.RenameIn, oldName, newName string) gofuse.Status {
	if in.Flags&^(renameNoReplace|renameExchange) != 0 {
		return gofuse.Status(syscall.EINVAL) // RENAME_WHITEOUT and unknown flags
	}
	var flags uint32
	if in.Flags&renameNoReplace != 0 {
		flags |= rpc.RenameNoReplace
	}
	if in.Flags&renameExchange != 0 {
		flags |= rpc.RenameExchange
	}
	return fs.errno("rename", in.NodeId, fs.c.Rename(fs.ctx(), in.NodeId, oldName, in.Newdir, newName, flags))
}

func (fs *fileSystem) Link(cancel <-chan struct{}, in *gofuse.LinkIn, name string, out *gofuse.EntryOut) gofuse.Status {
	a, err := fs.c.Link(fs.ctx(), in.Oldnodeid, in.NodeId, name)
	if err != nil {
		return fs.errno("link", in.NodeId, err)
	}
	fs.fillEntry(&a, out)
	return gofuse.OK
}

func (fs *fileSystem) Symlink(cancel <-chan struct{}, h *gofuse.InHeader, target, name string, out *gofuse.EntryOut) gofuse.Status {
	a, err := fs.c.Symlink(fs.ctx(), h.NodeId, name, target, h.Uid, h.Gid)
	if err != nil {
		return fs.errno("symlink", h.NodeId, err)
	}
	fs.fillEntry(&a, out)
	return gofuse.OK
}

func (fs *fileSystem) Readlink(cancel <-chan struct{}, h *gofuse.InHeader) ([]byte, gofuse.Status) {
	t, err := fs.c.Readlink(fs.ctx(), h.NodeId)
	if err != nil {
		return nil, fs.errno("readlink", h.NodeId, err)
	}
	return []byte(t), gofuse.OK
}

// Access is only reached without default_permissions; the kernel checks
// permissions itself on this mount.
func (fs *fileSystem) Access(cancel <-chan struct{}, in *gofuse.AccessIn) gofuse.Status {
	return gofuse.OK
}

const (
	xattrACLAccess  = "system.posix_acl_access"
	xattrACLDefault = "system.posix_acl_default"
)

func (fs *fileSystem) GetXAttr(cancel <-chan struct{}, h *gofuse.InHeader, attr string, dest []byte) (uint32, gofuse.Status) {
	if attr == xattrACLAccess || attr == xattrACLDefault {
		return 0, gofuse.ENOATTR // ACLs are not supported; no ACL is set
	}
	if attr == layoutXattr {
		return fs.getLayoutXattr(h.NodeId, dest)
	}
	// The client answers misses it knows of without a round trip (the
	// kernel asks for security.capability before every write).
	v, err := fs.c.GetXattr(fs.ctx(), h.NodeId, attr)
	if err != nil {
		return 0, fs.errno("getxattr", h.NodeId, err)
	}
	if len(dest) < len(v) {
		return uint32(len(v)), gofuse.ERANGE
	}
	return uint32(copy(dest, v)), gofuse.OK
}

func (fs *fileSystem) ListXAttr(cancel <-chan struct{}, h *gofuse.InHeader, dest []byte) (uint32, gofuse.Status) {
	names, err := fs.c.ListXattr(fs.ctx(), h.NodeId)
	if err != nil {
		return 0, fs.errno("listxattr", h.NodeId, err)
	}
	n := 0
	for _, s := range names {
		n += len(s) + 1
	}
	if len(dest) < n {
		return uint32(n), gofuse.ERANGE
	}
	k := 0
	for _, s := range names {
		k += copy(dest[k:], s)
		dest[k] = 0
		k++
	}
	return uint32(n), gofuse.OK
}

func (fs *fileSystem) SetXAttr(cancel <-chan struct{}, in *gofuse.SetXAttrIn, attr string, data []byte) gofuse.Status {
	if attr == xattrACLAccess || attr == xattrACLDefault {
		return gofuse.Status(syscall.EOPNOTSUPP)
	}
	if attr == layoutXattr {
		return fs.setLayoutXattr(in.NodeId, data)
	}
	var flags uint32
	if in.Flags&0x1 != 0 { // XATTR_CREATE
		flags |= rpc.XattrCreate
	}
	if in.Flags&0x2 != 0 { // XATTR_REPLACE
		flags |= rpc.XattrReplace
	}
	return fs.errno("setxattr", in.NodeId, fs.c.SetXattr(fs.ctx(), in.NodeId, attr, data, flags))
}

func (fs *fileSystem) RemoveXAttr(cancel <-chan struct{}, h *gofuse.InHeader, attr string) gofuse.Status {
	return fs.errno("removexattr", h.NodeId, fs.c.RemoveXattr(fs.ctx(), h.NodeId, attr))
}

func (fs *fileSystem) StatFs(cancel <-chan struct{}, h *gofuse.InHeader, out *gofuse.StatfsOut) gofuse.Status {
	s, err := fs.c.StatFS(fs.ctx())
	if err != nil {
		return fs.errno("statfs", h.NodeId, err)
	}
	const bs = 4096
	out.Bsize = bs
	out.Frsize = bs
	out.Blocks = s.TotalBytes / bs
	out.Bfree = s.FreeBytes / bs
	out.Bavail = s.AvailBytes / bs
	out.Files = s.Inodes
	out.Ffree = s.FreeInodes
	out.NameLen = client.MaxNameBytes
	return gofuse.OK
}

func (fs *fileSystem) FsyncDir(cancel <-chan struct{}, in *gofuse.FsyncIn) gofuse.Status {
	// Namespace changes are durable at the next barrier (as on a local
	// file system, fsync of the directory is that barrier).
	return fs.errno("fsyncdir", in.NodeId, fs.c.SyncMeta(fs.ctx()))
}

// releaseAll releases handles the kernel did not release (after a forced
// unmount), so that buffered data is flushed.
func (fs *fileSystem) releaseAll() {
	fs.files.Range(func(k, v any) bool {
		h := v.(*fileHandle)
		if err := h.f.Release(fs.ctx()); err != nil {
			fs.log.Warn("release at unmount failed", "ino", h.f.Ino(), "err", err)
		}
		fs.files.Delete(k)
		return true
	})
}
