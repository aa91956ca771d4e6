package meta

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// File type and permission bits (as in stat(2)).
const (
	modeType   = 0o170000
	modeDir    = 0o040000
	modeReg    = 0o100000
	modeLink   = 0o120000
	modeChr    = 0o020000
	modeBlk    = 0o060000
	modeFifo   = 0o010000
	modeSock   = 0o140000
	modeSetuid = 0o4000
	modeSetgid = 0o2000
	modePerm   = 0o7777
	modeGrpX   = 0o0010
)

const (
	rootIno        = 1
	maxNameBytes   = 255
	maxSymlinkLen  = 4096
	maxXattrName   = 255
	maxXattrValue  = 64 << 10
	maxDirNlink    = 1<<31 - 1
	opCacheEntries = 6
)

// opCtx applies one command. Inodes are read through a small per-command
// cache and written back by flush only when the command succeeds, so a
// command that fails halfway leaves no trace: every apply function checks
// everything before it changes anything, and only dentry/xattr writes go
// straight to the batch, after the checks.
type opCtx struct {
	f     *fsm
	b     kv.Batch
	now   int64
	index uint64 // raft index of the command (0 without a log: tests)
	term  uint64 // raft term of that entry
	n     int
	c     [opCacheEntries]struct {
		ino     uint64
		in      schema.Inode
		dirty   bool
		deleted bool
	}
	buf []byte
}

func (x *opCtx) reset(f *fsm, b kv.Batch, now int64) {
	x.f, x.b, x.now, x.n = f, b, now, 0
}

// inode returns the cached inode ino, loading it; ENOENT if absent.
func (x *opCtx) inode(ino uint64) (*schema.Inode, error) {
	for i := 0; i < x.n; i++ {
		if x.c[i].ino == ino {
			if x.c[i].deleted {
				return nil, rpc.Errorf(syscall.ENOENT, "inode %d does not exist", ino)
			}
			return &x.c[i].in, nil
		}
	}
	if x.n == len(x.c) {
		panic("meta: opCtx inode cache overflow") // an op touching > 6 inodes is a bug
	}
	s := &x.c[x.n]
	*s = struct {
		ino     uint64
		in      schema.Inode
		dirty   bool
		deleted bool
	}{ino: ino}
	if x.f.cachedForApply(ino, &s.in) { // the committed record, unchanged in this batch
		x.n++
		return &s.in, nil
	}
	v, err := x.b.Get(schema.InodeKey(ino))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, rpc.Errorf(syscall.ENOENT, "inode %d does not exist", ino)
	}
	if err != nil {
		return nil, fmt.Errorf("read inode %d: %w", ino, err)
	}
	if err := schema.DecodeInode(v, &s.in); err != nil {
		return nil, rpc.Errorf(syscall.EIO, "inode %d: %v", ino, err)
	}
	x.n++
	return &s.in, nil
}

// put adds a new inode to the cache, dirty.
func (x *opCtx) put(ino uint64, in schema.Inode) {
	x.c[x.n].ino, x.c[x.n].in, x.c[x.n].dirty, x.c[x.n].deleted = ino, in, true, false
	x.n++
}

func (x *opCtx) mark(ino uint64) {
	for i := 0; i < x.n; i++ {
		if x.c[i].ino == ino {
			x.c[i].dirty = true
		}
	}
}

func (x *opCtx) drop(ino uint64) {
	for i := 0; i < x.n; i++ {
		if x.c[i].ino == ino {
			x.c[i].deleted = true
		}
	}
}

// dir loads ino and checks it is a directory.
func (x *opCtx) dir(ino uint64) (*schema.Inode, error) {
	in, err := x.inode(ino)
	if err != nil {
		return nil, err
	}
	if in.Mode&modeType != modeDir {
		return nil, rpc.Errorf(syscall.ENOTDIR, "inode %d is not a directory", ino)
	}
	return in, nil
}

func (x *opCtx) dentry(parent uint64, name string) (schema.Dentry, bool, error) {
	x.buf = schema.AppendDentryKey(x.buf[:0], parent, name)
	if de, found, ok := x.f.entryForApply(x.buf); ok {
		return de, found, nil // a map read, not a point read of the memtable
	}
	v, err := x.b.Get(x.buf)
	if errors.Is(err, kv.ErrNotFound) {
		return schema.Dentry{}, false, nil
	}
	if err != nil {
		return schema.Dentry{}, false, fmt.Errorf("read entry %d/%q: %w", parent, name, err)
	}
	de, err := schema.DecodeDentry(v)
	if err != nil {
		return schema.Dentry{}, false, rpc.Errorf(syscall.EIO, "entry %d/%q: %v", parent, name, err)
	}
	return de, true, nil
}

func (x *opCtx) setDentry(parent uint64, name string, de schema.Dentry) error {
	k := schema.DentryKey(parent, name)
	x.f.batch.noteEntry(k, &de)
	return x.b.Set(k, schema.AppendDentry(nil, de))
}

func (x *opCtx) delDentry(parent uint64, name string) error {
	k := schema.DentryKey(parent, name)
	x.f.batch.noteEntry(k, nil)
	return x.b.Delete(k)
}

