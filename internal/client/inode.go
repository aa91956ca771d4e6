package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"syscall"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// maxWbufBytes caps one write-behind buffer (one storage write).
const maxWbufBytes = 1 << 20

// maxInflight caps the storage writes in flight for one inode; it bounds
// the overlap scans below.
const maxInflight = 256

// wbuf is one storage write: bytes for one slot's chunk, contiguous in
// chunk space (it may hold several stripe units that are apart in the file).
type wbuf struct {
	slot     int
	chunkOff int64
	buf      []byte
	budgeted bool // len(buf) bytes are held in the client's budget
	pooled   bool // buf came from bufPool or smallPool (putBuf)
	sync     bool // WriteReq.Sync (O_SYNC writes)
	sticky   bool // a failure is also kept for the next Flush/Fsync (large buffered writes)
	done     chan struct{}
	err      error // valid after done
	// gen is the slot's allocGen once w was submitted; shared: another
	// write of the slot was in flight with w, so w's answer's space may
	// miss it (the server may stat the chunk before that write lands).
	gen    uint64
	shared bool
}

func (w *wbuf) end() int64 { return w.chunkOff + int64(len(w.buf)) }

func (w *wbuf) overlaps(slot int, off, end int64) bool {
	return w.slot == slot && w.chunkOff < end && off < w.end()
}

// smallWbufBytes is the size of the write-behind buffers of small writes
// (smallPool): a random 4 KiB writer took a fresh, zeroed 64 KiB buffer
// per write, whose clearing and collection cost more than the write.
const smallWbufBytes = 64 << 10

var (
	bufPool   = sync.Pool{New: func() any { b := make([]byte, maxWbufBytes); return &b }}
	smallPool = sync.Pool{New: func() any { b := make([]byte, smallWbufBytes); return &b }}
)

func getBuf() []byte      { return (*bufPool.Get().(*[]byte))[:0] }
func getSmallBuf() []byte { return (*smallPool.Get().(*[]byte))[:0] }

// putBuf gives a pooled buffer back to its pool (one grown out of its
// size by append is left to the collector).
func putBuf(b []byte) {
	switch cap(b) {
	case maxWbufBytes:
		b = b[:maxWbufBytes]
		bufPool.Put(&b)
	case smallWbufBytes:
		b = b[:smallWbufBytes]
		smallPool.Put(&b)
	}
}

