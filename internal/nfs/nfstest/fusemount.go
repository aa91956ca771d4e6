package nfstest

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// FUSEOptions says what MountFUSE mounts.
type FUSEOptions struct {
	Addr   string // the gateway, host:port (NFS and MOUNT on one port)
	Export string // the path to MNT, e.g. "/"
	Conns  int    // TCP connections to the gateway (default 8)
	Debug  bool   // log every FUSE request
}

// FUSEMount is an NFSv3 client exposed as a FUSE file system: every
// operation on the mount is an NFSv3 call of this package's client to the
// gateway, so that a test suite written for a kernel file system (system
// calls on paths) runs through NFS on a machine whose kernel has no NFS
// client. It behaves as Linux's NFSv3 client mounted with actimeo=0 does
// (docs/design/0015 § POSIX suite through NFS):
//
//   - every request runs with the AUTH_SYS credential of the process that
//     made it (uid, gid, supplementary groups from /proc); READ, WRITE and
//     COMMIT with the opener's, as the kernel's open context;
//   - permissions are the server's: OPEN asks ACCESS for what the open
//     mode needs, access(2) asks ACCESS (no default_permissions);
//   - no attribute or name caching in the kernel (timeouts of zero), the
//     attributes are those the calls answered;
//   - close-to-open: writes are UNSTABLE and COMMITted at every close
//     (flush) and fsync, and sent again when the COMMIT's verifier is not
//     the writes' (a restarted server lost them); an open finds the page
//     cache dropped when the file's change attributes moved since this
//     mount last saw them;
//   - an open file that is unlinked (or renamed over) is renamed to
//     .nfsXXXX in its directory instead, and removed at its last close
//     (silly rename);
//   - no locks (NLM is not spoken), no extended attributes, no
//     O_TMPFILE, no SEEK_DATA/SEEK_HOLE, no RENAME_NOREPLACE/EXCHANGE: as
//     the Linux v3 client, which refuses or emulates them locally.
type FUSEMount struct {
	srv *gofuse.Server
	fs  *nfsFS
	dir string
}

