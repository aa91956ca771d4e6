package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// RootIno is the inode number of the root directory.
const RootIno uint64 = 1

// MaxNameBytes is the longest directory entry name.
const MaxNameBytes = 255

func checkName(name string) error {
	if len(name) > MaxNameBytes {
		return fmt.Errorf("name of %d bytes: %w", len(name), syscall.ENAMETOOLONG)
	}
	if name == "" || name == "." || name == ".." || strings.IndexByte(name, '/') >= 0 || strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("name %q: %w", name, syscall.EINVAL)
	}
	return nil
}

// Lookup finds name in directory parent.
func (c *Client) Lookup(ctx context.Context, parent uint64, name string) (rpc.Attr, error) {
	if len(name) > MaxNameBytes {
		return rpc.Attr{}, fmt.Errorf("lookup of a %d-byte name: %w", len(name), syscall.ENAMETOOLONG)
	}
	if c.deleg.lookupLocal(ctx, parent, name) {
		c.m.op("lookup_local")
		return rpc.Attr{}, fmt.Errorf("lookup of %q in directory %d (absent: this client holds its create delegation): %w", name, parent, syscall.ENOENT)
	}
	var resp rpc.AttrResp
	since := c.sizeSeq.Load()
	if err := c.metaCall(ctx, rpc.MLookup, &rpc.LookupReq{Parent: parent, Name: name, Client: c.ClientID()}, &resp); err != nil {
		return rpc.Attr{}, metaErr(c, "lookup", err)
	}
	c.mergeLocal(&resp.Attr, since)
	c.looked.put(&resp.Attr) // an open may follow (smallread.go)
	return resp.Attr, nil
}

// GetAttr reads ino's attributes from the metadata service. If this client
// holds the file open with writes not yet committed, the size and mtime
// include them (a stat after a write sees it before close).
func (c *Client) GetAttr(ctx context.Context, ino uint64) (rpc.Attr, error) {
	if a, ok := c.dirs.get(ino); ok {
		return a, nil
	}
	c.deleg.before(ctx, ino)
	var resp rpc.AttrResp
	since := c.sizeSeq.Load()
	if err := c.metaCall(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: ino, Client: c.ClientID()}, &resp); err != nil {
		return rpc.Attr{}, metaErr(c, "getattr", err)
	}
	c.mergeLocal(&resp.Attr, since)
	return resp.Attr, nil
}

// SizeSeq orders this client's size changes in metadata (commits,
// truncates): read it before a GetAttr or Lookup whose answer is kept, and
// give it to MergeLocal with that answer.
func (c *Client) SizeSeq() uint64 { return c.sizeSeq.Load() }

// MergeLocal folds into attributes a caller kept — an answer of this
// client's GetAttr, Lookup, SetAttr or creation, to a call begun when
// SizeSeq was since — what this client changed since and the metadata
// service may not have yet (an open file's buffered writes and truncates,
// access times not sent), as GetAttr does with its own answer: a cache of
// attributes (the NFS gateway's) stays as current as this client's view.
func (c *Client) MergeLocal(a *rpc.Attr, since uint64) { c.mergeLocal(a, since) }

// mergeLocal folds the uncommitted state of an open inode into a.
// since is Client.sizeSeq before the call that answered a (inode.merge).
func (c *Client) mergeLocal(a *rpc.Attr, since uint64) {
	c.atimes.merge(a) // reads whose atimes are not sent yet
	if in := c.openInode(a.Ino); in != nil {
		in.merge(a, since)
	}
}

// openInode is the state of ino if this client holds it open, else nil.
func (c *Client) openInode(ino uint64) *inode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.inodes[ino]
}