// inode is the client-side state of a file that this client holds open:
// the write-behind buffers, the uncommitted size and mtime, and what must
// be synced. All handles of the file share it, so a read through one handle
// sees what another handle of the same client wrote.
type inode struct {
	c      *Client
	ino    uint64
	layout layout.Layout // immutable for a file
	refs   int           // open handles; guarded by c.mu
	// lost records the locks of this client on the file that were lost
	// (File.lockErr).
	lost lostLocks
	// commitMu serialises this client's changes of the file's size in
	// metadata: size commits, and SetAttrs of the size or mtime (which
	// commit first). The service takes the larger size of a commit, so a
	// commit landing after a truncate would undo it; and a flush must
	// not return while another handle's commit of the same writes is
	// still on its way (its caller counts on the size being there).
	commitMu sync.Mutex
	// resize orders this client's reads and writes of the file with its
	// size changes (SetAttr of the size: a truncate cuts the chunks, then
	// sets the size in metadata): reads and writes hold it shared, a size
	// change exclusive from before it cuts until the new size is known
	// here. A read so sees the file as it was or at its new size, never
	// at its old size with the data already cut (zeros); a write lands
	// before the truncate or after it, never between the cut and the
	// size (data past the end of the file). Taken before commitMu.
	resize sync.RWMutex

	mu struct {
		sync.Mutex
		cond     *sync.Cond // broadcast when an in-flight write completes
		size     uint64     // our view of the size: committed size, grown by our writes, set by truncate
		mtime    int64      // mtime of our last write, valid when dirty
		dirty    bool       // writes (size/mtime) not yet committed to metadata
		unsynced []bool     // per slot: written since the last SSync
		allocOld []bool     // per slot: written or punched since its space was last reported
		allocGen []uint64   // per slot: writes and punches so far (markAlloc), to tell a space answer's age
		pending  []*wbuf    // per slot: coalescing buffer not yet submitted
		inflight []*wbuf    // submitted, not yet acknowledged
		err      error      // first write-behind error, not yet reported by flush/fsync
		gen      uint64     // bumped by writes, truncates and punches: read-ahead validity
		attr     rpc.Attr   // attributes from the last open or commit (atime logic, keep-cache)
		// allocAns is per slot the space a write's answer reported, with
		// the allocGen of that write (0: none): the size commit uses it
		// while no write or punch followed (allocGen unchanged). A
		// truncate needs nothing here: SetAttr commits before it cuts
		// the chunks, and the metadata service caps the space at the
		// new size.
		allocAns []slotSpace
		// metaSeq is the client's metaChanged count after its last
		// namespace change of this inode (chmod, utimes, a deferred size
		// commit…), metaIndex
		// the raft index of its creation by this client: fsync and close
		// make the metadata log durable at least up to there.
		metaSeq   uint64
		metaIndex uint64
		metaTerm  uint64 // the raft term of the entry at metaIndex
		// metaIndexSeq is the metaChanged count after the creation: a
		// durable answer (a size commit) sent later covers it too.
		metaIndexSeq uint64
		// committing: a size commit is on its way (dirty is already
		// false): the service may not have the size yet.
		committing bool
		// sizeAt is Client.sizeSeq when a commit or truncate of this
		// client last ended: metadata answers to calls begun before it
		// may predate the change.
		sizeAt uint64
		// inline: the file's data kept with its inode (inline.go),
		// bytes from 0; reads are answered from it. Set by an open
		// whose answer carried it, or by the close that folded the
		// data into the file's queued create; nil otherwise.
		inline []byte
		// inlineCtime is the ctime the service answered with inline
		// (or this client set with the bytes); inlineStale: an answer
		// since showed another ctime while the file is still inline
		// there — the bytes held here were dropped, and the next read
		// fetches them again (refetchInline).
		inlineCtime int64
		inlineStale bool
		// touched: this client sent a write, punch or truncate of the
		// file's chunks — its data is no longer all here.
		touched bool
	}
}

// noteMetaIndex records the raft index of the inode's creation, made when
// the client's change count was seq.
func (in *inode) noteMetaIndex(idx, term, seq uint64) {
	in.mu.Lock()
	if idx > in.mu.metaIndex {
		in.mu.metaIndex, in.mu.metaTerm, in.mu.metaIndexSeq = idx, term, seq
	}
	in.mu.Unlock()
}

// noteMetaChange records that the client's namespace changes up to seq
// include one of this inode.
func (in *inode) noteMetaChange(seq uint64) {
	in.mu.Lock()
	in.mu.metaSeq = max(in.mu.metaSeq, seq)
	in.mu.Unlock()
}

// fsyncOwed is what an inode's fsync still has to make durable, kept when
// its last handle closes: the metadata barrier (its metaSeq, metaIndex,
// metaTerm and metaIndexSeq) and the slots written since their last sync
// (unsynced; nil when none). A file written and closed under the async
// policy, then opened again and fsync'ed, must still sync its chunks and
// wait for its deferred size commit and its creation.
type fsyncOwed struct {
	seq, idx, term, idxSeq uint64
	unsynced               []bool
}

// maxOwed bounds the records of closed inodes kept; past it the covered
// ones are dropped and the rest fold into what every inode opened
// afterwards owes: a barrier of all the client's changes so far, and a
// sync of each of its chunks (of clean ones a cheap call) when a dropped
// record had data unsynced.
const maxOwed = 4096

// owedLocked is what in's fsync owes, with in.mu held.
func (in *inode) owedLocked() fsyncOwed {
	o := fsyncOwed{seq: in.mu.metaSeq, idx: in.mu.metaIndex, term: in.mu.metaTerm, idxSeq: in.mu.metaIndexSeq}
	if slices.Contains(in.mu.unsynced, true) {
		o.unsynced = slices.Clone(in.mu.unsynced)
	}
	return o
}

