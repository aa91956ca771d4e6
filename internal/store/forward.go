package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Forwarding at a mirror group's primary (docs/design/0014).
//
// A mutation of a group's chunk admitted at the primary (admitGroup) is
// applied to the local copy and sent, unchanged (same ChunkID: group id and
// epoch), to the secondary's server; the client is answered once both
// succeeded. The two run concurrently.
//
// Ordering. Two mutations of overlapping ranges of one chunk that arrive
// together must leave both copies equal. The local copy orders them by its
// block range locks, the secondary by its own — and the two may choose
// different orders (the forwards travel independently, and the secondary
// serves each request on a goroutine of its own). So the primary holds a
// per-chunk ordering lock over the 1 MiB regions a mutation touches
// (orderLocks: the chunk's stripes, as the block range locks; all of them
// for truncate and remove) from before the local apply until BOTH the local
// apply and the forward have answered: a second overlapping mutation then
// starts on either copy only after the first ended on both, so both copies
// see the same order. Mutations of disjoint regions still run in parallel,
// and a resync copying a region holds the same lock (resync.go), so a copy
// never overtakes a forwarded write nor is overtaken by one.
//
// Failures of the forward:
//   - ESTALE: the secondary knows a newer epoch — this store was deposed.
//     It re-reads the map and answers ESTALE (the client goes to the new
//     primary).
//   - EAGAIN: the secondary has not learnt our epoch yet; retried shortly,
//     within forwardRetryFor.
//   - anything else (unreachable, EIO, ENOSPC, EROFS: its disk failed or
//     is full): the primary reports MirrorSecondaryLost (degrade), adopts
//     the answered GroupInfo (new epoch, degraded), records the change in
//     mirror.log durably and only then answers the client. If the report
//     fails, the client gets EAGAIN and nothing was acknowledged.
//
// The forward succeeded but the local apply failed with a disk error
// (EIO on write or fsync, EROFS, ENOSPC: diskFailed) in an in-sync group:
// the secondary holds the change and this copy may have lost writes it
// acknowledged (a failed fsync may drop dirty pages). The primary stops
// serving reads of the group at once (groupMap.markFailed), reports
// MirrorPrimaryFailed — the service promotes the secondary, degraded, and
// marks the group FullResync — adopts the answer (it is the out-of-sync
// secondary now, which serves no reads) and answers the client ESTALE, so
// that it sends the request again to the new primary. Report failed:
// EAGAIN. The new primary's resync later copies every chunk to this copy
// (resync.go). A local disk error in a resyncing or degraded group has no
// current copy to switch to: the client gets the error.
//
// While the group is degraded, a mutation records its change (durably)
// before it touches the local copy, and is not forwarded. The group's gate
// (an RWMutex per group) is held shared by every mutation from admission
// to its answer; a resync takes it exclusively once when it starts, so no
// mutation admitted in the degraded epoch is still unrecorded when the
// resync takes the record.

// forwardRetryFor bounds the retries of a forward answered EAGAIN.
const forwardRetryFor = time.Second

// forwardTimeout bounds one forward.
const forwardTimeout = 5 * time.Second

// inflightForwards are the forwards under way, by group, each with the
// epoch it was sent in and the cancel of its context. When the group map
// says that a group of which this server stays primary is degraded in a
// newer epoch (the metadata service found the secondary's server silent:
// stopped, cut off), the forwards of the older epochs are cancelled: their
// mutations take the degraded path at once (recorded for the resync,
// acknowledged) instead of each waiting out forwardTimeout on a peer that
// will not answer.
type inflightForwards struct {
	mu sync.Mutex
	m  map[uint32]map[*inflightForward]struct{}
}

type inflightForward struct {
	epoch  uint64
	cancel context.CancelFunc
}

