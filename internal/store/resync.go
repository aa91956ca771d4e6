package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Resync (docs/design/0014 § Resync).
//
// When the group map says that a group whose primary is here is
// resyncing, the primary catches the secondary up: it takes the changes
// mirror.log recorded for the group while it was degraded (mirrorLog.take)
// and, for each chunk,
//
//  1. under the chunk's whole ordering lock: a chunk gone here is removed
//     at the peer; else the peer's copy is cut to the smallest length the
//     chunk was truncated to (or to 0 for a whole-chunk change);
//  2. each run of consecutive recorded 4 KiB blocks of a 1 MiB region (a
//     whole region for a whole-chunk change), under that region's
//     ordering lock: read here (checksums verified), written to the peer
//     in one request — or punched there when it reads as zeros;
//  3. under the whole ordering lock: the peer's copy cut to this one's
//     length, and synced there (the group may be promoted once in sync).
//
// The requests carry the group id and the resyncing epoch, which the
// secondary accepts as the primary's forwards. Holding the ordering lock
// while a range is copied means a forwarded write of that region runs
// wholly before or wholly after the copy, on both copies: the copy never
// overtakes newer forwarded data, nor the reverse (forward.go). New writes
// are forwarded meanwhile, so the record does not grow for them; a
// mutation admitted in the degraded epoch may still be recording when the
// map changes, so the resync first waits for the group's gate, and it then
// takes the record again until a pass finds it empty.
//
// Without a begin record for the current secondary (a replaced, empty
// target, or a record lost), or when the group is marked FullResync (the
// secondary was the primary until its disk failed, so its copy may lack
// writes it acknowledged before the failure: no record names them), every
// chunk of the local target is copied whole, and chunks the peer has that
// are gone here are removed there.
//
// The copy is throttled (Config.ResyncBytesPerSec, a token bucket), its
// progress reported every second (MirrorResyncProgress) and its end
// (MirrorResyncDone); once the service accepts the end, the copied records
// leave mirror.log. A failed pass gives its records back and is tried
// again a second later, until the map changes or the server closes.

// DefaultResyncBytesPerSec is the default Config.ResyncBytesPerSec.
const DefaultResyncBytesPerSec = 200 << 20

const (
	resyncRetry         = time.Second
	resyncMaxAttempts   = 600
	resyncMaxPasses     = 64
	resyncProgressEvery = time.Second
)

// Test hooks: testHookResyncListed runs in addAll between the listing of
// the local target and the peer's; testHookResyncChunk runs before each
// chunk's head.
var (
	testHookResyncListed atomic.Pointer[func()]
	testHookResyncChunk  atomic.Pointer[func(ino uint64)]
)

// resyncRun is a resync running for one group in one epoch.
type resyncRun struct {
	epoch  uint64
	cancel context.CancelFunc
	done   chan struct{}
}

// groupsChanged is the group map's hook: a primary of a degraded group
// makes sure its record has a begin for the current secondary; a primary
// of a resyncing group starts the resync; any other change stops one.
func (s *Server) groupsChanged(changed []groupEntry) {
	for _, g := range changed {
		id := g.info.ID
		switch {
		case g.primary && g.info.State == rpc.GroupDegraded:
			s.stopResync(id)
			if t := (*s.byID.Load())[g.local]; t != nil {
				if err := t.mlog.record([]mlRec{{kind: mlBegin, group: id, arg: uint64(g.peerTarget)}}); err != nil {
					s.log.Error("cannot record the start of a degraded period; the resync will copy every chunk", "group", id, "target", t.path, "err", err)
				}
			}
			// The begin record first: the forwards given up take the
			// degraded path, which acknowledges what it records.
			if n := s.forwards.cancelBefore(id, g.info.Epoch); n > 0 {
				s.log.Info("mirror group degraded by the metadata service: forwards to the old secondary given up", "group", id,
					"epoch", g.info.Epoch, "forwards", n)
			}
		case g.primary && g.info.State == rpc.GroupResyncing:
			s.startResync(g)
		default:
			s.stopResync(id)
		}
	}
}