// coveredBy reports that nothing is owed once the client's changes up to
// durable are durable.
func (o *fsyncOwed) coveredBy(durable uint64) bool {
	return o.unsynced == nil && o.seq <= durable && (o.idx == 0 || o.idxSeq <= durable)
}

// keepOwedLocked records o for ino, closed here, unless nothing is owed;
// with c.mu held.
func (c *Client) keepOwedLocked(ino uint64, o fsyncOwed) {
	durable := c.metaDurable.Load()
	if o.coveredBy(durable) {
		return
	}
	if len(c.mu.owed) >= maxOwed {
		for i, r := range c.mu.owed {
			if r.coveredBy(durable) {
				delete(c.mu.owed, i)
			}
		}
	}
	if len(c.mu.owed) >= maxOwed {
		for i, r := range c.mu.owed {
			c.mu.owedOver = max(c.mu.owedOver, r.seq, r.idxSeq)
			c.mu.owedOverData = c.mu.owedOverData || r.unsynced != nil
			delete(c.mu.owed, i)
		}
	}
	c.mu.owed[ino] = o
}

// takeOwedLocked moves what was kept for in's inode (keepOwedLocked) into
// in, newly opened; with c.mu held.
func (c *Client) takeOwedLocked(in *inode) {
	o, ok := c.mu.owed[in.ino]
	delete(c.mu.owed, in.ino)
	if c.mu.owedOver <= c.metaDurable.Load() {
		c.mu.owedOver = 0
	}
	if !ok && c.mu.owedOver == 0 && !c.mu.owedOverData {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.mu.metaSeq = max(in.mu.metaSeq, o.seq, c.mu.owedOver)
	if o.idx > in.mu.metaIndex {
		in.mu.metaIndex, in.mu.metaTerm, in.mu.metaIndexSeq = o.idx, o.term, o.idxSeq
	}
	for s := range in.mu.unsynced {
		if c.mu.owedOverData || s < len(o.unsynced) && o.unsynced[s] {
			in.mu.unsynced[s] = true
		}
	}
}

func newInode(c *Client, a *rpc.Attr) *inode {
	in := &inode{c: c, ino: a.Ino, layout: a.Layout}
	in.mu.cond = sync.NewCond(&in.mu.Mutex)
	in.mu.size = a.Size
	in.mu.attr = *a
	n := len(a.Layout.Targets)
	in.mu.unsynced = make([]bool, n)
	in.mu.allocOld = make([]bool, n)
	in.mu.allocGen = make([]uint64, n)
	in.mu.allocAns = make([]slotSpace, n)
	in.mu.pending = make([]*wbuf, n)
	return in
}

// merge folds this client's view of the file into attributes a that the
// metadata service answered to a call begun when Client.sizeSeq was since.
// An answer that predates a size commit or truncate of this client may be
// older than what the kernel (or an NFS client) was already told — a write
// acknowledged, then committed while the answer was on its way — so the
// local size stands. While writes are uncommitted or their commit is on
// its way, the larger size stands (another client may have grown the
// file). Otherwise, with nothing in flight, the answer's size is adopted.
func (in *inode) merge(a *rpc.Attr, since uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.mu.sizeAt > since:
		a.Size = in.mu.size
	case in.mu.dirty || in.mu.committing:
		a.Size = max(a.Size, in.mu.size)
	case len(in.mu.inflight) == 0 && !in.hasPendingLocked():
		in.mu.size = a.Size
	}
	if in.mu.dirty || in.mu.committing {
		a.Mtime = max(a.Mtime, in.mu.mtime)
		a.Ctime = max(a.Ctime, in.mu.mtime)
	}
	if in.mu.inline != nil && !in.mu.dirty && in.mu.sizeAt <= since && (!a.Inline || a.Ctime != in.mu.inlineCtime) {
		// Changed elsewhere (another mount's write moved the bytes to
		// the chunks, or a truncate cut them): what is held here is
		// stale. Reads go to the chunks, or fetch the bytes again.
		in.mu.inline = nil
		in.mu.inlineStale = a.Inline
		in.mu.gen++
	}
}