// SetAttr changes the attributes named by req.Valid (rpc.Set* bits); req.Hdr
// and req.Ino are filled in here. A size change truncates every chunk of
// the file on its target (after draining this client's write-behind for the
// file) and then sets the size in metadata, while this client's reads and
// writes of the file wait (they see it as it was or at its new size); a
// size past the largest file of the file's layout (layout.MaxFileSize)
// fails with EFBIG and changes nothing.
func (c *Client) SetAttr(ctx context.Context, ino uint64, req rpc.SetAttrReq) (rpc.Attr, error) {
	req.Ino = ino
	req.Mode &= 07777
	c.deleg.before(ctx, ino)
	if req.Valid&(rpc.SetSize|rpc.SetMtime|rpc.SetMtimeNow) != 0 {
		// Commit buffered writes first so that their (older) size and
		// mtime cannot overwrite what this call sets, and keep other
		// commits of the file out until it is set (one landing after a
		// truncate would undo it).
		if in := c.openInode(ino); in != nil {
			if req.Valid&rpc.SetSize != 0 {
				// This client's reads and writes of the file wait
				// until the new size is known here (inode.resize).
				in.resize.Lock()
				defer in.resize.Unlock()
			}
			in.commitMu.Lock()
			defer in.commitMu.Unlock()
			if err := in.drain(ctx); err != nil {
				return rpc.Attr{}, err
			}
			if err := in.commitHeld(ctx, nil); err != nil {
				return rpc.Attr{}, err
			}
		}
	}
	if req.Valid&rpc.SetSize != 0 {
		if err := c.truncate(ctx, ino, req.Size); err != nil {
			return rpc.Attr{}, err
		}
	}
	req.Hdr = c.hdr()
	var resp rpc.AttrResp
	since := c.sizeSeq.Load()
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MSetAttr, &req, &resp); err != nil {
		return rpc.Attr{}, metaErr(c, "setattr", err)
	}
	c.dirs.note(&resp.Attr, resp.Index, gen, at) // a directory's new attributes
	seq := c.metaChanged.Load()
	if in := c.openInode(ino); in != nil {
		in.setAttr(&resp.Attr, req.Valid&rpc.SetSize != 0)
		in.noteMetaChange(seq) // fsync of the open file covers its attributes
		in.merge(&resp.Attr, since)
	}
	c.m.op("setattr")
	return resp.Attr, nil
}

// truncate sets the length of every chunk of ino for a file of size bytes.
func (c *Client) truncate(ctx context.Context, ino uint64, size uint64) error {
	c.mu.Lock()
	in := c.mu.inodes[ino]
	c.mu.Unlock()
	var lay layout.Layout
	if in != nil {
		lay = in.layout
	} else {
		a, err := c.GetAttr(ctx, ino)
		if err != nil {
			return err
		}
		if a.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return fmt.Errorf("truncate inode %d: %w", ino, syscall.EINVAL)
		}
		lay = a.Layout
	}
	if limit := lay.MaxFileSize(); size > uint64(limit) {
		return fmt.Errorf("truncate inode %d to %d bytes: the largest file of its layout is %d bytes: %w", ino, size, limit, syscall.EFBIG)
	}
	if in != nil {
		if err := in.drain(ctx); err != nil {
			return err
		}
		in.invalidate()
	}
	errs := make([]error, len(lay.Targets))
	var wg sync.WaitGroup
	for slot, t := range lay.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: t, Ino: ino}, Size: uint64(lay.ChunkSize(int64(size), slot))}
			errs[slot] = c.storeCall(ctx, "truncate", &req.Chunk, rpc.STruncate, req, nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	c.m.op("truncate")
	failpoint.Hit("client/after-truncate-chunks")
	return nil
}

// Create makes a regular file (mode's permission bits, S_IFREG implied).
func (c *Client) Create(ctx context.Context, parent uint64, name string, mode, uid, gid uint32) (rpc.Attr, error) {
	return c.create(ctx, &rpc.CreateReq{Parent: parent, Name: name, Mode: syscall.S_IFREG | mode&07777, Uid: uid, Gid: gid})
}

// Mkdir makes a directory.
func (c *Client) Mkdir(ctx context.Context, parent uint64, name string, mode, uid, gid uint32) (rpc.Attr, error) {
	return c.create(ctx, &rpc.CreateReq{Parent: parent, Name: name, Mode: syscall.S_IFDIR | mode&07777, Uid: uid, Gid: gid})
}

// Mknod makes a node of the type in mode's S_IF* bits (regular file,
// device, FIFO or socket).
func (c *Client) Mknod(ctx context.Context, parent uint64, name string, mode, rdev, uid, gid uint32) (rpc.Attr, error) {
	if mode&syscall.S_IFMT == 0 {
		mode |= syscall.S_IFREG
	}
	if mode&syscall.S_IFMT == syscall.S_IFDIR || mode&syscall.S_IFMT == syscall.S_IFLNK {
		return rpc.Attr{}, fmt.Errorf("mknod of type %o: %w", mode&syscall.S_IFMT, syscall.EINVAL)
	}
	return c.create(ctx, &rpc.CreateReq{Parent: parent, Name: name, Mode: mode, Rdev: rdev, Uid: uid, Gid: gid})
}

