package store

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Crash consistency of data and checksums
//
// Invariant: for every chunk whose sidecar says "clean" and that its
// target's intent log (dirty.log) does not name, each block's stored sum
// matches the block's data on stable storage, so a mismatch at read time is
// corruption and answers EIO. A chunk may differ from its sums on disk only
// while its sidecar says "dirty" or the log names it, and such a chunk is
// never trusted after a crash: its sums are recomputed from its data before
// it serves.
//
// Why: data and sums live in two files (or two places of one file) and no
// file system orders their write-back. After a crash before fsync, a block's
// new data may be on disk without its new sum, or the reverse. Neither was
// acknowledged as durable (Sync answers only after both are synced), so
// neither may turn into EIO — but a bit flipped in data that *was* synced
// must still be caught.
//
// Outline:
//   - The first mutation (write, truncate, punch) after a sync waits until
//     the chunk's record in the target's intent log is durable, *before*
//     touching data (beginMutation); the records of concurrent first
//     mutations on the target share one fdatasync (dirtylog.go). It also
//     sets the dirty flag in the sidecar header, without a sync: this
//     process reads it back after an eviction, and a crash that loses it
//     leaves the log's record. A target's open marks every chunk its log
//     names dirty in its sidecar (synced), then empties the log. A chunk
//     created by this process starts dirty without a record or a sync: any
//     state a crash can leave of a new sidecar (absent, short, zeros,
//     dirty) makes the next open recompute.
//   - Mutations then write sums and data through the page cache, so while
//     the process runs the two always agree (block range locks keep readers
//     from seeing one without the other).
//   - Sync makes data and sidecar durable (a syncfs round shared with the
//     target's concurrent syncs, or else an fdatasync of each: see
//     groupsync.go; a small chunk whose sums are inline in its data file's
//     attribute, inlinesums.go, is one fsync), then clears the flag — but
//     only if no mutation started since it sampled the mutation generation
//     (gen) under the flag's write lock; otherwise the chunk stays dirty.
//     Clearing needs no fsync: a lost clear only costs a recomputation.
//     Clearing also lets the intent log drop the chunk's record (the log
//     is cut back once no record in it names a chunk still dirty).
//   - Creating a chunk (and its fan-out directories) syncs nothing; Sync
//     also fsyncs the directories on the chunk's path that changed since
//     their last fsync (target.syncDirsOf), so a synced chunk is reachable
//     after a crash and an unsynced one may vanish whole.
//   - Opening a chunk whose sidecar is dirty and that this process did not
//     mark itself (target.ours) recomputes every block's sum from the data,
//     syncs, and clears the flag, logging how many sums changed.
//
// Rejected:
//   - Sums inside the data file, interleaved per block: one file, but every
//     read and write becomes a scatter/gather and the data no longer sits at
//     its chunk offset (no plain pread, no fallocate punch).
//   - A journal of (block, sum) records fsynced before each data write:
//     correct, but one fsync per write; buffered write speed is the point.
//   - Trusting sums after a crash and calling mismatches "torn writes":
//     indistinguishable from real corruption, so it either raises EIO for
//     data that was never acknowledged or hides rot of data that was.
//   - A dirty bit per block range instead of per chunk: smaller recovery
//     windows, but a flag fsync per range on the write path.
//   - An fdatasync of the sidecar's dirty flag per chunk (the design before
//     the intent log): one device flush per chunk per sync cycle, which
//     concurrent first mutations cannot share (docs/design/0010 § a4).
//
// Cost and limit: one intent-log fdatasync per batch of concurrent first
// mutations on a target, per sync cycle of their chunks; recovery reads
// whole dirty chunks. Within a chunk that was dirty at the crash, rot
// of blocks synced before the crash is re-blessed by the recomputation (it
// cannot be told apart from an unsynced write); the recovery log line says
// how many sums changed.

// Block range locks: a chunk's offsets are cut into regions of 1 MiB, mapped
// onto regionStripes RWMutexes; an operation locks the stripes of the regions
// it touches in ascending stripe order (so no deadlock). Writes lock
// exclusively, reads shared: a reader never sees a block's new data with its
// old sum. Writers of disjoint 1 MiB ranges (N-to-1) mostly run in parallel.
const (
	regionShift   = 20
	regionStripes = 32
	allStripes    = ^uint32(0)
)

// Streaming write-out: a chunk written as one sequential run (each write
// starting where the previous one ended, as striped streaming writes
// arrive) gets the write-out of every writeOutBytes of the run started at
// once (sync_file_range WRITE), instead of leaving it dirty in the page
// cache until a sync or the kernel's background threshold (10% of memory)
// comes. The disk then works while the data arrives, and the fsync or
// close that ends a stream finds little left to write: 4 × 512 MiB written
// and fsynced spent 0.6–1 s in fsync before, 0.03–0.1 s after. Random and
// interleaved writes never complete a run and start nothing; the
// durability rules above do not change (only Sync makes data durable).
const writeOutBytes = 4 << 20

