package client

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// Creates answered here under a create delegation (docs/design/0016,
// slice 2): while this client holds a directory's delegation, a LOOKUP of
// a name it does not know is answered ENOENT without a call, and a CREATE
// of a regular file is answered at once — an inode number of the
// session's reserved ranges, attributes built here, a layout from the
// grant's placement template — and queued. A flusher per directory sends
// the queue as one MCreateBatch when it holds flushAtCount creates or
// flushAfter after its first, whichever comes first; anything that needs
// the service to know a queued file or the directory's entries flushes
// first and waits (before).

const (
	// flushAfter is how long a create waits in its directory's queue
	// when nothing asks for it sooner.
	flushAfter = 2 * time.Millisecond
	// flushAtCount creates in a queue send it at once.
	flushAtCount = 64
	// holdWriting is how long a create whose file is open for writing
	// here stays queued at most while other creates of its directory are
	// sent: a small file closed meanwhile keeps its data with its inode
	// (inline.go), which a sent create no longer can.
	holdWriting = 50 * time.Millisecond
	// inoPoolAsk numbers are reserved at a time; inoPoolLow left make
	// the client reserve more in the background.
	inoPoolAsk = 2048
	inoPoolLow = 512
	// maxFailed bounds the failed creates remembered for their files'
	// next fsync or close.
	maxFailed = 4096
)

// queuedCreate is one create answered here and not yet answered by the
// metadata service.
type queuedCreate struct {
	dir  uint64
	bc   rpc.BatchCreate
	sent bool          // taken by a flush: bc is not to change
	done chan struct{} // closed once the service answered, or the flush failed
	// set before done is closed:
	err   error     // the create's failure (reported at the file's fsync or close)
	stamp rpc.Stamp // the raft entry that made it
	seq   uint64    // Client.metaChanged after the answer
	// writing: the file is open for writing here and not closed yet
	// (held back from flushes for up to holdWriting after at).
	writing bool
	at      time.Time
	// durable: a waiter needs the create on stable storage (a sync
	// close, an fsync): its batch asks to be answered once durable.
	durable bool
}

// heldLocked reports whether a flush leaves q queued (d.mu held).
func (q *queuedCreate) heldLocked(now time.Time) bool {
	return q.writing && now.Sub(q.at) < holdWriting
}

// inoPool is the unused part of the inode numbers this client reserved,
// valid for the session that reserved them: [next, end) in use, then
// [spareStart, spareEnd), reserved ahead. Every number is handed out
// before its range is left: an unused remainder would stay one of the
// session's few ranges (rpc.MaxSessionRanges) until the session ends.
type inoPool struct {
	session              uint64
	next, end            uint64
	spareStart, spareEnd uint64
	asking               bool
	refusedTil           time.Time // a refused reservation is not asked again before
}

// left is how many numbers the pool holds.
func (p *inoPool) left() uint64 { return p.end - p.next + p.spareEnd - p.spareStart }

// template is a grant's placement template, ready for layout.Choose.
type template struct {
	dir                     rpc.Attr
	stripeSize, stripeCount uint32
	cands                   []layout.Candidate
	rrStart                 uint64
}

func templateOf(r *rpc.DelegateResp) *template {
	t := &template{dir: r.Dir, stripeSize: r.StripeSize, stripeCount: r.StripeCount, rrStart: r.RRStart}
	for _, c := range r.Cands {
		t.cands = append(t.cands, layout.Candidate{ID: c.ID, FreeBytes: c.FreeBytes})
	}
	return t
}

// place lays out the n-th file created under the grant, as the service's
// placeFile would.
func (t *template) place(n uint64) (layout.Layout, bool) {
	if len(t.cands) == 0 {
		return layout.Layout{}, false
	}
	size := t.stripeSize
	if size == 0 {
		size = layout.DefaultStripeSize
	}
	count := t.stripeCount
	if count == 0 {
		count = layout.DefaultCount(len(t.cands))
	}
	count = min(count, uint32(len(t.cands)))
	ts, err := layout.Choose(t.cands, int(count), t.rrStart+n)
	if err != nil {
		return layout.Layout{}, false
	}
	return layout.Layout{StripeSize: size, StripeCount: count, Targets: ts}, true
}