// startResync starts g's resync unless one of its epoch runs.
func (s *Server) startResync(g groupEntry) {
	id := g.info.ID
	s.resyncs.Lock()
	if s.resyncs.m == nil {
		s.resyncs.m = map[uint32]*resyncRun{}
	}
	old := s.resyncs.m[id]
	if old != nil && old.epoch == g.info.Epoch {
		s.resyncs.Unlock()
		return
	}
	select {
	case <-s.stop:
		s.resyncs.Unlock()
		return
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &resyncRun{epoch: g.info.Epoch, cancel: cancel, done: make(chan struct{})}
	s.resyncs.m[id] = run
	s.wg.Add(1)
	s.resyncs.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(run.done)
		defer cancel()
		if old != nil {
			old.cancel()
			<-old.done
		}
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		s.resyncLoop(ctx, g)
		s.resyncs.Lock()
		if s.resyncs.m[id] == run {
			delete(s.resyncs.m, id)
		}
		s.resyncs.Unlock()
	}()
}

// stopResync cancels the group's resync, if one runs.
func (s *Server) stopResync(id uint32) {
	s.resyncs.Lock()
	defer s.resyncs.Unlock()
	if r := s.resyncs.m[id]; r != nil {
		r.cancel()
		delete(s.resyncs.m, id)
	}
}

// resyncLoop runs g's resync until it is done, the map moves on or the
// server closes.
func (s *Server) resyncLoop(ctx context.Context, g groupEntry) {
	id := g.info.ID
	t := (*s.byID.Load())[g.local]
	if t == nil {
		s.log.Error("resync: the primary's target is not served here", "group", id, "target", g.local)
		return
	}
	// Mutations admitted in the degraded epoch finish (and record)
	// before the record is taken.
	gate := s.gate(id)
	gate.Lock()
	gate.Unlock() //nolint:staticcheck // a barrier
	label := groupLabel(id)
	defer s.mm.resyncRemaining.WithLabelValues(label).Set(0)
	s.log.Info("mirror resync starting", "group", id, "epoch", g.info.Epoch, "secondary", g.peerAddr, "target", t.path)
	for attempt := 0; attempt < resyncMaxAttempts; attempt++ {
		copied, err := s.resyncOnce(ctx, g, t)
		if err == nil {
			_, err = s.mirrorReport(&rpc.MirrorReportReq{Group: id, Epoch: g.info.Epoch, Target: g.local,
				Event: rpc.MirrorResyncDone, Done: copied, Total: copied})
			if err == nil {
				if err := t.mlog.done(id); err != nil {
					s.log.Error("resync done but the record could not be cleared; the next resync copies its regions again", "group", id, "err", err)
				}
				s.log.Info("mirror resync done", "group", id, "copied_bytes", copied)
				return
			}
		}
		if ctx.Err() != nil || rpc.ErrnoOf(err) == syscall.ESTALE {
			s.log.Info("mirror resync stopped", "group", id, "epoch", g.info.Epoch, "err", err)
			return
		}
		s.log.Warn("mirror resync pass failed; retrying", "group", id, "attempt", attempt+1, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(resyncRetry):
		}
	}
	s.log.Error("mirror resync gave up", "group", id, "attempts", resyncMaxAttempts)
}