// MountFUSE mounts the export o.Export of the gateway o.Addr at
// mountpoint and serves it in the background until Unmount.
func MountFUSE(mountpoint string, o FUSEOptions) (*FUSEMount, error) {
	if o.Conns <= 0 {
		o.Conns = 8
	}
	fs, err := newNFSFS(o)
	if err != nil {
		return nil, err
	}
	mo := &gofuse.MountOptions{
		AllowOther:    os.Geteuid() == 0,
		FsName:        "nfs://" + o.Addr + o.Export,
		Name:          "nfstest",
		MaxWrite:      int(min(fs.wtmax, 1<<20)),
		MaxReadAhead:  int(min(fs.rtmax, 1<<20)),
		MaxBackground: 32,
		// The server clears setuid and setgid on a write, truncate or
		// chown, as knfsd does; the Linux client never sends the mode
		// change the kernel would otherwise ask of a FUSE file system.
		ExtraCapabilities:  gofuse.CAP_HANDLE_KILLPRIV,
		DisableReadDirPlus: true,
		DisableSplice:      true,
		DirectMount:        true,
		Debug:              o.Debug,
	}
	if o.Debug {
		mo.Logger = log.New(os.Stderr, "nfs-fuse: ", 0)
	}
	srv, err := gofuse.NewServer(fs, mountpoint, mo)
	if err != nil {
		fs.close()
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		fs.close()
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	return &FUSEMount{srv: srv, fs: fs, dir: mountpoint}, nil
}

// Unmount unmounts (retrying a few seconds while busy) and closes the
// connections.
func (m *FUSEMount) Unmount() error {
	var err error
	for i := 0; i < 20; i++ {
		if err = m.srv.Unmount(); err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", m.dir, err)
	}
	m.srv.Wait()
	m.fs.close()
	return nil
}

// Wait returns once the file system is unmounted.
func (m *FUSEMount) Wait() { m.srv.Wait() }

// node is an inode the kernel knows: its FUSE node id, the NFS handle
// and how many lookups the kernel holds.
type node struct {
	id, fileid uint64
	fh         []byte
	lookups    uint64
	opens      int
	// stamp is the change attributes this mount last saw (size, mtime,
	// ctime); changed says that attributes seen since the last open
	// moved without this mount's own change: the next open keeps no
	// cached page (Linux's NFS_INO_INVALID_DATA).
	stamp   [3]uint64
	changed bool
	// silly is the .nfs name an unlinked open file was renamed to.
	silly *sillyName
}

type sillyName struct {
	dir  []byte
	name string
	cred *xdr.Authsys_parms
}

type nfsFS struct {
	gofuse.RawFileSystem
	o            FUSEOptions
	pool         chan *Client
	rtmax, wtmax uint32

	mu       sync.Mutex
	nodes    map[uint64]*node // by FUSE node id
	byFileid map[uint64]*node
	nextID   uint64
	files    map[uint64]*openFile
	dirs     map[uint64]*dirHandle
	nextFh   uint64
	sillySeq uint32
}

func newNFSFS(o FUSEOptions) (*nfsFS, error) {
	fs := &nfsFS{RawFileSystem: gofuse.NewDefaultRawFileSystem(), o: o, pool: make(chan *Client, o.Conns),
		nodes: map[uint64]*node{}, byFileid: map[uint64]*node{}, nextID: 2,
		files: map[uint64]*openFile{}, dirs: map[uint64]*dirHandle{}}
	c, err := Dial(o.Addr, "")
	if err != nil {
		return nil, fmt.Errorf("nfs %s: %w", o.Addr, err)
	}
	c.As(0, 0)
	root, err := c.MountRoot(o.Export)
	if err != nil {
		c.Close()
		return nil, err
	}
	var info xdr.FSINFO3res
	if err := c.NFS(ProcFsinfo, &xdr.FSINFO3args{Fsroot: fhOf(root)}, &info); err != nil || info.Status != xdr.NFS3_OK {
		c.Close()
		return nil, fmt.Errorf("FSINFO: %v %v", info.Status, err)
	}
	fs.rtmax, fs.wtmax = info.Resok().Rtmax, info.Resok().Wtmax
	if fs.rtmax == 0 || fs.wtmax == 0 {
		fs.rtmax, fs.wtmax = 1<<20, 1<<20
	}
	attr, err := c.Getattr(root)
	if err != nil {
		c.Close()
		return nil, err
	}
	rn := &node{id: gofuse.FUSE_ROOT_ID, fileid: uint64(attr.Fileid), fh: bytes.Clone(root), lookups: 1}
	fs.nodes[rn.id], fs.byFileid[rn.fileid] = rn, rn
	fs.pool <- c
	for i := 1; i < o.Conns; i++ {
		fs.pool <- nil // dialled when first used
	}
	return fs, nil
}

func (fs *nfsFS) String() string { return "nfstest(" + fs.o.Addr + ")" }

func (fs *nfsFS) close() {
	for i := 0; i < fs.o.Conns; i++ {
		if c := <-fs.pool; c != nil {
			c.Close()
		}
	}
}

// retryFor bounds how long a call is sent again over new connections
// while the gateway does not answer (a hard mount retries forever).
const retryFor = 30 * time.Second

// call makes one NFS call as cred over a pooled connection. A connection
// that failed below RPC (no reply: the gateway died or restarted) is
// closed, and the call sent again with the same xid over a new one for up
// to retryFor, as a hard mount retransmits: the gateway's duplicate
// request cache answers a non-idempotent call it already ran (one a
// restarted gateway ran before it died may run twice, as with knfsd).
func (fs *nfsFS) call(cred *xdr.Authsys_parms, proc uint32, args, res xdr.XdrType) error {
	deadline := time.Now().Add(retryFor)
	var xid uint32
	sent := false
	for attempt := 1; ; attempt++ {
		c := <-fs.pool
		var err error
		if c == nil {
			c, err = Dial(fs.o.Addr, "")
		}
		if err == nil {
			c.Client.Cred = cred // the connection is this caller's until put back
			if !sent {
				err = c.NFS(proc, args, res)
				xid, sent = c.LastXid(), true
			} else {
				err = c.Retransmit(xid, NFS, Version, proc, args, res)
			}
			var ae *AcceptError
			var de *DeniedError
			if err == nil || errors.As(err, &ae) || errors.As(err, &de) {
				fs.pool <- c
				return err
			}
			c.Close()
		}
		fs.pool <- nil
		if time.Now().After(deadline) || attempt >= 1000 {
			return fmt.Errorf("nfs %s, %d attempts: %w", fs.o.Addr, attempt, err)
		}
		slog.Warn("nfs-fuse: no answer, sending again", "proc", proc, "attempt", attempt, "err", err)
		time.Sleep(100 * time.Millisecond)
	}
}

// credOf is the AUTH_SYS credential of the process that made a request:
// its uid and gid, and its supplementary groups (at most 16, as AUTH_SYS).
func credOf(h *gofuse.InHeader) *xdr.Authsys_parms {
	return &xdr.Authsys_parms{Machinename: "nfstest-fuse", Uid: h.Uid, Gid: h.Gid, Gids: groupsOf(h.Pid)}
}

func groupsOf(pid uint32) []uint32 {
	if pid == 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		f, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var gids []uint32
		for _, s := range strings.Fields(f) {
			if g, err := strconv.ParseUint(s, 10, 32); err == nil && len(gids) < 16 {
				gids = append(gids, uint32(g))
			}
		}
		return gids
	}
	return nil
}