// errNotExist: the chunk has no data file (and create was not asked).
var errNotExist = errors.New("chunk does not exist")

// errRemoved: the handle was removed while the caller waited for its locks;
// look the chunk up again.
var errRemoved = errors.New("chunk removed")

// chunk is one open chunk: the data and sidecar descriptors and the state
// that keeps them consistent. Handles are shared through chunkCache and
// reference counted; the descriptors stay valid while a reference is held.
type chunk struct {
	t      *target
	ino    uint64
	dataFd int // -1 until opened
	sumFd  int // the sidecar; -1 for an inline chunk
	// inl holds the sums of an inline chunk (inlinesums.go), nil for a
	// chunk with a sidecar. Set at open; becomes nil (never the reverse)
	// only with every region locked, inside a mutation.
	inl atomic.Pointer[inlineSums]

	// Guarded by chunkCache.mu.
	refs  int
	gone  bool          // no longer in the cache map: the last release closes
	elem  *list.Element // position in the LRU list
	ready chan struct{} // closed when open finished; then openErr is set
	// wantCreate: a creator waits on this handle's open, which does not
	// create; should that find no chunk, it creates one instead.
	wantCreate bool
	// openErr is written once before ready is closed.
	openErr error

	// size is the data file's length. Updated by writers (atomic max)
	// before they release their region locks, and by truncate under all
	// region locks.
	size atomic.Int64

	regions [regionStripes]sync.RWMutex

	// flag guards the sidecar's dirty flag. Mutations hold it shared for
	// their whole duration (beginMutation/endMutation); setting and
	// clearing the flag hold it exclusively.
	flag struct {
		sync.RWMutex
		dirty   bool // the on-disk header says dirty (or will before any data write)
		removed bool // files unlinked; the handle must not be used for writes
	}
	// pages: the sidecar's sums of recently read regions (sumcache.go).
	pages sumPages

	// gen counts mutations; Sync clears the flag only if it did not move.
	gen atomic.Uint64
	// dirtyEpoch is the target's error epoch (groupSync.errEpoch) when
	// the chunk last became dirty; 0 for a chunk found dirty at open.
	dirtyEpoch atomic.Uint64

	// stream is the sequential run of writes being followed (see
	// Streaming write-out): end is where the last write ended, from where
	// the part of the run not handed to write-out yet begins.
	stream struct {
		sync.Mutex
		end, from int64
	}
}

func (c *chunk) name() string { return fmt.Sprintf("%x", c.ino) }

// open opens (or, with create, creates) the chunk's files and brings the
// sums up to date if a crash left them dirty.
func (c *chunk) open(create bool, s *Server) error {
	dir, base := c.t.chunkPath(c.ino)
	dataPath := filepath.Join(dir, base+".data")
	sumPath := filepath.Join(dir, base+".sum")
	created := false
	fd, err := c.t.openChunkFile(dataPath, unix.O_RDWR, 0)
	if errors.Is(err, unix.ENOENT) {
		if !create {
			return errNotExist
		}
		if err := c.t.coverIno(c.ino); err != nil {
			return c.ioErr("record the target's inode ceiling", 0, err)
		}
		if err := c.t.makeChunkDir(dir); err != nil {
			return c.ioErr("create chunk directory", 0, err)
		}
		fd, err = c.t.openChunkFile(dataPath, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o644)
		created = err == nil
		if errors.Is(err, unix.EEXIST) {
			fd, err = c.t.openChunkFile(dataPath, unix.O_RDWR, 0)
		}
	}
	if err != nil {
		return c.ioErr("open data file", 0, err)
	}
	c.dataFd = fd
	if created {
		if c.t.sums == sumsInline {
			// No attribute until the first write: a data file with
			// neither attribute nor sidecar is recomputed after a crash
			// (empty, or holes only, it has nothing to check). A
			// leftover sidecar (a remove cut by a crash) would take
			// precedence: remove it.
			if err := unix.Unlink(sumPath); err != nil && !errors.Is(err, unix.ENOENT) {
				return c.ioErr("remove stale sidecar", 0, err)
			}
			c.inl.Store(&inlineSums{flags: flagDirty})
		} else {
			// A leftover sidecar (a remove cut by a crash) is stale: truncate.
			sfd, err := c.t.openChunkFile(sumPath, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o644)
			if err != nil {
				return c.ioErr("create sidecar", 0, err)
			}
			c.sumFd = sfd
		}
		c.t.createdIn(dir)
		c.flag.dirty = true
		c.t.noteDirty(c.ino)
		c.dirtyEpoch.Store(c.t.gs.errEpoch.Load())
		if c.sumFd < 0 {
			return nil
		}
		return c.writeHeader(flagDirty, false)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return c.ioErr("stat data file", 0, err)
	}
	c.size.Store(st.Size)
	if c.t.sums == sumsInline {
		flags, sums, found, err := readInline(fd)
		var damaged errInlineDamaged
		switch {
		case errors.As(err, &damaged):
			s.log.Error("chunk inline sums damaged", "target", c.t.path, "ino", c.name(), "err", err)
			c.t.m.csumErrors.Inc()
			return rpc.Errorf(syscall.EIO, "target %s chunk %x: inline sums damaged: %v", c.t.path, c.ino, err)
		case err != nil:
			return c.ioErr("read inline sums", 0, err)
		case found:
			c.inl.Store(&inlineSums{flags: flags, sums: sums})
			return c.settle(s, headerOK, flags)
		}
	}
	state := headerMissing
	var hdr sumHeader
	sfd, err := c.t.openChunkFile(sumPath, unix.O_RDWR, 0)
	if errors.Is(err, unix.ENOENT) {
		if c.t.sums == sumsInline {
			// Neither form: a new chunk (or a conversion) cut by a crash,
			// or evicted by this process before its first write.
			c.inl.Store(&inlineSums{flags: flagDirty})
			if c.t.isOurs(c.ino) {
				c.flag.dirty = true // every write of this process set the attribute
				return nil
			}
			return c.recover(s, headerMissing)
		}
		sfd, err = c.t.openChunkFile(sumPath, unix.O_RDWR|unix.O_CREAT, 0o644)
	} else if err == nil {
		var b [sumHeaderBytes]byte
		n, rerr := preadFull(sfd, b[:], 0)
		if rerr != nil {
			unix.Close(sfd)
			return c.ioErr("read sidecar header", 0, rerr)
		}
		var herr error
		hdr, state, herr = decodeSumHeader(b[:n], c.ino)
		if state == headerCorrupt {
			unix.Close(sfd)
			s.log.Error("chunk sidecar damaged", "target", c.t.path, "ino", c.name(), "err", herr)
			c.t.m.csumErrors.Inc()
			return rpc.Errorf(syscall.EIO, "target %s chunk %x: sidecar damaged: %v", c.t.path, c.ino, herr)
		}
	}
	if err != nil {
		return c.ioErr("open sidecar", 0, err)
	}
	c.sumFd = sfd
	return c.settle(s, state, hdr.flags)
}