// resyncOnce copies what the record names (or everything) until a pass
// finds nothing new; it answers the bytes copied.
func (s *Server) resyncOnce(ctx context.Context, g groupEntry, t *target) (uint64, error) {
	id := g.info.ID
	rs := &resyncer{s: s, g: g, t: t, bucket: newTokenBucket(s.cfg.ResyncBytesPerSec), last: time.Now()}
	for pass := 0; pass < resyncMaxPasses; pass++ {
		taken, begun, peer := t.mlog.take(id)
		if pass == 0 && (!begun || peer != g.peerTarget || g.info.FullResync) {
			s.log.Info("mirror resync copies every chunk (no record of the changes for this secondary, or its copy failed as the primary)", "group", id,
				"secondary_target", g.peerTarget, "recorded_for", peer, "begun", begun, "full_resync", g.info.FullResync)
			if err := rs.addAll(ctx, taken); err != nil {
				t.mlog.giveBack(id, taken)
				return rs.done, err
			}
		} else if len(taken.inos) == 0 {
			return rs.done, nil
		}
		if err := rs.copySet(ctx, taken); err != nil {
			t.mlog.giveBack(id, taken)
			return rs.done, err
		}
	}
	return rs.done, fmt.Errorf("mirror group %d: the record kept growing over %d passes", id, resyncMaxPasses)
}

// resyncer is one resync pass's state.
type resyncer struct {
	s           *Server
	g           groupEntry
	t           *target
	bucket      *tokenBucket
	done, total uint64    // progress: bytes of recorded blocks dealt with, of all
	sent        uint64    // data bytes written to the secondary
	last        time.Time // of the last progress report
	// inPlace: copy over the secondary's bytes without cutting them
	// first, and report no progress (a secondary in sync serves reads
	// meanwhile: consumeSuspects).
	inPlace bool
}

// chunk answers the group chunk id of ino in the resync's epoch.
func (r *resyncer) chunk(ino uint64) rpc.ChunkID {
	return rpc.ChunkID{Target: rpc.GroupBit | r.g.info.ID, Ino: ino, Epoch: r.g.info.Epoch}
}

// call sends one request to the secondary.
func (r *resyncer) call(ctx context.Context, m rpc.Method, req, resp rpc.Message) error {
	cctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	if err := r.s.peerCall(cctx, r.g.peerAddr, m, req, resp); err != nil {
		return fmt.Errorf("resync of mirror group %d to %s: %w", r.g.info.ID, r.g.peerAddr, err)
	}
	return nil
}

// addAll adds every chunk of the local target to set as changed whole,
// and removes at the peer the chunks it has that are gone here.
func (r *resyncer) addAll(ctx context.Context, set *changeSet) error {
	local := map[uint64]bool{}
	err := r.list(ctx, func(req *rpc.ListChunksReq, resp *rpc.ListChunksResp) error {
		req.Target = r.g.local
		out, err := r.s.handleListChunks(ctx, req)
		if err == nil {
			*resp = *out
		}
		return err
	}, func(ino uint64) error {
		local[ino] = true
		set.add(mlRec{kind: mlWhole, ino: ino})
		return nil
	})
	if err != nil {
		return err
	}
	if h := testHookResyncListed.Load(); h != nil {
		(*h)()
	}
	return r.list(ctx, func(req *rpc.ListChunksReq, resp *rpc.ListChunksResp) error {
		req.Target = r.g.peerTarget
		return r.call(ctx, rpc.SListChunks, req, resp)
	}, func(ino uint64) error {
		if local[ino] {
			return nil
		}
		set.add(mlRec{kind: mlTruncate, ino: ino, arg: 0}) // copySet removes it there if still gone here
		return nil
	})
}

// list walks a target's chunks with listOne, calling each for every one.
func (r *resyncer) list(ctx context.Context, listOne func(*rpc.ListChunksReq, *rpc.ListChunksResp) error, each func(ino uint64) error) error {
	req := &rpc.ListChunksReq{Max: 4096}
	for i := 0; i <= fanOutDirs; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		var resp rpc.ListChunksResp
		if err := listOne(req, &resp); err != nil {
			return err
		}
		for _, ino := range resp.Inos {
			if err := each(ino); err != nil {
				return err
			}
		}
		if resp.Done {
			return nil
		}
		req.From = resp.Next
	}
	return errors.New("chunk listing did not end")
}