// errnos are the errno Linux's client returns for the NFS statuses whose
// number is not the errno's; the RFC's others are errno numbers.
var errnos = map[xdr.Nfsstat3]syscall.Errno{
	xdr.NFS3ERR_NAMETOOLONG: syscall.ENAMETOOLONG, xdr.NFS3ERR_NOTEMPTY: syscall.ENOTEMPTY,
	xdr.NFS3ERR_DQUOT: syscall.EDQUOT, xdr.NFS3ERR_STALE: syscall.ESTALE, xdr.NFS3ERR_BADHANDLE: syscall.ESTALE,
	xdr.NFS3ERR_REMOTE: syscall.EREMOTE, xdr.NFS3ERR_NOTSUPP: syscall.EOPNOTSUPP,
	xdr.NFS3ERR_TOOSMALL: syscall.EINVAL, xdr.NFS3ERR_BADTYPE: syscall.EINVAL, xdr.NFS3ERR_JUKEBOX: syscall.EAGAIN,
}

func errnoOf(st xdr.Nfsstat3) syscall.Errno {
	if e, ok := errnos[st]; ok {
		return e
	}
	if st > 0 && st < 1000 {
		return syscall.Errno(st)
	}
	return syscall.EIO // SERVERFAULT, BAD_COOKIE, NOT_SYNC
}

// fstatus is the FUSE status of a call's outcome.
func fstatus(op string, err error, st xdr.Nfsstat3) gofuse.Status {
	if err != nil {
		slog.Warn("nfs-fuse: call failed", "op", op, "err", err)
		return gofuse.EIO
	}
	if st != xdr.NFS3_OK {
		return gofuse.Status(errnoOf(st))
	}
	return gofuse.OK
}

// node returns the node of a FUSE node id.
func (fs *nfsFS) node(id uint64) *node {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.nodes[id]
}

// remember registers one kernel lookup of the file (fh, a) and fills out.
func (fs *nfsFS) remember(fh []byte, a *xdr.Fattr3, out *gofuse.EntryOut) {
	fs.mu.Lock()
	n := fs.byFileid[uint64(a.Fileid)]
	if n == nil {
		n = &node{id: fs.nextID, fileid: uint64(a.Fileid), fh: bytes.Clone(fh)}
		fs.nextID++
		fs.nodes[n.id], fs.byFileid[n.fileid] = n, n
	}
	n.lookups++
	n.note(a, false)
	fs.mu.Unlock()
	*out = gofuse.EntryOut{NodeId: n.id}
	attrOf(a, &out.Attr, fs.wtmax)
}

// saw notes the attributes a call answered for n; own says the call
// was this mount's change of the file (a WRITE, SETATTR or COMMIT).
func (fs *nfsFS) saw(n *node, pa *xdr.Post_op_attr, own bool) {
	if pa.Attributes_follow {
		fs.mu.Lock()
		n.note(pa.Attributes(), own)
		fs.mu.Unlock()
	}
}

// note records attributes seen (under fs.mu).
func (n *node) note(a *xdr.Fattr3, own bool) {
	st := stampOf(a)
	if st != n.stamp && !own {
		n.changed = true
	}
	n.stamp = st
}

