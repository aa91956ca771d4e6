package store

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Self-healing of mirror group chunks (docs/design/0014 § Self-healing)
//
// A block whose data fails its stored sum on one copy of a group is taken
// from the other copy, if that copy is in sync and its block passes its own
// sum. The callers: a read of a group chunk that failed its checksum
// (healRead, from handleRead: only for group ids, so unmirrored reads
// cost nothing), a partial write of a group chunk over a bad block
// (healBeforeWrite, for the group write paths of forward.go), SChunkSums
// with Heal (the other copy asks this one to repair itself: scrub.go),
// and the scrub of a primary copy (scrub.go).
//
// The good bytes come from the other copy's SChunkSums (never SRead: an
// SRead of a block bad on both copies would make each copy ask the other
// in a loop; SChunkSums answers what it has and heals only when told).
//
// Race with writes: a repair is a mutation of the chunk (beginMutation)
// that holds the range's regions exclusively from finding the bad blocks
// to rewriting them, across the fetch from the other copy, so no write of
// the range lands between (repairLocked). A block found bad under those
// locks was not rewritten since it went bad (a bad block turns good only
// by a write covering it whole, a punch or a truncate; a partial write
// over it fails its edge verification), and a write forwarded later lands
// on the repaired block. The other copy answers the fetch without waiting
// for its own locks (EAGAIN when busy; the repair retries after a jittered
// pause, healAttempts times), so two copies repairing the same range from
// each other never wait on each other. Copies are compared block by
// block; a block good on both but different is not touched here (resync's
// business), only reported by scrub.
//
// The rewrite is a mutation like a write: intent log record and dirty
// flag first (beginMutation), sums and data under the exclusive region
// locks, then a sync so the repair is durable before it is counted.

// peerFinder is the store's view of the mirror groups it holds a copy of:
// for group (without rpc.GroupBit), its local target, the other copy's
// target and server, the epoch and whether this copy is the primary and
// the group in sync. mirror.go's group map provides it.
type peerFinder interface {
	peerOf(group uint32) (groupPeer, bool)
}

// healAttempts bounds the attempts of one repair whose other copy cannot
// lock the range at once.
const healAttempts = 8

// healRunGap: bad blocks closer than this many blocks are fetched from the
// other copy in one call.
const healRunGap = 16

// healCallTimeout bounds one call to the other copy's server.
const healCallTimeout = 10 * time.Second

// healer holds the self-healing state of a Server: the group view, the
// clients of the other copies' servers and the repair counter.
type healer struct {
	s       *Server
	peers   atomic.Pointer[peerFinder]
	repairs *prometheus.CounterVec // strata_mirror_repairs_total{kind}

	mu      sync.Mutex
	clients map[string]*transport.Client
	meta    *transport.Multi // for MMirrorReport; nil until the first report
	closed  bool
}

func newHealer(s *Server) *healer {
	h := &healer{s: s, clients: map[string]*transport.Client{}}
	h.repairs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_mirror_repairs_total",
		Help: "Blocks of mirror group chunks rewritten from the other copy, by what found them (read, write, scrub)."}, []string{"kind"})
	s.m.reg.MustRegister(h.repairs)
	return h
}

// setPeerFinder installs the group view self-healing uses.
func (s *Server) setPeerFinder(p peerFinder) { s.heal.peers.Store(&p) }

// peerOf looks group up in the installed group view.
func (h *healer) peerOf(group uint32) (groupPeer, bool) {
	p := h.peers.Load()
	if p == nil || *p == nil {
		return groupPeer{}, false
	}
	return (*p).peerOf(group &^ rpc.GroupBit)
}

// healCall calls the server at addr (another copy's) with the server's
// cluster key, over a pooled client. The call ends with ctx (and within
// healCallTimeout) but carries none of ctx's values: a handler's context
// holds its caller's lent buffers and read destination, which must not
// reach another handler (an in-process call passes its context on).
func (h *healer) healCall(ctx context.Context, addr string, m rpc.Method, req, resp rpc.Message) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return rpc.Errorf(syscall.ESHUTDOWN, "storage server closing")
	}
	cl := h.clients[addr]
	if cl == nil {
		cl = transport.NewClient(addr, transport.ClientConfig{Key: h.s.cfg.ClusterKey, TLS: h.s.cfg.TLS, Conns: 1, CallTimeout: healCallTimeout})
		h.clients[addr] = cl
	}
	h.mu.Unlock()
	deadline := time.Now().Add(healCallTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	cctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	return cl.Call(cctx, m, req, resp)
}

