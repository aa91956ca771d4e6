package nfs

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// nfsProgram is NFS v3 (RFC 1813): the procedures on files and the file
// system; the directory procedures are in nfsdir.go.
func (s *Server) nfsProgram() *oncrpc.Program {
	return &oncrpc.Program{Prog: nfsProgram, Vers: nfsVersion, Name: "nfs", Procs: []oncrpc.Proc{
		0:  nullProc,
		1:  serve(xdr.XDR_GETATTR3args, xdr.XDR_GETATTR3res, s.getattr3),
		2:  serve(xdr.XDR_SETATTR3args, xdr.XDR_SETATTR3res, s.setattr3),
		3:  serve(xdr.XDR_LOOKUP3args, xdr.XDR_LOOKUP3res, s.lookup3),
		4:  serve(xdr.XDR_ACCESS3args, xdr.XDR_ACCESS3res, s.access3),
		5:  serve(xdr.XDR_READLINK3args, xdr.XDR_READLINK3res, s.readlink3),
		6:  serveRelease(xdr.XDR_READ3args, xdr.XDR_READ3res, s.read3),
		7:  serve(xdr.XDR_WRITE3args, xdr.XDR_WRITE3res, s.write3),
		8:  serve(xdr.XDR_CREATE3args, xdr.XDR_CREATE3res, s.create3),
		9:  serve(xdr.XDR_MKDIR3args, xdr.XDR_MKDIR3res, s.mkdir3),
		10: serve(xdr.XDR_SYMLINK3args, xdr.XDR_SYMLINK3res, s.symlink3),
		11: serve(xdr.XDR_MKNOD3args, xdr.XDR_MKNOD3res, s.mknod3),
		12: serve(xdr.XDR_REMOVE3args, xdr.XDR_REMOVE3res, s.remove3),
		13: serve(xdr.XDR_RMDIR3args, xdr.XDR_RMDIR3res, s.rmdir3),
		14: serve(xdr.XDR_RENAME3args, xdr.XDR_RENAME3res, s.rename3),
		15: serve(xdr.XDR_LINK3args, xdr.XDR_LINK3res, s.link3),
		16: serve(xdr.XDR_READDIR3args, xdr.XDR_READDIR3res, s.readdir3),
		17: serve(xdr.XDR_READDIRPLUS3args, xdr.XDR_READDIRPLUS3res, s.readdirplus3),
		18: serve(xdr.XDR_FSSTAT3args, xdr.XDR_FSSTAT3res, s.fsstat3),
		19: serve(xdr.XDR_FSINFO3args, xdr.XDR_FSINFO3res, s.fsinfo3),
		20: serve(xdr.XDR_PATHCONF3args, xdr.XDR_PATHCONF3res, s.pathconf3),
		21: serve(xdr.XDR_COMMIT3args, xdr.XDR_COMMIT3res, s.commit3),
	},
		// The non-idempotent procedures: a retransmission gets the first
		// call's reply (oncrpc's duplicate request cache), not a second
		// run's NOENT or EXIST. SETATTR is one too (a guarded ctime check, a
		// size change racing a write).
		Cached: []uint32{2, 8, 9, 10, 11, 12, 13, 14, 15},
	}
}

// attr reads ino's attributes; a missing inode is NFS3ERR_STALE (the
// handle outlived its file), and so is a removed file some client still
// holds open (an orphan, Nlink 0): NFS clients keep their open files alive
// themselves by renaming them (silly rename), not through the server.
//
// The answer refreshes the attribute cache (attrcache.go).
func (s *Server) attr(ctx context.Context, ino uint64) (*rpc.Attr, error) {
	since, at := s.c.SizeSeq(), time.Now()
	a, err := s.c.GetAttr(ctx, ino)
	if err != nil {
		return nil, staleIfGone(err)
	}
	s.fresh(&a, since, at)
	return liveAttr(&a)
}

// fresh keeps attributes the metadata service answered to a call begun
// when SizeSeq was since, at: in the attribute cache, and as the sign that
// a client may have revalidated the file (its read-ahead piece goes).
func (s *Server) fresh(a *rpc.Attr, since uint64, at time.Time) {
	s.attrs.put(a, since, at)
	s.files.dropAheadIno(a.Ino)
}

func liveAttr(a *rpc.Attr) (*rpc.Attr, error) {
	if a.Nlink == 0 {
		return nil, errStatus(xdr.NFS3ERR_STALE)
	}
	return a, nil
}

