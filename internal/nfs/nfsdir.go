package nfs

import (
	"context"
	"encoding/binary"
	"errors"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// The directory procedures of NFS v3: LOOKUP, the creations, REMOVE,
// RMDIR, RENAME, LINK, READDIR and READDIRPLUS.

// dir resolves a directory's handle and checks that it is one.
func (s *Server) dir(ctx context.Context, call *oncrpc.Call, fh *xdr.Nfs_fh3) (target, *rpc.Attr, error) {
	t, a, err := s.object(ctx, call, fh)
	if err == nil && !isDir(a) {
		err = errNotDir
	}
	return t, a, err
}

// dirForChange resolves the directory of a change of its entries: the
// export must be writable and the caller may write and search it.
func (s *Server) dirForChange(ctx context.Context, call *oncrpc.Call, fh *xdr.Nfs_fh3) (target, *rpc.Attr, error) {
	t, a, err := s.dir(ctx, call, fh)
	if err != nil {
		return t, a, err
	}
	if t.exp.ReadOnly {
		return t, a, errROFS
	}
	if !t.cred.may(a, mayWrite|mayExec) {
		return t, a, errAcces
	}
	return t, a, nil
}

// rootOf is the export's root inode (as MNT resolved it, or now).
func (s *Server) rootOf(ctx context.Context, e *Export) (uint64, error) {
	s.mu.Lock()
	ino, ok := s.mu.roots[e.id()]
	s.mu.Unlock()
	if ok {
		return ino, nil
	}
	a, err := s.c.ResolvePath(ctx, e.Path)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.mu.roots[e.id()] = a.Ino
	s.mu.Unlock()
	return a.Ino, nil
}

func (s *Server) lookup3(ctx context.Context, call *oncrpc.Call, a *xdr.LOOKUP3args) *xdr.LOOKUP3res {
	res := &xdr.LOOKUP3res{}
	var obj *rpc.Attr
	t, dir, err := s.dir(ctx, call, &a.What.Dir)
	if err == nil && !t.cred.may(dir, mayExec) {
		err = errAcces
	}
	if err == nil {
		obj, err = s.lookup(ctx, t, dir, a.What.Name)
	}
	if res.Status = s.status("lookup", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		ok.Object.Data = s.handleOf(t.exp, obj.Ino)
		s.postOp(&ok.Obj_attributes, obj)
		s.postOp(&ok.Dir_attributes, dir)
	} else {
		s.postOp(&res.Resfail().Dir_attributes, dir)
	}
	return res
}

// lookup finds name in dir. "." is dir; ".." is the export's root itself
// at the root (a client never leaves the export through it), else the
// directory's parent, which the metadata keeps (an older metadata service
// does not answer it: NOENT).
func (s *Server) lookup(ctx context.Context, t target, dir *rpc.Attr, name string) (*rpc.Attr, error) {
	switch name {
	case ".":
		return dir, nil
	case "..":
		root, err := s.rootOf(ctx, t.exp)
		if err != nil {
			return nil, err
		}
		if root == t.ino {
			return dir, nil
		}
		a, err := s.c.Lookup(ctx, t.ino, "..")
		if errors.Is(err, syscall.EINVAL) {
			return nil, errStatus(xdr.NFS3ERR_NOENT)
		}
		if err != nil {
			return nil, err
		}
		return &a, nil
	}
	since, at := s.c.SizeSeq(), time.Now()
	a, err := s.c.Lookup(ctx, t.ino, name)
	if err != nil {
		return nil, err
	}
	s.fresh(&a, since, at)
	return &a, nil
}

// created is the outcome of a creation: the new object and its directory.
type created struct {
	t        target
	obj      *rpc.Attr
	dirAfter *rpc.Attr
}

// makeNode runs a creation in where's directory: checks, mk (which makes
// the object as the caller, with sa's mode), then sa's other attributes
// (set as the caller, now the owner), durability and the directory's new
// attributes.
func (s *Server) makeNode(ctx context.Context, call *oncrpc.Call, where *xdr.Diropargs3, sa *xdr.Sattr3, mk func(t target) (rpc.Attr, error)) (created, error) {
	var out created
	t, _, err := s.dirForChange(ctx, call, &where.Dir)
	out.t = t
	if err != nil {
		return out, err
	}
	since, at := s.c.SizeSeq(), time.Now()
	a, err := mk(t)
	if err == nil {
		s.fresh(&a, since, at)
	}
	if err == nil && sa != nil {
		rest := *sa
		rest.Mode.Set_it = false
		var after *rpc.Attr
		if after, err = s.setattr(ctx, target{ino: a.Ino, exp: t.exp, cred: t.cred}, &a, &rest, nil); err == nil {
			a = *after
		}
	}
	if err == nil {
		out.obj = &a
		err = s.durable(ctx, t)
	}
	out.dirAfter = s.attrOrNil(ctx, t.ino)
	return out, err
}

// modeOr is sa's mode if set, else def.
func modeOr(sa *xdr.Sattr3, def uint32) uint32 {
	if sa.Mode.Set_it {
		return *sa.Mode.Mode() & 0o7777
	}
	return def
}

// newOK is the success arm of the four creations' answers (CREATE, MKDIR,
// SYMLINK, MKNOD), which have the same fields; dirWcc is their failure arm
// and both arms of REMOVE's and RMDIR's.
type (
	newOK = struct {
		Obj            xdr.Post_op_fh3
		Obj_attributes xdr.Post_op_attr
		Dir_wcc        xdr.Wcc_data
	}
	dirWcc = struct{ Dir_wcc xdr.Wcc_data }
)

// answerNew sets a creation's status and fills its answer through its
// arms' accessors.
func answerNew[OK ~newOK, F ~dirWcc](s *Server, op string, c created, err error, status *xdr.Nfsstat3, ok func() *OK, fail func() *F) {
	if *status = s.status(op, c.t.ino, err); *status != xdr.NFS3_OK {
		var f dirWcc
		s.wcc(&f.Dir_wcc, nil, c.dirAfter)
		*fail() = F(f)
		return
	}
	var r newOK
	r.Obj.Handle_follows = true
	r.Obj.Handle().Data = s.handleOf(c.t.exp, c.obj.Ino)
	s.postOp(&r.Obj_attributes, c.obj)
	s.wcc(&r.Dir_wcc, nil, c.dirAfter)
	*ok() = OK(r)
}

// exclusiveStamp is where an EXCLUSIVE create keeps the client's verifier:
// the new file's atime, as knfsd does, until the client's SETATTR that
// follows such a create sets the real times.
func exclusiveStamp(v xdr.Createverf3) int64 {
	return int64(binary.BigEndian.Uint64(v[:]) &^ (1 << 63))
}

func (s *Server) create3(ctx context.Context, call *oncrpc.Call, a *xdr.CREATE3args) *xdr.CREATE3res {
	res := &xdr.CREATE3res{}
	var sa *xdr.Sattr3
	mode := uint32(0o644)
	if a.How.Mode != xdr.EXCLUSIVE {
		sa = a.How.Obj_attributes()
		mode = modeOr(sa, mode)
	}
	c, err := s.makeNode(ctx, call, &a.Where, sa, func(t target) (rpc.Attr, error) {
		attr, err := s.c.Create(ctx, t.ino, a.Where.Name, mode, t.cred.uid, t.cred.gid)
		if err == nil && sa != nil && sa.Size.Set_it && *sa.Size.Size() == 0 {
			sa.Size.Set_it = false // a new file is empty: no truncation to send
		}
		switch {
		case err == nil && a.How.Mode == xdr.EXCLUSIVE:
			req := rpc.SetAttrReq{Valid: rpc.SetAtime, Atime: exclusiveStamp(*a.How.Verf())}
			return s.c.SetAttr(ctx, attr.Ino, req)
		case rpc.ErrnoOf(err) != syscall.EEXIST || a.How.Mode == xdr.GUARDED:
			return attr, err
		}
		// It exists: UNCHECKED truncates a regular file (the size in sa
		// does, after mk); EXCLUSIVE succeeds if this is the retransmission
		// of the create that made it.
		old, lerr := s.c.Lookup(ctx, t.ino, a.Where.Name)
		if lerr != nil {
			return attr, lerr
		}
		if a.How.Mode == xdr.EXCLUSIVE && (!isReg(&old) || old.Atime != exclusiveStamp(*a.How.Verf())) {
			return attr, errExist
		}
		if !isReg(&old) {
			return attr, errExist
		}
		return old, nil
	})
	answerNew(s, "create", c, err, &res.Status, res.Resok, res.Resfail)
	return res
}

func (s *Server) mkdir3(ctx context.Context, call *oncrpc.Call, a *xdr.MKDIR3args) *xdr.MKDIR3res {
	res := &xdr.MKDIR3res{}
	c, err := s.makeNode(ctx, call, &a.Where, &a.Attributes, func(t target) (rpc.Attr, error) {
		return s.c.Mkdir(ctx, t.ino, a.Where.Name, modeOr(&a.Attributes, 0o755), t.cred.uid, t.cred.gid)
	})
	answerNew(s, "mkdir", c, err, &res.Status, res.Resok, res.Resfail)
	return res
}

func (s *Server) symlink3(ctx context.Context, call *oncrpc.Call, a *xdr.SYMLINK3args) *xdr.SYMLINK3res {
	res := &xdr.SYMLINK3res{}
	sa := a.Symlink.Symlink_attributes
	sa.Mode.Set_it = false // a symbolic link's mode means nothing
	c, err := s.makeNode(ctx, call, &a.Where, &sa, func(t target) (rpc.Attr, error) {
		return s.c.Symlink(ctx, t.ino, a.Where.Name, a.Symlink.Symlink_data, t.cred.uid, t.cred.gid)
	})
	answerNew(s, "symlink", c, err, &res.Status, res.Resok, res.Resfail)
	return res
}

func (s *Server) mknod3(ctx context.Context, call *oncrpc.Call, a *xdr.MKNOD3args) *xdr.MKNOD3res {
	res := &xdr.MKNOD3res{}
	var sa *xdr.Sattr3
	var kind, rdev uint32
	var err error
	switch a.What.Type {
	case xdr.NF3CHR, xdr.NF3BLK:
		d := a.What.Device()
		sa, rdev = &d.Dev_attributes, rdevOf(d.Spec)
		kind = syscall.S_IFCHR
		if a.What.Type == xdr.NF3BLK {
			kind = syscall.S_IFBLK
		}
	case xdr.NF3SOCK:
		sa, kind = a.What.Pipe_attributes(), syscall.S_IFSOCK
	case xdr.NF3FIFO:
		sa, kind = a.What.Pipe_attributes(), syscall.S_IFIFO
	default:
		err = errBadType
	}
	var c created
	if err == nil {
		c, err = s.makeNode(ctx, call, &a.Where, sa, func(t target) (rpc.Attr, error) {
			if (kind == syscall.S_IFCHR || kind == syscall.S_IFBLK) && t.cred.uid != 0 {
				return rpc.Attr{}, errPerm // devices: CAP_MKNOD, root only
			}
			return s.c.Mknod(ctx, t.ino, a.Where.Name, kind|modeOr(sa, 0o644), rdev, t.cred.uid, t.cred.gid)
		})
	}
	answerNew(s, "mknod", c, err, &res.Status, res.Resok, res.Resfail)
	return res
}

// mayRemove checks the sticky bit's rule for removing name from dir (the
// directory's write and search permission are checked already).
func (s *Server) mayRemove(ctx context.Context, t target, dir *rpc.Attr, name string) error {
	if dir.Mode&syscall.S_ISVTX == 0 || t.cred.uid == 0 || t.cred.uid == dir.Uid {
		return nil
	}
	victim, err := s.c.Lookup(ctx, t.ino, name)
	if err != nil {
		return err
	}
	if !t.cred.mayDelete(dir, &victim) {
		return errAcces
	}
	return nil
}

// removeEntry is REMOVE and RMDIR: rm removes name from the directory;
// the answer is filled through its arms' accessors.
func removeEntry[OK, F ~dirWcc](s *Server, ctx context.Context, call *oncrpc.Call, op string, d *xdr.Diropargs3, status *xdr.Nfsstat3,
	ok func() *OK, fail func() *F, rm func(t target) error) {
	t, dir, err := s.dirForChange(ctx, call, &d.Dir)
	if err == nil {
		err = s.mayRemove(ctx, t, dir, d.Name)
	}
	if err == nil {
		err = rm(t)
	}
	if err == nil {
		err = s.durable(ctx, t)
	}
	var w dirWcc
	s.wcc(&w.Dir_wcc, nil, s.attrOrNil(ctx, t.ino))
	if *status = s.status(op, t.ino, err); *status == xdr.NFS3_OK {
		*ok() = OK(w)
	} else {
		*fail() = F(w)
	}
}

func (s *Server) remove3(ctx context.Context, call *oncrpc.Call, a *xdr.REMOVE3args) *xdr.REMOVE3res {
	res := &xdr.REMOVE3res{}
	removeEntry(s, ctx, call, "remove", &a.Object, &res.Status, res.Resok, res.Resfail, func(t target) error {
		victim, err := s.c.Unlink(ctx, t.ino, a.Object.Name)
		switch {
		case err == nil:
			s.attrs.drop(victim.Ino) // its link count changed; gone: STALE at once
			if victim.Nlink == 0 {
				s.files.forget(victim.Ino) // else the gateway would keep it alive
			}
		case !changeRefused(err):
			s.attrs.reset() // what it removed, if anything, is unknown
		}
		return err
	})
	return res
}

func (s *Server) rmdir3(ctx context.Context, call *oncrpc.Call, a *xdr.RMDIR3args) *xdr.RMDIR3res {
	res := &xdr.RMDIR3res{}
	removeEntry(s, ctx, call, "rmdir", &a.Object, &res.Status, res.Resok, res.Resfail, func(t target) error {
		err := s.c.Rmdir(ctx, t.ino, a.Object.Name)
		if !changeRefused(err) {
			s.attrs.reset() // the directory removed is not named by the answer
		}
		return err
	})
	return res
}

func (s *Server) rename3(ctx context.Context, call *oncrpc.Call, a *xdr.RENAME3args) *xdr.RENAME3res {
	res := &xdr.RENAME3res{}
	from, to, err := s.rename(ctx, call, a)
	if res.Status = s.status("rename", from.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.wcc(&ok.Fromdir_wcc, nil, s.attrOrNil(ctx, from.ino))
		s.wcc(&ok.Todir_wcc, nil, s.attrOrNil(ctx, to.ino))
	} else {
		fail := res.Resfail()
		s.wcc(&fail.Fromdir_wcc, nil, s.attrOrNil(ctx, from.ino))
		s.wcc(&fail.Todir_wcc, nil, s.attrOrNil(ctx, to.ino))
	}
	return res
}

// rename checks both directories (write and search, the sticky bit for
// the entry moved and the one replaced; a directory moved to another
// parent needs write permission on itself, for its "..") and renames.
func (s *Server) rename(ctx context.Context, call *oncrpc.Call, a *xdr.RENAME3args) (target, target, error) {
	from, fromDir, err := s.dirForChange(ctx, call, &a.From.Dir)
	if err != nil {
		return from, target{}, err
	}
	to, toDir, err := s.dirForChange(ctx, call, &a.To.Dir)
	if err != nil {
		return from, to, err
	}
	if from.exp != to.exp {
		return from, to, errXDev
	}
	src, err := s.c.Lookup(ctx, from.ino, a.From.Name)
	if err != nil {
		return from, to, err
	}
	if !from.cred.mayDelete(fromDir, &src) {
		return from, to, errAcces
	}
	if isDir(&src) && from.ino != to.ino && !from.cred.may(&src, mayWrite) {
		return from, to, errAcces
	}
	if toDir.Mode&syscall.S_ISVTX != 0 {
		if old, err := s.c.Lookup(ctx, to.ino, a.To.Name); err == nil && !to.cred.mayDelete(toDir, &old) {
			return from, to, errAcces
		}
	}
	err = s.c.Rename(ctx, from.ino, a.From.Name, to.ino, a.To.Name, 0)
	if !changeRefused(err) {
		s.attrs.reset() // the file it replaced, if any, is not named by the answer
	}
	if err != nil {
		return from, to, err
	}
	return from, to, s.durable(ctx, from)
}

func (s *Server) link3(ctx context.Context, call *oncrpc.Call, a *xdr.LINK3args) *xdr.LINK3res {
	res := &xdr.LINK3res{}
	var dirIno uint64
	t, file, err := s.object(ctx, call, &a.File)
	if err == nil {
		var d target
		d, _, err = s.dirForChange(ctx, call, &a.Link.Dir)
		dirIno = d.ino
		if err == nil && d.exp != t.exp {
			err = errXDev
		}
		if err == nil && isDir(file) {
			err = errIsDir
		}
	}
	if err == nil {
		_, err = s.c.Link(ctx, t.ino, dirIno, a.Link.Name)
		s.attrs.drop(t.ino) // its link count changed
	}
	if err == nil {
		err = s.durable(ctx, t)
	}
	after, dirAfter := s.attrOrNil(ctx, t.ino), s.attrOrNil(ctx, dirIno)
	if res.Status = s.status("link", t.ino, err); res.Status == xdr.NFS3_OK {
		ok := res.Resok()
		s.postOp(&ok.File_attributes, after)
		s.wcc(&ok.Linkdir_wcc, nil, dirAfter)
	} else {
		fail := res.Resfail()
		s.postOp(&fail.File_attributes, after)
		s.wcc(&fail.Linkdir_wcc, nil, dirAfter)
	}
	return res
}

// XDR sizes of READDIR answers, to fill a reply to the client's count.
const (
	readdirHeadBytes = 4 + 4 + 84 + 8 + 4 + 4 // status, dir attrs, verifier, list end, eof
	entryBytes       = 4 + 8 + 4 + 8          // follows, fileid, name length, cookie
	entryPlusBytes   = entryBytes + 4 + 84 + 4 + 4 + handleBytes
	maxDirEntries    = 1024 // entries asked of the metadata service per reply
)

func pad4(n int) int { return (n + 3) &^ 3 }

// listing is one READDIR(PLUS) page.
type listing struct {
	t       target
	dir     *rpc.Attr
	entries []rpc.DirEntry
	cookies []uint64
	eof     bool
}

// list reads the entries after cookie that fit: fits says whether the
// entries so far, with one more of the given name, fit the client's count.
//
// fetch is how many entries to ask the metadata service for: about as many
// as the client's count can take, so that a large directory listed in
// small pages is not read a thousand entries at a time for each page.
func (s *Server) list(ctx context.Context, call *oncrpc.Call, fh *xdr.Nfs_fh3, cookie uint64, verf xdr.Cookieverf3, plus bool, fetch int, fits func(n int, name string) bool) (listing, error) {
	var l listing
	t, dir, err := s.dir(ctx, call, fh)
	l.t, l.dir = t, dir
	if err != nil {
		return l, err
	}
	if !t.cred.may(dir, mayRead) {
		return l, errAcces
	}
	after := ""
	if cookie != 0 {
		if verf != s.verifier {
			return l, errBadCook
		}
		name, ok := s.cookies.name(t.ino, cookie)
		if !ok {
			return l, errBadCook
		}
		after = name
	}
	since, at := s.c.SizeSeq(), time.Now()
	entries, eof, err := s.c.ReadDir(ctx, t.ino, after, min(max(fetch, 1), maxDirEntries), plus)
	if err != nil {
		return l, staleIfGone(err)
	}
	if plus {
		for i := range entries {
			s.fresh(&entries[i].Attr, since, at)
		}
	}
	n := 0
	for n < len(entries) && fits(n, entries[n].Name) {
		n++
	}
	if n == 0 && len(entries) > 0 {
		return l, errTooSmall
	}
	names := make([]string, n)
	for i := range names {
		names[i] = entries[i].Name
	}
	l.entries = entries[:n]
	l.cookies = s.cookies.add(t.ino, names)
	l.eof = eof && n == len(entries)
	return l, nil
}

// listFailed sets a READDIR(PLUS)'s status and, when it is an error, its
// failure arm (the same fields in both); it reports the failure.
func listFailed[F ~struct{ Dir_attributes xdr.Post_op_attr }](s *Server, op string, l listing, err error, status *xdr.Nfsstat3, fail func() *F) bool {
	if *status = s.status(op, l.t.ino, err); *status == xdr.NFS3_OK {
		return false
	}
	var f struct{ Dir_attributes xdr.Post_op_attr }
	s.postOp(&f.Dir_attributes, l.dir)
	*fail() = F(f)
	return true
}

// listHead fills what READDIR and READDIRPLUS answers both carry: the
// directory's attributes, the cookie verifier and the end mark.
func (s *Server) listHead(l *listing, attrs *xdr.Post_op_attr, verf *xdr.Cookieverf3, eof *bool) {
	s.postOp(attrs, l.dir)
	*verf, *eof = s.verifier, l.eof
}

func (s *Server) readdir3(ctx context.Context, call *oncrpc.Call, a *xdr.READDIR3args) *xdr.READDIR3res {
	res := &xdr.READDIR3res{}
	used := readdirHeadBytes
	fetch := (int(a.Count) - readdirHeadBytes) / (entryBytes + 4)
	l, err := s.list(ctx, call, &a.Dir, a.Cookie, a.Cookieverf, false, fetch, func(n int, name string) bool {
		used += entryBytes + pad4(len(name))
		return used <= int(a.Count)
	})
	if listFailed(s, "readdir", l, err, &res.Status, res.Resfail) {
		return res
	}
	ok := res.Resok()
	s.listHead(&l, &ok.Dir_attributes, &ok.Cookieverf, &ok.Reply.Eof)
	for i := len(l.entries) - 1; i >= 0; i-- {
		e := &l.entries[i]
		ok.Reply.Entries = &xdr.Entry3{Fileid: e.Ino, Name: e.Name, Cookie: l.cookies[i], Nextentry: ok.Reply.Entries}
	}
	return res
}

func (s *Server) readdirplus3(ctx context.Context, call *oncrpc.Call, a *xdr.READDIRPLUS3args) *xdr.READDIRPLUS3res {
	res := &xdr.READDIRPLUS3res{}
	used, dirUsed := readdirHeadBytes, 0
	fetch := min((int(a.Maxcount)-readdirHeadBytes)/(entryPlusBytes+4), int(a.Dircount)/(entryBytes+4))
	l, err := s.list(ctx, call, &a.Dir, a.Cookie, a.Cookieverf, true, fetch, func(n int, name string) bool {
		used += entryPlusBytes + pad4(len(name))
		dirUsed += entryBytes + pad4(len(name))
		return used <= int(a.Maxcount) && dirUsed <= int(a.Dircount)
	})
	if listFailed(s, "readdirplus", l, err, &res.Status, res.Resfail) {
		return res
	}
	ok := res.Resok()
	s.listHead(&l, &ok.Dir_attributes, &ok.Cookieverf, &ok.Reply.Eof)
	for i := len(l.entries) - 1; i >= 0; i-- {
		e := &l.entries[i]
		ent := &xdr.Entryplus3{Fileid: e.Ino, Name: e.Name, Cookie: l.cookies[i], Nextentry: ok.Reply.Entries}
		s.postOp(&ent.Name_attributes, &e.Attr)
		ent.Name_handle.Handle_follows = true
		ent.Name_handle.Handle().Data = s.handleOf(l.t.exp, e.Ino)
		ok.Reply.Entries = ent
	}
	return res
}