// setAttr records the result of a SetAttr made by this client.
func (in *inode) setAttr(a *rpc.Attr, sizeSet bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if sizeSet {
		in.mu.size = a.Size
		in.cutInlineLocked(a.Size, a.Ctime)
		in.mu.gen++
		in.mu.sizeAt = in.c.sizeSeq.Add(1)
	}
	in.mu.attr = *a
}

func (in *inode) hasPendingLocked() bool {
	for _, w := range in.mu.pending {
		if w != nil {
			return true
		}
	}
	return false
}

// slotRange is the contiguous chunk range of one slot covered by a
// contiguous file range, with the extents it is made of (in file order).
type slotRange struct {
	slot     int
	chunkOff int64
	n        int64
	ext      []layout.Extent
}

// slotRanges groups the extents of [off, off+n) by slot. Because units of
// one slot are stored back to back, the part of a contiguous file range on
// one slot is contiguous in its chunk: one storage call per slot.
func slotRanges(l *layout.Layout, off, n int64) []slotRange {
	exts := l.Split(off, n)
	if len(exts) == 1 {
		e := exts[0]
		return []slotRange{{slot: e.Slot, chunkOff: e.ChunkOff, n: e.Len, ext: exts}}
	}
	var out []slotRange
	idx := make(map[int]int, len(l.Targets))
	for _, e := range exts {
		i, ok := idx[e.Slot]
		if !ok {
			idx[e.Slot] = len(out)
			out = append(out, slotRange{slot: e.Slot, chunkOff: e.ChunkOff})
			i = len(out) - 1
		}
		r := &out[i]
		r.n = e.ChunkOff + e.Len - r.chunkOff
		r.ext = append(r.ext, e)
	}
	return out
}

// submitLocked sends w to its target in the background. It first waits for
// any in-flight write that overlaps w, so that writes to the same bytes
// reach the store in the order they were made.
func (in *inode) submitLocked(w *wbuf) {
	for {
		busy := len(in.mu.inflight) >= maxInflight
		if !busy {
			for _, x := range in.mu.inflight {
				if x.overlaps(w.slot, w.chunkOff, w.end()) {
					busy = true
					break
				}
			}
		}
		if !busy {
			break
		}
		in.mu.cond.Wait()
	}
	if w.pooled && cap(w.buf) == maxWbufBytes && len(w.buf) < maxWbufBytes/4 {
		// Do not pin a 1 MiB buffer for a small write.
		var small []byte
		if len(w.buf) <= smallWbufBytes {
			small = append(getSmallBuf(), w.buf...)
		} else {
			small = append([]byte(nil), w.buf...)
		}
		putBuf(w.buf)
		w.buf, w.pooled = small, len(small) <= smallWbufBytes
	}
	w.done = make(chan struct{})
	for _, x := range in.mu.inflight {
		if x.slot == w.slot {
			x.shared, w.shared = true, true
		}
	}
	in.mu.inflight = append(in.mu.inflight, w)
	in.mu.touched = true
	in.mu.unsynced[w.slot] = true
	in.markAllocLocked(w.slot)
	w.gen = in.mu.allocGen[w.slot]
	go in.writeOut(w)
}

// flushPendingLocked submits every coalescing buffer.
func (in *inode) flushPendingLocked() {
	for s, w := range in.mu.pending {
		if w != nil {
			in.mu.pending[s] = nil
			in.submitLocked(w)
		}
	}
}

