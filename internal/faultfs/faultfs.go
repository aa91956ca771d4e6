// Package faultfs is a disk that fails on demand: a FUSE loopback of a
// directory (the bench's internal/passthrough, so file data goes through
// this daemon) whose operations fail the way a dying or full disk's do —
// EIO on writes, EIO on fsync, EIO on everything, EROFS, ENOSPC — in a
// mode that a test switches while the file system stays mounted. Tests put
// a real daemon's data directory (a store's target, a metadata voter's
// --data) on it; `strata faultfs` runs it as a process of its own, driven
// through a control socket (Serve, Send; testutil.MountFaultFS).
//
// # Modes
//
//   - ok: a plain loopback.
//   - eio-write: writing file data (write, fallocate, copy_file_range,
//     truncate) fails with EIO.
//   - eio-fsync: fsync and fdatasync of files and directories fail with EIO.
//   - eio: every operation, reads and lookups included, fails with EIO (a
//     disk that vanished).
//   - erofs: every change fails with EROFS, opening for writing too; reads
//     and fsync work (a file system remounted read-only after an error).
//   - hang-fsync: fsync and fdatasync block until the mode changes (a disk
//     whose cache flushes stall); other operations work.
//   - hang: every operation blocks until the mode changes (a disk that
//     stopped answering).
//   - enospc: everything that takes space (writes, new files and
//     directories, xattrs) fails with ENOSPC, and statfs reports no free
//     space; removing and renaming work.
//   - slow:DURATION (slow:200ms): every read, write and fsync of file data
//     waits DURATION first, then works (a disk that is failing slowly, or
//     overloaded: the fault layer's netem-like delay).
//
// # Pitfalls
//
//   - syncfs(2) on a FUSE mount does not reach the daemon (go-fuse does not
//     implement FUSE_SYNCFS), so it succeeds in every mode: only fsync and
//     fdatasync see eio-fsync.
//   - A mode applies to operations that start after the switch; one that is
//     running finishes as it began, except that operations held by a hang
//     mode go on (in the new mode) when it changes.
//   - While a hang mode holds operations, unmounting waits for them: switch
//     to ok first (testutil.MountFaultFS's cleanup does).
package faultfs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stratafs/strata/internal/passthrough"
)

// Mode is a way of failing.
type Mode string

// The modes (see the package documentation).
const (
	OK       Mode = "ok"
	EIOWrite Mode = "eio-write"
	EIOFsync Mode = "eio-fsync"
	EIO      Mode = "eio"
	ReadOnly Mode = "erofs"
	Full     Mode = "enospc"
	HangSync Mode = "hang-fsync"
	Hang     Mode = "hang"
)

// Modes lists every mode.
var Modes = []Mode{OK, EIOWrite, EIOFsync, EIO, ReadOnly, Full, HangSync, Hang}

// opKind classes the operations a mode fails.
type opKind int

const (
	opRead   opKind = iota // lookups, reads, listings, attributes
	opWrite                // file data: write, allocate, truncate
	opCreate               // a new name: create, mkdir, mknod, symlink, link
	opChange               // other changes: unlink, rmdir, rename, chmod, xattrs
	opSync                 // fsync, fdatasync
)

// errno is what mode m answers to an operation of kind k (0: go ahead).
func (m Mode) errno(k opKind) syscall.Errno {
	switch m {
	case EIOWrite:
		if k == opWrite {
			return syscall.EIO
		}
	case EIOFsync:
		if k == opSync {
			return syscall.EIO
		}
	case EIO:
		return syscall.EIO
	case ReadOnly:
		if k == opWrite || k == opCreate || k == opChange {
			return syscall.EROFS
		}
	case Full:
		if k == opWrite || k == opCreate {
			return syscall.ENOSPC
		}
	}
	return 0
}

// hangs reports whether mode m holds an operation of kind k.
func (m Mode) hangs(k opKind) bool {
	return m == Hang || m == HangSync && k == opSync
}

// FS is the switch of a mounted fault file system.
type FS struct {
	mu      sync.Mutex
	mode    Mode
	changed chan struct{} // closed (and replaced) at every switch
}

// slowPrefix starts the slow modes' names: slow:DURATION.
const slowPrefix = "slow:"