// settle decides, once the sums are found (state, and the flags they
// carry), whether they can be trusted or must be recomputed.
func (c *chunk) settle(s *Server, state headerState, flags uint16) error {
	switch {
	case state == headerOK && flags&flagDirty == 0:
		return nil
	case state == headerOK && c.t.isOurs(c.ino):
		// Marked dirty by this process and closed before a sync: sums and
		// data went through the same page cache and agree.
		c.flag.dirty = true
		return nil
	default:
		return c.recover(s, state)
	}
}

// recover recomputes every block's sum from the data after an unclean
// shutdown (see the essay above), then marks the chunk clean.
func (c *chunk) recover(s *Server, state headerState) error {
	if err := fdatasync(c.dataFd); err != nil {
		return c.ioErr("sync data before recovery", 0, err)
	}
	size := c.size.Load()
	if c.outgrows(size) {
		// Extended past the inline limit by a mutation a crash cut
		// before its sums moved: they move now, then are recomputed.
		if err := c.convertToSidecar(); err != nil {
			return err
		}
	}
	const batch = 1 << 20
	dp := getBuf(batch)
	defer putBuf(dp)
	sp := getBuf(4 * (batch / blockSize))
	defer putBuf(sp)
	var changed, total int64
	for off := int64(0); off < size; off += batch {
		n := min(batch, size-off)
		data := (*dp)[:n]
		m, err := preadFull(c.dataFd, data, off)
		if err != nil {
			return c.ioErr("read during recovery", off, err)
		}
		clear(data[m:])
		nb := blocks(n)
		sums := (*sp)[:4*nb]
		k, err := c.readSums(sums, off>>blockShift)
		if err != nil {
			return c.ioErr("read sums during recovery", off, err)
		}
		clear(sums[k:])
		for i := int64(0); i < nb; i++ {
			blk := data[i*blockSize : min((i+1)*blockSize, n)]
			sum := storedSum(blk)
			if getU32(sums[4*i:]) != sum {
				changed++
				putU32(sums[4*i:], sum)
			}
		}
		total += nb
		if _, err := c.writeSums(sums, off>>blockShift); err != nil {
			return c.ioErr("write sums during recovery", off, err)
		}
	}
	if err := c.truncateSums(blocks(size)); err != nil {
		return c.ioErr("truncate sums during recovery", 0, err)
	}
	if c.inl.Load() == nil {
		if err := fdatasync(c.sumFd); err != nil {
			return c.ioErr("sync sums during recovery", 0, err)
		}
	}
	if err := c.writeHeader(0, true); err != nil {
		return err
	}
	why := "dirty since last sync"
	if state == headerMissing {
		why = "sums missing or incomplete"
	}
	s.log.Warn("recomputed chunk checksums after unclean shutdown", "target", c.t.path, "ino", c.name(),
		"reason", why, "blocks", total, "changed", changed)
	return nil
}