// copySet copies the changes of set to the peer (see the top).
func (r *resyncer) copySet(ctx context.Context, set *changeSet) error {
	for _, ic := range set.inos {
		if ic.whole {
			continue // counted by copyChunk, from the chunk's length
		}
		for _, b := range ic.regions {
			r.total += uint64(b.count()) << blockShift
		}
	}
	for ino, ic := range set.inos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.copyChunk(ctx, ino, ic); err != nil {
			return err
		}
	}
	return nil
}

// copyChunk copies one chunk's changes: each run of recorded blocks (or,
// for a whole-chunk change, each region up to the chunk's length) in one
// range.
func (r *resyncer) copyChunk(ctx context.Context, ino uint64, ic *inoChanges) error {
	if h := testHookResyncChunk.Load(); h != nil {
		(*h)(ino)
	}
	size, exists, err := r.head(ctx, ino, ic)
	if err != nil || !exists {
		return err
	}
	blocksOf := func(reg uint64) regionBlocks { return ic.regions[reg] }
	regions := sortedRegions(ic)
	switch {
	case ic.whole:
		regions = regions[:0]
		for reg := uint64(0); reg<<mirrorRegionShift < uint64(size); reg++ {
			regions = append(regions, reg)
		}
		r.total += uint64(len(regions)) << mirrorRegionShift
		blocksOf = func(uint64) regionBlocks { return allBlocks }
	case ic.hasTrunc && uint64(size) > ic.minTrunc:
		// The head cut the peer's copy to minTrunc, and with it whatever
		// was forwarded there past minTrunc since the record was taken
		// (new writes are forwarded, not recorded): everything from
		// minTrunc's block to the chunk's length is copied, besides the
		// recorded blocks below it (the third soak run lost a chunk so).
		regions, blocksOf = r.pastTruncate(ic, size)
	}
	for _, reg := range regions {
		blocks := blocksOf(reg)
		base := int64(reg << mirrorRegionShift)
		for _, run := range blocks.runs() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := r.copyRange(ctx, ino, base+int64(run[0]<<blockShift), base+int64(run[1]<<blockShift)); err != nil {
				return err
			}
			r.progress()
		}
	}
	return r.tail(ctx, ino)
}

// pastTruncate answers the regions to copy of a chunk of length size
// whose record has a truncate to ic.minTrunc (and no whole-chunk change),
// and their blocks: the recorded ones, and every block from the one
// holding minTrunc on. The blocks added join the total.
func (r *resyncer) pastTruncate(ic *inoChanges, size int64) ([]uint64, func(uint64) regionBlocks) {
	from := ic.minTrunc >> blockShift // the first block the head's cut changed
	extra := map[uint64]regionBlocks{}
	for reg := from >> (mirrorRegionShift - blockShift); reg<<mirrorRegionShift < uint64(size); reg++ {
		b0 := uint64(0)
		if base := reg << (mirrorRegionShift - blockShift); from > base {
			b0 = from - base
		}
		add := blockSpan(b0, regionBlockCount)
		old := ic.regions[reg]
		extra[reg] = old.or(add)
		r.total += uint64(extra[reg].count()-old.count()) << blockShift
	}
	regions := sortedRegions(ic)
	for reg := range extra {
		if _, ok := ic.regions[reg]; !ok {
			regions = append(regions, reg)
		}
	}
	sort.Slice(regions, func(i, j int) bool { return regions[i] < regions[j] })
	return regions, func(reg uint64) regionBlocks {
		if b, ok := extra[reg]; ok {
			return b
		}
		return ic.regions[reg]
	}
}