// Symlink makes a symbolic link name → target.
func (c *Client) Symlink(ctx context.Context, parent uint64, name, target string, uid, gid uint32) (rpc.Attr, error) {
	if len(target) > 4095 {
		return rpc.Attr{}, fmt.Errorf("symlink target of %d bytes: %w", len(target), syscall.ENAMETOOLONG)
	}
	return c.create(ctx, &rpc.CreateReq{Parent: parent, Name: name, Mode: syscall.S_IFLNK | 0777, Uid: uid, Gid: gid, SymlinkTarget: target})
}

func (c *Client) create(ctx context.Context, req *rpc.CreateReq) (rpc.Attr, error) {
	a, _, err := c.createIdx(ctx, req)
	return a, err
}

// createIdx is create that also returns the whole answer (the change's
// raft index and term).
func (c *Client) createIdx(ctx context.Context, req *rpc.CreateReq) (rpc.Attr, *rpc.ChangeResp, error) {
	if err := checkName(req.Name); err != nil {
		return rpc.Attr{}, nil, err
	}
	c.deleg.before(ctx, req.Parent) // after the creates answered here
	req.Hdr = c.hdr()
	var resp rpc.ChangeResp
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MCreate, req, &resp); err != nil {
		return rpc.Attr{}, nil, metaErr(c, "create", err)
	}
	c.dirs.note(&resp.Dir, resp.Index, gen, at)
	c.deleg.noteCreate(req.Parent, req.Name, resp.Attr.Ino)
	c.m.op("create")
	return resp.Attr, &resp, nil
}

// Unlink removes a non-directory entry and answers the victim's attributes
// after the unlink (Nlink 0: the inode is an orphan, kept while open).
func (c *Client) Unlink(ctx context.Context, parent uint64, name string) (rpc.Attr, error) {
	if len(name) > MaxNameBytes {
		return rpc.Attr{}, syscall.ENAMETOOLONG
	}
	c.deleg.before(ctx, parent)
	ctx, cancel := c.reportOpen(ctx)
	defer cancel()
	var resp rpc.ChangeResp
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MUnlink, &rpc.EntryReq{Hdr: c.hdr(), Parent: parent, Name: name}, &resp); err != nil {
		return rpc.Attr{}, metaErr(c, "unlink", err)
	}
	c.dirs.note(&resp.Dir, resp.Index, gen, at)
	c.deleg.noteOther(parent, name, "", 0)
	c.m.op("unlink")
	return resp.Attr, nil
}

// Rmdir removes an empty directory.
func (c *Client) Rmdir(ctx context.Context, parent uint64, name string) error {
	if len(name) > MaxNameBytes {
		return syscall.ENAMETOOLONG
	}
	c.deleg.before(ctx, parent)
	c.deleg.flushQueues(ctx) // the directory removed may have creates queued here: not empty
	var resp rpc.DirChangeResp
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MRmdir, &rpc.EntryReq{Hdr: c.hdr(), Parent: parent, Name: name}, &resp); err != nil {
		return metaErr(c, "rmdir", err)
	}
	c.noteDirs(&resp, gen, at)
	c.deleg.noteOther(parent, name, "", 0)
	c.m.op("rmdir")
	return nil
}

// Rename moves an entry atomically; flags are rpc.RenameNoReplace or
// rpc.RenameExchange (or 0).
func (c *Client) Rename(ctx context.Context, oldParent uint64, oldName string, newParent uint64, newName string, flags uint32) error {
	if err := checkName(newName); err != nil {
		return err
	}
	if len(oldName) > MaxNameBytes {
		return syscall.ENAMETOOLONG
	}
	if flags&^(rpc.RenameNoReplace|rpc.RenameExchange) != 0 || flags == rpc.RenameNoReplace|rpc.RenameExchange {
		return fmt.Errorf("rename flags %#x: %w", flags, syscall.EINVAL)
	}
	c.deleg.before(ctx, oldParent)
	c.deleg.before(ctx, newParent)
	c.deleg.flushQueues(ctx) // a directory replaced may have creates queued here
	ctx, cancel := c.reportOpen(ctx)
	defer cancel()
	req := &rpc.RenameReq{Hdr: c.hdr(), OldParent: oldParent, OldName: oldName, NewParent: newParent, NewName: newName, Flags: flags}
	var resp rpc.DirChangeResp
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MRename, req, &resp); err != nil {
		return metaErr(c, "rename", err)
	}
	c.noteDirs(&resp, gen, at)
	c.deleg.noteRename(oldParent, oldName, newParent, newName, flags)
	c.m.op("rename")
	return nil
}