// writeHeader writes the sidecar header (or the inline sums) with flags,
// and syncs it when sync.
func (c *chunk) writeHeader(flags uint16, sync bool) error {
	if inl := c.inl.Load(); inl != nil {
		inl.mu.Lock()
		err := writeInline(c.dataFd, flags, inl.sums)
		if err == nil {
			inl.flags = flags
		}
		inl.mu.Unlock()
		if err != nil {
			return c.ioErr("write inline sums", 0, err)
		}
		if sync {
			if err := fsync(c.dataFd); err != nil {
				return c.ioErr("sync inline sums", 0, err)
			}
		}
		return nil
	}
	h := sumHeader{version: sumFormat, flags: flags, block: blockSize, ino: c.ino}.encode()
	if err := pwriteFull(c.sumFd, h[:], 0); err != nil {
		return c.ioErr("write sidecar header", 0, err)
	}
	if sync {
		if err := fdatasync(c.sumFd); err != nil {
			return c.ioErr("sync sidecar header", 0, err)
		}
	}
	return nil
}

// beginMutation makes sure the chunk is durably known to be dirty, then
// holds the flag shared until endMutation: the first mutation of a clean
// chunk waits for its record in the target's intent log (a sync shared
// with the target's other first mutations, dirtylog.go), then sets the
// sidecar's dirty flag without a sync. On success the caller must call
// endMutation.
func (c *chunk) beginMutation() error {
	c.flag.RLock()
	for !c.flag.dirty || c.flag.removed {
		if c.flag.removed {
			c.flag.RUnlock()
			return errRemoved
		}
		c.flag.RUnlock()
		c.flag.Lock()
		if !c.flag.dirty && !c.flag.removed {
			if err := c.t.dlog.record(c.ino); err != nil {
				c.flag.Unlock()
				return c.ioErr("record the chunk in the intent log", 0, err)
			}
			if err := c.writeHeader(flagDirty, false); err != nil {
				c.flag.Unlock()
				return err
			}
			c.flag.dirty = true
			c.dirtyEpoch.Store(c.t.gs.errEpoch.Load())
			c.t.noteDirty(c.ino)
		}
		c.flag.Unlock()
		c.flag.RLock()
	}
	c.gen.Add(1)
	return nil
}

func (c *chunk) endMutation() { c.flag.RUnlock() }

// stripeMask returns the lock stripes covering [off, end).
func stripeMask(off, end int64) uint32 {
	if end <= off {
		end = off + 1
	}
	r0, r1 := off>>regionShift, (end-1)>>regionShift
	if r1-r0+1 >= regionStripes {
		return allStripes
	}
	var m uint32
	for r := r0; r <= r1; r++ {
		m |= 1 << (r % regionStripes)
	}
	return m
}

func (c *chunk) lock(m uint32, excl bool) {
	for mm := m; mm != 0; mm &= mm - 1 {
		i := bits.TrailingZeros32(mm)
		if excl {
			c.regions[i].Lock()
		} else {
			c.regions[i].RLock()
		}
	}
}

func (c *chunk) unlock(m uint32, excl bool) {
	for mm := m; mm != 0; mm &= mm - 1 {
		i := bits.TrailingZeros32(mm)
		if excl {
			c.regions[i].Unlock()
		} else {
			c.regions[i].RUnlock()
		}
	}
}

// growSize raises size to at least end.
func (c *chunk) growSize(end int64) {
	for {
		cur := c.size.Load()
		if cur >= end || c.size.CompareAndSwap(cur, end) {
			return
		}
	}
}