func (in *inode) writeOut(w *wbuf) {
	c := in.c
	target := in.layout.Targets[w.slot]
	req := &rpc.WriteReq{Chunk: rpc.ChunkID{Target: target, Ino: in.ino}, Off: uint64(w.chunkOff), Sync: w.sync, Data: w.buf}
	var resp rpc.WriteResp
	err := c.storeCall(c.ctxOrBackground(), "write", &req.Chunk, rpc.SWrite, req, &resp)
	n := int64(len(w.buf))
	c.m.bytesWrite.Add(float64(n))
	in.mu.Lock()
	w.err = err
	if err == nil && resp.HasAlloc && !w.shared && in.mu.allocGen[w.slot] == w.gen && !c.noWriteSpace.Load() {
		// The slot's latest write, alone in flight: its answer's space
		// is the chunk's now, and the size commit need not ask.
		in.mu.allocAns[w.slot] = slotSpace{rpc.SlotAlloc{Slot: uint32(w.slot), Bytes: resp.Alloc}, w.gen}
	}
	for i, x := range in.mu.inflight {
		if x == w {
			last := len(in.mu.inflight) - 1
			in.mu.inflight[i] = in.mu.inflight[last]
			in.mu.inflight[last] = nil
			in.mu.inflight = in.mu.inflight[:last]
			break
		}
	}
	if err != nil && (w.budgeted || w.sticky) && in.mu.err == nil {
		in.mu.err = err
	}
	in.mu.cond.Broadcast()
	in.mu.Unlock()
	close(w.done)
	if w.budgeted {
		c.budget.release(n)
	}
	if w.pooled {
		// Free whatever the outcome: once a call returned, no handler
		// reads its request's bytes any more — an in-process store that
		// borrows them holds an abandoning caller until it is done
		// (transport.UseLent).
		putBuf(w.buf)
	}
}

// waitRangeLocked makes the bytes of [off, off+n) that this client wrote
// readable from the stores: overlapping coalescing buffers are submitted
// and overlapping in-flight writes awaited.
func (in *inode) waitRangeLocked(off, n int64) {
	if len(in.mu.inflight) == 0 && !in.hasPendingLocked() {
		return
	}
	for _, r := range slotRanges(&in.layout, off, n) {
		if w := in.mu.pending[r.slot]; w != nil && w.overlaps(r.slot, r.chunkOff, r.chunkOff+r.n) {
			in.mu.pending[r.slot] = nil
			in.submitLocked(w)
		}
		for {
			busy := false
			for _, x := range in.mu.inflight {
				if x.overlaps(r.slot, r.chunkOff, r.chunkOff+r.n) {
					busy = true
					break
				}
			}
			if !busy {
				break
			}
			in.mu.cond.Wait()
		}
	}
}

// drain submits all buffered writes and waits until none is in flight.
func (in *inode) drain(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.flushPendingLocked()
	for len(in.mu.inflight) > 0 {
		in.mu.cond.Wait()
	}
	return nil
}

// drainSynced is drain for a close or fsync that makes the file durable.
// When every slot written since its last sync still has its last bytes
// buffered here and no write of the file is in flight, those buffers go
// out as WriteReq.Sync: the store syncs the chunk after the write, in the
// same group-commit round an SSync joins, and answers its space. Each slot
// whose synced write completed alone (no other write or punch of the slot
// while it was on its way) is then durable, and syncTargets skips it: a
// small file's close makes one store call instead of a write and an
// SSyncStat one after the other. Otherwise it is drain, and syncTargets
// syncs the slots as before (a slot with writes in flight would be synced
// twice).
func (in *inode) drainSynced(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	var sent []*wbuf
	if in.syncByWriteLocked() {
		for s, w := range in.mu.pending {
			if w != nil {
				in.mu.pending[s] = nil
				w.sync = true
				in.submitLocked(w)
				sent = append(sent, w)
			}
		}
	}
	in.flushPendingLocked()
	for len(in.mu.inflight) > 0 {
		in.mu.cond.Wait()
	}
	for _, w := range sent {
		if w.err == nil && !w.shared && in.mu.allocGen[w.slot] == w.gen {
			in.mu.unsynced[w.slot] = false
			in.c.m.op("sync_by_write") // strata_client_ops_total: slots a synced write made durable
		}
	}
	return nil
}

// syncByWriteLocked reports whether drainSynced can sync every unsynced
// slot through its buffered write: nothing in flight, something buffered,
// and no unsynced slot without a buffer.
func (in *inode) syncByWriteLocked() bool {
	if len(in.mu.inflight) > 0 || !in.hasPendingLocked() {
		return false
	}
	for s, u := range in.mu.unsynced {
		if u && in.mu.pending[s] == nil {
			return false
		}
	}
	return true
}