// start registers a forward of group in epoch and returns its context
// (bounded by forwardTimeout) and the function that ends it.
func (f *inflightForwards) start(group uint32, epoch uint64) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), forwardTimeout)
	fw := &inflightForward{epoch: epoch, cancel: cancel}
	f.mu.Lock()
	if f.m == nil {
		f.m = map[uint32]map[*inflightForward]struct{}{}
	}
	if f.m[group] == nil {
		f.m[group] = map[*inflightForward]struct{}{}
	}
	f.m[group][fw] = struct{}{}
	f.mu.Unlock()
	return ctx, func() {
		cancel()
		f.mu.Lock()
		delete(f.m[group], fw)
		if len(f.m[group]) == 0 {
			delete(f.m, group)
		}
		f.mu.Unlock()
	}
}

// count is the number of group's forwards in flight.
func (f *inflightForwards) count(group uint32) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m[group])
}

// cancelBefore cancels group's forwards sent in an epoch before epoch and
// returns how many.
func (f *inflightForwards) cancelBefore(group uint32, epoch uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for fw := range f.m[group] {
		if fw.epoch < epoch {
			fw.cancel()
			n++
		}
	}
	return n
}

// orderKey names a chunk for the ordering locks.
type orderKey struct {
	t   *target
	ino uint64
}

// chunkOrder is one chunk's ordering lock: a mutex per region stripe.
type chunkOrder struct {
	refs    int
	regions [regionStripes]sync.Mutex
}

// orderLocks are the primary's per-chunk ordering locks, made on demand
// and dropped when unused.
type orderLocks struct {
	mu sync.Mutex
	m  map[orderKey]*chunkOrder
}

// lock takes the stripes mask of t's chunk ino, in ascending order.
func (o *orderLocks) lock(t *target, ino uint64, mask uint32) *chunkOrder {
	k := orderKey{t, ino}
	o.mu.Lock()
	if o.m == nil {
		o.m = map[orderKey]*chunkOrder{}
	}
	c := o.m[k]
	if c == nil {
		c = &chunkOrder{}
		o.m[k] = c
	}
	c.refs++
	o.mu.Unlock()
	for i := 0; i < regionStripes; i++ {
		if mask&(1<<i) != 0 {
			c.regions[i].Lock()
		}
	}
	return c
}

// unlock releases what lock took.
func (o *orderLocks) unlock(t *target, ino uint64, c *chunkOrder, mask uint32) {
	for i := regionStripes - 1; i >= 0; i-- {
		if mask&(1<<i) != 0 {
			c.regions[i].Unlock()
		}
	}
	o.mu.Lock()
	if c.refs--; c.refs == 0 {
		delete(o.m, orderKey{t, ino})
	}
	o.mu.Unlock()
}

// lockRange takes the ordering lock of [off, end) of chunk ino of the
// local target id tgt (end <= off: the whole chunk) and answers the
// function that releases it. Whoever rewrites a group chunk's range from
// the other copy (a repair) holds it from the read of the other copy to
// the local write: on the primary no client mutation of the range runs
// meanwhile on either copy, on the secondary no forwarded one, so the
// repair never lands over newer data.
func (s *Server) lockRange(tgt uint32, ino uint64, off, end int64) (unlock func(), err error) {
	t, err := s.target(tgt, ino)
	if err != nil {
		return nil, err
	}
	mask := allStripes
	if end > off {
		mask = stripeMask(off, end)
	}
	c := s.order.lock(t, ino, mask)
	return func() { s.order.unlock(t, ino, c, mask) }, nil
}

// gate answers group's gate (see above).
func (s *Server) gate(group uint32) *sync.RWMutex {
	s.gates.Lock()
	defer s.gates.Unlock()
	if s.gates.m == nil {
		s.gates.m = map[uint32]*sync.RWMutex{}
	}
	g := s.gates.m[group]
	if g == nil {
		g = &sync.RWMutex{}
		s.gates.m[group] = g
	}
	return g
}