// write stores data at off. The caller checked bounds and space.
//
// data may be lent by an in-process caller (its own buffer, e.g. a FUSE
// request's): write reads it only once the range is locked and the caller
// still waits (transport.UseLent), and holds the caller until it is done with it.
// A caller that gave up while the write waited for its range gets nothing
// written (a later write of the range may have been served meanwhile, and
// its buffer may serve another request by now).
func (c *chunk) write(ctx context.Context, s *Server, off int64, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	if err := c.beginMutation(); err != nil {
		return err
	}
	defer c.endMutation()
	end := off + int64(len(data))
	if err := c.growForm(end); err != nil {
		return err
	}
	mask := stripeMask(off, end)
	c.lock(mask, true)
	locked := true
	defer func() {
		if locked {
			c.unlock(mask, true)
		}
	}()
	if !transport.UseLent(ctx) {
		return rpc.Errorf(syscall.EIO, "target %s chunk %x: write at %d abandoned by its caller before it began", c.t.path, c.ino, off)
	}
	defer transport.DoneLent(ctx)
	if h := testHookWriteLocked.Load(); h != nil {
		(*h)()
	}

	oldSize := c.size.Load()
	b0, b1 := off>>blockShift, blocks(end)
	nb := b1 - b0
	sp := getBuf(int(8 * nb))
	defer putBuf(sp)
	newSums, oldSums := (*sp)[:4*nb], (*sp)[4*nb:8*nb]
	k, err := c.readSums(oldSums, b0)
	if err != nil {
		return c.ioErr("read sums", off, err)
	}
	clear(oldSums[k:])

	// Sums of fully covered blocks come straight from the request; the
	// (at most two) edge blocks are read, verified, and merged.
	for i := int64(0); i < nb; i++ {
		bs := (b0 + i) << blockShift
		be := bs + blockSize
		if off <= bs && end >= be {
			putU32(newSums[4*i:], storedSum(data[bs-off:be-off]))
			continue
		}
		var blk [blockSize]byte
		if bs < oldSize {
			if err := c.readBlock(s, blk[:], bs, getU32(oldSums[4*i:])); err != nil {
				return err
			}
		}
		lo, hi := max(off, bs), min(end, be)
		copy(blk[lo-bs:hi-bs], data[lo-off:hi-off])
		putU32(newSums[4*i:], storedSum(blk[:]))
	}

	// Sums first: if they cannot be written, the data is untouched and the
	// old sums go back.
	if n, err := c.writeSums(newSums, b0); err != nil {
		if n > 0 {
			_, _ = c.writeSums(oldSums[:n], b0) // allocated already: cannot fail for space
		}
		return c.ioErr("write sums", off, err)
	}
	n, err := pwritePartial(c.dataFd, data, off)
	if err != nil {
		c.repairFailedWrite(s, off, data, n, oldSums, newSums)
		c.unlock(mask, true)
		locked = false
		c.trimFailedWrite(s)
		return c.ioErr("write", off, err)
	}
	c.growSize(end)
	c.t.noteWritten(c.ino, len(data))
	c.unlock(mask, true)
	locked = false
	c.streamWrote(off, end)
	return nil
}

// streamWrote follows the sequential run of writes after one of [off, end)
// succeeded, and starts the write-out of the run's part not started yet
// once it reaches writeOutBytes. A failed start is harmless: Sync writes
// what is still dirty.
func (c *chunk) streamWrote(off, end int64) {
	c.stream.Lock()
	if off != c.stream.end {
		c.stream.from = off // a new run
	}
	c.stream.end = end
	from := c.stream.from
	if end-from < writeOutBytes {
		c.stream.Unlock()
		return
	}
	c.stream.from = end
	c.stream.Unlock()
	if h := testHookWriteOut.Load(); h != nil {
		(*h)(from, end)
	}
	_ = unix.SyncFileRange(c.dataFd, from, end-from, unix.SYNC_FILE_RANGE_WRITE)
}

// testHookWriteOut, when set (tests), sees every write-out streamWrote
// starts.
var testHookWriteOut atomic.Pointer[func(from, end int64)]

// testHookFdatasync, when set (tests), sees the descriptor of every
// fdatasync of a chunk file or the intent log.
var testHookFdatasync atomic.Pointer[func(fd int)]

// testHookWriteLocked, when set (tests), runs in write once the range is
// locked and the caller was still there, before anything is summed or
// written.
var testHookWriteLocked atomic.Pointer[func()]

// repairFailedWrite makes the sums of [off, off+len(data)) match the data
// after a pwrite that stored only its first n bytes. Called with the range
// locked. Blocks entirely written keep their new sums, blocks not reached
// get their old sums back, and the block where the write stopped (or an
// edge block it did not finish) is summed from what is on disk now.
func (c *chunk) repairFailedWrite(s *Server, off int64, data []byte, n int, oldSums, newSums []byte) {
	end, wend := off+int64(len(data)), off+int64(n)
	b0 := off >> blockShift
	for i := int64(0); i < int64(len(newSums)/4); i++ {
		bs := (b0 + i) << blockShift
		be := bs + blockSize
		lo, hi := max(off, bs), min(end, be) // the part this write meant to change
		switch {
		case hi <= wend:
			// all written: the new sum holds
		case lo >= wend:
			copy(newSums[4*i:4*i+4], oldSums[4*i:4*i+4])
		default:
			var blk [blockSize]byte
			m, err := preadFull(c.dataFd, blk[:], bs)
			if err != nil {
				s.log.Error("cannot repair sums after failed write", "target", c.t.path, "ino", c.name(), "off", bs, "err", err)
				continue
			}
			clear(blk[m:])
			putU32(newSums[4*i:], storedSum(blk[:]))
		}
	}
	if _, err := c.writeSums(newSums, b0); err != nil {
		s.log.Error("cannot repair sums after failed write", "target", c.t.path, "ino", c.name(), "off", off, "err", err)
	}
}

