package nfs

import (
	"syscall"

	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

func ftypeOf(mode uint32) xdr.Ftype3 {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return xdr.NF3DIR
	case syscall.S_IFLNK:
		return xdr.NF3LNK
	case syscall.S_IFBLK:
		return xdr.NF3BLK
	case syscall.S_IFCHR:
		return xdr.NF3CHR
	case syscall.S_IFSOCK:
		return xdr.NF3SOCK
	case syscall.S_IFIFO:
		return xdr.NF3FIFO
	default:
		return xdr.NF3REG
	}
}

func nfsTime(ns int64) xdr.Nfstime3 {
	if ns < 0 {
		return xdr.Nfstime3{}
	}
	return xdr.Nfstime3{Seconds: uint32(ns / 1e9), Nseconds: uint32(ns % 1e9)}
}

func nsOf(t xdr.Nfstime3) int64 { return int64(t.Seconds)*1e9 + int64(t.Nseconds) }

// fattr converts attributes; fsid is the cluster id.
func (s *Server) fattr(a *rpc.Attr) xdr.Fattr3 {
	used := a.Blocks * 512
	if !a.BlocksKnown {
		used = (a.Size + 4095) &^ 4095
	}
	return xdr.Fattr3{
		Type:  ftypeOf(a.Mode),
		Mode:  a.Mode & 0o7777,
		Nlink: a.Nlink,
		Uid:   a.Uid,
		Gid:   a.Gid,
		Size:  a.Size,
		Used:  used,
		// Linux's dev_t: major in bits 8-19 (and 32-43), minor in 0-7 and 20-31.
		Rdev:   xdr.Specdata3{Specdata1: (a.Rdev >> 8) & 0xfff, Specdata2: (a.Rdev & 0xff) | ((a.Rdev >> 12) & 0xfff00)},
		Fsid:   s.clusterID,
		Fileid: a.Ino,
		Atime:  nfsTime(a.Atime),
		Mtime:  nfsTime(a.Mtime),
		Ctime:  nfsTime(a.Ctime),
	}
}

// postOp fills a post_op_attr; a nil a leaves it empty.
func (s *Server) postOp(out *xdr.Post_op_attr, a *rpc.Attr) {
	out.Attributes_follow = a != nil
	if a != nil {
		*out.Attributes() = s.fattr(a)
	}
}

// wcc fills weak cache consistency data. Pre-operation attributes are only
// given when the caller has them from the operation itself (atomically
// with it); the client library gives none, so they are mostly absent, and
// clients then revalidate their caches from the post-operation attributes,
// as RFC 1813 allows.
func (s *Server) wcc(out *xdr.Wcc_data, before, after *rpc.Attr) {
	out.Before.Attributes_follow = before != nil
	if before != nil {
		*out.Before.Attributes() = xdr.Wcc_attr{Size: before.Size, Mtime: nfsTime(before.Mtime), Ctime: nfsTime(before.Ctime)}
	}
	s.postOp(&out.After, after)
}

func rdevOf(sd xdr.Specdata3) uint32 {
	major, minor := sd.Specdata1, sd.Specdata2
	return (minor & 0xff) | ((major & 0xfff) << 8) | ((minor &^ 0xff) << 12)
}