func stampOf(a *xdr.Fattr3) [3]uint64 {
	t := func(x xdr.Nfstime3) uint64 { return uint64(x.Seconds)<<32 | uint64(x.Nseconds) }
	return [3]uint64{uint64(a.Size), t(a.Mtime), t(a.Ctime)}
}

func (fs *nfsFS) Forget(id, nlookup uint64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes[id]
	if n == nil || id == gofuse.FUSE_ROOT_ID {
		return
	}
	n.lookups -= min(nlookup, n.lookups)
	if n.lookups == 0 && n.opens == 0 {
		delete(fs.nodes, id)
		if fs.byFileid[n.fileid] == n {
			delete(fs.byFileid, n.fileid)
		}
	}
}

// fileTypes are the mode bits of each NFS file type.
var fileTypes = map[xdr.Ftype3]uint32{xdr.NF3REG: syscall.S_IFREG, xdr.NF3DIR: syscall.S_IFDIR, xdr.NF3LNK: syscall.S_IFLNK,
	xdr.NF3BLK: syscall.S_IFBLK, xdr.NF3CHR: syscall.S_IFCHR, xdr.NF3SOCK: syscall.S_IFSOCK, xdr.NF3FIFO: syscall.S_IFIFO}

// attrOf converts NFS attributes to FUSE's.
func attrOf(a *xdr.Fattr3, out *gofuse.Attr, blksize uint32) {
	major, minor := a.Rdev.Specdata1, a.Rdev.Specdata2
	*out = gofuse.Attr{
		Ino:       uint64(a.Fileid),
		Size:      uint64(a.Size),
		Blocks:    (uint64(a.Used) + 511) / 512,
		Atime:     uint64(a.Atime.Seconds),
		Atimensec: a.Atime.Nseconds,
		Mtime:     uint64(a.Mtime.Seconds),
		Mtimensec: a.Mtime.Nseconds,
		Ctime:     uint64(a.Ctime.Seconds),
		Ctimensec: a.Ctime.Nseconds,
		Mode:      fileTypes[a.Type] | a.Mode&0o7777,
		Nlink:     a.Nlink,
		Owner:     gofuse.Owner{Uid: a.Uid, Gid: a.Gid},
		Rdev:      (minor & 0xff) | (major&0xfff)<<8 | (minor&^0xff)<<12,
		Blksize:   blksize,
	}
}

// getattr asks the server for n's attributes.
func (fs *nfsFS) getattr(cred *xdr.Authsys_parms, n *node) (*xdr.Fattr3, gofuse.Status) {
	var res xdr.GETATTR3res
	err := fs.call(cred, ProcGetattr, &xdr.GETATTR3args{Object: fhOf(n.fh)}, &res)
	if st := fstatus("GETATTR", err, res.Status); !st.Ok() {
		return nil, st
	}
	a := &res.Resok().Obj_attributes
	fs.mu.Lock()
	n.note(a, false)
	fs.mu.Unlock()
	return a, gofuse.OK
}

// entry answers a LOOKUP-like reply: the handle and attributes it gave,
// or a GETATTR for what it left out (a LOOKUP when it gave no handle).
func (fs *nfsFS) entry(cred *xdr.Authsys_parms, dir *node, name string, fh *xdr.Post_op_fh3, pa *xdr.Post_op_attr, out *gofuse.EntryOut) gofuse.Status {
	if !fh.Handle_follows {
		return fs.lookup(cred, dir, name, out)
	}
	h := fh.Handle().Data
	if pa.Attributes_follow {
		fs.remember(h, pa.Attributes(), out)
		return gofuse.OK
	}
	a, st := fs.getattr(cred, &node{fh: h})
	if st.Ok() {
		fs.remember(h, a, out)
	}
	return st
}

// handleFollows is a post_op_fh3 that carries h.
func handleFollows(h []byte) *xdr.Post_op_fh3 {
	var pf xdr.Post_op_fh3
	pf.Handle_follows = true
	pf.Handle().Data = h
	return &pf
}

func (fs *nfsFS) lookup(cred *xdr.Authsys_parms, dir *node, name string, out *gofuse.EntryOut) gofuse.Status {
	var res xdr.LOOKUP3res
	err := fs.call(cred, ProcLookup, &xdr.LOOKUP3args{What: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}, &res)
	if st := fstatus("LOOKUP", err, res.Status); !st.Ok() {
		return st
	}
	ok := res.Resok()
	return fs.entry(cred, dir, name, handleFollows(ok.Object.Data), &ok.Obj_attributes, out)
}