// Slow is the mode that delays every data operation by d.
func Slow(d time.Duration) Mode { return Mode(slowPrefix + d.String()) }

// delay is how long mode m holds an operation of kind k before it runs.
func (m Mode) delay(k opKind) time.Duration {
	s, ok := strings.CutPrefix(string(m), slowPrefix)
	if !ok || k == opCreate || k == opChange {
		return 0
	}
	d, _ := time.ParseDuration(s) // checked by valid
	return d
}

// valid checks that m is a known mode.
func (m Mode) valid() error {
	if s, ok := strings.CutPrefix(string(m), slowPrefix); ok {
		if d, err := time.ParseDuration(s); err != nil || d <= 0 || d > time.Minute {
			return fmt.Errorf("faultfs: mode %q: want slow:DURATION, a duration up to 1m", m)
		}
		return nil
	}
	if !slices.Contains(Modes, m) {
		return fmt.Errorf("faultfs: unknown mode %q (want one of %v, or slow:DURATION)", m, Modes)
	}
	return nil
}

// SetMode switches the mode; later operations see it, and operations held
// by a hang mode go on.
func (f *FS) SetMode(m Mode) error {
	if err := m.valid(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode = m
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
	return nil
}

// Mode is the current mode.
func (f *FS) Mode() Mode {
	m, _ := f.state()
	return m
}

func (f *FS) state() (Mode, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mode == "" {
		return OK, f.changed
	}
	return f.mode, f.changed
}

// fail is what the current mode answers to an operation of kind k, after
// holding it while a hang mode lasts.
func (f *FS) fail(k opKind) syscall.Errno {
	for {
		m, changed := f.state()
		if d := m.delay(k); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-changed: // the mode changed: go on in the new one
				t.Stop()
			}
			return f.Mode().errno(k)
		}
		if !m.hangs(k) {
			return m.errno(k)
		}
		<-changed
	}
}

// Mount mounts a fault-injecting loopback of src at mnt, in mode OK
// (allowOther: admit every user, as root only). The caller unmounts
// (server.Unmount) and waits (server.Wait).
func Mount(src, mnt string, allowOther bool) (*fuse.Server, *FS, error) {
	f := &FS{}
	r, err := fs.NewLoopbackRoot(src)
	if err != nil {
		return nil, nil, fmt.Errorf("faultfs: loopback of %s: %w", src, err)
	}
	// Every node the loopback makes from now on, and the root, consults
	// the mode first.
	lr := r.(*fs.LoopbackNode).RootData
	lr.NewNode = func(rd *fs.LoopbackRoot, parent *fs.Inode, name string, st *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: &fs.LoopbackNode{RootData: rd}, f: f}
	}
	root := &node{LoopbackNode: r.(*fs.LoopbackNode), f: f}
	lr.RootNode = root
	// The kernel caches no names or attributes: every operation reaches
	// this daemon, so a mode applies to the next stat as to the next write.
	var timeout time.Duration
	mo := fuse.MountOptions{FsName: src, Name: "strata-faultfs", MaxWrite: 1 << 20, AllowOther: allowOther}
	if allowOther {
		mo.Options = append(mo.Options, "default_permissions")
	}
	srv, err := fs.Mount(mnt, root, &fs.Options{MountOptions: mo, EntryTimeout: &timeout, AttrTimeout: &timeout})
	if err != nil {
		return nil, nil, fmt.Errorf("faultfs: mount %s: %w", mnt, err)
	}
	return srv, f, nil
}

// node is a loopback node that asks the mode before each operation.
type node struct {
	*fs.LoopbackNode
	f *FS
}

var (
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.FileFsyncdirer     = (*dir)(nil)
	_ fs.FileReaddirenter   = (*dir)(nil)
	_ fs.FileFsyncer        = (*file)(nil)
	_ fs.FileAllocater      = (*file)(nil)
)