func (h *healer) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, cl := range h.clients {
		cl.Close()
	}
	if h.meta != nil {
		h.meta.Close()
	}
}

// healRead serves read r of a chunk of group (its layout id, with or
// without rpc.GroupBit) whose checksum failed (readErr), after repairing
// the range's bad blocks from the other copy; it answers readErr when they
// cannot be repaired.
func (s *Server) healRead(ctx context.Context, c *chunk, group uint32, r *rpc.ReadReq, dest []byte, readErr error) (*readResp, error) {
	if !isChecksumFailure(readErr) {
		return nil, readErr
	}
	group &^= rpc.GroupBit
	p, ok := s.heal.peerOf(group)
	if !ok || !p.InSync {
		s.log.Error("checksum mismatch in a mirror group chunk, and the other copy is not in sync: not repaired",
			"group", group, "target", c.t.path, "ino", c.name())
		return nil, readErr
	}
	b0, b1 := int64(r.Off)>>blockShift, blocks(int64(r.Off)+int64(r.Len))
	_, unrep, err := s.heal.repairRange(ctx, c, group, p, b0, b1, "read")
	if errors.Is(err, syscall.ESTALE) || errors.Is(err, syscall.EAGAIN) {
		// The group is switching (the copies disagree on the epoch) or
		// the other copy stayed busy: the caller re-reads the group map
		// and tries again, within its bounded wait.
		s.log.Warn("checksum mismatch in a mirror group chunk: the other copy cannot help now", "group", group,
			"target", c.t.path, "ino", c.name(), "err", err)
		return nil, rpc.Errorf(syscall.EAGAIN, "group %d chunk %x: bad blocks here, the other copy cannot serve them now: %v", group, c.ino, err)
	}
	if err != nil || unrep > 0 {
		s.log.Error("checksum mismatch in a mirror group chunk: not repaired from the other copy", "group", group,
			"target", c.t.path, "ino", c.name(), "blocks_bad_on_both", unrep, "err", err)
		return nil, readErr
	}
	return c.read(s, int64(r.Off), int(r.Len), dest)
}

// healBeforeWrite repairs from the other copy the edge blocks of a write
// [off, end) to a chunk of group that failed (werr) because one of them
// fails its sum (a write verifies the blocks it merges into), and reports
// whether it did: the caller then writes again. For the write paths of
// group chunks (a client's on the primary, a forwarded one on the
// secondary), so that a bad block under a partial write neither fails the
// write nor, on a secondary, degrades the group.
func (s *Server) healBeforeWrite(ctx context.Context, c *chunk, group uint32, off, end int64, werr error) bool {
	if !isChecksumFailure(werr) || end <= off {
		return false
	}
	group &^= rpc.GroupBit
	p, ok := s.heal.peerOf(group)
	if !ok || !p.InSync {
		return false
	}
	fixed := 0
	edges := []int64{off >> blockShift}
	if last := (end - 1) >> blockShift; last != edges[0] {
		edges = append(edges, last)
	}
	for _, b := range edges {
		n, _, err := s.heal.repairRange(ctx, c, group, p, b, b+1, "write")
		if err != nil {
			s.log.Error("write over a bad block of a mirror group chunk: not repaired from the other copy", "group", group,
				"target", c.t.path, "ino", c.name(), "block", b, "err", err)
			return false
		}
		fixed += n
	}
	return fixed > 0
}

// healWriteEdges is healBeforeWrite for a write to chunk ino of local
// target tgt, for the callers that hold no chunk handle (the group write
// paths, which apply a write through handleWrite).
func (s *Server) healWriteEdges(ctx context.Context, tgt uint32, ino uint64, group uint32, off, end int64, werr error) bool {
	if !isChecksumFailure(werr) {
		return false
	}
	t, err := s.target(tgt, ino)
	if err != nil {
		return false
	}
	c, err := s.cache.get(t, ino, false)
	if err != nil {
		return false
	}
	defer s.cache.release(c)
	return s.healBeforeWrite(ctx, c, group, off, end, werr)
}

