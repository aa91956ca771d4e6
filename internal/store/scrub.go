package store

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Scrub (SScrub, `strata scrub`): verify every block of a target's chunks
// and, on a mirror group's primary copy, compare them with the other copy.
//
// One call walks the target's fan-out directories from ScrubReq.From,
// whole directories, until about Max chunks or scrubCallBudget of work
// are done (a directory started is finished: the answer's Next resumes at
// a directory). Each chunk is read in spans of scrubSpanBlocks, each span
// verified here (scanBlocks) and, for a group whose other copy is in sync,
// compared with that copy's sums and bad blocks (SChunkSums without data,
// which verifies the same span there). Per block position:
//
//	here      there     outcome
//	bad       good      bad here; Repair: rewritten here from there (repairRange)
//	good      bad       bad there; Repair: SChunkSums Heal makes it rewrite from here
//	bad       bad       unrepairable (twice: one per copy)
//	good      good      equal sums: fine; different: mismatched if both sums
//	                    stay put over two later looks (a write may be between
//	                    the copies); not repaired here (resync's business)
//
// An unmirrored chunk, a chunk the other copy lacks (counted PeerMissing)
// or a group not in sync is verified here only: its bad blocks are
// unrepairable. Reads are paced to RateBytes per second (the span is the
// burst); the other copy reads as much, paced by these calls.

// scrubSpanBlocks is the blocks verified and compared at a time (8 MiB).
const scrubSpanBlocks = 2048

// scrubCallBudget: a call takes no new directory after this long.
const scrubCallBudget = 5 * time.Second

// scrubRechecks and scrubRecheckPause: how often, and how far apart
// (growing), blocks that differ between the copies are looked at again
// before they count (a write may be between the copies).
const (
	scrubRechecks     = 2
	scrubRecheckPause = 50 * time.Millisecond
)

// maxScrubProblems bounds ScrubResp.Problems.
const maxScrubProblems = 16

// scrub is one SScrub call's state.
type scrub struct {
	s      *Server
	t      *target
	r      *rpc.ScrubReq
	group  uint32
	p      groupPeer
	paired bool // compare with the other copy
	resp   *rpc.ScrubResp
	start  time.Time
	read   uint64 // bytes read, for the pace
}

func (s *Server) handleScrub(ctx context.Context, r *rpc.ScrubReq) (*rpc.ScrubResp, error) {
	t, err := s.target(r.Target, 0)
	if err != nil {
		return nil, err
	}
	sc := &scrub{s: s, t: t, r: r, resp: &rpc.ScrubResp{}, start: time.Now()}
	if r.Group != 0 {
		sc.group = r.Group &^ rpc.GroupBit
		p, ok := s.heal.peerOf(sc.group)
		switch {
		case !ok || p.Local != r.Target:
			return nil, rpc.Errorf(syscall.ESTALE, "scrub target %d: it holds no copy of group %d on storage server %s", r.Target, sc.group, s.addr)
		case !p.Primary:
			return nil, rpc.Errorf(syscall.ESTALE, "scrub target %d: it is not the primary copy of group %d", r.Target, sc.group)
		}
		sc.p, sc.paired = p, p.InSync
		if !p.InSync {
			sc.problem(fmt.Sprintf("group %d is not in sync: its copies were not compared", sc.group))
		}
	}
	resp := sc.resp
	walk := newFanOutWalk(t)
	for resp.Next = walk.next(r.From); resp.Next < fanOutDirs && resp.Chunks < uint64(max(r.Max, 1)) &&
		time.Since(sc.start) < scrubCallBudget; resp.Next = walk.next(resp.Next + 1) {
		var list rpc.ListChunksResp
		if err := t.listChunkDir(resp.Next, &list); err != nil {
			return nil, s.failed(rpc.Errorf(syscall.EIO, "scrub target %s: list chunks: %v", t.path, err))
		}
		for _, ino := range list.Inos {
			if err := ctx.Err(); err != nil {
				return nil, rpc.Errorf(syscall.ETIMEDOUT, "scrub target %s: %v", t.path, err)
			}
			if err := sc.chunk(ctx, ino); err != nil {
				return nil, err
			}
		}
	}
	resp.Done = resp.Next >= fanOutDirs
	return resp, nil
}

