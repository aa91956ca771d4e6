package fuse

import (
	"errors"
	"math"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/rpc"
)

// fileHandle is one open file description of the kernel.
type fileHandle struct {
	f *client.File
}

func (fs *fileSystem) handle(fh uint64) *fileHandle {
	v, ok := fs.files.Load(fh)
	if !ok {
		return nil
	}
	return v.(*fileHandle)
}

func (fs *fileSystem) addHandle(f *client.File) uint64 {
	fh := fs.nextFh.Add(1)
	fs.files.Store(fh, &fileHandle{f: f})
	return fh
}

// openFlags decides the kernel's caching for a fresh open (close-to-open):
// the page cache is kept only if size and mtime are what the kernel last
// got from us; otherwise it is dropped and the kernel's cached attributes
// are invalidated so that the new size is seen at once.
func (fs *fileSystem) openFlags(f *client.File, flags uint32) uint32 {
	if flags&syscall.O_DIRECT != 0 {
		return gofuse.FOPEN_DIRECT_IO
	}
	a := f.Attr()
	now := reportedAttr{size: a.Size, mtime: a.Mtime}
	prev, ok := fs.notes.report(a.Ino, now)
	if ok && prev == now {
		return gofuse.FOPEN_KEEP_CACHE
	}
	// An O_TRUNC open (atomic_o_trunc) has the kernel set the size to 0
	// and drop the pages itself when it gets the answer. A notification
	// now would only count as an attribute change racing with the reads
	// under way, which then may not lower the kernel's size at their
	// short answers (fuse_read_update_size) and leave a zeroed page
	// within the old size.
	if ok && flags&syscall.O_TRUNC == 0 && fs.server != nil {
		fs.server.InodeNotify(a.Ino, -1, 0) // attributes only; pages go with !KEEP_CACHE
	}
	return 0
}

func (fs *fileSystem) Open(cancel <-chan struct{}, in *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	// With atomic_o_trunc (mount.go) the kernel asks for O_TRUNC here
	// instead of with a SETATTR after the open: during a SETATTR of the
	// size the kernel keeps its old size over the pages that short READ
	// answers zeroed, so a read racing the truncate would return zeros.
	// The client truncates within the open, its reads of the file waiting
	// (client.SetAttr).
	flags := int(in.Flags)
	f, err := fs.c.Open(fs.ctx(), in.NodeId, flags)
	if errors.Is(err, syscall.ENOENT) {
		// The inode is gone (removed, or unlinked and open nowhere)
		// while the kernel still holds a name for it: an unlink on
		// another thread, or another mount, not answered to the kernel
		// yet. ENOENT would fail this open while a stat of the name
		// right after still found the file in the kernel's caches.
		// ESTALE has the kernel look the name up again (open(2) retries
		// once with LOOKUP_REVAL on ESTALE: fs/namei.c do_filp_open), and
		// the lookup answers ENOENT and drops the name, or finds the
		// file now behind it.
		// The retry's lookup may have been answered before the removal
		// and found the name still behind this inode, or behind another
		// one removed in turn (names re-created and removed fast): that
		// caller's second stale open answers ENOENT, which the kernel
		// would otherwise pass on as ESTALE, and the kernel's attributes
		// of the inode go (stale.go).
		if fs.staleAgain(in.Pid, in.NodeId) {
			if fs.server != nil {
				fs.server.InodeNotify(in.NodeId, -1, 0)
			}
			return fs.errno("open", in.NodeId, err)
		}
		fs.log.Debug("open of a removed inode: stale name", "ino", in.NodeId, "err", err)
		return gofuse.Status(syscall.ESTALE)
	}
	if err != nil {
		return fs.errno("open", in.NodeId, err)
	}
	out.Fh = fs.addHandle(f)
	out.OpenFlags = fs.openFlags(f, in.Flags)
	return gofuse.OK
}

func (fs *fileSystem) Create(cancel <-chan struct{}, in *gofuse.CreateIn, name string, out *gofuse.CreateOut) gofuse.Status {
	flags := int(in.Flags) &^ (syscall.O_TRUNC | syscall.O_CREAT | syscall.O_EXCL)
	f, err := fs.c.CreateOpen(fs.ctx(), in.NodeId, name, in.Mode, in.Uid, in.Gid, flags)
	if err != nil {
		return fs.errno("create", in.NodeId, err)
	}
	fs.answerCreate(f, in, out)
	return gofuse.OK
}