func (x *opCtx) flush() error {
	for i := 0; i < x.n; i++ {
		s := &x.c[i]
		switch {
		case s.deleted:
			x.f.batch.noteInode(s.ino, nil)
			if err := x.deleteInode(s.ino); err != nil {
				return err
			}
		case s.dirty:
			x.f.batch.noteInode(s.ino, &s.in)
			x.buf = schema.AppendInode(x.buf[:0], &s.in)
			if err := x.b.Set(schema.InodeKey(s.ino), x.buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteInode removes an inode record and its xattrs with point deletes.
// Not a range deletion: pebble checks every range tombstone on each read of
// the levels that hold it, and a remove-heavy workload would leave one per
// file, slowing every later lookup until compaction.
func (x *opCtx) deleteInode(ino uint64) error {
	if err := x.b.Delete(schema.InodeKey(ino)); err != nil {
		return err
	}
	p := schema.XattrPrefix(ino)
	it, err := x.b.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return err
	}
	var keys [][]byte
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, append([]byte(nil), it.Key()...))
	}
	if err := it.Error(); err != nil {
		it.Close()
		return err
	}
	it.Close()
	for _, k := range keys {
		if err := x.b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// checkName enforces the rules for one path component.
func checkName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return rpc.Errorf(syscall.EINVAL, "invalid name %q", name)
	case len(name) > maxNameBytes:
		return rpc.Errorf(syscall.ENAMETOOLONG, "name of %d bytes is longer than %d", len(name), maxNameBytes)
	case strings.ContainsAny(name, "/\x00"):
		return rpc.Errorf(syscall.EINVAL, "name %q contains '/' or NUL", name)
	}
	return nil
}

// answer is what an applied command answers. The deduplicated changes
// answer rec, which the dedupe table records as it is (schema.Result); the
// commands that are never deduplicated (session open, register) answer a
// wire message. The leader turns rec into the wire answer (reply).
type answer struct {
	rec schema.Answer
	msg rpc.Message
	// dirs, of an rmdir, rename or link, are the attributes the change
	// left on the directories and entries it changed (rpc.DirChangeResp,
	// rpc.LinkResp): hints for the client's attribute cache, not
	// recorded in the dedupe table (an answer replayed for a retry goes
	// without them, and the client then forgets what it cached).
	dirs *changedDirs
}

// changedDirs: see answer.dirs and rpc.DirChangeResp (Ino 0: none).
type changedDirs struct {
	dir, newDir, entry, other schema.Attr
}

// withDirs adds the attributes of a change's directories and entries to
// its answer: the (cached, changed) inodes of dir, newDir, entry and other;
// an ino of 0 leaves that one out.
func withDirs(ans *answer, dir uint64, d *schema.Inode, newDir uint64, nd *schema.Inode, entry uint64, e *schema.Inode, other uint64, o *schema.Inode) *answer {
	cd := &changedDirs{}
	for _, x := range []struct {
		dst *schema.Attr
		ino uint64
		in  *schema.Inode
	}{{&cd.dir, dir, d}, {&cd.newDir, newDir, nd}, {&cd.entry, entry, e}, {&cd.other, other, o}} {
		if x.ino != 0 && x.in != nil {
			*x.dst = answerAttr(x.ino, x.in)
		}
	}
	ans.dirs = cd
	return ans
}

// recAttr is an inode's attributes (sharing the layout's targets).
func recAttr(ino uint64, in *schema.Inode) schema.Attr {
	a := schema.Attr{Ino: ino, Mode: in.Mode, Nlink: in.Nlink, Uid: in.Uid, Gid: in.Gid, Rdev: in.Rdev,
		Size: in.Size, Atime: in.Atime, Mtime: in.Mtime, Ctime: in.Ctime, Layout: in.Layout}
	a.Blocks, a.BlocksKnown = in.AllocBlocks()
	if in.IsInline() {
		// What the inode's data takes, as a file system counts a
		// small file's block: its bytes rounded up to 512.
		a.Inline = true
		a.Blocks, a.BlocksKnown = (uint64(len(in.Inline))+511)/512, true
	}
	return a
}

// answerAttr is an inode's attributes as a change answers them. The
// answer leaves the apply loop for the handler's goroutine, so it shares
// no memory with the inode the apply loop holds (the targets are copied).
func answerAttr(ino uint64, in *schema.Inode) schema.Attr {
	a := recAttr(ino, in)
	a.Layout.Targets = slices.Clone(a.Layout.Targets)
	return a
}

// attrBody answers a change of one inode with its attributes (rpc.AttrResp).
func (x *opCtx) attrBody(ino uint64, in *schema.Inode) (*answer, error) {
	return &answer{rec: schema.Answer{Kind: schema.AnswerAttr, Index: x.index, Term: x.term, Attr: answerAttr(ino, in)}}, nil
}

// stampBody answers a change that has nothing else to say with its entry's
// index and term (rpc.Stamp).
func (x *opCtx) stampBody() (*answer, error) {
	return &answer{rec: schema.Answer{Kind: schema.AnswerStamp, Index: x.index, Term: x.term}}, nil
}

// changeBody answers a change of an entry of directory dir (rpc.ChangeResp).
func (x *opCtx) changeBody(ino uint64, in *schema.Inode, dir uint64, d *schema.Inode) (*answer, error) {
	return &answer{rec: schema.Answer{Kind: schema.AnswerChange, Index: x.index, Term: x.term,
		Attr: answerAttr(ino, in), Dir: answerAttr(dir, d)}}, nil
}

// apply runs one command.
func (x *opCtx) apply(c *command) (*answer, error) {
	switch c.Op {
	case opInit:
		return x.init()
	case opCreate:
		return x.create(c)
	case opTmpfile:
		return x.tmpfile(c)
	case opSetAttr:
		return x.setAttr(c)
	case opUnlink:
		return x.unlink(c)
	case opRmdir:
		return x.rmdir(c)
	case opRename:
		return x.rename(c)
	case opLink:
		return x.link(c)
	case opSetXattr:
		return x.setXattr(c)
	case opRemoveXattr:
		return x.removeXattr(c)
	case opCommitSize:
		return x.commitSize(c)
	case opSetDirLayout:
		return x.setDirLayout(c)
	case opSessionOpen:
		return x.sessionOpen(c)
	case opSessionClose:
		return x.sessionClose(c)
	case opRegister:
		return x.register(c)
	case opReap:
		return x.reap(c)
	case opRaiseIno:
		x.raiseIno(c.Ino)
		return nil, nil
	case opSetAtimes:
		return x.setAtimes(c)
	case opMirrorCreate:
		return x.mirrorCreate(c)
	case opMirrorFailOver:
		return x.mirrorFailOver(c)
	case opMirrorReport:
		return x.mirrorReport(c)
	case opMirrorReplace:
		return x.mirrorReplace(c)
	case opMirrorResync:
		return x.mirrorResync(c)
	case opHALease:
		return x.haLease(c)
	case opReserveInos:
		return x.reserveInos(c)
	case opCreateBatch:
		return x.createBatch(c)
	case opDelegate:
		return x.delegate(c)
	case opReturn:
		return x.returnDeleg(c)
	case opUninline:
		return x.uninline(c)
	case opReapMany:
		// Each reap is a whole step of its own: flush it and empty the
		// small inode cache before the next (reaps only fail on kv errors).
		for _, ino := range c.Inos {
			if _, err := x.reap(&command{Ino: ino}); err != nil {
				return nil, err
			}
			if err := x.flush(); err != nil {
				return nil, err
			}
			x.reset(x.f, x.b, x.now)
		}
		return nil, nil
	}
	return nil, rpc.Errorf(syscall.EINVAL, "unknown command op %d", c.Op)
}

// init creates the root directory; the first command of every namespace.
func (x *opCtx) init() (*answer, error) {
	ctr := &x.f.ctr
	if ctr.NextIno != 0 {
		return nil, nil // already initialised
	}
	x.put(rootIno, schema.Inode{Mode: modeDir | 0o755, Nlink: 2, Atime: x.now, Mtime: x.now, Ctime: x.now, Parent: rootIno})
	ctr.NextIno, ctr.NextClient, ctr.NextServer, ctr.NextTarget, ctr.Inodes = rootIno+1, 1, 1, 1, 1
	// The cluster id: a function of this first entry, the same on every
	// replica, and different for every namespace ever created.
	id := clusterIDOf(x.now, x.index, x.term)
	if err := x.b.Set(schema.ClusterIDKey(), []byte(id)); err != nil {
		return nil, err
	}
	x.f.cid.Store(&id)
	return nil, nil
}

func (x *opCtx) touchDir(ino uint64, in *schema.Inode) {
	in.Mtime, in.Ctime = x.now, x.now
	x.mark(ino)
}

// newEntryDir checks that name may be made in directory parent (a valid
// name, a live directory, no such entry yet) and returns the directory.
func (x *opCtx) newEntryDir(parentIno uint64, name string) (*schema.Inode, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	parent, err := x.dir(parentIno)
	if err != nil {
		return nil, err
	}
	if parent.Nlink == 0 {
		return nil, rpc.Errorf(syscall.ENOENT, "directory %d was removed", parentIno)
	}
	if _, ok, err := x.dentry(parentIno, name); err != nil {
		return nil, err
	} else if ok {
		return nil, rpc.Errorf(syscall.EEXIST, "%q exists in directory %d", name, parentIno)
	}
	return parent, nil
}

func (x *opCtx) create(c *command) (*answer, error) {
	parent, err := x.newEntryDir(c.Parent, c.Name)
	if err != nil {
		return nil, err
	}
	mode := c.Mode
	if mode&modeType == 0 {
		mode |= modeReg
	}
	in := schema.Inode{Mode: mode, Nlink: 1, Uid: c.Uid, Gid: c.Gid, Atime: x.now, Mtime: x.now, Ctime: x.now}
	if parent.Mode&modeSetgid != 0 {
		in.Gid = parent.Gid
		if mode&modeType == modeDir {
			in.Mode |= modeSetgid
		}
	}
	switch mode & modeType {
	case modeReg:
		l, err := placeFile(c.Parent, parent, c.Cands, c.RRStart)
		if err != nil {
			return nil, err
		}
		in.Layout = l
		in.Alloc = make([]uint64, len(l.Targets)) // no chunk yet: no space
	case modeDir:
		if parent.Nlink >= maxDirNlink {
			return nil, rpc.Errorf(syscall.EMLINK, "directory %d has too many subdirectories", c.Parent)
		}
		in.Nlink = 2
		in.Parent = c.Parent
		in.Layout = layout.Layout{StripeSize: parent.Layout.StripeSize, StripeCount: parent.Layout.StripeCount}
		in.Mirror = parent.Mirror
	case modeLink:
		if c.Symlink == "" {
			return nil, rpc.Errorf(syscall.ENOENT, "empty symlink target")
		}
		if len(c.Symlink) > maxSymlinkLen {
			return nil, rpc.Errorf(syscall.ENAMETOOLONG, "symlink target of %d bytes is longer than %d", len(c.Symlink), maxSymlinkLen)
		}
		in.Symlink = c.Symlink
		in.Size = uint64(len(c.Symlink))
		in.Mode = modeLink | 0o777
	case modeChr, modeBlk:
		in.Rdev = c.Rdev
	case modeFifo, modeSock:
	default:
		return nil, rpc.Errorf(syscall.EINVAL, "unknown file type %o", mode&modeType)
	}
	ctr := &x.f.ctr
	ino := ctr.NextIno
	ctr.NextIno++
	ctr.Inodes++
	x.put(ino, in)
	parent.Entries++
	if mode&modeType == modeDir {
		parent.Nlink++
	}
	x.touchDir(c.Parent, parent)
	if err := x.setDentry(c.Parent, c.Name, schema.Dentry{Ino: ino, Type: in.Mode & modeType}); err != nil {
		return nil, err
	}
	return x.changeBody(ino, &in, c.Parent, parent)
}

// tmpfile makes a regular file that no directory names (open with
// O_TMPFILE in directory c.Parent): an orphan from the start, kept while a
// client holds it open and reaped after, unless linkat gives it a name
// first (link). Like Linux, it leaves the directory unchanged; the new file
// takes the directory's default layout and, under a setgid directory, its
// group.
func (x *opCtx) tmpfile(c *command) (*answer, error) {
	parent, err := x.dir(c.Parent)
	if err != nil {
		return nil, err
	}
	if parent.Nlink == 0 {
		return nil, rpc.Errorf(syscall.ENOENT, "directory %d was removed", c.Parent)
	}
	if c.Mode&modeType != 0 && c.Mode&modeType != modeReg {
		return nil, rpc.Errorf(syscall.EINVAL, "O_TMPFILE makes regular files, not type %o", c.Mode&modeType)
	}
	in := schema.Inode{Mode: modeReg | c.Mode&^modeType, Uid: c.Uid, Gid: c.Gid, Atime: x.now, Mtime: x.now, Ctime: x.now}
	if parent.Mode&modeSetgid != 0 {
		in.Gid = parent.Gid
	}
	l, err := placeFile(c.Parent, parent, c.Cands, c.RRStart)
	if err != nil {
		return nil, err
	}
	in.Layout = l
	in.Alloc = make([]uint64, len(l.Targets))
	ctr := &x.f.ctr
	ino := ctr.NextIno
	ctr.NextIno++
	ctr.Inodes++
	x.put(ino, in)
	if err := x.b.Set(schema.OrphanKey(ino), schema.AppendOrphan(nil, schema.Orphan{Since: x.now, Tmpfile: true})); err != nil {
		return nil, err
	}
	return x.changeBody(ino, &in, c.Parent, parent)
}

// placeFile chooses a new file's layout: the directory default (zero fields
// mean system default) over the live targets the leader listed — or, under
// a directory marked mirrored, over the mirror groups it listed (ids with
// layout.GroupBit).
func placeFile(dirIno uint64, dir *schema.Inode, cands []layout.Candidate, start uint64) (layout.Layout, error) {
	def := dir.Layout
	if dir.Mirror && !isGroupCands(cands) {
		// The leader lists groups for a mirrored directory whenever any
		// exist; without any, a mirrored file cannot be placed.
		return layout.Layout{}, rpc.Errorf(syscall.ENOSPC, "directory %d is marked mirrored but no mirror group exists: pair targets first (strata mirror create --auto)", dirIno)
	}
	if len(cands) == 0 {
		return layout.Layout{}, rpc.Errorf(syscall.ENOSPC, "no storage target is registered, alive and has free space: start a storage server (strata store)")
	}
	size := def.StripeSize
	if size == 0 {
		size = layout.DefaultStripeSize
	}
	count := def.StripeCount
	if count == 0 {
		count = layout.DefaultCount(len(cands))
	}
	if int(count) > len(cands) {
		count = uint32(len(cands)) // degrade rather than fail while targets are down
	}
	ts, err := layout.Choose(cands, int(count), start)
	if err != nil {
		return layout.Layout{}, rpc.Errorf(syscall.ENOSPC, "choose targets: %v", err)
	}
	return layout.Layout{StripeSize: size, StripeCount: count, Targets: ts}, nil
}

func (x *opCtx) setAttr(c *command) (*answer, error) {
	in, err := x.inode(c.Ino)
	if err != nil {
		return nil, err
	}
	typ := in.Mode & modeType
	if c.Valid&rpc.SetSize != 0 {
		switch typ {
		case modeReg:
		case modeDir:
			return nil, rpc.Errorf(syscall.EISDIR, "inode %d is a directory", c.Ino)
		default:
			return nil, rpc.Errorf(syscall.EINVAL, "size of inode %d (type %o) cannot change", c.Ino, typ)
		}
	}
	if c.Valid&(rpc.SetUid|rpc.SetGid) != 0 && typ != modeDir {
		// POSIX chown: clear setuid, and setgid when it means "set group
		// id on execution" (with group-execute; without, it marks mandatory
		// locking and stays).
		in.Mode &^= modeSetuid
		if in.Mode&modeGrpX != 0 {
			in.Mode &^= modeSetgid
		}
	}
	if c.Valid&rpc.SetMode != 0 {
		in.Mode = in.Mode&^modePerm | c.Mode&modePerm
	}
	if c.Valid&rpc.SetUid != 0 {
		in.Uid = c.Uid
	}
	if c.Valid&rpc.SetGid != 0 {
		in.Gid = c.Gid
	}
	if c.Valid&rpc.SetSize != 0 {
		in.Size = c.Size
		if c.Valid&(rpc.SetMtime|rpc.SetMtimeNow) == 0 {
			in.Mtime = x.now
		}
		if in.IsInline() && uint64(len(in.Inline)) > c.Size {
			// Cut here: the bytes past the new size are gone, and a
			// later growth reads zeros there (a new slice: the cached
			// record's bytes are shared with readers).
			in.Inline = append([]byte{}, in.Inline[:c.Size]...)
		}
		// The chunks were cut to the new size: none keeps more than its
		// part of it (rounded up to whole blocks); a later commit says
		// exactly.
		if in.Alloc != nil {
			alloc := make([]uint64, len(in.Alloc))
			for slot, a := range in.Alloc {
				limit := uint64(in.Layout.ChunkSize(int64(in.Size), slot)+allocBlock-1) &^ (allocBlock - 1)
				alloc[slot] = min(a, limit)
			}
			in.Alloc = alloc
		}
	}
	switch {
	case c.Valid&rpc.SetAtimeNow != 0:
		in.Atime = x.now
	case c.Valid&rpc.SetAtime != 0:
		in.Atime = c.Atime
	}
	switch {
	case c.Valid&rpc.SetMtimeNow != 0:
		in.Mtime = x.now
	case c.Valid&rpc.SetMtime != 0:
		in.Mtime = c.Mtime
	}
	if c.Valid&rpc.SetCtime != 0 {
		in.Ctime = c.Ctime
	} else {
		in.Ctime = x.now
	}
	x.mark(c.Ino)
	return x.attrBody(c.Ino, in)
}

// dropLink removes one link to ino (already detached from its entry). A
// regular file left without links becomes an orphan, which the reaper
// deletes once its data is removed from the targets; other types go at once.
func (x *opCtx) dropLink(ino uint64, in *schema.Inode) error {
	in.Nlink--
	in.Ctime = x.now
	x.mark(ino)
	if in.Nlink > 0 {
		return nil
	}
	if in.Mode&modeType == modeReg {
		return x.b.Set(schema.OrphanKey(ino), schema.AppendOrphan(nil, schema.Orphan{Since: x.now}))
	}
	x.drop(ino)
	x.f.ctr.Inodes--
	return nil
}

// entryOf loads the directory c.Parent and its existing entry c.Name
// (ENOENT when absent): the common start of unlink and rmdir.
func (x *opCtx) entryOf(c *command) (*schema.Inode, schema.Dentry, error) {
	if err := checkName(c.Name); err != nil {
		return nil, schema.Dentry{}, err
	}
	parent, err := x.dir(c.Parent)
	if err != nil {
		return nil, schema.Dentry{}, err
	}
	de, ok, err := x.dentry(c.Parent, c.Name)
	if err != nil {
		return nil, schema.Dentry{}, err
	}
	if !ok {
		return nil, schema.Dentry{}, rpc.Errorf(syscall.ENOENT, "no %q in directory %d", c.Name, c.Parent)
	}
	return parent, de, nil
}

func (x *opCtx) unlink(c *command) (*answer, error) {
	parent, de, err := x.entryOf(c)
	if err != nil {
		return nil, err
	}
	if de.Type == modeDir {
		return nil, rpc.Errorf(syscall.EISDIR, "%q in directory %d is a directory (use rmdir)", c.Name, c.Parent)
	}
	in, err := x.inode(de.Ino)
	if err != nil {
		return nil, err
	}
	if err := x.delDentry(c.Parent, c.Name); err != nil {
		return nil, err
	}
	parent.Entries--
	x.touchDir(c.Parent, parent)
	if err := x.dropLink(de.Ino, in); err != nil {
		return nil, err
	}
	return x.changeBody(de.Ino, in, c.Parent, parent)
}

func (x *opCtx) rmdir(c *command) (*answer, error) {
	parent, de, err := x.entryOf(c)
	if err != nil {
		return nil, err
	}
	if de.Type != modeDir {
		return nil, rpc.Errorf(syscall.ENOTDIR, "%q in directory %d is not a directory", c.Name, c.Parent)
	}
	in, err := x.inode(de.Ino)
	if err != nil {
		return nil, err
	}
	if in.Entries != 0 {
		return nil, rpc.Errorf(syscall.ENOTEMPTY, "directory %q (inode %d) has %d entries", c.Name, de.Ino, in.Entries)
	}
	if err := x.delDentry(c.Parent, c.Name); err != nil {
		return nil, err
	}
	in.Nlink = 0
	x.drop(de.Ino)
	x.f.ctr.Inodes--
	parent.Entries--
	parent.Nlink--
	x.touchDir(c.Parent, parent)
	ans, _ := x.stampBody()
	return withDirs(ans, c.Parent, parent, 0, nil, de.Ino, in, 0, nil), nil
}

// isAncestor reports whether directory anc is dir or one of dir's ancestors.
func (x *opCtx) isAncestor(anc, dir uint64) (bool, error) {
	for depth := 0; ; depth++ {
		if dir == anc {
			return true, nil
		}
		if dir == rootIno {
			return false, nil
		}
		if depth > 1<<16 {
			return false, rpc.Errorf(syscall.ELOOP, "directory chain from %d does not reach the root", dir)
		}
		// Read without the op cache: walking a deep path must not fill it.
		v, err := x.b.Get(schema.InodeKey(dir))
		if err != nil {
			return false, rpc.Errorf(syscall.EIO, "walk up from directory %d: %v", dir, err)
		}
		var in schema.Inode
		if err := schema.DecodeInode(v, &in); err != nil {
			return false, rpc.Errorf(syscall.EIO, "inode %d: %v", dir, err)
		}
		if in.Parent == 0 {
			return false, rpc.Errorf(syscall.EIO, "directory %d has no parent", dir)
		}
		dir = in.Parent
	}
}

func (x *opCtx) rename(c *command) (*answer, error) {
	if c.Flags&^(rpc.RenameNoReplace|rpc.RenameExchange) != 0 || c.Flags == rpc.RenameNoReplace|rpc.RenameExchange {
		return nil, rpc.Errorf(syscall.EINVAL, "invalid rename flags %#x", c.Flags)
	}
	if err := checkName(c.Name); err != nil {
		return nil, err
	}
	if err := checkName(c.NewName); err != nil {
		return nil, err
	}
	op, err := x.dir(c.Parent)
	if err != nil {
		return nil, err
	}
	np, err := x.dir(c.NewParent)
	if err != nil {
		return nil, err
	}
	src, ok, err := x.dentry(c.Parent, c.Name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, rpc.Errorf(syscall.ENOENT, "no %q in directory %d", c.Name, c.Parent)
	}
	dst, dstOK, err := x.dentry(c.NewParent, c.NewName)
	if err != nil {
		return nil, err
	}
	if c.Parent == c.NewParent && c.Name == c.NewName {
		if c.Flags&rpc.RenameNoReplace != 0 {
			return nil, rpc.Errorf(syscall.EEXIST, "%q exists in directory %d", c.NewName, c.NewParent)
		}
		return x.stampBody()
	}
	if src.Type == modeDir && c.Parent != c.NewParent {
		if in, err := x.isAncestor(src.Ino, c.NewParent); err != nil {
			return nil, err
		} else if in {
			return nil, rpc.Errorf(syscall.EINVAL, "cannot move directory %q (inode %d) into its own subtree", c.Name, src.Ino)
		}
	}
	srcIn, err := x.inode(src.Ino)
	if err != nil {
		return nil, err
	}

	if c.Flags&rpc.RenameExchange != 0 {
		if !dstOK {
			return nil, rpc.Errorf(syscall.ENOENT, "no %q in directory %d to exchange with", c.NewName, c.NewParent)
		}
		if dst.Type == modeDir && c.Parent != c.NewParent {
			if in, err := x.isAncestor(dst.Ino, c.Parent); err != nil {
				return nil, err
			} else if in {
				return nil, rpc.Errorf(syscall.EINVAL, "cannot move directory %q (inode %d) into its own subtree", c.NewName, dst.Ino)
			}
		}
		dstIn, err := x.inode(dst.Ino)
		if err != nil {
			return nil, err
		}
		if err := x.setDentry(c.Parent, c.Name, dst); err != nil {
			return nil, err
		}
		if err := x.setDentry(c.NewParent, c.NewName, src); err != nil {
			return nil, err
		}
		if c.Parent != c.NewParent {
			x.moveDir(src.Ino, srcIn, op, np, c.NewParent)
			x.moveDir(dst.Ino, dstIn, np, op, c.Parent)
		}
		srcIn.Ctime, dstIn.Ctime = x.now, x.now
		x.mark(src.Ino)
		x.mark(dst.Ino)
		x.touchDir(c.Parent, op)
		x.touchDir(c.NewParent, np)
		ans, _ := x.stampBody()
		return withDirs(ans, c.Parent, op, c.NewParent, np, src.Ino, srcIn, dst.Ino, dstIn), nil
	}

	var replaced *schema.Inode
	if dstOK {
		if c.Flags&rpc.RenameNoReplace != 0 {
			return nil, rpc.Errorf(syscall.EEXIST, "%q exists in directory %d", c.NewName, c.NewParent)
		}
		if dst.Ino == src.Ino {
			return nil, nil // two links to one inode: POSIX says do nothing
		}
		dstIn, err := x.inode(dst.Ino)
		if err != nil {
			return nil, err
		}
		replaced = dstIn
		switch {
		case src.Type == modeDir && dst.Type != modeDir:
			return nil, rpc.Errorf(syscall.ENOTDIR, "cannot replace non-directory %q with a directory", c.NewName)
		case src.Type != modeDir && dst.Type == modeDir:
			return nil, rpc.Errorf(syscall.EISDIR, "cannot replace directory %q with a non-directory", c.NewName)
		case dst.Type == modeDir && dstIn.Entries != 0:
			return nil, rpc.Errorf(syscall.ENOTEMPTY, "directory %q (inode %d) is not empty", c.NewName, dst.Ino)
		}
		if dst.Type == modeDir {
			dstIn.Nlink = 0
			x.drop(dst.Ino)
			x.f.ctr.Inodes--
			np.Nlink--
		} else if err := x.dropLink(dst.Ino, dstIn); err != nil {
			return nil, err
		}
		np.Entries--
	}
	if err := x.delDentry(c.Parent, c.Name); err != nil {
		return nil, err
	}
	if err := x.setDentry(c.NewParent, c.NewName, src); err != nil {
		return nil, err
	}
	op.Entries--
	np.Entries++
	if c.Parent != c.NewParent {
		x.moveDir(src.Ino, srcIn, op, np, c.NewParent)
	}
	srcIn.Ctime = x.now
	x.mark(src.Ino)
	x.touchDir(c.Parent, op)
	x.touchDir(c.NewParent, np)
	ans, _ := x.stampBody()
	if replaced == nil {
		dst.Ino = 0
	}
	return withDirs(ans, c.Parent, op, c.NewParent, np, src.Ino, srcIn, dst.Ino, replaced), nil
}

// moveDir fixes link counts and the parent pointer when directory ino moves
// from directory from to directory to (no-op for non-directories).
func (x *opCtx) moveDir(ino uint64, in, from, to *schema.Inode, toIno uint64) {
	if in.Mode&modeType != modeDir {
		return
	}
	from.Nlink--
	to.Nlink++
	in.Parent = toIno
	x.mark(ino)
}

func (x *opCtx) link(c *command) (*answer, error) {
	if err := checkName(c.NewName); err != nil {
		return nil, err
	}
	in, err := x.inode(c.Ino)
	if err != nil {
		return nil, err
	}
	if in.Mode&modeType == modeDir {
		return nil, rpc.Errorf(syscall.EPERM, "cannot hard-link directory %d", c.Ino)
	}
	tmp := false
	if in.Nlink == 0 {
		// Only a file made with O_TMPFILE and never linked may get a
		// name back (the kernel asks so only for one opened without
		// O_EXCL); an unlinked file stays gone.
		o, ok, err := x.orphan(c.Ino)
		if err != nil {
			return nil, err
		}
		if !ok || !o.Tmpfile {
			return nil, rpc.Errorf(syscall.ENOENT, "inode %d was unlinked", c.Ino)
		}
		tmp = true
	}
	parent, err := x.dir(c.NewParent)
	if err != nil {
		return nil, err
	}
	if _, ok, err := x.dentry(c.NewParent, c.NewName); err != nil {
		return nil, err
	} else if ok {
		return nil, rpc.Errorf(syscall.EEXIST, "%q exists in directory %d", c.NewName, c.NewParent)
	}
	if in.Nlink >= maxDirNlink {
		return nil, rpc.Errorf(syscall.EMLINK, "inode %d has too many links", c.Ino)
	}
	in.Nlink++
	in.Ctime = x.now
	x.mark(c.Ino)
	parent.Entries++
	x.touchDir(c.NewParent, parent)
	if err := x.setDentry(c.NewParent, c.NewName, schema.Dentry{Ino: c.Ino, Type: in.Mode & modeType}); err != nil {
		return nil, err
	}
	if tmp {
		// Named now: no longer the reaper's once it is closed.
		if err := x.b.Delete(schema.OrphanKey(c.Ino)); err != nil {
			return nil, err
		}
	}
	ans, _ := x.attrBody(c.Ino, in)
	return withDirs(ans, c.NewParent, parent, 0, nil, 0, nil, 0, nil), nil
}

func checkXattrName(name string) error {
	if name == "" {
		return rpc.Errorf(syscall.EINVAL, "empty xattr name")
	}
	if len(name) > maxXattrName {
		return rpc.Errorf(syscall.ERANGE, "xattr name of %d bytes is longer than %d", len(name), maxXattrName)
	}
	return nil
}

// setAtimes applies a client's batch of access times: each file's atime
// moves forward to the one given (never back, so that a batch arriving
// after a utimes(2) of an older time set elsewhere, or a second client's
// batch, cannot undo a later time), and its ctime stays, as for any
// atime update on a read. Files unlinked since are skipped. Each file is a
// step of its own (flushed, the inode cache emptied), as in opReapMany.
func (x *opCtx) setAtimes(c *command) (*answer, error) {
	for i, ino := range c.Inos {
		in, err := x.inode(ino)
		if errors.Is(err, syscall.ENOENT) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if c.Atimes[i] <= in.Atime {
			x.reset(x.f, x.b, x.now)
			continue
		}
		in.Atime = c.Atimes[i]
		x.mark(ino)
		if err := x.flush(); err != nil {
			return nil, err
		}
		x.reset(x.f, x.b, x.now)
	}
	return x.stampBody()
}

func (x *opCtx) setXattr(c *command) (*answer, error) {
	if err := checkXattrName(c.Name); err != nil {
		return nil, err
	}
	if len(c.Value) > maxXattrValue {
		return nil, rpc.Errorf(syscall.E2BIG, "xattr value of %d bytes is larger than %d", len(c.Value), maxXattrValue)
	}
	if c.Flags&^(rpc.XattrCreate|rpc.XattrReplace) != 0 {
		return nil, rpc.Errorf(syscall.EINVAL, "invalid xattr flags %#x", c.Flags)
	}
	in, err := x.inode(c.Ino)
	if err != nil {
		return nil, err
	}
	key := schema.XattrKey(c.Ino, c.Name)
	_, err = x.b.Get(key)
	exists := err == nil
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return nil, err
	}
	if exists && c.Flags&rpc.XattrCreate != 0 {
		return nil, rpc.Errorf(syscall.EEXIST, "xattr %q of inode %d exists", c.Name, c.Ino)
	}
	if !exists && c.Flags&rpc.XattrReplace != 0 {
		return nil, rpc.Errorf(syscall.ENODATA, "no xattr %q on inode %d", c.Name, c.Ino)
	}
	if err := x.b.Set(key, c.Value); err != nil {
		return nil, err
	}
	in.Ctime = x.now
	x.mark(c.Ino)
	return x.stampBody()
}