// noteDirs keeps what an rmdir or rename (a call begun at gen, at)
// answered of the directories it changed: the parents, a moved directory,
// a replaced or exchanged one (a removed one as gone). An answer without
// them (an older service, a retry's replayed answer) empties the cache:
// which directories moved is unknown.
func (c *Client) noteDirs(r *rpc.DirChangeResp, gen uint64, at time.Time) {
	if r.Dir.Ino == 0 {
		c.dirs.reset()
		return
	}
	for _, a := range []*rpc.Attr{&r.Dir, &r.NewDir, &r.Entry, &r.Other} {
		c.dirs.note(a, r.Index, gen, at)
	}
}

// Link adds the hard link newParent/newName to ino.
func (c *Client) Link(ctx context.Context, ino, newParent uint64, newName string) (rpc.Attr, error) {
	if err := checkName(newName); err != nil {
		return rpc.Attr{}, err
	}
	c.deleg.before(ctx, ino)
	c.deleg.before(ctx, newParent)
	var resp rpc.LinkResp
	since := c.sizeSeq.Load()
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: ino, NewParent: newParent, NewName: newName}, &resp); err != nil {
		return rpc.Attr{}, metaErr(c, "link", err)
	}
	if resp.Dir.Ino != 0 {
		c.dirs.note(&resp.Dir, resp.Index, gen, at)
	} else { // an older service, or a retry's replayed answer
		c.dirs.changed(newParent, resp.Index)
	}
	c.mergeLocal(&resp.Attr, since)
	c.deleg.noteOther(newParent, "", newName, ino)
	c.m.op("link")
	return resp.Attr, nil
}

// Readlink returns a symlink's target.
func (c *Client) Readlink(ctx context.Context, ino uint64) (string, error) {
	var resp rpc.ReadlinkResp
	if err := c.metaCall(ctx, rpc.MReadlink, &rpc.GetAttrReq{Ino: ino}, &resp); err != nil {
		return "", metaErr(c, "readlink", err)
	}
	return resp.Target, nil
}

// ReadDir lists up to limit entries of dir after the name after ("" = from
// the start), in name order, without "." and "..". With plus every entry
// carries its attributes. eof is true when the listing is complete.
func (c *Client) ReadDir(ctx context.Context, dir uint64, after string, limit int, plus bool) (entries []rpc.DirEntry, eof bool, err error) {
	if limit <= 0 {
		limit = 1024
	}
	c.deleg.before(ctx, dir)
	var resp rpc.ReadDirResp
	since := c.sizeSeq.Load()
	if err := c.metaCall(ctx, rpc.MReadDir, &rpc.ReadDirReq{Dir: dir, After: after, Limit: uint32(limit), Plus: plus, Client: c.ClientID()}, &resp); err != nil {
		return nil, false, metaErr(c, "readdir", err)
	}
	if plus {
		for i := range resp.Entries {
			c.mergeLocal(&resp.Entries[i].Attr, since)
		}
	}
	return resp.Entries, resp.EOF, nil
}

// StatFS reports the file system's capacity.
func (c *Client) StatFS(ctx context.Context) (rpc.StatFSResp, error) {
	var resp rpc.StatFSResp
	if err := c.metaCall(ctx, rpc.MStatFS, &rpc.Empty{}, &resp); err != nil {
		return resp, metaErr(c, "statfs", err)
	}
	return resp, nil
}

// GetXattr returns the value of an extended attribute (ENODATA if absent).
func (c *Client) GetXattr(ctx context.Context, ino uint64, name string) ([]byte, error) {
	asked := time.Now()
	if c.xattrs.absent(ino, name, asked) {
		return nil, fmt.Errorf("getxattr %q of inode %d (known absent): %w", name, ino, syscall.ENODATA)
	}
	c.deleg.before(ctx, ino)
	gen := c.xattrs.generation()
	var resp rpc.XattrResp
	if err := c.metaCall(ctx, rpc.MGetXattr, &rpc.XattrReq{Ino: ino, Name: name}, &resp); err != nil {
		if rpc.ErrnoOf(err) == syscall.ENODATA {
			c.xattrs.missing(ino, name, asked, c.cfg.DirAttrTTL, gen)
		}
		return nil, metaErr(c, "getxattr", err)
	}
	return resp.Value, nil
}