// answerCreate fills the answer to a create of f: its entry and handle.
func (fs *fileSystem) answerCreate(f *client.File, in *gofuse.CreateIn, out *gofuse.CreateOut) {
	a := f.Attr()
	fs.fillEntry(&a, &out.EntryOut)
	out.Fh = fs.addHandle(f)
	if in.Flags&syscall.O_DIRECT != 0 {
		out.OpenFlags = gofuse.FOPEN_DIRECT_IO
	}
}

// Tmpfile answers open(2) with O_TMPFILE: a regular file in no directory,
// open for the caller. It gets a name only through linkat (the kernel
// allows that unless O_EXCL was given); otherwise its data goes after the
// last close. A metadata service without it answers ENOSYS, which the
// kernel keeps for the mount: O_TMPFILE then fails with EOPNOTSUPP and
// programs fall back to named temporary files.
func (fs *fileSystem) Tmpfile(cancel <-chan struct{}, in *gofuse.CreateIn, out *gofuse.CreateOut) gofuse.Status {
	flags := int(in.Flags) &^ (syscall.O_TRUNC | syscall.O_CREAT | syscall.O_EXCL | unix.O_TMPFILE)
	f, err := fs.c.TmpfileOpen(fs.ctx(), in.NodeId, in.Mode, in.Uid, in.Gid, flags)
	if err != nil {
		return fs.errno("tmpfile", in.NodeId, err)
	}
	fs.answerCreate(f, in, out)
	return gofuse.OK
}

func (fs *fileSystem) Read(cancel <-chan struct{}, in *gofuse.ReadIn, buf []byte) (gofuse.ReadResult, gofuse.Status) {
	h := fs.handle(in.Fh)
	if h == nil {
		return nil, gofuse.EBADF
	}
	d, err := h.f.ReadBuffers(fs.ctx(), buf[:min(len(buf), int(in.Size))], int64(in.Offset))
	if err != nil {
		return nil, fs.errno("read", in.NodeId, err)
	}
	if d.Len() == 0 {
		d.Release()
		return gofuse.ReadResultData(nil), gofuse.OK
	}
	if b := d.Bufs; len(b) == 1 && &b[0][0] == &buf[0] {
		d.Release() // our own buffer: nothing to give back
		return gofuse.ReadResultData(b[0]), gofuse.OK
	}
	return &readResult{d: d}, gofuse.OK
}

// readResult answers a read with the client's read-ahead buffers, written
// to /dev/fuse with one writev (go-fuse's vectored path, taken for results
// with a Slices method) instead of being copied into the request buffer
// first. go-fuse calls Done after the write; then the buffers go back.
type readResult struct {
	d client.ReadData
}

func (r *readResult) Size() int { return r.d.Len() }

func (r *readResult) Slices() ([][]byte, gofuse.Status) { return r.d.Bufs, gofuse.OK }

func (r *readResult) Bytes(buf []byte) ([]byte, gofuse.Status) {
	buf = buf[:0]
	for _, b := range r.d.Bufs {
		buf = append(buf, b...)
	}
	return buf, gofuse.OK
}

func (r *readResult) Done() { r.d.Release() }

func (fs *fileSystem) Write(cancel <-chan struct{}, in *gofuse.WriteIn, data []byte) (uint32, gofuse.Status) {
	h := fs.handle(in.Fh)
	if h == nil {
		return 0, gofuse.EBADF
	}
	n, err := h.f.WriteAt(fs.ctx(), data, int64(in.Offset))
	if err != nil {
		return 0, fs.errno("write", in.NodeId, err)
	}
	return uint32(n), gofuse.OK
}

func (fs *fileSystem) Flush(cancel <-chan struct{}, in *gofuse.FlushIn) gofuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return gofuse.EBADF
	}
	err := h.f.Flush(fs.ctx())
	// After the data: whoever takes the lock next reads what was written.
	fs.releasePosixLocks(in.NodeId, in.LockOwner)
	if err == nil {
		// The kernel's page cache holds what we wrote: keep it valid for
		// the next open if nobody else changes the file.
		a := h.f.Committed()
		if a.Ino != 0 {
			fs.notes.report(a.Ino, reportedAttr{size: a.Size, mtime: a.Mtime})
			fs.noteBlocks(&a)
		}
	}
	return fs.errno("flush", in.NodeId, err)
}