// trimFailedWrite cuts the data file back to the size every successful
// write agrees on, dropping bytes a failed write left past the end of file.
// Runs with all regions locked so that no writer is between its pwrite and
// its size update.
func (c *chunk) trimFailedWrite(s *Server) {
	c.lock(allStripes, true)
	defer c.unlock(allStripes, true)
	var st unix.Stat_t
	if err := unix.Fstat(c.dataFd, &st); err != nil {
		return
	}
	size := c.size.Load()
	if st.Size <= size {
		return
	}
	if err := c.setLength(s, size, st.Size); err != nil {
		s.log.Error("cannot trim chunk after failed write", "target", c.t.path, "ino", c.name(), "err", err)
	}
}

// readBlock reads the block at bs (blockSize bytes, zeros past the end of
// file) into blk and verifies it against want.
func (c *chunk) readBlock(s *Server, blk []byte, bs int64, want uint32) error {
	m, err := preadFull(c.dataFd, blk, bs)
	if err != nil {
		return c.ioErr("read", bs, err)
	}
	clear(blk[m:])
	if got := storedSum(blk); got != want {
		return c.corrupt(s, bs, got, want)
	}
	return nil
}

// corrupt logs a checksum mismatch and returns the EIO answer.
func (c *chunk) corrupt(s *Server, off int64, got, want uint32) error {
	c.t.m.csumErrors.Inc()
	s.log.Error("checksum mismatch: refusing to return corrupt data", "target", c.t.path, "ino", c.name(),
		"offset", off, "block", off>>blockShift, "stored", fmt.Sprintf("%08x", want), "computed", fmt.Sprintf("%08x", got))
	return rpc.Errorf(syscall.EIO, "target %s chunk %x: checksum mismatch in block at offset %d (data corrupt on disk)", c.t.path, c.ino, off)
}

// read returns up to n bytes at off, short only at the end of the chunk.
// With dest (an in-process caller's own buffer, transport.LocalReadDest) and an
// aligned range that fits it, the blocks are read and verified in dest
// itself and the answer aliases it: one copy of every byte less. A
// checksum failure then leaves unverified bytes in dest, which the caller
// drops on the error.
func (c *chunk) read(s *Server, off int64, n int, dest []byte) (*readResp, error) {
	mask := stripeMask(off, off+int64(n))
	c.lock(mask, false)
	defer c.unlock(mask, false)
	size := c.size.Load()
	if off >= size || n == 0 {
		return &readResp{}, nil
	}
	n = int(min(int64(n), size-off))
	end := off + int64(n)
	a0 := off &^ (blockSize - 1)
	a1 := blocks(end) << blockShift
	var bp *[]byte
	var buf []byte
	if off == a0 && int64(len(dest)) >= a1-a0 {
		buf = dest[:a1-a0]
	} else {
		bp = getBuf(int(a1 - a0))
		buf = *bp
	}
	m, err := preadFull(c.dataFd, buf, a0)
	if err != nil {
		putBuf(bp)
		return nil, c.ioErr("read", off, err)
	}
	clear(buf[m:])
	nb := (a1 - a0) >> blockShift
	sp := getBuf(int(4 * nb))
	defer putBuf(sp)
	sums := *sp
	k, err := c.readSumsCached(sums, a0>>blockShift)
	if err != nil {
		putBuf(bp)
		return nil, c.ioErr("read sums", off, err)
	}
	clear(sums[k:])
	for i := int64(0); i < nb; i++ {
		blk := buf[i*blockSize : (i+1)*blockSize]
		if got, want := storedSum(blk), getU32(sums[4*i:]); got != want {
			putBuf(bp)
			return nil, c.corrupt(s, a0+i*blockSize, got, want)
		}
	}
	r := &readResp{buf: bp}
	r.Data = buf[off-a0 : off-a0+int64(n)]
	return r, nil
}

// truncate sets the chunk's length.
func (c *chunk) truncate(s *Server, size int64) error {
	if err := c.beginMutation(); err != nil {
		return err
	}
	defer c.endMutation()
	c.lock(allStripes, true)
	defer c.unlock(allStripes, true)
	if c.outgrows(size) {
		if err := c.convertToSidecar(); err != nil {
			return err
		}
	}
	return c.setLength(s, size, c.size.Load())
}