// isChecksumFailure tells a checksum mismatch (EIO) from other errors.
func isChecksumFailure(err error) bool {
	var re *rpc.Error
	return errors.As(err, &re) && re.Errno == syscall.EIO && isChecksumErr(re)
}

// repairRange rewrites the blocks of c in [b0, b1) that fail their sums
// from the copy of group on p's server, and answers how many it rewrote
// and how many it could not (bad there too, or absent there). kind labels
// the repair counter and the log line. The other copy answers EAGAIN when
// it cannot lock the range at once (it may be repairing it from this
// copy): the attempt is then given up, locks released, and made again a
// little later, at most healAttempts times.
func (h *healer) repairRange(ctx context.Context, c *chunk, group uint32, p groupPeer, b0, b1 int64, kind string) (fixed, unrep int, err error) {
	var fix []int64
	for attempt := 0; ; attempt++ {
		fix, unrep, err = h.repairLocked(ctx, c, group, p, b0, b1)
		if !errors.Is(err, syscall.EAGAIN) || attempt == healAttempts-1 {
			break
		}
		tm := time.NewTimer(time.Duration(1+rand.IntN(1<<attempt)) * time.Millisecond)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return 0, 0, fmt.Errorf("target %s chunk %x: repair: %w", c.t.path, c.ino, ctx.Err())
		}
	}
	if len(fix) > 0 {
		if serr := c.sync(); serr != nil && err == nil {
			err = serr
		}
		h.repaired(c, group, p, kind, fix)
	}
	return len(fix), unrep, err
}

// repairLocked is one attempt of repairRange: as a mutation of c, with the
// range's regions locked exclusively, it finds the bad blocks, fetches
// them from the other copy and rewrites those that copy has good. The
// locks held across the fetch keep every write of the range out until the
// repair is done (a forwarded write then lands on the repaired block), and
// a block found bad under them has not been rewritten since: a bad block
// turns good only by a write covering it whole, a punch or a truncate.
func (h *healer) repairLocked(ctx context.Context, c *chunk, group uint32, p groupPeer, b0, b1 int64) (fixed []int64, unrep int, err error) {
	if err := c.beginMutation(); err != nil {
		return nil, 0, err
	}
	defer c.endMutation()
	mask := stripeMask(b0<<blockShift, b1<<blockShift)
	c.lock(mask, true)
	defer c.unlock(mask, true)
	_, bad, err := c.scanBlocks(b0, b1, nil, scanHeld)
	if err != nil || len(bad) == 0 {
		return nil, 0, err
	}
	idx := make([]int64, len(bad))
	for i, b := range bad {
		idx[i] = b0 + int64(b)
	}
	good, missing, err := h.fetchGood(ctx, c, group, p, idx)
	if err != nil {
		return nil, 0, err
	}
	size := c.size.Load()
	var sb [4]byte
	for i, b := range idx {
		bs := b << blockShift
		if good[i] == nil || bs >= size {
			continue
		}
		data := good[i][:min(blockSize, size-bs)]
		putU32(sb[:], storedSum(data))
		if _, err := c.writeSums(sb[:], b); err != nil {
			return fixed, missing, c.ioErr("write sums", bs, err)
		}
		if err := pwriteFull(c.dataFd, data, bs); err != nil {
			// The sum now matches neither: the block stays bad.
			return fixed, missing, c.ioErr("write", bs, err)
		}
		fixed = append(fixed, b)
	}
	return fixed, missing, nil
}