// maxCopyCall bounds one copy_file_range request (the answer is 32 bits;
// callers loop), so that one request does not hold a handler for long.
const maxCopyCall = 256 << 20

// CopyFileRange serves copy_file_range (cp uses it first) in the daemon:
// the data goes from the source's stores to the destination's through the
// client, instead of the kernel's fallback reading pages through FUSE and
// writing them back 64 KiB at a time. The kernel has checked the handles'
// modes, the ranges and that they do not overlap.
func (fs *fileSystem) CopyFileRange(cancel <-chan struct{}, in *gofuse.CopyFileRangeIn) (uint32, gofuse.Status) {
	src, dst := fs.handle(in.FhIn), fs.handle(in.FhOut)
	if src == nil || dst == nil {
		return 0, gofuse.EBADF
	}
	if in.Flags != 0 || in.OffIn > math.MaxInt64 || in.OffOut > math.MaxInt64 {
		return 0, gofuse.EINVAL
	}
	n, err := client.CopyRange(fs.ctx(), src.f, int64(in.OffIn), dst.f, int64(in.OffOut), int64(min(in.Len, maxCopyCall)), cancel)
	if n > 0 {
		return uint32(n), gofuse.OK // what was copied; the caller asks again for the rest
	}
	if err != nil {
		return 0, fs.errno("copy_file_range", in.NodeId, err)
	}
	return 0, gofuse.OK
}

// Lseek answers SEEK_DATA and SEEK_HOLE (the kernel handles the other
// whences itself), so that sparse-aware tools (cp, tar --sparse, backup
// programs) skip the holes of striped files instead of reading zeros.
func (fs *fileSystem) Lseek(cancel <-chan struct{}, in *gofuse.LseekIn, out *gofuse.LseekOut) gofuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return gofuse.EBADF
	}
	if in.Whence != unix.SEEK_DATA && in.Whence != unix.SEEK_HOLE {
		return gofuse.EINVAL
	}
	if in.Offset > math.MaxInt64 {
		return gofuse.Status(syscall.ENXIO)
	}
	off, err := h.f.Seek(fs.ctx(), int64(in.Offset), in.Whence == unix.SEEK_DATA)
	if err != nil {
		return fs.errno("lseek", in.NodeId, err)
	}
	out.Offset = uint64(off)
	return gofuse.OK
}

func (fs *fileSystem) Fsync(cancel <-chan struct{}, in *gofuse.FsyncIn) gofuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return gofuse.EBADF
	}
	err := h.f.Fsync(fs.ctx())
	if err == nil {
		a := h.f.Committed()
		fs.noteBlocks(&a)
	}
	return fs.errno("fsync", in.NodeId, err)
}

// noteBlocks has the kernel drop its cached attributes of a file whose
// space a size commit changed from what the kernel was last told.
func (fs *fileSystem) noteBlocks(a *rpc.Attr) {
	if !a.BlocksKnown || a.Ino == 0 {
		return
	}
	if fs.server != nil && fs.notes.blocksChanged(a.Ino, a.Blocks) {
		fs.server.InodeNotify(a.Ino, -1, 0) // attributes only
	}
}

func (fs *fileSystem) Release(cancel <-chan struct{}, in *gofuse.ReleaseIn) {
	v, ok := fs.files.LoadAndDelete(in.Fh)
	if !ok {
		return
	}
	// The handle is the open file description: its release drops the
	// locks still held through it (File.Release) — its OFD locks and
	// flocks, which is what FUSE_RELEASE_FLOCK_UNLOCK asks. Never by
	// owner (in.LockOwner): the kernel names owners by addresses, and this
	// release may arrive after a newer open got the same name and locked.
	h := v.(*fileHandle)
	if err := h.f.Release(fs.ctx()); err != nil {
		fs.errno("release", h.f.Ino(), err)
	}
}

// Linux fallocate modes.
const (
	fallocKeepSize  = 0x1
	fallocPunchHole = 0x2
)