func (fs *nfsFS) Lookup(_ <-chan struct{}, h *gofuse.InHeader, name string, out *gofuse.EntryOut) gofuse.Status {
	dir := fs.node(h.NodeId)
	if dir == nil {
		return gofuse.ENOENT
	}
	return fs.lookup(credOf(h), dir, name, out)
}

func (fs *nfsFS) GetAttr(_ <-chan struct{}, in *gofuse.GetAttrIn, out *gofuse.AttrOut) gofuse.Status {
	n := fs.node(in.NodeId)
	if n == nil {
		return gofuse.ENOENT
	}
	a, st := fs.getattr(credOf(&in.InHeader), n)
	if st.Ok() {
		attrOf(a, &out.Attr, fs.wtmax)
	}
	return st
}

func nfsTimeOf(sec uint64, nsec uint32) xdr.Nfstime3 {
	return xdr.Nfstime3{Seconds: uint32(sec), Nseconds: nsec}
}

func (fs *nfsFS) SetAttr(_ <-chan struct{}, in *gofuse.SetAttrIn, out *gofuse.AttrOut) gofuse.Status {
	n := fs.node(in.NodeId)
	if n == nil {
		return gofuse.ENOENT
	}
	var sa xdr.Sattr3
	if m, ok := in.GetMode(); ok {
		sa.Mode.Set_it = true
		*sa.Mode.Mode() = m & 0o7777
	}
	if u, ok := in.GetUID(); ok {
		sa.Uid.Set_it = true
		*sa.Uid.Uid() = u
	}
	if g, ok := in.GetGID(); ok {
		sa.Gid.Set_it = true
		*sa.Gid.Gid() = g
	}
	if s, ok := in.GetSize(); ok {
		sa.Size.Set_it = true
		*sa.Size.Size() = s
	}
	switch {
	case in.Valid&gofuse.FATTR_ATIME_NOW != 0:
		sa.Atime.Set_it = xdr.SET_TO_SERVER_TIME
	case in.Valid&gofuse.FATTR_ATIME != 0:
		sa.Atime.Set_it = xdr.SET_TO_CLIENT_TIME
		*sa.Atime.Atime() = nfsTimeOf(in.Atime, in.Atimensec)
	}
	switch {
	case in.Valid&gofuse.FATTR_MTIME_NOW != 0:
		sa.Mtime.Set_it = xdr.SET_TO_SERVER_TIME
	case in.Valid&gofuse.FATTR_MTIME != 0:
		sa.Mtime.Set_it = xdr.SET_TO_CLIENT_TIME
		*sa.Mtime.Mtime() = nfsTimeOf(in.Mtime, in.Mtimensec)
	}
	cred := credOf(&in.InHeader)
	var res xdr.SETATTR3res
	err := fs.call(cred, ProcSetattr, &xdr.SETATTR3args{Object: fhOf(n.fh), New_attributes: sa}, &res)
	if st := fstatus("SETATTR", err, res.Status); !st.Ok() {
		return st
	}
	if after := &res.Resok().Obj_wcc.After; after.Attributes_follow {
		fs.saw(n, after, true)
		attrOf(after.Attributes(), &out.Attr, fs.wtmax)
		return gofuse.OK
	}
	a, st := fs.getattr(cred, n)
	if st.Ok() {
		attrOf(a, &out.Attr, fs.wtmax)
	}
	return st
}

func (fs *nfsFS) Mkdir(_ <-chan struct{}, in *gofuse.MkdirIn, name string, out *gofuse.EntryOut) gofuse.Status {
	dir := fs.node(in.NodeId)
	if dir == nil {
		return gofuse.ENOENT
	}
	args := xdr.MKDIR3args{Where: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}
	args.Attributes.Mode.Set_it = true
	*args.Attributes.Mode.Mode() = in.Mode & 0o7777
	cred := credOf(&in.InHeader)
	var res xdr.MKDIR3res
	err := fs.call(cred, ProcMkdir, &args, &res)
	if st := fstatus("MKDIR", err, res.Status); !st.Ok() {
		return st
	}
	ok := res.Resok()
	return fs.entry(cred, dir, name, &ok.Obj, &ok.Obj_attributes, out)
}