// mutation is one group mutation as groupMutate runs it.
type mutation struct {
	id   rpc.ChunkID
	mask uint32  // the region stripes it changes
	recs []mlRec // its change, for mirror.log (group filled in by groupMutate)
	// local applies it to the local target's chunk.
	local func(target uint32) error
	// method and req are what is forwarded to the peer's server: the
	// client's request, unchanged; answer makes the answer to decode.
	method rpc.Method
	req    rpc.Message
	answer func() rpc.Message
	bytes  int // data bytes forwarded (metrics)
	// precheck, if set, refuses at the primary what the local apply
	// would refuse (bounds, space) before anything is forwarded, so
	// that the secondary does not take a change the primary then fails.
	precheck func(t *target) error
}

// groupMutate admits and runs a mutation of a group's chunk (see the top
// of the file).
func (s *Server) groupMutate(ctx context.Context, m mutation) error {
	group := m.id.Target &^ rpc.GroupBit
	gate := s.gate(group)
	gate.RLock()
	defer gate.RUnlock()
	a, err := s.admitGroup(ctx, m.id, true)
	if err != nil {
		return err
	}
	ord := s.order.lock(a.t, m.id.Ino, m.mask)
	defer s.order.unlock(a.t, m.id.Ino, ord, m.mask)
	// The wait for the ordering lock may have been long (the mutations
	// ahead forwarded to a secondary that stopped answering): if the group
	// moved on meanwhile, act in its new epoch — degraded with this copy
	// still primary: the degraded path at once, instead of one more
	// forward timeout each; anything else: ESTALE, the client re-reads
	// the group map.
	if cur, ok := s.groups.entry(group); ok && cur.info.Epoch > a.g.info.Epoch {
		if !a.g.primary || !cur.primary || cur.info.State != rpc.GroupDegraded || cur.local != a.g.local {
			return rpc.Errorf(syscall.ESTALE, "mirror group %d moved to epoch %d while this request waited", group, cur.info.Epoch)
		}
		a.g = cur
	}
	if !a.g.primary {
		// The secondary applies what its primary forwards, under its own
		// ordering lock too: a repair of this copy from the primary's
		// (lockRange) then never lands over a newer forwarded change.
		return m.local(a.g.local)
	}
	for i := range m.recs {
		m.recs[i].group = group
	}
	if m.precheck != nil {
		if err := m.precheck(a.t); err != nil {
			return err
		}
	}
	if a.g.info.State == rpc.GroupDegraded {
		if err := s.recordChange(a, m.recs); err != nil {
			return err
		}
		if err := m.local(a.g.local); err != nil {
			return err
		}
		return ackWait(ctx, a.g)
	}
	// In sync or resyncing: local and forward together, both under the
	// ordering lock. The forward's context is the server's, bounded:
	// a caller that gives up must not leave the copies different.
	fwdErr := make(chan error, 1)
	fctx, done := s.forwards.start(group, a.g.info.Epoch)
	go func() {
		defer done()
		fwdErr <- s.forwardRetrying(fctx, a.g, m)
	}()
	lerr := m.local(a.g.local)
	ferr := <-fwdErr
	if ferr == nil {
		s.mm.forwarded(group, m.bytes)
		if lerr != nil && diskFailed(lerr) && a.g.info.State == rpc.GroupInSync {
			// The secondary has the change and this copy's disk failed:
			// the secondary takes over.
			return s.primaryFailed(ctx, a, lerr)
		}
		return lerr
	}
	switch {
	case rpc.ErrnoOf(ferr) == syscall.ESTALE:
		// Deposed: the secondary serves a newer epoch.
		if err := s.refreshGroups(ctx, s.groups.seen()); err != nil {
			s.log.Warn("cannot refresh the mirror group map", "group", group, "err", err)
		}
		if lerr == nil {
			// Applied here and not at the new primary: record it, so
			// that the change is known should this copy be caught up.
			_ = s.recordChange(a, m.recs)
		}
		return rpc.Errorf(syscall.ESTALE, "mirror group %d: the secondary on %s refused epoch %d (this primary was replaced): %v",
			group, a.g.peerAddr, a.g.info.Epoch, ferr)
	case lerr != nil:
		// Failed here: the client gets the local error; the secondary
		// may still be fine, and the client retries the whole request.
		return lerr
	}
	s.log.Warn("mirror secondary lost: cannot forward", "group", group, "secondary", a.g.peerAddr, "target", a.g.peerTarget, "err", ferr)
	na, err := s.degrade(ctx, a, ferr)
	if err != nil {
		return rpc.Errorf(syscall.EAGAIN, "mirror group %d: secondary %s failed (%v) and the metadata service could not be told: %v",
			group, a.g.peerAddr, ferr, err)
	}
	if err := s.recordChange(na, m.recs); err != nil {
		return err
	}
	return ackWait(ctx, na.g)
}