// cachedAttr is attr answered from the attribute cache when it holds ino's
// attributes from within Config.AttrTimeout, with this gateway's own
// uncommitted changes folded in: for READ, WRITE and COMMIT, which check
// permissions and bound reads with them (attrcache.go says why that is
// safe).
func (s *Server) cachedAttr(ctx context.Context, ino uint64) (*rpc.Attr, error) {
	e, ok := s.attrs.get(ino)
	if !ok {
		return s.attr(ctx, ino)
	}
	a := e.a
	s.c.MergeLocal(&a, e.since)
	return liveAttr(&a)
}

// attrOrNil is attr for post-operation attributes, which may be omitted.
func (s *Server) attrOrNil(ctx context.Context, ino uint64) *rpc.Attr {
	a, err := s.attr(ctx, ino)
	if err != nil {
		return nil
	}
	return a
}

// object resolves a handle and reads its inode's attributes.
func (s *Server) object(ctx context.Context, call *oncrpc.Call, fh *xdr.Nfs_fh3) (target, *rpc.Attr, error) {
	return s.resolveWith(ctx, call, fh, s.attr)
}

// file is object for READ, WRITE and COMMIT: the attributes may come from
// the attribute cache.
func (s *Server) file(ctx context.Context, call *oncrpc.Call, fh *xdr.Nfs_fh3) (target, *rpc.Attr, error) {
	return s.resolveWith(ctx, call, fh, s.cachedAttr)
}

func (s *Server) resolveWith(ctx context.Context, call *oncrpc.Call, fh *xdr.Nfs_fh3, attr func(context.Context, uint64) (*rpc.Attr, error)) (target, *rpc.Attr, error) {
	t, err := s.resolve(call, fh)
	if err != nil {
		return t, nil, err
	}
	a, err := attr(ctx, t.ino)
	return t, a, err
}

// durable makes a sync export's namespace change durable before the reply
// (RFC 1813: a server answers a change once it is on stable storage); an
// async export answers at once (scratch-grade).
//
// Concurrent changes share one barrier (metaSyncs, a group commit): a
// caller joins the next round that starts after its change was answered,
// and one SyncMeta covers every change the client made before it began.
// The round runs on a context of its own (the client's IO timeout bounds
// it): its callers' calls may end before it does.
func (s *Server) durable(_ context.Context, t target) error {
	if t.exp.Async {
		return nil
	}
	return s.metaSyncs.Join(struct{}{}, s.syncMeta)
}

func (s *Server) syncMeta([]struct{}) error { return s.c.SyncMeta(context.Background()) }

func isDir(a *rpc.Attr) bool { return a.Mode&syscall.S_IFMT == syscall.S_IFDIR }
func isReg(a *rpc.Attr) bool { return a.Mode&syscall.S_IFMT == syscall.S_IFREG }

var (
	errAcces    = errStatus(xdr.NFS3ERR_ACCES)
	errPerm     = errStatus(xdr.NFS3ERR_PERM)
	errROFS     = errStatus(xdr.NFS3ERR_ROFS)
	errNotDir   = errStatus(xdr.NFS3ERR_NOTDIR)
	errIsDir    = errStatus(xdr.NFS3ERR_ISDIR)
	errInval    = errStatus(xdr.NFS3ERR_INVAL)
	errNotSync  = errStatus(xdr.NFS3ERR_NOT_SYNC)
	errExist    = errStatus(xdr.NFS3ERR_EXIST)
	errXDev     = errStatus(xdr.NFS3ERR_XDEV)
	errBadType  = errStatus(xdr.NFS3ERR_BADTYPE)
	errTooSmall = errStatus(xdr.NFS3ERR_TOOSMALL)
	errBadCook  = errStatus(xdr.NFS3ERR_BAD_COOKIE)
)

func (s *Server) getattr3(ctx context.Context, call *oncrpc.Call, a *xdr.GETATTR3args) *xdr.GETATTR3res {
	res := &xdr.GETATTR3res{}
	t, attr, err := s.object(ctx, call, &a.Object)
	if res.Status = s.status("getattr", t.ino, err); res.Status == xdr.NFS3_OK {
		res.Resok().Obj_attributes = s.fattr(attr)
	}
	return res
}