func (fs *nfsFS) Symlink(_ <-chan struct{}, h *gofuse.InHeader, target, name string, out *gofuse.EntryOut) gofuse.Status {
	dir := fs.node(h.NodeId)
	if dir == nil {
		return gofuse.ENOENT
	}
	args := xdr.SYMLINK3args{Where: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}
	args.Symlink.Symlink_data = target
	args.Symlink.Symlink_attributes.Mode.Set_it = true
	*args.Symlink.Symlink_attributes.Mode.Mode() = 0o777
	cred := credOf(h)
	var res xdr.SYMLINK3res
	err := fs.call(cred, ProcSymlink, &args, &res)
	if st := fstatus("SYMLINK", err, res.Status); !st.Ok() {
		return st
	}
	ok := res.Resok()
	return fs.entry(cred, dir, name, &ok.Obj, &ok.Obj_attributes, out)
}

func (fs *nfsFS) Readlink(_ <-chan struct{}, h *gofuse.InHeader) ([]byte, gofuse.Status) {
	n := fs.node(h.NodeId)
	if n == nil {
		return nil, gofuse.ENOENT
	}
	var res xdr.READLINK3res
	err := fs.call(credOf(h), ProcReadlink, &xdr.READLINK3args{Symlink: fhOf(n.fh)}, &res)
	if st := fstatus("READLINK", err, res.Status); !st.Ok() {
		return nil, st
	}
	return []byte(res.Resok().Data), gofuse.OK
}

func (fs *nfsFS) Link(_ <-chan struct{}, in *gofuse.LinkIn, name string, out *gofuse.EntryOut) gofuse.Status {
	n, dir := fs.node(in.Oldnodeid), fs.node(in.NodeId)
	if n == nil || dir == nil {
		return gofuse.ENOENT
	}
	cred := credOf(&in.InHeader)
	var res xdr.LINK3res
	err := fs.call(cred, ProcLink, &xdr.LINK3args{File: fhOf(n.fh), Link: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}, &res)
	if st := fstatus("LINK", err, res.Status); !st.Ok() {
		return st
	}
	pa := &res.Resok().File_attributes
	return fs.entry(cred, dir, name, handleFollows(n.fh), pa, out)
}

// openNode is the node of fileid if this mount has it open.
func (fs *nfsFS) openNode(fileid uint64) *node {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if n := fs.byFileid[fileid]; n != nil && n.opens > 0 && n.silly == nil {
		return n
	}
	return nil
}

// sillyRename renames name in dir to .nfsXXXX when it is a file this
// mount holds open, as Linux's client does before an unlink or a rename
// over it: the file stays reachable (by its handle) until its last close,
// which removes the new name. It reports whether it renamed.
func (fs *nfsFS) sillyRename(cred *xdr.Authsys_parms, dir *node, name string) (bool, gofuse.Status) {
	var lk xdr.LOOKUP3res
	err := fs.call(cred, ProcLookup, &xdr.LOOKUP3args{What: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}, &lk)
	if err != nil || lk.Status != xdr.NFS3_OK || !lk.Resok().Obj_attributes.Attributes_follow {
		return false, gofuse.OK // the call that follows reports what is wrong
	}
	a := lk.Resok().Obj_attributes.Attributes()
	n := fs.openNode(uint64(a.Fileid))
	if n == nil || a.Type == xdr.NF3DIR {
		return false, gofuse.OK
	}
	fs.mu.Lock()
	fs.sillySeq++
	silly := fmt.Sprintf(".nfs%016x%08x", n.fileid, fs.sillySeq)
	fs.mu.Unlock()
	var res xdr.RENAME3res
	err = fs.call(cred, ProcRename, &xdr.RENAME3args{From: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name},
		To: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: silly}}, &res)
	if st := fstatus("RENAME (silly)", err, res.Status); !st.Ok() {
		return false, st
	}
	fs.mu.Lock()
	n.silly = &sillyName{dir: dir.fh, name: silly, cred: cred}
	fs.mu.Unlock()
	return true, gofuse.OK
}