func (sc *scrub) problem(p string) {
	if len(sc.resp.Problems) < maxScrubProblems {
		sc.resp.Problems = append(sc.resp.Problems, p)
	}
}

// sleep waits d, or until the call or the server ends.
func (sc *scrub) sleep(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return rpc.Errorf(syscall.ETIMEDOUT, "scrub target %s: %v", sc.t.path, ctx.Err())
	case <-sc.s.stop:
		return rpc.Errorf(syscall.ESHUTDOWN, "scrub target %s: storage server closing", sc.t.path)
	}
}

// pace waits until n more bytes may be read at the call's rate.
func (sc *scrub) pace(ctx context.Context, n int64) error {
	sc.read += uint64(n)
	if sc.r.RateBytes == 0 {
		return nil
	}
	due := sc.start.Add(time.Duration(float64(sc.read-uint64(n)) / float64(sc.r.RateBytes) * float64(time.Second)))
	d := time.Until(due)
	if d <= 0 {
		return nil
	}
	return sc.sleep(ctx, d)
}

// chunk scrubs one chunk.
func (sc *scrub) chunk(ctx context.Context, ino uint64) error {
	s := sc.s
	c, err := s.cache.get(sc.t, ino, false)
	if errors.Is(err, errNotExist) {
		return nil // removed since listed
	}
	if err != nil {
		// Unreadable as a whole (a damaged sidecar header): nothing of it
		// can be compared block by block.
		sc.resp.Chunks++
		sc.problem(fmt.Sprintf("chunk %x: cannot open: %v", ino, err))
		return nil
	}
	defer s.cache.release(c)
	size := c.size.Load()
	sc.resp.Chunks++
	sc.resp.Bytes += uint64(size)
	paired := sc.paired
	for b0, nb := int64(0), blocks(size); b0 < nb; b0 += scrubSpanBlocks {
		b1 := min(nb, b0+scrubSpanBlocks)
		if err := sc.pace(ctx, (b1-b0)<<blockShift); err != nil {
			return err
		}
		sums, bad, err := c.scanBlocks(b0, b1, nil, scanShared)
		if err != nil {
			sc.problem(fmt.Sprintf("chunk %x: %v", ino, err))
			return nil
		}
		if len(bad) > 0 {
			c.t.m.csumErrors.Add(float64(len(bad)))
		}
		if paired {
			var peer rpc.ChunkSumsResp
			if err := sc.peerSums(ctx, ino, b0, b1, false, &peer); err != nil {
				return err
			}
			if peer.Exists {
				if err := sc.compare(ctx, c, b0, b1, sums, bad, &peer); err != nil {
					return err
				}
				continue
			}
			sc.resp.PeerMissing++
			paired = false
		}
		sc.resp.BadBlocks += uint64(len(bad))
		sc.resp.Unrepairable += uint64(len(bad))
		if len(bad) > 0 {
			s.log.Error("scrub: bad blocks without a good copy", "target", sc.t.path, "ino", c.name(), "blocks", len(bad),
				"first", b0+int64(bad[0]))
			sc.problem(fmt.Sprintf("chunk %x: %d bad blocks from block %d with no good copy", ino, len(bad), b0+int64(bad[0])))
		}
	}
	return nil
}

// peerSums asks the other copy for blocks [b0, b1) of chunk ino (healing
// them there first with heal).
func (sc *scrub) peerSums(ctx context.Context, ino uint64, b0, b1 int64, heal bool, resp *rpc.ChunkSumsResp) error {
	req := &rpc.ChunkSumsReq{Chunk: rpc.ChunkID{Target: rpc.GroupBit | sc.group, Ino: ino, Epoch: sc.p.Epoch},
		Off: uint64(b0 << blockShift), Len: uint64((b1 - b0) << blockShift), Heal: heal}
	if err := sc.s.heal.healCall(ctx, sc.p.PeerAddr, rpc.SChunkSums, req, resp); err != nil {
		return fmt.Errorf("scrub target %s chunk %x: the other copy of group %d on %s: %w", sc.t.path, ino, sc.group, sc.p.PeerAddr, err)
	}
	return nil
}