// localSize answers the local chunk's length and whether it exists.
func (r *resyncer) localSize(ino uint64) (int64, bool, error) {
	c, err := r.s.cache.get(r.t, ino, false)
	if errors.Is(err, errNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer r.s.cache.release(c)
	return c.size.Load(), true, nil
}

// head is step 1 under the chunk's whole ordering lock.
func (r *resyncer) head(ctx context.Context, ino uint64, ic *inoChanges) (int64, bool, error) {
	ord := r.s.order.lock(r.t, ino, allStripes)
	defer r.s.order.unlock(r.t, ino, ord, allStripes)
	size, exists, err := r.localSize(ino)
	switch {
	case err != nil:
		return 0, false, err
	case !exists:
		return 0, false, r.call(ctx, rpc.SRemove, &rpc.ChunkReq{Chunk: r.chunk(ino)}, &rpc.Empty{})
	case ic.whole && !r.inPlace:
		return size, true, r.call(ctx, rpc.STruncate, &rpc.TruncateReq{Chunk: r.chunk(ino), Size: 0}, &rpc.Empty{})
	case ic.hasTrunc:
		return size, true, r.call(ctx, rpc.STruncate, &rpc.TruncateReq{Chunk: r.chunk(ino), Size: ic.minTrunc}, &rpc.Empty{})
	}
	return size, true, nil
}

// tail is step 3 under the chunk's whole ordering lock.
func (r *resyncer) tail(ctx context.Context, ino uint64) error {
	ord := r.s.order.lock(r.t, ino, allStripes)
	defer r.s.order.unlock(r.t, ino, ord, allStripes)
	size, exists, err := r.localSize(ino)
	switch {
	case err != nil:
		return err
	case !exists:
		return r.call(ctx, rpc.SRemove, &rpc.ChunkReq{Chunk: r.chunk(ino)}, &rpc.Empty{})
	}
	if err := r.call(ctx, rpc.STruncate, &rpc.TruncateReq{Chunk: r.chunk(ino), Size: uint64(size)}, &rpc.Empty{}); err != nil {
		return err
	}
	// Durable there before the group is declared in sync (the secondary
	// may be promoted then).
	return r.call(ctx, rpc.SSync, &rpc.ChunkReq{Chunk: r.chunk(ino)}, &rpc.Empty{})
}

// copyRange is step 2 for [off, end) of chunk ino, a range within one
// region (so under that region's ordering lock). The part past the
// chunk's length is not copied (the tail cuts the peer's copy there) and
// leaves the total.
func (r *resyncer) copyRange(ctx context.Context, ino uint64, off, end int64) error {
	mask := stripeMask(off, end)
	ord := r.s.order.lock(r.t, ino, mask)
	defer r.s.order.unlock(r.t, ino, ord, mask)
	c, err := r.s.cache.get(r.t, ino, false)
	if errors.Is(err, errNotExist) {
		r.total -= uint64(end - off)
		return nil // removed meanwhile: the tail removes it there
	}
	if err != nil {
		return err
	}
	size := c.size.Load()
	if off >= size {
		r.s.cache.release(c)
		r.total -= uint64(end - off)
		return nil
	}
	n := min(end, size) - off
	r.total -= uint64(end - off - n)
	resp, err := c.read(r.s, off, int(n), nil)
	r.s.cache.release(c)
	if err != nil {
		return fmt.Errorf("resync of mirror group %d: read chunk %x at %d: %w", r.g.info.ID, ino, off, err)
	}
	defer resp.Release()
	if err := r.bucket.wait(ctx, len(resp.Data)); err != nil {
		return err
	}
	// A range of zeros is punched there: nothing to send, and the
	// secondary keeps the hole.
	sent := 0
	if allZero(resp.Data) {
		err = r.call(ctx, rpc.SPunch, &rpc.PunchReq{Chunk: r.chunk(ino), Off: uint64(off), Len: uint64(len(resp.Data))}, &rpc.Empty{})
	} else {
		err = r.call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: r.chunk(ino), Off: uint64(off), Data: resp.Data}, &rpc.WriteResp{})
		sent = len(resp.Data)
	}
	if err != nil {
		return err
	}
	r.done += uint64(len(resp.Data))
	r.sent += uint64(sent)
	r.s.mm.resyncBytes.WithLabelValues(groupLabel(r.g.info.ID)).Add(float64(sent))
	return nil
}