func (fs *nfsFS) Unlink(_ <-chan struct{}, h *gofuse.InHeader, name string) gofuse.Status {
	dir := fs.node(h.NodeId)
	if dir == nil {
		return gofuse.ENOENT
	}
	cred := credOf(h)
	if renamed, st := fs.sillyRename(cred, dir, name); renamed || !st.Ok() {
		return st
	}
	var res xdr.REMOVE3res
	err := fs.call(cred, ProcRemove, &xdr.REMOVE3args{Object: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}, &res)
	return fstatus("REMOVE", err, res.Status)
}

func (fs *nfsFS) Rmdir(_ <-chan struct{}, h *gofuse.InHeader, name string) gofuse.Status {
	dir := fs.node(h.NodeId)
	if dir == nil {
		return gofuse.ENOENT
	}
	var res xdr.RMDIR3res
	err := fs.call(credOf(h), ProcRmdir, &xdr.RMDIR3args{Object: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}, &res)
	return fstatus("RMDIR", err, res.Status)
}

func (fs *nfsFS) Rename(_ <-chan struct{}, in *gofuse.RenameIn, from, to string) gofuse.Status {
	if in.Flags != 0 {
		return gofuse.EINVAL // NFSv3 has no RENAME_NOREPLACE/EXCHANGE; Linux's client refuses them so
	}
	dir, newDir := fs.node(in.NodeId), fs.node(in.Newdir)
	if dir == nil || newDir == nil {
		return gofuse.ENOENT
	}
	cred := credOf(&in.InHeader)
	if _, st := fs.sillyRename(cred, newDir, to); !st.Ok() {
		return st
	}
	var res xdr.RENAME3res
	err := fs.call(cred, ProcRename, &xdr.RENAME3args{From: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: from},
		To: xdr.Diropargs3{Dir: fhOf(newDir.fh), Name: to}}, &res)
	return fstatus("RENAME", err, res.Status)
}

// access asks the server whether cred may do want (ACCESS3_ bits) on n.
func (fs *nfsFS) access(cred *xdr.Authsys_parms, n *node, want uint32) gofuse.Status {
	var res xdr.ACCESS3res
	err := fs.call(cred, ProcAccess, &xdr.ACCESS3args{Object: fhOf(n.fh), Access: want}, &res)
	if st := fstatus("ACCESS", err, res.Status); !st.Ok() {
		return st
	}
	if res.Resok().Access&want != want {
		return gofuse.EACCES
	}
	return gofuse.OK
}

func (fs *nfsFS) Access(_ <-chan struct{}, in *gofuse.AccessIn) gofuse.Status {
	n := fs.node(in.NodeId)
	if n == nil {
		return gofuse.ENOENT
	}
	cred := credOf(&in.InHeader)
	var want uint32
	if in.Mask&gofuse.R_OK != 0 {
		want |= xdr.ACCESS3_READ
	}
	if in.Mask&gofuse.W_OK != 0 {
		want |= xdr.ACCESS3_MODIFY
	}
	if st := fs.access(cred, n, want); !st.Ok() || in.Mask&gofuse.X_OK == 0 {
		return st
	}
	// Execute is LOOKUP on a directory, EXECUTE on anything else.
	if st := fs.access(cred, n, xdr.ACCESS3_LOOKUP); st.Ok() {
		return st
	}
	return fs.access(cred, n, xdr.ACCESS3_EXECUTE)
}

func (fs *nfsFS) StatFs(_ <-chan struct{}, h *gofuse.InHeader, out *gofuse.StatfsOut) gofuse.Status {
	n := fs.node(h.NodeId)
	if n == nil {
		return gofuse.ENOENT
	}
	var res xdr.FSSTAT3res
	err := fs.call(credOf(h), ProcFsstat, &xdr.FSSTAT3args{Fsroot: fhOf(n.fh)}, &res)
	if st := fstatus("FSSTAT", err, res.Status); !st.Ok() {
		return st
	}
	ok := res.Resok()
	const bs = 4096
	*out = gofuse.StatfsOut{Blocks: uint64(ok.Tbytes) / bs, Bfree: uint64(ok.Fbytes) / bs, Bavail: uint64(ok.Abytes) / bs,
		Files: uint64(ok.Tfiles), Ffree: uint64(ok.Ffiles), Bsize: bs, Frsize: bs, NameLen: 255}
	return gofuse.OK
}