func (fs *fileSystem) Fallocate(cancel <-chan struct{}, in *gofuse.FallocateIn) gofuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return gofuse.EBADF
	}
	off, n := int64(in.Offset), int64(in.Length)
	if err := h.f.CheckRange(off, n); err != nil { // EFBIG past the largest file, whatever the mode
		return fs.errno("fallocate", in.NodeId, err)
	}
	switch in.Mode {
	case 0:
		return fs.errno("fallocate", in.NodeId, h.f.Allocate(fs.ctx(), off, n))
	case fallocKeepSize:
		return gofuse.OK // nothing to reserve: chunks are sparse
	case fallocPunchHole | fallocKeepSize:
		return fs.errno("punch", in.NodeId, h.f.Punch(fs.ctx(), off, n))
	default:
		return gofuse.Status(syscall.EOPNOTSUPP)
	}
}

// lockOf converts a kernel lock request.
func lockOf(ino uint64, in *gofuse.LkIn) client.Lock {
	l := client.Lock{Ino: ino, Owner: in.Owner, Start: in.Lk.Start, End: in.Lk.End, Type: in.Lk.Typ,
		Pid: in.Lk.Pid, Flock: in.LkFlags&gofuse.FUSE_LK_FLOCK != 0}
	if l.End >= math.MaxInt64 {
		l.End = math.MaxUint64
	}
	if l.Flock {
		l.Start, l.End = 0, math.MaxUint64
	}
	return l
}

func (fs *fileSystem) GetLk(cancel <-chan struct{}, in *gofuse.LkIn, out *gofuse.LkOut) gofuse.Status {
	r, err := fs.c.GetLk(fs.ctx(), lockOf(in.NodeId, in))
	if err != nil {
		return fs.errno("getlk", in.NodeId, err)
	}
	out.Lk = gofuse.FileLock{Start: r.Start, End: r.End, Typ: r.Type, Pid: r.Pid}
	if r.End == math.MaxUint64 {
		out.Lk.End = math.MaxInt64
	}
	return gofuse.OK
}

func (fs *fileSystem) SetLk(cancel <-chan struct{}, in *gofuse.LkIn) gofuse.Status {
	return fs.setLk(cancel, in, false)
}

func (fs *fileSystem) SetLkw(cancel <-chan struct{}, in *gofuse.LkIn) gofuse.Status {
	return fs.setLk(cancel, in, true)
}

func (fs *fileSystem) setLk(cancel <-chan struct{}, in *gofuse.LkIn, wait bool) gofuse.Status {
	l := lockOf(in.NodeId, in)
	h := fs.handle(in.Fh)
	if !l.Flock && l.Type != rpc.LockUnlock {
		fs.noteOwner(in.NodeId, l.Owner)
	}
	if h != nil {
		// Through the handle: a loss of the owner's locks fails it.
		err := h.f.SetLk(fs.ctx(), l, wait, cancel)
		if err == nil && l.Type != rpc.LockUnlock && fs.server != nil {
			// The kernel's pages of the file may predate what the
			// previous holder wrote on another mount: drop them, so that
			// reads under the lock see it (as NFS does at lock time).
			fs.server.InodeNotify(in.NodeId, 0, 0)
		}
		return fs.errno("setlk", in.NodeId, err)
	}
	return fs.errno("setlk", in.NodeId, fs.c.SetLk(fs.ctx(), l, wait, cancel))
}

// noteOwner records that owner took a record lock on ino, so that a
// flush by that owner releases it.
func (fs *fileSystem) noteOwner(ino uint64, owner uint64) {
	fs.lockMu.Lock()
	defer fs.lockMu.Unlock()
	m := fs.lockOwners[ino]
	if m == nil {
		m = map[uint64]struct{}{}
		fs.lockOwners[ino] = m
	}
	m[owner] = struct{}{}
}

// releasePosixLocks drops owner's record locks on ino when the owner took
// any through this mount (POSIX: closing any descriptor of a file releases
// the process's locks on it).
func (fs *fileSystem) releasePosixLocks(ino, owner uint64) {
	fs.lockMu.Lock()
	m := fs.lockOwners[ino]
	_, held := m[owner]
	if held {
		delete(m, owner)
		if len(m) == 0 {
			delete(fs.lockOwners, ino)
		}
	}
	fs.lockMu.Unlock()
	if !held {
		return
	}
	l := client.Lock{Ino: ino, Owner: owner, Start: 0, End: math.MaxUint64, Type: rpc.LockUnlock}
	if err := fs.c.SetLk(fs.ctx(), l, false, nil); err != nil {
		fs.log.Warn("lock release at close failed", "ino", ino, "err", err)
	}
}