// fetchGood asks the other copy for blocks idx (ascending) and answers
// each one's bytes (a whole block, zero padded), or nil where that copy's
// block is bad or absent too, with the count of those.
func (h *healer) fetchGood(ctx context.Context, c *chunk, group uint32, p groupPeer, idx []int64) ([][]byte, int, error) {
	good := make([][]byte, len(idx))
	missing := 0
	const maxRun = rpc.MaxChunkSumsData >> blockShift
	for i := 0; i < len(idx); {
		j := i + 1
		for j < len(idx) && idx[j]-idx[j-1] <= healRunGap && idx[j]-idx[i] < maxRun {
			j++
		}
		lo, hi := idx[i], idx[j-1]+1
		req := &rpc.ChunkSumsReq{Chunk: rpc.ChunkID{Target: rpc.GroupBit | group, Ino: c.ino, Epoch: p.Epoch},
			Off: uint64(lo << blockShift), Len: uint64((hi - lo) << blockShift), Data: true}
		var resp rpc.ChunkSumsResp
		if err := h.healCall(ctx, p.PeerAddr, rpc.SChunkSums, req, &resp); err != nil {
			return nil, 0, fmt.Errorf("group %d chunk %x: fetch blocks %d-%d from the other copy on %s: %w", group, c.ino, lo, hi-1, p.PeerAddr, err)
		}
		peerBad := map[int64]bool{}
		for _, b := range resp.Bad {
			peerBad[lo+int64(b)] = true
		}
		for k := i; k < j; k++ {
			rel := idx[k] - lo
			if !resp.Exists || peerBad[idx[k]] || rel >= int64(len(resp.Sums)) || (rel+1)<<blockShift > int64(len(resp.Data)) {
				missing++
				continue
			}
			blk := resp.Data[rel<<blockShift : (rel+1)<<blockShift]
			if storedSum(blk) != resp.Sums[rel] {
				missing++ // damaged on the way: do not trust it
				continue
			}
			good[k] = append([]byte(nil), blk...)
		}
		i = j
	}
	return good, missing, nil
}

// repaired logs, counts and reports the blocks of c rewritten from the other
// copy.
func (h *healer) repaired(c *chunk, group uint32, p groupPeer, kind string, blocks []int64) {
	n := len(blocks)
	h.repairs.WithLabelValues(kind).Add(float64(n))
	rng := fmt.Sprintf("%d-%d", blocks[0], blocks[len(blocks)-1])
	h.s.log.Warn("repaired from peer", "target", c.t.path, "ino", c.name(), "blocks", rng, "count", n,
		"group", group, "peer", p.PeerAddr, "kind", kind)
	h.report(group, p, fmt.Sprintf("target %d chunk %x: %d bad blocks in %s rewritten from the other copy (%s)", p.Local, c.ino, n, rng, kind))
}

// report tells the metadata service (MMirrorReport MirrorCopyBad), in the
// background and best effort: a failure is logged.
func (h *healer) report(group uint32, p groupPeer, detail string) {
	s := h.s
	if len(s.cfg.MetaAddrs) == 0 {
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	if h.meta == nil {
		h.meta = transport.NewMulti(s.cfg.MetaAddrs, transport.MultiConfig{
			ClientConfig:   transport.ClientConfig{Key: s.cfg.ClusterKey, TLS: s.cfg.TLS, Conns: 1, CallTimeout: callTimeout},
			AttemptTimeout: attemptTimeout,
		})
	}
	mc := h.meta
	s.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		req := &rpc.MirrorReportReq{ServerID: s.serverID.Load(), Group: group, Epoch: p.Epoch, Target: p.Local,
			Event: rpc.MirrorCopyBad, Detail: detail}
		if err := mc.Call(ctx, rpc.MMirrorReport, req, &rpc.GroupInfo{}); err != nil {
			s.log.Warn("cannot report a repaired copy to the metadata service", "group", group, "detail", detail, "err", err)
		}
	}()
}

// How scanBlocks locks the regions it reads.
type scanLock int

const (
	scanShared scanLock = iota // shared, waiting for writers
	scanTry                    // shared if free at once, else EAGAIN
	scanHeld                   // the caller holds them
)

// scanBlocks reads blocks [b0, b1) of c (clipped to its length), 1 MiB at
// a time (regions locked as lk says), and checks each against its stored
// sum. It answers the stored sums and the indexes (from b0) of the blocks
// that fail them; with data (at least b1-b0 blocks long) it leaves the
// blocks' bytes there, zero padded.
func (c *chunk) scanBlocks(b0, b1 int64, data []byte, lk scanLock) (sums []uint32, bad []uint32, err error) {
	const batch = (1 << regionShift) >> blockShift
	var own []byte
	if data == nil {
		own = make([]byte, batch<<blockShift)
	}
	sb := make([]byte, 4*batch)
	for b := b0; b < b1; {
		end := min(b1, (b/batch+1)*batch) // within one region
		lo := b << blockShift
		mask := stripeMask(lo, end<<blockShift)
		switch lk {
		case scanShared:
			c.lock(mask, false)
		case scanTry:
			if !c.tryRLock(mask) {
				return nil, nil, rpc.Errorf(syscall.EAGAIN, "target %s chunk %x: blocks from %d busy", c.t.path, c.ino, b)
			}
		}
		size := c.size.Load()
		end = min(end, blocks(size))
		var rerr error
		var buf []byte
		if lo < size {
			if data != nil {
				buf = data[(b-b0)<<blockShift : (end-b0)<<blockShift]
			} else {
				buf = own[:(end-b)<<blockShift]
			}
			var m, k int
			m, rerr = preadFull(c.dataFd, buf, lo)
			if rerr == nil {
				clear(buf[m:])
				k, rerr = c.readSums(sb[:4*(end-b)], b)
				clear(sb[k : 4*(end-b)])
			}
		}
		if lk != scanHeld {
			c.unlock(mask, false)
		}
		if lo >= size {
			break
		}
		if rerr != nil {
			return nil, nil, c.ioErr("scan", lo, rerr)
		}
		for i := int64(0); i < end-b; i++ {
			want := getU32(sb[4*i:])
			sums = append(sums, want)
			if storedSum(buf[i<<blockShift:(i+1)<<blockShift]) != want {
				bad = append(bad, uint32(b+i-b0))
			}
		}
		b = end
	}
	return sums, bad, nil
}