func (x *opCtx) removeXattr(c *command) (*answer, error) {
	if err := checkXattrName(c.Name); err != nil {
		return nil, err
	}
	in, err := x.inode(c.Ino)
	if err != nil {
		return nil, err
	}
	key := schema.XattrKey(c.Ino, c.Name)
	if _, err := x.b.Get(key); errors.Is(err, kv.ErrNotFound) {
		return nil, rpc.Errorf(syscall.ENODATA, "no xattr %q on inode %d", c.Name, c.Ino)
	} else if err != nil {
		return nil, err
	}
	if err := x.b.Delete(key); err != nil {
		return nil, err
	}
	in.Ctime = x.now
	x.mark(c.Ino)
	return x.stampBody()
}

func (x *opCtx) commitSize(c *command) (*answer, error) {
	in, err := x.inode(c.Ino)
	if err != nil {
		return nil, err
	}
	if in.Mode&modeType != modeReg {
		return nil, rpc.Errorf(syscall.EINVAL, "inode %d is not a regular file", c.Ino)
	}
	if in.IsInline() && len(c.Alloc) > 0 {
		// Chunks written while the data is kept with the inode: a writer
		// that did not open the file for writing (which moves the data
		// out first). Refused rather than have reads ignore its bytes.
		return nil, rpc.Errorf(syscall.EIO, "inode %d keeps its data inline: a write must open it for writing first", c.Ino)
	}
	if c.Size > in.Size {
		in.Size = c.Size
	}
	if c.Mtime != 0 {
		in.Mtime, in.Ctime = c.Mtime, c.Mtime
	}
	if c.ClearSuid {
		in.Mode &^= modeSetuid
		if in.Mode&modeGrpX != 0 {
			in.Mode &^= modeSetgid
		}
	}
	if len(c.Alloc) > 0 {
		// Slots never reported count as empty: a client reports every
		// chunk it wrote, and a chunk nobody wrote takes no space.
		in.Alloc = withAllocs(in.Alloc, len(in.Layout.Targets), c.Alloc)
	}
	x.mark(c.Ino)
	return x.attrBody(c.Ino, in)
}