// setLength changes the data file from old to size bytes and fixes the
// sums. Called with all regions locked and the flag held shared.
func (c *chunk) setLength(s *Server, size, old int64) error {
	if size < old && size%blockSize != 0 {
		// The new last block loses its tail: verify, then re-sum.
		bs := size &^ (blockSize - 1)
		var sb [4]byte
		k, err := c.readSums(sb[:], bs>>blockShift)
		if err != nil {
			return c.ioErr("read sums", bs, err)
		}
		clear(sb[k:])
		var blk [blockSize]byte
		if err := c.readBlock(s, blk[:], bs, getU32(sb[:])); err != nil {
			return err
		}
		clear(blk[size-bs:])
		var nsb [4]byte
		putU32(nsb[:], storedSum(blk[:]))
		if _, err := c.writeSums(nsb[:], bs>>blockShift); err != nil {
			return c.ioErr("write sums", bs, err)
		}
		if err := unix.Ftruncate(c.dataFd, size); err != nil {
			_, _ = c.writeSums(sb[:], bs>>blockShift)
			return c.ioErr("truncate", size, err)
		}
	} else if err := unix.Ftruncate(c.dataFd, size); err != nil {
		return c.ioErr("truncate", size, err)
	}
	if size < old {
		// Sums past the end must read as 0 (holes) for a later extension.
		if err := c.truncateSums(blocks(size)); err != nil {
			return c.ioErr("truncate sums", size, err)
		}
	}
	c.size.Store(size)
	return nil
}

// punch deallocates [off, off+n); the range reads as zeros afterwards.
func (c *chunk) punch(s *Server, off, n int64) error {
	if err := c.beginMutation(); err != nil {
		return err
	}
	defer c.endMutation()
	mask := stripeMask(off, off+n)
	c.lock(mask, true)
	defer c.unlock(mask, true)
	size := c.size.Load()
	end := min(off+n, size)
	if off >= end {
		return nil // past the end of file: nothing reads differently
	}
	// Edge blocks keep some data: verify them and compute their new sums
	// before the punch. Interior blocks become zeros, whose sum is 0.
	type edge struct {
		b   int64
		sum uint32
	}
	var edges [2]edge
	ne := 0
	firstFull, lastFull := blocks(off), end>>blockShift // [firstFull, lastFull) fully punched
	if end == size {
		lastFull = blocks(end) // the tail past EOF is zeros already
	}
	for _, b := range [2]int64{off >> blockShift, end >> blockShift} {
		if (b >= firstFull && b < lastFull) || b<<blockShift >= min(size, end) || (ne == 1 && edges[0].b == b) {
			continue
		}
		bs := b << blockShift
		var sb [4]byte
		k, err := c.readSums(sb[:], b)
		if err != nil {
			return c.ioErr("read sums", bs, err)
		}
		clear(sb[k:])
		var blk [blockSize]byte
		if err := c.readBlock(s, blk[:], bs, getU32(sb[:])); err != nil {
			return err
		}
		clear(blk[max(off, bs)-bs : min(end, bs+blockSize)-bs])
		edges[ne] = edge{b, storedSum(blk[:])}
		ne++
	}
	if err := unix.Fallocate(c.dataFd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, end-off); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return rpc.Errorf(syscall.EOPNOTSUPP, "target %s chunk %x: the target's file system cannot punch holes", c.t.path, c.ino)
		}
		return c.ioErr("punch", off, err)
	}
	if lastFull > firstFull {
		if err := c.zeroSumRange(firstFull, lastFull); err != nil {
			return c.ioErr("clear sums", off, err)
		}
	}
	for _, e := range edges[:ne] {
		var sb [4]byte
		putU32(sb[:], e.sum)
		if _, err := c.writeSums(sb[:], e.b); err != nil {
			return c.ioErr("write sums", e.b<<blockShift, err)
		}
	}
	return nil
}

// zeroSums sets the stored sums of blocks [b0, b1) to 0 by punching the
// sidecar (no allocation, so no ENOSPC).
func zeroSums(fd int, b0, b1 int64) error {
	err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, sumOff(b0), 4*(b1-b0))
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	for b := b0; b < b1; b += blockSize / 4 {
		n := min(b1-b, blockSize/4)
		if err := pwriteFull(fd, zeroBlock[:4*n], sumOff(b)); err != nil {
			return err
		}
	}
	return nil
}

// sync makes the chunk's data and sums durable and marks it clean.
func (c *chunk) sync() error {
	c.flag.Lock()
	dirty, removed := c.flag.dirty, c.flag.removed
	g0 := c.gen.Load()
	c.flag.Unlock()
	if !dirty || removed {
		return nil
	}
	// A round shared with the target's other syncs, or else (a failed
	// round, a dirty period across one, too much dirty memory) the
	// chunk's own files: see groupsync.go.
	epoch := c.dirtyEpoch.Load()
	grouped := c.t.canGroupSync(epoch) && c.t.gs.wait() == nil && c.t.gs.errEpoch.Load() == epoch
	if !grouped {
		if err := c.syncOwnFiles(); err != nil {
			return err
		}
	}
	c.flag.Lock()
	defer c.flag.Unlock()
	if c.flag.dirty && !c.flag.removed && c.gen.Load() == g0 {
		if err := c.writeHeader(0, false); err != nil {
			return err
		}
		c.flag.dirty = false
		c.t.forgetOurs(c.ino)
		c.t.dlog.clean(c.ino)
	}
	return nil
}