// progress publishes the remaining bytes and, every second, reports the
// progress to the metadata service.
func (r *resyncer) progress() {
	r.total = max(r.total, r.done)
	r.s.mm.resyncRemaining.WithLabelValues(groupLabel(r.g.info.ID)).Set(float64(r.total - r.done))
	if time.Since(r.last) < resyncProgressEvery || r.s.meta == nil || r.inPlace {
		return
	}
	r.last = time.Now()
	if _, err := r.s.mirrorReport(&rpc.MirrorReportReq{Group: r.g.info.ID, Epoch: r.g.info.Epoch, Target: r.g.local,
		Event: rpc.MirrorResyncProgress, Done: r.done, Total: r.total}); err != nil {
		r.s.log.Warn("cannot report resync progress", "group", r.g.info.ID, "err", err)
	}
}

func allZero(b []byte) bool {
	for len(b) >= blockSize {
		if [blockSize]byte(b[:blockSize]) != zeroBlock {
			return false
		}
		b = b[blockSize:]
	}
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// tokenBucket limits a rate of bytes: at most rate a second, with a burst
// of a second's worth.
type tokenBucket struct {
	rate   float64 // bytes per second; <= 0: unlimited
	tokens float64
	last   time.Time
}

func newTokenBucket(rate int64) *tokenBucket {
	return &tokenBucket{rate: float64(rate), tokens: float64(rate), last: time.Now()}
}

// wait takes n bytes' tokens, sleeping until they are there.
func (b *tokenBucket) wait(ctx context.Context, n int) error {
	if b.rate <= 0 {
		return nil
	}
	now := time.Now()
	b.tokens = min(b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return nil
	}
	d := time.Duration(-b.tokens / b.rate * float64(time.Second))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// consumeSuspects deals with the suspects of each target (mirrorlog.go)
// once the group map is known (after a heartbeat answer): a target in no
// group drops them (logged, for strata scrub); the secondary of a group
// hands them to its primary (sendSuspects) and refuses reads of them
// until the primary has them; the primary of a degraded or resyncing
// group adds them to the group's record as whole chunks; the primary of
// an in-sync group copies them to the secondary now, region by region
// over the old bytes (the secondary serves reads meanwhile).
func (s *Server) consumeSuspects() {
	for _, t := range s.targets {
		if _, n := t.mlog.pending(suspectGroup); n == 0 || t.suspectPush.Load() {
			continue
		}
		var g groupEntry
		found := false
		for _, e := range s.groups.all() {
			if e.local == t.id.Load() {
				g, found = e, true
			}
		}
		if found && !g.primary {
			t.suspectPush.Store(true)
			t.suspectsAsSecondary.Store(true)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer t.suspectPush.Store(false)
				s.sendSuspects(t, g.info.ID)
			}()
			continue
		}
		taken, _, _ := t.mlog.take(suspectGroup)
		if found && t.suspectsAsSecondary.Load() {
			// Promoted (its primary died) before the primary took the
			// suspects: these chunks may lack writes that were
			// acknowledged, and this copy is now the group's only
			// current one. The resync makes the returning copy equal to
			// it; what this copy lost is lost unless scrub or a person
			// finds it there first.
			s.log.Error("mirror group's secondary was promoted before the chunks an unclean stop left unsure were copied from the old primary: they may be stale; the returning copy is made equal to them by the resync — compare with strata scrub before it returns if the data matters",
				"target", t.path, "group", g.info.ID, "epoch", g.info.Epoch, "chunks", len(taken.inos), "first", firstInos(taken, 8))
		}
		switch {
		case !found:
			s.log.Warn("chunks written before an unclean stop: this target is in no mirror group; strata scrub checks them",
				"target", t.path, "chunks", len(taken.inos))
			s.dropSuspects(t)
		case g.info.State != rpc.GroupInSync:
			recs := taken.records(g.info.ID)
			if err := t.mlog.record(recs); err != nil {
				t.mlog.giveBack(suspectGroup, taken)
				s.log.Error("cannot record the suspect chunks for the resync", "target", t.path, "group", g.info.ID, "err", err)
				continue
			}
			s.dropSuspects(t)
		default:
			t.suspectPush.Store(true)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer t.suspectPush.Store(false)
				s.pushSuspects(t, g, taken)
			}()
		}
	}
}