// tryRLock takes the stripes of m shared if none is held or waited for
// exclusively, and reports whether it did.
func (c *chunk) tryRLock(m uint32) bool {
	for mm := m; mm != 0; mm &= mm - 1 {
		i := bits.TrailingZeros32(mm)
		if !c.regions[i].TryRLock() {
			c.unlock(m&(1<<i-1), false)
			return false
		}
	}
	return true
}

// handleChunkSums answers a range of a group chunk's sums, bad blocks and
// bytes to the other copy (after healing the range with Heal).
func (s *Server) handleChunkSums(ctx context.Context, r *rpc.ChunkSumsReq) (*rpc.ChunkSumsResp, error) {
	if !rpc.IsGroup(r.Chunk.Target) {
		return nil, rpc.Errorf(syscall.EINVAL, "chunk sums of target %d chunk %x: not a mirror group chunk", r.Chunk.Target, r.Chunk.Ino)
	}
	group := r.Chunk.Target &^ rpc.GroupBit
	if err := s.groupRead(ctx, &r.Chunk); err != nil {
		return nil, err
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	p, _ := s.heal.peerOf(group)
	limit := uint64(rpc.MaxChunkSumsRange)
	if r.Data {
		limit = rpc.MaxChunkSumsData
	}
	if r.Off%blockSize != 0 || r.Len > limit {
		return nil, rpc.Errorf(syscall.EINVAL, "target %s chunk %x: chunk sums at %d length %d: offset not block aligned or length over %d",
			t.path, r.Chunk.Ino, r.Off, r.Len, limit)
	}
	if err := checkRange(t, r.Chunk.Ino, r.Off, r.Len, "chunk sums"); err != nil {
		return nil, err
	}
	c, err := s.cache.get(t, r.Chunk.Ino, false)
	if errors.Is(err, errNotExist) {
		return &rpc.ChunkSumsResp{}, nil
	}
	if err != nil {
		return nil, s.failed(err)
	}
	defer s.cache.release(c)
	b0, b1 := int64(r.Off)>>blockShift, blocks(int64(r.Off+r.Len))
	resp := &rpc.ChunkSumsResp{Exists: true}
	if r.Heal && p.InSync {
		n, _, err := s.heal.repairRange(ctx, c, group, p, b0, b1, "scrub")
		if err != nil {
			return nil, s.failed(err)
		}
		resp.Healed = uint32(n)
	}
	var data []byte
	if r.Data {
		data = make([]byte, (b1-b0)<<blockShift)
	}
	// A fetch of blocks (Data) comes from a repair that holds its own
	// copy's locks of the range: without waiting for the range here,
	// since this copy may be repairing it from the asker in turn (the
	// asker then tries again). A scrub's comparison holds nothing and may
	// wait for writers.
	lk := scanShared
	if r.Data {
		lk = scanTry
	}
	sums, bad, err := c.scanBlocks(b0, b1, data, lk)
	if errors.Is(err, syscall.EAGAIN) {
		return nil, err
	}
	if err != nil {
		return nil, s.failed(err)
	}
	resp.Size = uint64(c.size.Load())
	resp.Sums, resp.Bad = sums, bad
	if r.Data {
		resp.Data = data[:int64(len(sums))<<blockShift]
	}
	return resp, nil
}