// syncOwnFiles fdatasyncs the chunk's data and sidecar and fsyncs the
// directories on its path that changed.
func (c *chunk) syncOwnFiles() error {
	if c.inl.Load() != nil {
		// The sums are inode metadata, which fdatasync may leave out.
		if err := fsync(c.dataFd); err != nil {
			return c.ioErr("sync data and inline sums", 0, err)
		}
	} else {
		if err := fdatasync(c.dataFd); err != nil {
			return c.ioErr("sync data", 0, err)
		}
		if err := fdatasync(c.sumFd); err != nil {
			return c.ioErr("sync sums", 0, err)
		}
	}
	dir, _ := c.t.chunkPath(c.ino)
	if err := c.t.syncDirsOf(dir); err != nil {
		return c.ioErr("sync chunk directory", 0, err)
	}
	return nil
}

// remove unlinks the chunk's files. Waits for operations in flight; later
// users of this handle see errRemoved.
func (c *chunk) remove() error {
	c.flag.Lock()
	defer c.flag.Unlock()
	c.lock(allStripes, true)
	defer c.unlock(allStripes, true)
	c.flag.removed = true
	return removeChunkFiles(c.t, c.ino)
}

func removeChunkFiles(t *target, ino uint64) error {
	dir, base := t.chunkPath(ino)
	// Data first: a crash in between leaves a stale sidecar, which the
	// next create truncates, never data without sums.
	err := unix.Unlink(filepath.Join(dir, base+".data"))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return rpc.Errorf(errnoOf(err), "target %s chunk %x: remove: %v", t.path, ino, err)
	}
	err = unix.Unlink(filepath.Join(dir, base+".sum"))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return rpc.Errorf(errnoOf(err), "target %s chunk %x: remove sidecar: %v", t.path, ino, err)
	}
	t.forgetOurs(ino)
	t.dlog.clean(ino)
	return nil
}

// closeFiles closes the descriptors. Called once, with no references left.
func (c *chunk) closeFiles() {
	c.pages.dropAll()
	if c.dataFd >= 0 {
		unix.Close(c.dataFd)
		c.dataFd = -1
	}
	if c.sumFd >= 0 {
		unix.Close(c.sumFd)
		c.sumFd = -1
	}
}

// ioErr turns a system call error into an rpc error naming target, chunk
// and offset, keeping the errno (ENOSPC, EIO, …).
func (c *chunk) ioErr(op string, off int64, err error) error {
	var re *rpc.Error
	if errors.As(err, &re) {
		return err
	}
	return rpc.Errorf(errnoOf(err), "target %s chunk %x: %s at offset %d: %v", c.t.path, c.ino, op, off, err)
}

func errnoOf(err error) syscall.Errno {
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return syscall.EIO
}

// openChunkFile opens a chunk's data file or sidecar with O_NOATIME: a
// chunk file's access time means nothing to Strata, and with the usual
// relatime the first read of a chunk written since its last read would
// otherwise dirty its inode — a journal handle in the read and an inode
// block written back later, for every small file of a cold read phase.
// O_NOATIME needs the caller to own the file (or CAP_FOWNER): on EPERM the
// open is made without it, and if that works, never tried again on t.
func (t *target) openChunkFile(path string, flags int, mode uint32) (int, error) {
	if !t.atimeDenied.Load() {
		fd, err := openRetry(path, flags|unix.O_NOATIME, mode)
		if err != unix.EPERM {
			return fd, err
		}
		fd, err = openRetry(path, flags, mode)
		if err == nil {
			t.atimeDenied.Store(true)
		}
		return fd, err
	}
	return openRetry(path, flags, mode)
}

// System call helpers: retry EINTR, loop over short transfers.

func openRetry(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// preadFull reads into b from off until b is full or end of file; it
// returns the bytes read.
func preadFull(fd int, b []byte, off int64) (int, error) {
	done := 0
	for done < len(b) {
		n, err := unix.Pread(fd, b[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			break
		}
		done += n
	}
	return done, nil
}

// pwritePartial writes all of b at off, or returns the bytes written with
// the error that stopped it.
func pwritePartial(fd int, b []byte, off int64) (int, error) {
	done := 0
	for done < len(b) {
		n, err := unix.Pwrite(fd, b[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, unix.EIO
		}
		done += n
	}
	return done, nil
}

func pwriteFull(fd int, b []byte, off int64) error {
	_, err := pwritePartial(fd, b, off)
	return err
}

func fdatasync(fd int) error { return syncFd(fd, unix.Fdatasync) }

// syncFd calls sync (fdatasync or fsync) on fd, retrying EINTR.
func syncFd(fd int, sync func(int) error) error {
	if h := testHookFdatasync.Load(); h != nil {
		(*h)(fd)
	}
	for {
		err := sync(fd)
		if err != unix.EINTR {
			return err
		}
	}
}

func getU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