// ackWait waits until g's primary may acknowledge a mutation of its
// degraded epoch (groupEntry.ackAfter; degradeWait). A caller that gives
// up meanwhile gets EAGAIN: its change is applied and recorded, and
// sending it again is harmless.
func ackWait(ctx context.Context, g groupEntry) error {
	d := time.Until(g.ackAfter)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return rpc.Errorf(syscall.EAGAIN, "mirror group %d: gave up while the degraded primary waited for the secondary's lease: %v", g.info.ID, ctx.Err())
	}
}

// forwardRetrying forwards m to g's secondary, again while it answers
// EAGAIN (it has not learnt the epoch yet), for at most forwardRetryFor.
func (s *Server) forwardRetrying(ctx context.Context, g groupEntry, m mutation) error {
	if g.peerAddr == "" {
		return fmt.Errorf("%w: mirror group %d: no address for the secondary's server", transport.ErrUnavailable, g.info.ID)
	}
	end := time.Now().Add(forwardRetryFor)
	wait := 10 * time.Millisecond
	for i := 0; ; i++ {
		err := s.peerCall(ctx, g.peerAddr, m.method, m.req, m.answer())
		if rpc.ErrnoOf(err) != syscall.EAGAIN || time.Now().After(end) || i >= 20 {
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// recordChange puts recs in a's local target's mirror.log, durably.
func (s *Server) recordChange(a admitted, recs []mlRec) error {
	if len(recs) == 0 {
		return nil
	}
	if err := a.t.mlog.record(recs); err != nil {
		return rpc.Errorf(syscall.EIO, "mirror group %d: record the change on target %s: %v", a.g.info.ID, a.t.path, err)
	}
	return nil
}

// reportFlight is one report (MirrorSecondaryLost, MirrorPrimaryFailed)
// of a group that concurrent callers share.
type reportFlight struct {
	done chan struct{}
	a    admitted
	err  error
}

// flightKey names a report in flight: the group and the event.
type flightKey struct {
	group uint32
	event uint8
}

// shareReport runs send for event on group unless a caller runs it
// already, in which case it waits for that one's outcome.
func (s *Server) shareReport(ctx context.Context, group uint32, event uint8, send func() (admitted, error)) (admitted, error) {
	k := flightKey{group, event}
	s.degrading.Lock()
	if s.degrading.m == nil {
		s.degrading.m = map[flightKey]*reportFlight{}
	}
	f := s.degrading.m[k]
	if f == nil {
		f = &reportFlight{done: make(chan struct{})}
		s.degrading.m[k] = f
		s.degrading.Unlock()
		f.a, f.err = send()
		s.degrading.Lock()
		delete(s.degrading.m, k)
		s.degrading.Unlock()
		close(f.done)
	} else {
		s.degrading.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return admitted{}, ctx.Err()
		}
	}
	return f.a, f.err
}

// diskFailed reports whether err, the local apply's error of a mutation
// or sync, says the local disk failed: EIO (a failed write or fsync),
// EROFS (remounted read-only), ENOSPC or EDQUOT (full though the
// precheck found room). Errors without an errno are not counted: the
// disk is not known to be at fault.
func diskFailed(err error) bool {
	var re *rpc.Error
	var en syscall.Errno
	switch {
	case errors.As(err, &re):
		en = re.Errno
	case errors.As(err, &en):
	default:
		return false
	}
	return en == syscall.EIO || en == syscall.EROFS || en == syscall.ENOSPC || en == syscall.EDQUOT
}

// primaryFailed deals with a mutation or sync that the secondary applied
// and this primary's copy failed with a disk error (lerr), in an in-sync
// group: this copy serves no more reads in this epoch, and the service is
// told (MirrorPrimaryFailed; concurrent callers share the report), which
// promotes the secondary and makes this copy the secondary, out of sync
// and resynced whole. The client is answered ESTALE and sends the request
// again to the new primary, which has the change already (requests are
// idempotent). While the report fails, EAGAIN: nothing was acknowledged,
// and the client tries again. A service that finds the group no longer in
// sync (a race with a degrade) answers EIO: the local error stands.
func (s *Server) primaryFailed(ctx context.Context, a admitted, lerr error) error {
	group := a.g.info.ID
	s.groups.markFailed(group, a.g.info.Epoch)
	_, err := s.shareReport(ctx, group, rpc.MirrorPrimaryFailed, func() (admitted, error) {
		s.log.Error("mirror primary's own copy failed; asking the metadata service to promote the secondary", "group", group,
			"epoch", a.g.info.Epoch, "target", a.t.path, "secondary", a.g.peerAddr, "err", lerr)
		gi, err := s.mirrorReport(&rpc.MirrorReportReq{Group: group, Epoch: a.g.info.Epoch, Target: a.g.local,
			Event: rpc.MirrorPrimaryFailed, Detail: lerr.Error()})
		if err == nil {
			s.log.Warn("mirror group failed over: this copy's disk failed; it is the secondary now and waits for a full resync",
				"group", group, "epoch", gi.Epoch, "primary_server", gi.PrimaryAddr, "target", a.t.path)
		}
		return admitted{}, err
	})
	switch errno := rpc.ErrnoOf(err); {
	case err == nil || errno == syscall.ESTALE:
		return rpc.Errorf(syscall.ESTALE, "mirror group %d: the primary's copy on %s failed (%v); the secondary took over: read the group map again",
			group, s.addr, lerr)
	case errno == syscall.EIO:
		return lerr
	default:
		return rpc.Errorf(syscall.EAGAIN, "mirror group %d: the primary's copy on %s failed (%v) and the metadata service could not be told: %v",
			group, s.addr, lerr, err)
	}
}

// degrade reports a's secondary lost and adopts the answer: a new epoch
// in which a is still primary and the group degraded, with the begin
// record durable in mirror.log. Concurrent callers of one group share the
// report.
func (s *Server) degrade(ctx context.Context, a admitted, cause error) (admitted, error) {
	group := a.g.info.ID
	if cur, ok := s.groups.entry(group); ok && cur.info.Epoch > a.g.info.Epoch {
		if cur.primary && cur.info.State == rpc.GroupDegraded && cur.local == a.g.local {
			return admitted{g: cur, t: a.t}, nil // degraded meanwhile
		}
		return admitted{}, rpc.Errorf(syscall.ESTALE, "mirror group %d moved to epoch %d", group, cur.info.Epoch)
	}
	return s.shareReport(ctx, group, rpc.MirrorSecondaryLost, func() (admitted, error) { return s.reportLost(a, cause) })
}

// reportTimeout bounds a mirror report to the metadata service.
const reportTimeout = 3 * time.Second

// reportLost sends MirrorSecondaryLost and adopts the answer.
func (s *Server) reportLost(a admitted, cause error) (admitted, error) {
	gi, err := s.mirrorReport(&rpc.MirrorReportReq{Group: a.g.info.ID, Epoch: a.g.info.Epoch, Target: a.g.local,
		Event: rpc.MirrorSecondaryLost, Detail: cause.Error()})
	if err != nil {
		return admitted{}, err
	}
	cur, ok := s.groups.entry(a.g.info.ID)
	if !ok || !cur.primary || cur.info.State != rpc.GroupDegraded || cur.local != a.g.local || cur.info.Epoch != gi.Epoch {
		return admitted{}, rpc.Errorf(syscall.ESTALE, "mirror group %d: the metadata service answered epoch %d, state %s, primary %d",
			a.g.info.ID, gi.Epoch, rpc.GroupStateName(gi.State), gi.Primary)
	}
	na := admitted{g: cur, t: a.t}
	if err := s.recordChange(na, []mlRec{{kind: mlBegin, group: a.g.info.ID, arg: uint64(cur.peerTarget)}}); err != nil {
		return admitted{}, err
	}
	s.log.Warn("mirror group degraded: the secondary is away; changes are recorded for its resync", "group", a.g.info.ID,
		"epoch", cur.info.Epoch, "secondary", cur.peerAddr)
	return na, nil
}

// mirrorReport sends a report to the metadata service and installs the
// answered group.
func (s *Server) mirrorReport(req *rpc.MirrorReportReq) (*rpc.GroupInfo, error) {
	if s.meta == nil {
		return nil, errors.New("no metadata service to report to")
	}
	req.ServerID = s.serverID.Load()
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	var gr rpc.GroupResp
	if err := s.meta.Call(ctx, rpc.MMirrorReport, req, &gr); err != nil {
		if rpc.ErrnoOf(err) == syscall.ESTALE {
			_ = s.refreshGroups(ctx, s.groups.seen())
		}
		return nil, fmt.Errorf("mirror report (group %d, event %d): %w", req.Group, req.Event, err)
	}
	s.installGroups([]rpc.GroupInfo{gr.Group}, gr.Version, false)
	return &gr.Group, nil
}

// Handlers of group chunks: called by the S* handlers when the ChunkID
// names a group.

func (s *Server) groupWrite(ctx context.Context, r *rpc.WriteReq) (*rpc.WriteResp, error) {
	// The data may be lent by an in-process caller: the forward reads it
	// too, so the caller is held until both are done with it.
	if !transport.UseLent(ctx) {
		return nil, rpc.Errorf(syscall.EIO, "mirror group %d chunk %x: write abandoned by its caller before it began", r.Chunk.Target&^rpc.GroupBit, r.Chunk.Ino)
	}
	defer transport.DoneLent(ctx)
	var resp *rpc.WriteResp
	end := r.Off + uint64(len(r.Data))
	// The local write must not be abandoned once the forward may have
	// gone: the caller is held (above), so its bytes stay valid.
	lctx := context.WithoutCancel(ctx)
	err := s.groupMutate(ctx, mutation{
		id:    r.Chunk,
		mask:  stripeMask(int64(r.Off), int64(end)),
		recs:  regionRecs(0, r.Chunk.Ino, r.Off, uint64(len(r.Data))),
		bytes: len(r.Data),
		local: func(tgt uint32) error {
			lr := *r
			lr.Chunk = rpc.ChunkID{Target: tgt, Ino: r.Chunk.Ino}
			var err error
			resp, err = s.handleWrite(lctx, &lr)
			if err != nil && s.healWriteEdges(lctx, tgt, r.Chunk.Ino, r.Chunk.Target, int64(r.Off), int64(end), err) {
				// A block under the write's edge was bad here and is
				// repaired from the other copy (heal.go): write again.
				resp, err = s.handleWrite(lctx, &lr)
			}
			return err
		},
		precheck: func(t *target) error {
			if err := checkRange(t, r.Chunk.Ino, r.Off, uint64(len(r.Data)), "write"); err != nil {
				return err
			}
			if err := checkGrowth(t, r.Chunk.Ino, end, "write"); err != nil {
				return err
			}
			if len(r.Data) > 0 {
				return t.checkSpace(len(r.Data), r.Chunk.Ino)
			}
			return nil
		},
		method: rpc.SWrite, req: r, answer: func() rpc.Message { return &rpc.WriteResp{} },
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Server) groupTruncate(ctx context.Context, r *rpc.TruncateReq) (*rpc.Empty, error) {
	err := s.groupMutate(ctx, mutation{
		id:   r.Chunk,
		mask: allStripes,
		recs: []mlRec{{kind: mlTruncate, ino: r.Chunk.Ino, arg: r.Size}},
		local: func(tgt uint32) error {
			lr := *r
			lr.Chunk = rpc.ChunkID{Target: tgt, Ino: r.Chunk.Ino}
			_, err := s.handleTruncate(ctx, &lr)
			return err
		},
		precheck: func(t *target) error {
			if err := checkRange(t, r.Chunk.Ino, r.Size, 0, "truncate"); err != nil {
				return err
			}
			return checkGrowth(t, r.Chunk.Ino, r.Size, "truncate")
		},
		method: rpc.STruncate, req: r, answer: func() rpc.Message { return &rpc.Empty{} },
	})
	if err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}

func (s *Server) groupPunch(ctx context.Context, r *rpc.PunchReq) (*rpc.Empty, error) {
	if r.Len == 0 {
		return &rpc.Empty{}, nil
	}
	err := s.groupMutate(ctx, mutation{
		id:   r.Chunk,
		mask: stripeMask(int64(min(r.Off, maxChunkBytes)), int64(min(r.Off+r.Len, maxChunkBytes))),
		recs: regionRecs(0, r.Chunk.Ino, r.Off, r.Len),
		local: func(tgt uint32) error {
			lr := *r
			lr.Chunk = rpc.ChunkID{Target: tgt, Ino: r.Chunk.Ino}
			_, err := s.handlePunch(ctx, &lr)
			return err
		},
		precheck: func(t *target) error { return checkRange(t, r.Chunk.Ino, r.Off, r.Len, "punch") },
		method:   rpc.SPunch, req: r, answer: func() rpc.Message { return &rpc.Empty{} },
	})
	if err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}

func (s *Server) groupRemove(ctx context.Context, r *rpc.ChunkReq) (*rpc.Empty, error) {
	err := s.groupMutate(ctx, mutation{
		id:   r.Chunk,
		mask: allStripes,
		recs: []mlRec{{kind: mlTruncate, ino: r.Chunk.Ino, arg: 0}},
		local: func(tgt uint32) error {
			_, err := s.handleRemove(ctx, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: r.Chunk.Ino}})
			return err
		},
		method: rpc.SRemove, req: r, answer: func() rpc.Message { return &rpc.Empty{} },
	})
	if err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}

// groupSyncStat is SSync (stat false) and SSyncStat of a group's chunk:
// both copies on stable storage. It changes no bytes, so it takes no
// ordering lock: the writes it must cover were answered, hence applied on
// both copies, before it was sent.
func (s *Server) groupSyncStat(ctx context.Context, r *rpc.ChunkReq, stat bool) (*rpc.ChunkStatResp, error) {
	var resp *rpc.ChunkStatResp
	meth := rpc.SSync
	if stat {
		meth = rpc.SSyncStat
	}
	err := s.groupMutate(ctx, mutation{
		id: r.Chunk,
		local: func(tgt uint32) error {
			var err error
			resp, err = s.syncStat(&rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: r.Chunk.Ino}}, true, stat)
			return err
		},
		method: meth, req: r, answer: func() rpc.Message {
			if stat {
				return &rpc.ChunkStatResp{}
			}
			return &rpc.Empty{}
		},
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// groupRead admits a read-like request (SRead, SChunkStat, SSeek) whose
// chunk id names a group and turns the id into the local target's (the
// request is the handler's own). Other ids are left alone.
func (s *Server) groupRead(ctx context.Context, id *rpc.ChunkID) error {
	if !rpc.IsGroup(id.Target) {
		return nil
	}
	a, err := s.admitGroup(ctx, *id, false)
	if err != nil {
		return err
	}
	*id = rpc.ChunkID{Target: a.g.local, Ino: id.Ino}
	return nil
}