// compare accounts and repairs span [b0, b1) of c given its sums and bad
// blocks here and there.
func (sc *scrub) compare(ctx context.Context, c *chunk, b0, b1 int64, sums, bad []uint32, peer *rpc.ChunkSumsResp) error {
	resp := sc.resp
	here := map[uint32]bool{}
	for _, b := range bad {
		here[b] = true
	}
	there := map[uint32]bool{}
	for _, b := range peer.Bad {
		there[b] = true
	}
	var onlyHere, onlyThere, both int
	var firstThere, lastThere uint32
	for _, b := range bad {
		if there[b] {
			both++
		} else {
			onlyHere++
		}
	}
	for _, b := range peer.Bad {
		if !here[b] {
			if onlyThere == 0 {
				firstThere = b
			}
			lastThere = b
			onlyThere++
		}
	}
	resp.BadBlocks += uint64(len(bad) + len(peer.Bad))
	resp.Unrepairable += uint64(2 * both)
	if both > 0 {
		sc.s.log.Error("scrub: blocks bad on both copies", "target", sc.t.path, "ino", c.name(), "group", sc.group, "blocks", both)
		sc.problem(fmt.Sprintf("chunk %x: %d blocks bad on both copies", c.ino, both))
	}
	if sc.r.Repair && onlyHere > 0 {
		fixed, _, err := sc.s.heal.repairRange(ctx, c, sc.group, sc.p, b0, b1, "scrub")
		if err != nil {
			sc.problem(fmt.Sprintf("chunk %x: repair here failed: %v", c.ino, err))
		} else {
			resp.Repaired += uint64(min(fixed, onlyHere))
		}
	}
	if sc.r.Repair && onlyThere > 0 {
		var healed rpc.ChunkSumsResp
		if err := sc.peerSums(ctx, c.ino, b0+int64(firstThere), b0+int64(lastThere)+1, true, &healed); err != nil {
			sc.problem(err.Error())
		} else {
			resp.Repaired += uint64(min(int(healed.Healed), onlyThere))
		}
	}
	mism := mismatched(sums, bad, peer)
	// A write may be between the copies (applied here, its forward not
	// yet there, or the reverse): a block counts as differing only if
	// both copies' sums of it stay what they were, and different, over
	// scrubRechecks looks a little apart.
	for round := 1; round <= scrubRechecks && len(mism) > 0; round++ {
		if err := sc.sleep(ctx, time.Duration(round)*scrubRecheckPause); err != nil {
			return err
		}
		nsums, nbad, err := c.scanBlocks(b0, b1, nil, scanShared)
		if err != nil {
			return nil
		}
		var again rpc.ChunkSumsResp
		if err := sc.peerSums(ctx, c.ino, b0, b1, false, &again); err != nil {
			return err
		}
		now := map[uint32]bool{}
		for _, b := range mismatched(nsums, nbad, &again) {
			now[b] = true
		}
		var still []uint32
		for _, b := range mism {
			if now[b] && nsums[b] == sums[b] && int(b) < len(peer.Sums) && int(b) < len(again.Sums) && again.Sums[b] == peer.Sums[b] {
				still = append(still, b)
			}
		}
		mism, sums, peer = still, nsums, &again
	}
	if len(mism) > 0 {
		resp.Mismatched += uint64(len(mism))
		sc.s.log.Error("scrub: copies differ in blocks whose sums both hold", "target", sc.t.path, "ino", c.name(),
			"group", sc.group, "blocks", len(mism), "first", b0+int64(mism[0]))
		sc.problem(fmt.Sprintf("chunk %x: %d blocks differ between the copies (both verify), from block %d", c.ino, len(mism), b0+int64(mism[0])))
	}
	return nil
}

// mismatched lists the blocks (from the span's first) good on both
// copies whose sums differ; a block past the other copy's end counts when
// it is not zeros here.
func mismatched(sums, bad []uint32, peer *rpc.ChunkSumsResp) []uint32 {
	skip := map[uint32]bool{}
	for _, b := range bad {
		skip[b] = true
	}
	for _, b := range peer.Bad {
		skip[b] = true
	}
	var out []uint32
	for i, sum := range sums {
		b := uint32(i)
		if skip[b] {
			continue
		}
		other := uint32(0)
		if i < len(peer.Sums) {
			other = peer.Sums[i]
		}
		if sum != other {
			out = append(out, b)
		}
	}
	return out
}