// firstInos answers up to n of set's chunks, in order (for log lines).
func firstInos(set *changeSet, n int) []uint64 {
	out := make([]uint64, 0, len(set.inos))
	for ino := range set.inos {
		out = append(out, ino)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out[:min(n, len(out))]
}

// suspectWarnEvery is how often a failing hand-over of suspects is
// logged as a warning (it is retried at every heartbeat).
const suspectWarnEvery = time.Minute

// suspectsCallTimeout bounds one SMirrorSuspects call: the primary
// records the chunks durably and may report a degrade to the service.
const suspectsCallTimeout = 2*reportTimeout + forwardTimeout

// sendSuspects hands t's suspects to the primary of group, of which t is
// the secondary (SMirrorSuspects, at most rpc.MaxSuspectsPerCall a call),
// adopts the answered group (degraded: this copy serves no reads and is
// never promoted until the resync that copies them ended), and drops
// them here. On failure they stay (reads of them refused) and the next
// heartbeat answer tries again.
func (s *Server) sendSuspects(t *target, group uint32) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	inos := t.mlog.suspectInos()
	total := len(inos)
	for len(inos) > 0 {
		g, ok := s.groups.entry(group)
		if !ok || g.primary || g.local != t.id.Load() {
			s.log.Info("mirror group changed before the suspect chunks were handed to the primary; the next heartbeat decides", "group", group, "target", t.path)
			return
		}
		n := min(len(inos), rpc.MaxSuspectsPerCall)
		var gr rpc.GroupResp
		cctx, ccancel := context.WithTimeout(ctx, suspectsCallTimeout)
		err := s.peerCall(cctx, g.peerAddr, rpc.SMirrorSuspects,
			&rpc.MirrorSuspectsReq{Group: group, Epoch: g.info.Epoch, Target: g.local, Inos: inos[:n]}, &gr)
		ccancel()
		if rpc.ErrnoOf(err) == syscall.ENOSYS {
			// An older primary: nobody can take them. Reads of them
			// refused for ever would fail; as before, log and drop.
			s.log.Error("the mirror group's primary does not take suspect chunks (an older release): this copy may differ from it in them until strata scrub --repair",
				"group", group, "primary", g.peerAddr, "target", t.path, "chunks", total, "first", inos[:min(8, len(inos))])
			break
		}
		if err != nil {
			if rpc.ErrnoOf(err) == syscall.ESTALE {
				_ = s.refreshGroups(ctx, s.groups.seen())
			}
			lvl := slog.LevelDebug
			if now := time.Now().UnixNano(); now-t.suspectWarned.Load() >= int64(suspectWarnEvery) {
				t.suspectWarned.Store(now)
				lvl = slog.LevelWarn
			}
			s.log.Log(ctx, lvl, "cannot hand the chunks written before an unclean stop to the mirror group's primary; reads of them stay refused here, retried after every heartbeat",
				"group", group, "primary", g.peerAddr, "target", t.path, "chunks", total, "err", err)
			return
		}
		s.installGroups([]rpc.GroupInfo{gr.Group}, gr.Version, false)
		inos = inos[n:]
	}
	t.mlog.take(suspectGroup)
	s.dropSuspects(t)
	if len(inos) == 0 {
		s.log.Warn("chunks written before an unclean stop handed to the mirror group's primary; its resync copies them here whole",
			"group", group, "target", t.path, "chunks", total)
	}
}