// invalidate makes prefetched data of every handle stale.
func (in *inode) invalidate() {
	in.mu.Lock()
	in.mu.gen++
	in.mu.Unlock()
}

// takeErr returns and clears the remembered write-behind error.
func (in *inode) takeErr() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	err := in.mu.err
	in.mu.err = nil
	return err
}

// slotSpace is a chunk's space as a sync or write answered it, with the slot's
// allocGen when it was asked.
type slotSpace struct {
	rpc.SlotAlloc
	gen uint64
}

// markAllocLocked notes a write or punch of slot: its space changes.
func (in *inode) markAllocLocked(slot int) {
	in.mu.allocOld[slot] = true
	in.mu.allocGen[slot]++
}

// syncTargets makes every slot written since the last sync durable. The
// slots whose space the next size commit must report (allocOld) are
// synced with SSyncStat, which answers that space too: it returns them,
// for commit, and clears their allocOld (a write after that sets it
// again, and the commit then asks afresh).
func (in *inode) syncTargets(ctx context.Context) ([]slotSpace, error) {
	withStat := !in.c.noSyncStat.Load()
	in.mu.Lock()
	var slots []int
	var stat []bool
	var gens []uint64
	for s, u := range in.mu.unsynced {
		if u {
			slots = append(slots, s)
			in.mu.unsynced[s] = false
			st := withStat && in.mu.allocOld[s]
			stat = append(stat, st)
			gens = append(gens, in.mu.allocGen[s])
			if st {
				in.mu.allocOld[s] = false
			}
		}
	}
	in.mu.Unlock()
	if len(slots) == 0 {
		return nil, nil
	}
	errs := make([]error, len(slots))
	got := make([]rpc.ChunkStatResp, len(slots))
	in.eachSlot(slots, func(i int, t uint32) {
		req := &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: t, Ino: in.ino}}
		if stat[i] {
			errs[i] = in.c.storeCall(ctx, "sync", &req.Chunk, rpc.SSyncStat, req, &got[i])
			if !errIs(errs[i], syscall.ENOSYS) {
				return
			}
			in.c.noSyncStat.Store(true) // an older server: two calls from now on
			got[i] = rpc.ChunkStatResp{}
		}
		errs[i] = in.c.storeCall(ctx, "sync", &req.Chunk, rpc.SSync, req, nil)
	})
	err := firstErr(errs)
	var alloc []slotSpace
	in.mu.Lock()
	for i, s := range slots {
		if errs[i] != nil {
			in.mu.unsynced[s] = true
		}
		if !stat[i] {
			continue
		}
		if err == nil && got[i].HasAlloc {
			alloc = append(alloc, slotSpace{rpc.SlotAlloc{Slot: uint32(s), Bytes: got[i].Alloc}, gens[i]})
		} else {
			in.mu.allocOld[s] = true // the commit asks for it
		}
	}
	in.mu.Unlock()
	return alloc, err
}

// commit reports our size and mtime to the metadata service (CommitSize
// takes the max of sizes, so N-to-1 writers converge on the right size),
// with the space of the chunks written or punched since the last commit:
// pre holds what syncTargets learnt; a slot whose latest write answered
// its space (allocAns) needs no question; the other slots are asked here
// (an older server's write answer, a punch, writes in flight together). A
// pre answer of a slot written since it was asked is dropped: the slot is
// asked again here, or another commit reported a newer answer. A commit
// of another handle on its way is waited for first (commitMu).
func (in *inode) commit(ctx context.Context, pre []slotSpace) error {
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	return in.commitHeld(ctx, pre)
}

// commitDeferred is commit answered before the commit is durable
// (rpc.CommitSizeReq.Deferred): the async policy's close, which waits for
// no log sync. The commit then counts as one of the file's metadata
// changes (metaSeq), which its fsync makes durable and checks.
func (in *inode) commitDeferred(ctx context.Context) error {
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	return in.commitAs(ctx, nil, true)
}