// takeInoLocked takes the next reserved number (d.mu held); false when
// none is left, and then a reservation is under way.
func (d *delegations) takeInoLocked() (uint64, bool) {
	p := &d.pool
	if p.session != d.c.ClientID() { // a new session: the old ranges went with the old one
		p.next, p.end, p.spareStart, p.spareEnd = 0, 0, 0, 0
	}
	if p.left() < inoPoolLow {
		d.refillLocked()
	}
	if p.next >= p.end {
		if p.spareStart >= p.spareEnd {
			return 0, false
		}
		p.next, p.end, p.spareStart, p.spareEnd = p.spareStart, p.spareEnd, 0, 0
	}
	ino := p.next
	p.next++
	return ino, true
}

// refillLocked reserves more numbers in the background (d.mu held), unless
// the pool holds enough: a range it could not keep would stay one of the
// session's few (rpc.MaxSessionRanges), unused until the session ends.
func (d *delegations) refillLocked() {
	p := &d.pool
	if p.asking || d.closed || time.Now().Before(p.refusedTil) {
		return
	}
	if p.session == d.c.ClientID() && p.left() >= inoPoolLow {
		return
	}
	p.asking = true
	d.c.wg.Add(1)
	go func() {
		defer d.c.wg.Done()
		d.refill()
	}()
}

// refill reserves inoPoolAsk numbers for the pool: used once the numbers
// it holds are.
func (d *delegations) refill() {
	session := d.c.ClientID()
	ctx, cancel := context.WithTimeout(d.c.ctx, min(d.c.cfg.IOTimeout, 5*time.Second))
	start, n, err := d.c.ReserveInos(ctx, inoPoolAsk)
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	p := &d.pool
	p.asking = false
	if err != nil {
		// EAGAIN: the session holds its most ranges (numbers of failed
		// creates stay reserved); creates go to the service meanwhile.
		p.refusedTil = time.Now().Add(delegBackoff)
		if d.c.ctx.Err() == nil {
			d.c.log.Debug("inode numbers not reserved", "err", err)
		}
		return
	}
	if !p.add(session, start, n) {
		// Cannot be: one reservation at a time, asked only while low.
		d.c.log.Warn("inode numbers reserved with the pool full: left unused until the session ends", "start", start, "count", n)
	}
}

// add puts the range [start, start+n) that session reserved after the
// numbers the pool holds; false when it holds a spare already.
func (p *inoPool) add(session, start, n uint64) bool {
	if p.session != session {
		p.session, p.next, p.end, p.spareStart, p.spareEnd = session, 0, 0, 0, 0
	}
	switch {
	case p.next >= p.end:
		p.next, p.end = start, start+n
	case p.spareStart >= p.spareEnd:
		p.spareStart, p.spareEnd = start, start+n
	default:
		return false
	}
	return true
}