// withAllocs is a file's space per chunk (n slots): base, with the space
// as reports it for the slots it names (a new slice; base is the
// record's, shared with readers).
func withAllocs(base []uint64, n int, as []slotAlloc) []uint64 {
	alloc := make([]uint64, n)
	copy(alloc, base)
	for _, a := range as {
		if int(a.Slot) < n {
			alloc[a.Slot] = a.Bytes
		}
	}
	return alloc
}

func (x *opCtx) setDirLayout(c *command) (*answer, error) {
	in, err := x.dir(c.Ino)
	if err != nil {
		return nil, err
	}
	size, count := uint32(c.Size), c.Flags
	if c.Size > 1<<32-1 {
		return nil, rpc.Errorf(syscall.EINVAL, "stripe size %d too large", c.Size)
	}
	check := layout.Layout{StripeSize: size, StripeCount: count}
	if size == 0 {
		check.StripeSize = layout.DefaultStripeSize
	}
	if count == 0 {
		check.StripeCount = 1
	}
	check.Targets = make([]uint32, 0, check.StripeCount)
	for i := uint32(0); i < check.StripeCount && i < layout.MaxStripeCount+1; i++ {
		check.Targets = append(check.Targets, i)
	}
	if err := check.Validate(); err != nil {
		return nil, rpc.Errorf(syscall.EINVAL, "directory layout: %v", err)
	}
	if targets := x.f.ctr.NextTarget - 1; x.f.ctr.NextTarget > 0 && count > targets {
		return nil, rpc.Errorf(syscall.EINVAL, "stripe count %d exceeds the %d registered targets", count, targets)
	}
	switch c.MirrorMode {
	case rpc.DirMirrorKeep:
	case rpc.DirMirrorOn:
		in.Mirror = true
	case rpc.DirMirrorOff:
		in.Mirror = false
	default:
		return nil, rpc.Errorf(syscall.EINVAL, "unknown mirror mark change %d", c.MirrorMode)
	}
	in.Layout = layout.Layout{StripeSize: size, StripeCount: count}
	in.Ctime = x.now
	x.mark(c.Ino)
	return x.attrBody(c.Ino, in)
}