// commitHeld is commit with commitMu held.
func (in *inode) commitHeld(ctx context.Context, pre []slotSpace) error {
	return in.commitAs(ctx, pre, false)
}

// commitAs is commitHeld, deferred as commitDeferred when deferred.
func (in *inode) commitAs(ctx context.Context, pre []slotSpace, deferred bool) error {
	in.mu.Lock()
	var use []rpc.SlotAlloc
	for _, p := range pre {
		if in.mu.allocGen[p.Slot] == p.gen {
			use = append(use, p.SlotAlloc)
		}
	}
	if !in.mu.dirty {
		for _, a := range use { // reported with the next commit
			in.mu.allocOld[a.Slot] = true
		}
		in.mu.Unlock()
		return nil
	}
	size, mtime := in.mu.size, in.mu.mtime
	in.mu.dirty = false
	in.mu.committing = true
	var slots []int
	var known []rpc.SlotAlloc // answered by the slot's latest write
	for s, old := range in.mu.allocOld {
		if !old {
			continue
		}
		in.mu.allocOld[s] = false
		if a := in.mu.allocAns[s]; a.gen != 0 && a.gen == in.mu.allocGen[s] {
			known = append(known, a.SlotAlloc)
		} else {
			slots = append(slots, s)
		}
	}
	in.mu.Unlock()
	alloc := append(in.statAlloc(ctx, slots), known...)
	for _, a := range use {
		if !slices.Contains(slots, int(a.Slot)) { // asked afresh: that answer stands
			alloc = append(alloc, a)
		}
	}
	var resp rpc.AttrResp
	err := in.c.metaCall(ctx, rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: in.c.hdr(), Ino: in.ino, Size: size, Mtime: mtime, Alloc: alloc, Deferred: deferred}, &resp)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.mu.committing = false
	in.mu.sizeAt = in.c.sizeSeq.Add(1)
	if deferred {
		in.mu.metaSeq = max(in.mu.metaSeq, in.c.metaChanged.Load()) // fsync makes it durable
	}
	if err != nil {
		in.mu.dirty = true
		for _, s := range slots {
			in.mu.allocOld[s] = true
		}
		for _, a := range append(use, known...) {
			in.mu.allocOld[a.Slot] = true
		}
		return metaErr(in.c, "commit size", err)
	}
	in.mu.attr = resp.Attr
	if !in.mu.dirty && len(in.mu.inflight) == 0 && !in.hasPendingLocked() {
		in.mu.size = resp.Attr.Size
	}
	return nil
}

// eachSlot runs fn for every slots[i] (with its target) in parallel and
// waits for them all.
func (in *inode) eachSlot(slots []int, fn func(i int, target uint32)) {
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i, in.layout.Targets[s])
		}()
	}
	wg.Wait()
}

// statAlloc asks the targets of slots (in parallel) how much space their
// chunks take now, for the size commit to report (stat's st_blocks). A
// chunk whose server does not say (an older one) or cannot be reached is
// left out: its space stays as last reported, and the commit goes on.
func (in *inode) statAlloc(ctx context.Context, slots []int) []rpc.SlotAlloc {
	if len(slots) == 0 {
		return nil
	}
	got := make([]rpc.ChunkStatResp, len(slots))
	in.eachSlot(slots, func(i int, t uint32) {
		req := &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: t, Ino: in.ino}}
		if err := in.c.storeCall(ctx, "stat", &req.Chunk, rpc.SChunkStat, req, &got[i]); err != nil {
			got[i] = rpc.ChunkStatResp{}
		}
	})
	var out []rpc.SlotAlloc
	for i, s := range slots {
		if got[i].HasAlloc {
			out = append(out, rpc.SlotAlloc{Slot: uint32(s), Bytes: got[i].Alloc})
		}
	}
	return out
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func errIs(err, target error) bool { return errors.Is(err, target) }

var _ = syscall.EIO

// ctxOrBackground is the context of background storage writes: they are
// bounded by IOTimeout, not by the caller that buffered them.
func (c *Client) ctxOrBackground() context.Context { return context.Background() }