// setattrReq checks c's right to make the changes of sa to an inode with
// attributes a, and builds the request (chmod: the owner; chown: root;
// chgrp: the owner to one of its groups; size: write permission; times to
// given values: the owner; times to now: the owner or write permission).
func setattrReq(c cred, a *rpc.Attr, sa *xdr.Sattr3) (rpc.SetAttrReq, error) {
	var req rpc.SetAttrReq
	if sa.Mode.Set_it {
		if !c.owns(a) {
			return req, errPerm
		}
		req.Valid |= rpc.SetMode
		req.Mode = *sa.Mode.Mode() & 0o7777
		gid := a.Gid
		if sa.Gid.Set_it {
			gid = *sa.Gid.Gid()
		}
		if c.uid != 0 && !c.inGroup(gid) {
			req.Mode &^= syscall.S_ISGID // as chmod(2) for a non-member
		}
	}
	if sa.Uid.Set_it && *sa.Uid.Uid() != a.Uid {
		if c.uid != 0 {
			return req, errPerm
		}
		req.Valid |= rpc.SetUid
		req.Uid = *sa.Uid.Uid()
	}
	if sa.Gid.Set_it && *sa.Gid.Gid() != a.Gid {
		if c.uid != 0 && (c.uid != a.Uid || !c.inGroup(*sa.Gid.Gid())) {
			return req, errPerm
		}
		req.Valid |= rpc.SetGid
		req.Gid = *sa.Gid.Gid()
	}
	if sa.Size.Set_it {
		if isDir(a) {
			return req, errIsDir
		}
		if !isReg(a) {
			return req, errInval
		}
		if !c.may(a, mayWrite) {
			return req, errAcces
		}
		req.Valid |= rpc.SetSize
		req.Size = *sa.Size.Size()
	}
	timeOK := func(how xdr.Time_how) error {
		if how == xdr.SET_TO_CLIENT_TIME && !c.owns(a) {
			return errPerm
		}
		if how == xdr.SET_TO_SERVER_TIME && !c.owns(a) && !c.may(a, mayWrite) {
			return errAcces
		}
		return nil
	}
	switch sa.Atime.Set_it {
	case xdr.SET_TO_SERVER_TIME, xdr.SET_TO_CLIENT_TIME:
		if err := timeOK(sa.Atime.Set_it); err != nil {
			return req, err
		}
		if sa.Atime.Set_it == xdr.SET_TO_SERVER_TIME {
			req.Valid |= rpc.SetAtimeNow
		} else {
			req.Valid |= rpc.SetAtime
			req.Atime = nsOf(*sa.Atime.Atime())
		}
	}
	switch sa.Mtime.Set_it {
	case xdr.SET_TO_SERVER_TIME, xdr.SET_TO_CLIENT_TIME:
		if err := timeOK(sa.Mtime.Set_it); err != nil {
			return req, err
		}
		if sa.Mtime.Set_it == xdr.SET_TO_SERVER_TIME {
			req.Valid |= rpc.SetMtimeNow
		} else {
			req.Valid |= rpc.SetMtime
			req.Mtime = nsOf(*sa.Mtime.Mtime())
		}
	}
	return req, nil
}

func (s *Server) setattr3(ctx context.Context, call *oncrpc.Call, a *xdr.SETATTR3args) *xdr.SETATTR3res {
	res := &xdr.SETATTR3res{}
	var after *rpc.Attr
	t, before, err := s.object(ctx, call, &a.Object)
	if err == nil {
		after, err = s.setattr(ctx, t, before, &a.New_attributes, &a.Guard)
	}
	if res.Status = s.status("setattr", t.ino, err); res.Status == xdr.NFS3_OK {
		s.wcc(&res.Resok().Obj_wcc, nil, after)
	} else {
		s.wcc(&res.Resfail().Obj_wcc, nil, s.attrOrNil(ctx, t.ino))
	}
	return res
}

func (s *Server) setattr(ctx context.Context, t target, before *rpc.Attr, sa *xdr.Sattr3, guard *xdr.Sattrguard3) (*rpc.Attr, error) {
	if t.exp.ReadOnly {
		return nil, errROFS
	}
	if guard != nil && guard.Check && *guard.Obj_ctime() != nfsTime(before.Ctime) {
		return nil, errNotSync
	}
	req, err := setattrReq(t.cred, before, sa)
	if err != nil {
		return nil, err
	}
	if req.Valid == 0 {
		return before, nil
	}
	since, at := s.c.SizeSeq(), time.Now()
	after, err := s.c.SetAttr(ctx, t.ino, req)
	if err != nil {
		s.attrs.drop(t.ino) // it may have changed
		return nil, staleIfGone(err)
	}
	s.fresh(&after, since, at)
	return &after, s.durable(ctx, t)
}

func (s *Server) access3(ctx context.Context, call *oncrpc.Call, a *xdr.ACCESS3args) *xdr.ACCESS3res {
	res := &xdr.ACCESS3res{}
	t, attr, err := s.object(ctx, call, &a.Object)
	if res.Status = s.status("access", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.Obj_attributes, attr)
		ok.Access = t.cred.accessBits(attr, a.Access, t.exp.ReadOnly)
	}
	return res
}