func (x *opCtx) sessionOpen(c *command) (*answer, error) {
	ctr := &x.f.ctr
	id := ctr.NextClient
	ctr.NextClient++
	s := schema.Session{Host: c.Host, MountPoint: c.MountPoint, Pid: c.Pid, Opened: x.now}
	if err := x.b.Set(schema.SessionKey(id), schema.AppendSession(nil, &s)); err != nil {
		return nil, err
	}
	x.f.sess[id] = 0
	return &answer{msg: &rpc.SessionOpenResp{ClientID: id, LeaseMs: c.LeaseMs}}, nil
}

// sessionClose drops a session, its dedupe records, inode ranges and
// delegations (idempotent).
func (x *opCtx) sessionClose(c *command) (*answer, error) {
	if err := x.b.Delete(schema.SessionKey(c.Ino)); err != nil {
		return nil, err
	}
	if err := x.dropSessionHeld(c.Ino); err != nil {
		return nil, err
	}
	p := schema.DedupePrefix(c.Ino)
	if err := x.b.DeleteRange(p, kv.PrefixEnd(p)); err != nil {
		return nil, err
	}
	delete(x.f.sess, c.Ino)
	return nil, nil
}

// register records a storage server and its targets. A target's identity
// is its UUID: a known UUID keeps its id. The server keeps its id when any
// of its targets was already registered under it, or when its address is
// known; otherwise it gets a new one.
func (x *opCtx) register(c *command) (*answer, error) {
	if c.Addr == "" {
		return nil, rpc.Errorf(syscall.EINVAL, "server registration without an address")
	}
	seen := map[string]bool{}
	for _, t := range c.Targets {
		if t.UUID == "" {
			return nil, rpc.Errorf(syscall.EINVAL, "target %q has no UUID", t.Path)
		}
		if seen[t.UUID] {
			return nil, rpc.Errorf(syscall.EINVAL, "target UUID %s listed twice", t.UUID)
		}
		seen[t.UUID] = true
	}
	ctr := &x.f.ctr
	for _, t := range c.Targets {
		x.raiseIno(t.InoCeiling)
	}
	existing := make([]*schema.Target, len(c.Targets))
	var serverID uint32
	for i, t := range c.Targets {
		v, err := x.b.Get(schema.TargetUUIDKey(t.UUID))
		if errors.Is(err, kv.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		ref, err := schema.DecodeTargetRef(v)
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "target ref %s: %v", t.UUID, err)
		}
		tv, err := x.b.Get(schema.TargetKey(ref.ID))
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "target %d: %v", ref.ID, err)
		}
		tg, err := schema.DecodeTarget(tv)
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "target %d: %v", ref.ID, err)
		}
		existing[i] = &tg
		if serverID == 0 {
			serverID = tg.ServerID
		}
	}
	servers, err := x.servers()
	if err != nil {
		return nil, err
	}
	if serverID == 0 {
		for _, s := range servers {
			if s.Addr == c.Addr {
				serverID = s.ID
				break
			}
		}
	}
	if serverID == 0 {
		serverID = ctr.NextServer
		ctr.NextServer++
	}
	// A target that moved to this server leaves its old one.
	for _, s := range servers {
		if s.ID == serverID {
			continue
		}
		kept := s.Targets[:0:0]
		for _, id := range s.Targets {
			moved := false
			for _, e := range existing {
				if e != nil && e.ID == id {
					moved = true
				}
			}
			if !moved {
				kept = append(kept, id)
			}
		}
		if len(kept) != len(s.Targets) {
			s.Targets = kept
			if err := x.b.Set(schema.ServerKey(s.ID), schema.AppendServer(nil, &s)); err != nil {
				return nil, err
			}
		}
	}
	resp := rpc.RegisterServerResp{ServerID: serverID, TargetIDs: make([]uint32, len(c.Targets))}
	for i, t := range c.Targets {
		tg := existing[i]
		if tg == nil {
			tg = &schema.Target{ID: ctr.NextTarget, UUID: t.UUID}
			ctr.NextTarget++
			if err := x.b.Set(schema.TargetUUIDKey(t.UUID), schema.AppendTargetRef(nil, schema.TargetRef{ID: tg.ID})); err != nil {
				return nil, err
			}
		}
		tg.ServerID, tg.Path = serverID, t.Path
		if err := x.b.Set(schema.TargetKey(tg.ID), schema.AppendTarget(nil, tg)); err != nil {
			return nil, err
		}
		resp.TargetIDs[i] = tg.ID
	}
	srv := schema.Server{ID: serverID, Addr: c.Addr, Host: c.Host, Targets: resp.TargetIDs, Domain: c.Domain}
	if err := x.b.Set(schema.ServerKey(serverID), schema.AppendServer(nil, &srv)); err != nil {
		return nil, err
	}
	return &answer{msg: &resp}, nil
}