// wrap makes a loopback file handle a faulty one without kernel
// passthrough (which would bypass this daemon and so the faults).
func (n *node) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &file{File: passthrough.NewFile(lf), f: n.f}
	}
	return fh
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if e := n.f.fail(opRead); e != 0 {
		return e
	}
	if e := n.LoopbackNode.Statfs(ctx, out); e != 0 {
		return e
	}
	if n.f.Mode() == Full {
		out.Bfree, out.Bavail, out.Ffree = 0, 0, 0
	}
	return 0
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.f.fail(opRead); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.f.fail(opCreate); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Mknod(ctx, name, mode, dev, out)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.f.fail(opCreate); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if e := n.f.fail(opChange); e != 0 {
		return e
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := n.f.fail(opChange); e != 0 {
		return e
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if e := n.f.fail(opChange); e != 0 {
		return e
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := n.f.fail(opCreate); e != 0 {
		return nil, nil, 0, e
	}
	ch, fh, fl, e := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	return ch, n.wrap(fh), fl, 0
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.f.fail(opCreate); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := n.f.fail(opCreate); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if e := n.f.fail(opRead); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Readlink(ctx)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	k := opRead
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 && n.f.Mode() == ReadOnly {
		k = opChange
	}
	if e := n.f.fail(k); e != 0 {
		return nil, 0, e
	}
	fh, fl, e := n.LoopbackNode.Open(ctx, flags)
	if e != 0 {
		return nil, 0, e
	}
	return n.wrap(fh), fl, 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if e := n.f.fail(opRead); e != 0 {
		return nil, 0, e
	}
	fh, fl, e := n.LoopbackNode.OpendirHandle(ctx, flags)
	if e != 0 {
		return nil, 0, e
	}
	d, ok := fh.(dirOps)
	if !ok {
		return fh, fl, 0
	}
	return &dir{dirOps: d, f: n.f}, fl, 0
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if e := n.f.fail(opRead); e != 0 {
		return nil, e
	}
	return n.LoopbackNode.Readdir(ctx)
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if e := n.f.fail(opRead); e != 0 {
		return e
	}
	return n.LoopbackNode.Getattr(ctx, fh, out)
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if e := n.f.fail(setattrKind(in)); e != 0 {
		return e
	}
	return n.LoopbackNode.Setattr(ctx, fh, in, out)
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if e := n.f.fail(opRead); e != 0 {
		return 0, e
	}
	return n.LoopbackNode.Getxattr(ctx, attr, dest)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	k := opChange
	if n.f.Mode() == Full {
		k = opCreate
	}
	if e := n.f.fail(k); e != 0 {
		return e
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if e := n.f.fail(opChange); e != 0 {
		return e
	}
	return n.LoopbackNode.Removexattr(ctx, attr)
}

// CopyFileRange is not offered: the kernel falls back to reads and writes,
// which see the mode.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOTSUP
}

// setattrKind: a truncate writes file data; other attribute changes are
// changes.
func setattrKind(in *fuse.SetAttrIn) opKind {
	if _, ok := in.GetSize(); ok {
		return opWrite
	}
	return opChange
}

// dirOps is what the loopback's directory handle does.
type dirOps interface {
	fs.FileReaddirenter
	fs.FileReleasedirer
	fs.FileSeekdirer
	fs.FileFsyncdirer
}

// dir is a directory handle whose fsync asks the mode.
type dir struct {
	dirOps
	f *FS
}

func (d *dir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if e := d.f.fail(opRead); e != 0 {
		return nil, e
	}
	return d.dirOps.Readdirent(ctx)
}

func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	if e := d.f.fail(opSync); e != 0 {
		return e
	}
	return d.dirOps.Fsyncdir(ctx, flags)
}

// file is a passthrough file handle that asks the mode first.
type file struct {
	*passthrough.File
	f *FS
}

func (fl *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if e := fl.f.fail(opRead); e != 0 {
		return nil, e
	}
	return fl.File.Read(ctx, dest, off)
}

func (fl *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if e := fl.f.fail(opWrite); e != 0 {
		return 0, e
	}
	return fl.File.Write(ctx, data, off)
}

func (fl *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if e := fl.f.fail(opWrite); e != 0 {
		return e
	}
	return fl.File.Allocate(ctx, off, size, mode)
}

func (fl *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if e := fl.f.fail(opSync); e != 0 {
		return e
	}
	return fl.File.Fsync(ctx, flags)
}

func (fl *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	if e := fl.f.fail(opRead); e != 0 {
		return e
	}
	return fl.File.Getattr(ctx, out)
}

func (fl *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if e := fl.f.fail(setattrKind(in)); e != 0 {
		return e
	}
	return fl.File.Setattr(ctx, in, out)
}