// SetXattr sets an extended attribute; flags are rpc.XattrCreate or
// rpc.XattrReplace (or 0).
func (c *Client) SetXattr(ctx context.Context, ino uint64, name string, value []byte, flags uint32) error {
	defer c.xattrs.changed(ino)
	c.deleg.before(ctx, ino)
	var st rpc.Stamp
	if err := c.metaCall(ctx, rpc.MSetXattr, &rpc.XattrReq{Hdr: c.hdr(), Ino: ino, Name: name, Value: value, Flags: flags}, &st); err != nil {
		return metaErr(c, "setxattr", err)
	}
	c.dirs.changed(ino, st.Index) // its ctime moved
	return nil
}

// ListXattr lists the names of ino's extended attributes.
func (c *Client) ListXattr(ctx context.Context, ino uint64) ([]string, error) {
	c.deleg.before(ctx, ino)
	var resp rpc.ListXattrResp
	if err := c.metaCall(ctx, rpc.MListXattr, &rpc.GetAttrReq{Ino: ino}, &resp); err != nil {
		return nil, metaErr(c, "listxattr", err)
	}
	return resp.Names, nil
}

// RemoveXattr removes an extended attribute (ENODATA if absent).
func (c *Client) RemoveXattr(ctx context.Context, ino uint64, name string) error {
	defer c.xattrs.changed(ino)
	c.deleg.before(ctx, ino)
	var st rpc.Stamp
	if err := c.metaCall(ctx, rpc.MRemoveXattr, &rpc.XattrReq{Hdr: c.hdr(), Ino: ino, Name: name}, &st); err != nil {
		return metaErr(c, "removexattr", err)
	}
	c.dirs.changed(ino, st.Index) // its ctime moved
	return nil
}

// SetDirLayout sets a directory's default layout for new children (0 =
// system default).
func (c *Client) SetDirLayout(ctx context.Context, dir uint64, stripeSize, stripeCount uint32) (rpc.Attr, error) {
	c.deleg.before(ctx, dir)
	var resp rpc.AttrResp
	req := &rpc.SetDirLayoutReq{Hdr: c.hdr(), Dir: dir, StripeSize: stripeSize, StripeCount: stripeCount}
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MSetDirLayout, req, &resp); err != nil {
		return rpc.Attr{}, metaErr(c, "set layout", err)
	}
	c.dirs.note(&resp.Attr, resp.Index, gen, at)
	return resp.Attr, nil
}

// ResolvePath walks an absolute path inside the file system ("/a/b") from
// the root, component by component, and returns the attributes of its
// last component. Symbolic links are not followed. For admin tools; the
// FUSE mount never uses it.
func (c *Client) ResolvePath(ctx context.Context, path string) (rpc.Attr, error) {
	a, err := c.GetAttr(ctx, RootIno)
	if err != nil {
		return a, err
	}
	for _, comp := range strings.Split(path, "/") {
		if comp == "" || comp == "." {
			continue
		}
		if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return rpc.Attr{}, fmt.Errorf("resolve %q: %w", path, syscall.ENOTDIR)
		}
		if comp == ".." {
			return rpc.Attr{}, fmt.Errorf("resolve %q: '..' is not supported: %w", path, syscall.EINVAL)
		}
		if a, err = c.Lookup(ctx, a.Ino, comp); err != nil {
			return rpc.Attr{}, fmt.Errorf("resolve %q: %w", path, err)
		}
	}
	return a, nil
}

// ClusterStatus returns the metadata service's view of the cluster.
func (c *Client) ClusterStatus(ctx context.Context) (rpc.ClusterStatusResp, error) {
	var resp rpc.ClusterStatusResp
	if err := c.metaCall(ctx, rpc.MClusterStatus, &rpc.Empty{}, &resp); err != nil {
		return resp, metaErr(c, "status", err)
	}
	return resp, nil
}

// metaErr gives a transport failure (the service stayed unreachable for
// IOTimeout) the errno EIO; errnos answered by the service pass unchanged.
func metaErr(c *Client, op string, err error) error {
	if retryableMeta(err) {
		return fmt.Errorf("%s: metadata service %s unreachable for %v: %w (%w)", op, c.cfg.MetaAddr, c.cfg.IOTimeout, syscall.EIO, err)
	}
	return err
}

var nowNs = func() int64 { return time.Now().UnixNano() }