func (s *Server) readlink3(ctx context.Context, call *oncrpc.Call, a *xdr.READLINK3args) *xdr.READLINK3res {
	res := &xdr.READLINK3res{}
	var target string
	t, attr, err := s.object(ctx, call, &a.Symlink)
	if err == nil && attr.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		err = errInval
	}
	if err == nil {
		target, err = s.c.Readlink(ctx, t.ino)
	}
	if res.Status = s.status("readlink", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.Symlink_attributes, attr)
		ok.Data = target
	} else {
		s.postOp(&res.Resfail().Symlink_attributes, attr)
	}
	return res
}

// ioCheck checks a READ or WRITE of a regular file: write permission (or
// read), with the owner allowed regardless of the mode bits, as knfsd does
// — the client checked the mode at open, and a file created read-only or
// chmod'ed since must stay usable by its opener.
func ioCheck(c cred, a *rpc.Attr, want uint32) error {
	if isDir(a) {
		return errIsDir
	}
	if !isReg(a) {
		return errInval
	}
	if !c.may(a, want) && !c.owns(a) {
		return errAcces
	}
	return nil
}

// read3 answers READ; the data is read into a pooled buffer that release
// gives back once the answer is sent.
func (s *Server) read3(ctx context.Context, call *oncrpc.Call, a *xdr.READ3args) (_ *xdr.READ3res, release func()) {
	res := &xdr.READ3res{}
	var data []byte
	t, attr, err := s.file(ctx, call, &a.File)
	if err == nil {
		err = ioCheck(t.cred, attr, mayRead)
	}
	if err == nil && a.Offset < attr.Size && a.Count > 0 {
		data, release, err = s.readData(ctx, t.ino, int64(a.Offset), int(min(a.Count, maxIOBytes)))
	}
	if res.Status = s.status("read", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.File_attributes, attr)
		ok.Count = uint32(len(data))
		ok.Data = data
		ok.Eof = a.Offset+uint64(len(data)) >= attr.Size
	} else {
		s.postOp(&res.Resfail().File_attributes, attr)
	}
	return res, release
}

// readBufs are READ's data buffers (maxIOBytes each): a sequential reader
// would otherwise have a megabyte allocated and collected per call.
var readBufs = sync.Pool{New: func() any { b := make([]byte, maxIOBytes); return &b }}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// write3 writes through the file's client.File. A DATA_SYNC or FILE_SYNC
// write is made durable — data and the file's size, File.Fsync — before
// its FILE_SYNC answer, on every export. An UNSTABLE write is answered once
// the client library holds it (its write-behind memory or the stores'),
// UNSTABLE, with the gateway's verifier; COMMIT makes it durable, and a
// restart changes the verifier so that the client sends it again (RFC
// 1813 3.3.7). Both sync and async exports honour UNSTABLE, as knfsd's
// do: sync and async differ in namespace changes (durable before the
// answer, or not), and neither claims FILE_SYNC for what is not durable.
func (s *Server) write3(ctx context.Context, call *oncrpc.Call, a *xdr.WRITE3args) *xdr.WRITE3res {
	res := &xdr.WRITE3res{}
	var n int
	committed := xdr.FILE_SYNC
	t, attr, err := s.file(ctx, call, &a.File)
	if err == nil && t.exp.ReadOnly {
		err = errROFS
	}
	if err == nil {
		err = ioCheck(t.cred, attr, mayWrite)
	}
	if err == nil && int64(a.Count) > int64(len(a.Data)) {
		err = errInval
	}
	if err == nil {
		err = s.killPriv(ctx, t, attr)
	}
	if err == nil {
		unstable := a.Stable == xdr.UNSTABLE
		if unstable {
			committed = xdr.UNSTABLE
		}
		n, err = s.write(ctx, t.ino, int64(a.Offset), a.Data[:a.Count], unstable)
	}
	// The post-operation attributes: the ones the checks used, with this
	// write folded in (MergeLocal: size and mtime of the buffered write).
	after, _ := s.cachedAttr(ctx, t.ino)
	if res.Status = s.status("write", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.wcc(&ok.File_wcc, nil, after)
		ok.Count = uint32(n)
		ok.Committed = committed
		ok.Verf = s.verifier
	} else {
		s.wcc(&res.Resfail().File_wcc, nil, after)
	}
	return res
}