func (x *opCtx) servers() ([]schema.Server, error) { return readServers(x.b) }

// raiseIno makes sure no inode number below ceiling is handed out again:
// a target holds chunk files up to there.
func (x *opCtx) raiseIno(ceiling uint64) {
	if ctr := &x.f.ctr; ceiling > ctr.NextIno {
		ctr.NextIno = ceiling
	}
}

// allocBlock is the unit a target's disk allocates chunk space in (the
// stores' 4 KiB block), for bounding a truncated chunk's space.
const allocBlock = 4096

// orphan reads ino's orphan record, if it has one.
func (x *opCtx) orphan(ino uint64) (schema.Orphan, bool, error) {
	v, err := x.b.Get(schema.OrphanKey(ino))
	if errors.Is(err, kv.ErrNotFound) {
		return schema.Orphan{}, false, nil
	}
	if err != nil {
		return schema.Orphan{}, false, err
	}
	o, err := schema.DecodeOrphan(v)
	if err != nil {
		return schema.Orphan{}, false, fmt.Errorf("orphan record of inode %d: %w", ino, err)
	}
	return o, true, nil
}

// reap deletes an orphan whose data the leader removed from the targets.
func (x *opCtx) reap(c *command) (*answer, error) {
	if _, err := x.b.Get(schema.OrphanKey(c.Ino)); errors.Is(err, kv.ErrNotFound) {
		return nil, nil // already reaped
	} else if err != nil {
		return nil, err
	}
	in, err := x.inode(c.Ino)
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return nil, err
	}
	if err := x.b.Delete(schema.OrphanKey(c.Ino)); err != nil {
		return nil, err
	}
	if in != nil {
		if in.Nlink != 0 {
			return nil, nil // relinked: not an orphan any more
		}
		x.drop(c.Ino)
		x.f.ctr.Inodes--
	}
	return nil, nil
}