// createLocal answers a create of regular file name in dir here when this
// client holds dir's delegation and has what it needs (a number, a
// placement); ok false: make it at the service.
func (d *delegations) createLocal(dir uint64, name string, mode, uid, gid uint32, writing bool) (a rpc.Attr, q *queuedCreate, ok bool) {
	if !d.on() {
		return a, nil, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.dirs[dir]
	if s == nil || !s.held || s.recalled || s.tmpl == nil || d.closed {
		return a, nil, false
	}
	if _, known := s.names[name]; known {
		return a, nil, false // the service answers (EEXIST), after the queue
	}
	lay, ok := s.tmpl.place(s.rr)
	if !ok {
		return a, nil, false
	}
	ino, ok := d.takeInoLocked()
	if !ok {
		return a, nil, false
	}
	s.rr++
	now := time.Now()
	t := now.UnixNano()
	if s.tmpl.dir.Mode&syscall.S_ISGID != 0 {
		gid = s.tmpl.dir.Gid
	}
	mode = syscall.S_IFREG | mode&07777
	a = rpc.Attr{Ino: ino, Mode: mode, Nlink: 1, Uid: uid, Gid: gid, Atime: t, Mtime: t, Ctime: t,
		Layout: lay, BlocksKnown: true}
	q = &queuedCreate{dir: dir, done: make(chan struct{}), writing: writing, at: now,
		bc: rpc.BatchCreate{Parent: dir, Name: name, Ino: ino, Mode: mode & 07777, Uid: uid, Gid: gid, Time: t, Layout: lay}}
	s.queue = append(s.queue, q)
	s.lastQ = q
	s.names[name] = ino
	s.last = now
	d.pending[ino] = q
	d.npend.Add(1)
	if len(s.queue) >= flushAtCount {
		d.kickLocked(dir, s)
	} else if s.timer == nil && !s.flushing {
		d.armLocked(dir, s, d.flushDelay)
	}
	d.c.dirs.touch(dir, t)
	return a, q, true
}

// lookupLocal reports whether a lookup of name in dir is answered ENOENT
// here: this client holds dir's delegation and knows no such name. A name
// still queued is flushed first (the lookup then asks the service).
func (d *delegations) lookupLocal(ctx context.Context, dir uint64, name string) bool {
	if !d.on() {
		return false
	}
	d.mu.Lock()
	s := d.dirs[dir]
	if s == nil || !s.held || s.recalled {
		d.mu.Unlock()
		return false
	}
	ino, known := s.names[name]
	if !known {
		d.mu.Unlock()
		return true
	}
	q := d.pending[ino]
	d.mu.Unlock()
	if q != nil {
		d.wait(ctx, q)
	}
	return false
}

// armLocked has dir's queue flushed after delay (d.mu held; s.timer nil).
func (d *delegations) armLocked(dir uint64, s *dirDeleg, delay time.Duration) {
	s.timer = time.AfterFunc(delay, func() {
		d.mu.Lock()
		s.timer = nil
		d.kickLocked(dir, s)
		d.mu.Unlock()
	})
}

// kickLocked starts the flush of dir's queue unless one runs (d.mu held).
func (d *delegations) kickLocked(dir uint64, s *dirDeleg) {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if s.flushing || len(s.queue) == 0 {
		return
	}
	s.flushing = true
	d.c.wg.Add(1)
	go d.flush(dir, s)
}

// flush sends dir's queue, in order, in batches of at most
// rpc.MaxCreateBatch, until it is empty. One flush of a directory runs at
// a time, so its creates reach the service in the order they were
// answered.
func (d *delegations) flush(dir uint64, s *dirDeleg) {
	defer d.c.wg.Done()
	for {
		d.mu.Lock()
		batch, rest := takeBatchLocked(s.queue, s.force, time.Now())
		n := len(batch)
		if n == 0 {
			s.flushing = false
			if len(rest) == 0 {
				s.force = false
			} else if s.timer == nil {
				// Only files still being written: send them when their
				// hold ends, unless their close comes first (closing).
				wait := holdWriting
				for _, q := range rest {
					wait = min(wait, holdWriting-time.Since(q.at))
				}
				d.armLocked(dir, s, max(wait, flushAfter))
			}
			d.mu.Unlock()
			return
		}
		s.queue = rest
		s.lastSent = batch[n-1]
		creates := make([]rpc.BatchCreate, n)
		durable := false
		for i, q := range batch {
			q.sent = true
			creates[i] = q.bc
			durable = durable || q.durable
		}
		d.mu.Unlock()
		// Not the client's context: a flush at unmount runs while it
		// closes; metaCall bounds it by IOTimeout.
		before := d.c.metaChanged.Load()
		res, err := d.c.createBatch(context.Background(), creates, durable)
		seq := d.c.metaChanged.Load()
		if durable {
			// On stable storage when answered: nothing after the
			// call began needs a barrier for these creates.
			seq = before
		}
		d.c.m.op("create_flush")
		d.mu.Lock()
		for i, q := range batch {
			switch {
			case err != nil:
				q.err = err
			case res[i].Errno != 0:
				q.err = res[i].Err()
			default:
				q.stamp, q.seq = res[i].Stamp, seq
			}
			if q.err != nil {
				q.err = fmt.Errorf("create of %q in directory %d, answered by this client under a create delegation, "+
					"refused by the metadata service (%v): %w", q.bc.Name, dir, q.err, syscall.EIO)
				if s.names != nil && s.names[q.bc.Name] == q.bc.Ino {
					// Whether the name exists now is the service's
					// to say (EEXIST: another's file): known, number
					// unknown, so a lookup asks.
					s.names[q.bc.Name] = 0
				}
				if len(d.failed) < maxFailed {
					d.failed[q.bc.Ino] = q.err
				}
				d.refused.Add(1)
				d.c.log.Warn("a create answered under a create delegation failed", "dir", dir, "name", q.bc.Name, "err", q.err)
			}
			delete(d.pending, q.bc.Ino)
			d.npend.Add(-1)
			close(q.done)
		}
		d.mu.Unlock()
		for _, q := range batch {
			if q.err == nil {
				d.c.noteCreation(q.bc.Ino, q.stamp, q.seq)
			}
		}
	}
}

// takeBatchLocked splits queue into the next batch to send — in order, at
// most rpc.MaxCreateBatch, without the creates of files still being
// written here unless force — and the rest, in order. Leaving a create
// behind a later one is safe: a directory's queued names are distinct, and
// whatever needs the whole queue sent forces it (before).
func takeBatchLocked(queue []*queuedCreate, force bool, now time.Time) (batch, rest []*queuedCreate) {
	inline := 0 // the batch's inline bytes, bounded by maxBatchInline
	for i, q := range queue {
		if len(batch) == rpc.MaxCreateBatch || len(batch) > 0 && inline+len(q.bc.Inline) > maxBatchInline {
			rest = append(rest, queue[i:]...)
			break
		}
		if !force && q.heldLocked(now) {
			rest = append(rest, q)
		} else {
			batch = append(batch, q)
			inline += len(q.bc.Inline)
		}
	}
	return batch, rest
}

// maxBatchInline bounds the inline data of one batch (one raft entry):
// 64 creates of up to rpc.MaxInlineBytes each would make entries of 4 MiB.
const maxBatchInline = 1 << 20

// closing notes that ino, whose create may be queued here, is being
// closed: its create is not held back any more, and goes out with the
// next flush (started the usual flushAfter later if none is due).
func (d *delegations) closing(ino uint64) {
	if d == nil || d.npend.Load() == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.pending[ino]
	if q == nil || !q.writing {
		return
	}
	q.writing = false
	if s := d.dirs[q.dir]; s != nil && s.timer == nil && !s.flushing {
		d.armLocked(q.dir, s, d.flushDelay)
	}
}

// noteCreation records the entry that made ino, which this client
// answered the create of: the open file's fsync and close, or a later
// fsync of it once closed here, make it durable.
func (c *Client) noteCreation(ino uint64, st rpc.Stamp, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.mu.inodes[ino]; in != nil {
		in.noteMetaIndex(st.Index, st.Term, seq)
		return
	}
	o := c.mu.owed[ino]
	if st.Index > o.idx {
		o.idx, o.term, o.idxSeq = st.Index, st.Term, seq
	}
	c.keepOwedLocked(ino, o)
}

// fold hands the size, mtime and chunk space of in — written and being
// closed — to its create when that is still queued here: the batch makes
// the file with them, and the close needs no size commit of its own (nor,
// under async, any wait). pre is the space syncTargets answered. false:
// the create was sent already or not answered here, or the space of a
// written chunk is unknown here; commit as usual.
func (d *delegations) fold(in *inode, pre []slotSpace) bool {
	if d == nil || d.npend.Load() == 0 {
		return false
	}
	in.commitMu.Lock() // no other handle's commit of the file in between
	defer in.commitMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.pending[in.ino]
	if q == nil || q.sent {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.mu.dirty {
		return true // nothing written (or already folded): the create says it all
	}
	var alloc []rpc.SlotAlloc
	for s, old := range in.mu.allocOld {
		if !old {
			continue
		}
		if a := in.mu.allocAns[s]; a.gen != 0 && a.gen == in.mu.allocGen[s] {
			alloc = append(alloc, a.SlotAlloc)
			continue
		}
		found := false
		for _, p := range pre {
			if int(p.Slot) == s && p.gen == in.mu.allocGen[s] {
				alloc, found = append(alloc, p.SlotAlloc), true
				break
			}
		}
		if !found {
			return false
		}
	}
	for _, a := range alloc {
		in.mu.allocOld[a.Slot] = false
	}
	q.bc.Written, q.bc.Size, q.bc.Mtime, q.bc.Alloc = true, in.mu.size, in.mu.mtime, alloc
	in.mu.dirty = false
	in.mu.sizeAt = in.c.sizeSeq.Add(1)
	in.mu.attr.Size, in.mu.attr.Mtime, in.mu.attr.Ctime = in.mu.size, in.mu.mtime, in.mu.mtime
	in.c.m.op("create_folded")
	return true
}

// wait kicks q's flush and waits for the service's answer to it.
func (d *delegations) wait(ctx context.Context, q *queuedCreate) { d.waitFor(ctx, q, false) }

// waitFor is wait; durable asks that q's batch be answered once on stable
// storage (if q is not sent yet). With no flush of the directory under
// way, the caller runs it: one goroutine handoff less for the waiter.
func (d *delegations) waitFor(ctx context.Context, q *queuedCreate, durable bool) {
	d.mu.Lock()
	q.writing = false // asked for: not held back
	q.durable = q.durable || durable
	s := d.dirs[q.dir]
	if s != nil && !s.flushing && !q.sent && len(s.queue) > 0 {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		s.flushing = true
		d.c.wg.Add(1)
		d.mu.Unlock()
		d.flush(q.dir, s)
	} else {
		if s != nil {
			d.kickLocked(q.dir, s)
		}
		d.mu.Unlock()
	}
	select {
	case <-q.done:
	case <-ctx.Done():
	}
}

// before makes the service know what this client answered about ino: when
// ino is a queued create, its flush; when ino is a directory with queued
// creates, theirs. Any call about ino that the service answers goes after
// it (cheap when nothing is queued).
func (d *delegations) before(ctx context.Context, ino uint64) {
	if d == nil || d.npend.Load() == 0 {
		return
	}
	d.mu.Lock()
	q := d.pending[ino]
	if q == nil {
		if s := d.dirs[ino]; s != nil {
			if len(s.queue) > 0 {
				// Everything, files being written included, in order:
				// the last sent means all sent.
				s.force = true
				q = s.queue[len(s.queue)-1]
			} else if s.lastSent != nil {
				select {
				case <-s.lastSent.done:
				default:
					q = s.lastSent // the batch on its way, the last of all
				}
			}
		}
	}
	d.mu.Unlock()
	if q != nil {
		d.wait(ctx, q)
	}
}

// created waits until the service made in's file if this client answered
// its create, and records the entry that made it (the file's close and
// fsync make it durable). A create the service refused fails here, once.
// durable: the caller makes the file durable next (a sync close, fsync),
// so a create not sent yet goes in a batch answered once on stable
// storage, which saves that barrier its call.
func (d *delegations) created(ctx context.Context, in *inode, durable bool) error {
	if d == nil || !d.on() {
		return nil
	}
	d.mu.Lock()
	q := d.pending[in.ino]
	err := d.failed[in.ino]
	delete(d.failed, in.ino)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if q == nil {
		return nil
	}
	d.waitFor(ctx, q, durable)
	select {
	case <-q.done:
	default:
		return fmt.Errorf("waiting for the create of inode %d: %w", in.ino, ctx.Err())
	}
	d.mu.Lock()
	delete(d.failed, in.ino)
	d.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	in.noteMetaIndex(q.stamp.Index, q.stamp.Term, q.seq)
	return nil
}

// flushAll sends every queue and waits (SyncMeta: a barrier of the whole
// client, e.g. fsync of a directory). It fails with EIO, once, when
// creates answered here were refused by the service since the last time
// it said so: under the async policy a file closed before its create was
// sent learns it only here (as a write-back error shows at the next
// syncfs of a local file system).
func (d *delegations) flushAll(ctx context.Context) error {
	if d == nil {
		return nil
	}
	d.flushQueues(ctx)
	if n := d.refused.Swap(0); n > 0 {
		return fmt.Errorf("%d creates answered by this client under create delegations were refused by the metadata service "+
			"(their files are gone; the client log names them): %w", n, syscall.EIO)
	}
	return nil
}

// flushQueues sends every queue and waits (cheap when none holds
// anything).
func (d *delegations) flushQueues(ctx context.Context) {
	if d == nil || d.npend.Load() == 0 {
		return
	}
	d.mu.Lock()
	var dirs []uint64
	for dir, s := range d.dirs {
		if s.lastQ != nil {
			dirs = append(dirs, dir)
		}
	}
	d.mu.Unlock()
	for _, dir := range dirs {
		d.before(ctx, dir)
	}
}

// Queued is the number of creates this client answered that the metadata
// service has not answered yet (status, tests).
func (c *Client) Queued() int64 {
	if c.deleg == nil {
		return 0
	}
	return c.deleg.npend.Load()
}