// killPriv clears setuid, and setgid with group execute, before a write by
// anybody but root, as a local write does (knfsd: file_remove_privs). A
// FILE_SYNC write's fsync, or the COMMIT of UNSTABLE ones, makes it
// durable with the data.
func (s *Server) killPriv(ctx context.Context, t target, a *rpc.Attr) error {
	if t.cred.uid == 0 {
		return nil
	}
	kill := a.Mode & syscall.S_ISUID
	if a.Mode&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP {
		kill |= syscall.S_ISGID
	}
	if kill == 0 {
		return nil
	}
	_, err := s.c.SetAttr(ctx, t.ino, rpc.SetAttrReq{Valid: rpc.SetMode, Mode: a.Mode & 0o7777 &^ kill})
	return staleIfGone(err)
}

func (s *Server) write(ctx context.Context, ino uint64, off int64, p []byte, unstable bool) (int, error) {
	of, err := s.files.get(ctx, ino)
	if err != nil {
		return 0, staleIfGone(err)
	}
	s.files.dropAheadOf(of)
	n, err := of.f.WriteAt(ctx, p, off)
	if err == nil && !unstable {
		err = of.f.Fsync(ctx)
		if err == nil {
			s.files.committed(of) // earlier UNSTABLE writes too
		}
	}
	s.files.put(of, unstable)
	return n, err
}

func (s *Server) commit3(ctx context.Context, call *oncrpc.Call, a *xdr.COMMIT3args) *xdr.COMMIT3res {
	res := &xdr.COMMIT3res{}
	t, attr, err := s.file(ctx, call, &a.File)
	if err == nil {
		err = ioCheck(t.cred, attr, mayWrite)
		if errors.Is(err, errAcces) {
			err = nil // committing is not writing: anybody may ask
		}
	}
	if err == nil {
		var of *openFile
		if of, err = s.files.get(ctx, t.ino); err == nil {
			if err = of.f.Fsync(ctx); err == nil {
				s.files.committed(of)
			}
			s.files.put(of, false)
		}
	}
	after := s.attrOrNil(ctx, t.ino)
	if res.Status = s.status("commit", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.wcc(&ok.File_wcc, nil, after)
		ok.Verf = s.verifier
	} else {
		s.wcc(&res.Resfail().File_wcc, nil, after)
	}
	return res
}

func (s *Server) fsstat3(ctx context.Context, call *oncrpc.Call, a *xdr.FSSTAT3args) *xdr.FSSTAT3res {
	res := &xdr.FSSTAT3res{}
	var st rpc.StatFSResp
	t, attr, err := s.object(ctx, call, &a.Fsroot)
	if err == nil {
		st, err = s.c.StatFS(ctx)
	}
	if res.Status = s.status("fsstat", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.Obj_attributes, attr)
		ok.Tbytes, ok.Fbytes, ok.Abytes = st.TotalBytes, st.FreeBytes, st.AvailBytes
		ok.Tfiles, ok.Ffiles, ok.Afiles = st.Inodes, st.FreeInodes, st.FreeInodes
	} else {
		s.postOp(&res.Resfail().Obj_attributes, attr)
	}
	return res
}

func (s *Server) fsinfo3(ctx context.Context, call *oncrpc.Call, a *xdr.FSINFO3args) *xdr.FSINFO3res {
	res := &xdr.FSINFO3res{}
	t, attr, err := s.object(ctx, call, &a.Fsroot)
	if res.Status = s.status("fsinfo", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.Obj_attributes, attr)
		ok.Rtmax, ok.Rtpref, ok.Rtmult = maxIOBytes, maxIOBytes, 4096
		ok.Wtmax, ok.Wtpref, ok.Wtmult = maxIOBytes, maxIOBytes, 4096
		ok.Dtpref = 64 << 10
		ok.Maxfilesize = math.MaxInt64
		ok.Time_delta = xdr.Nfstime3{Nseconds: 1}
		ok.Properties = xdr.FSF3_LINK | xdr.FSF3_SYMLINK | xdr.FSF3_HOMOGENEOUS | xdr.FSF3_CANSETTIME
	} else {
		s.postOp(&res.Resfail().Obj_attributes, attr)
	}
	return res
}

func (s *Server) pathconf3(ctx context.Context, call *oncrpc.Call, a *xdr.PATHCONF3args) *xdr.PATHCONF3res {
	res := &xdr.PATHCONF3res{}
	t, attr, err := s.object(ctx, call, &a.Object)
	if res.Status = s.status("pathconf", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.Obj_attributes, attr)
		ok.Linkmax = math.MaxUint32
		ok.Name_max = 255
		ok.No_trunc = true
		ok.Chown_restricted = true
		ok.Case_preserving = true
	} else {
		s.postOp(&res.Resfail().Obj_attributes, attr)
	}
	return res
}