// handleMirrorSuspects is SMirrorSuspects at a group's primary: the
// secondary's copy of r.Inos may lack writes (it stopped uncleanly). The
// chunks are recorded durably in mirror.log as whole-chunk changes of the
// group, and a group not degraded yet is degraded (MirrorSecondaryLost,
// as for an unreachable secondary): from then on the secondary serves no
// reads and cannot be promoted, and the resync that follows when the
// service sees the secondary alive copies those chunks whole. Answers the
// group after, with the map version this server had it from.
func (s *Server) handleMirrorSuspects(ctx context.Context, r *rpc.MirrorSuspectsReq) (*rpc.GroupResp, error) {
	if len(r.Inos) > rpc.MaxSuspectsPerCall {
		return nil, rpc.Errorf(syscall.EINVAL, "mirror group %d: %d suspect chunks in one call, at most %d", r.Group, len(r.Inos), rpc.MaxSuspectsPerCall)
	}
	// As a mutation: a resync starting waits for the record.
	gate := s.gate(r.Group)
	gate.RLock()
	defer gate.RUnlock()
	a, err := s.admitGroup(ctx, rpc.ChunkID{Target: rpc.GroupBit | r.Group, Epoch: r.Epoch}, true)
	if err != nil {
		return nil, err
	}
	if !a.g.primary || a.g.peerTarget != r.Target {
		return nil, rpc.Errorf(syscall.EINVAL, "mirror group %d: storage server %s is not the primary of target %d's copy in epoch %d",
			r.Group, s.addr, r.Target, r.Epoch)
	}
	recs := make([]mlRec, 0, len(r.Inos))
	for _, ino := range r.Inos {
		recs = append(recs, mlRec{kind: mlWhole, group: r.Group, ino: ino})
	}
	if err := s.recordChange(a, recs); err != nil {
		return nil, err
	}
	if a.g.info.State != rpc.GroupDegraded {
		cause := fmt.Errorf("the secondary (target %d) restarted after an unclean stop unsure of %d chunks", r.Target, len(r.Inos))
		na, err := s.degrade(ctx, a, cause)
		if err != nil {
			return nil, rpc.Errorf(syscall.EAGAIN, "mirror group %d: %v, and the metadata service could not be told: %v", r.Group, cause, err)
		}
		a = na
	}
	s.log.Warn("mirror group's secondary restarted unsure of chunks; recorded for its resync", "group", r.Group,
		"epoch", a.g.info.Epoch, "secondary", a.g.peerAddr, "chunks", len(r.Inos))
	return &rpc.GroupResp{Group: a.g.info, Version: a.g.ver}, nil
}

// dropSuspects rewrites t's mirror log without the suspects taken.
func (s *Server) dropSuspects(t *target) {
	if err := t.mlog.done(suspectGroup); err != nil {
		s.log.Error("cannot drop the suspects from the mirror log", "target", t.path, "err", err)
	}
}

// pushSuspects copies the suspect chunks of taken to g's secondary.
func (s *Server) pushSuspects(t *target, g groupEntry, taken *changeSet) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	rs := &resyncer{s: s, g: g, t: t, bucket: newTokenBucket(s.cfg.ResyncBytesPerSec), last: time.Now(), inPlace: true}
	if err := rs.copySet(ctx, taken); err != nil {
		t.mlog.giveBack(suspectGroup, taken)
		s.log.Warn("cannot copy the chunks written before an unclean stop to the secondary; retried after the next heartbeat",
			"group", g.info.ID, "err", err)
		return
	}
	s.dropSuspects(t)
	s.log.Info("copied the chunks written before an unclean stop to the secondary", "group", g.info.ID, "chunks", len(taken.inos), "bytes", rs.sent)
}
