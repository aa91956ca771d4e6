package store

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/stratafs/strata/internal/rpc"
)

// TestMirrorWriteLandsOnBothCopies: writes (buffered and Sync), truncate,
// punch and remove of a group chunk sent to the primary change both copies
// alike, and each copy reads back what the client wrote.
func TestMirrorWriteLandsOnBothCopies(t *testing.T) {
	for _, network := range []bool{false, true} {
		name := "in-process"
		if network {
			name = "tcp"
		}
		t.Run(name, func(t *testing.T) { testMirrorWrite(t, newMirrorPairNet(t, nil, network)) })
	}
}

func testMirrorWrite(t *testing.T, p *mirrorPair) {
	want := make([]byte, 3<<20+123)
	for i, sync := range []bool{false, true} {
		ino := uint64(0x100 + i)
		data := pattern(i+1, len(want))
		for off := 0; off < len(data); off += 1 << 20 {
			end := min(off+1<<20, len(data))
			if err := p.gwrite(p.a, ino, uint64(off), data[off:end], sync); err != nil {
				t.Fatalf("mirrored write (sync %v) at %d: %v", sync, off, err)
			}
		}
		if got := p.sameCopies(ino); !bytes.Equal(got, data) {
			t.Fatalf("sync %v: copies equal but not what was written (first difference at %d)", sync, firstDiff(got, data))
		}
	}
	ctx := context.Background()
	ep := p.epoch()
	if err := p.a.cl.Call(ctx, rpc.SSyncStat, &rpc.ChunkReq{Chunk: gid(0x100, ep)}, &rpc.ChunkStatResp{}); err != nil {
		t.Fatalf("mirrored sync: %v", err)
	}
	if err := p.a.call(rpc.STruncate, &rpc.TruncateReq{Chunk: gid(0x100, ep), Size: 1<<20 + 5}); err != nil {
		t.Fatalf("mirrored truncate: %v", err)
	}
	if got := p.sameCopies(0x100); len(got) != 1<<20+5 {
		t.Fatalf("after truncate: length %d, want %d", len(got), 1<<20+5)
	}
	if err := p.a.call(rpc.SPunch, &rpc.PunchReq{Chunk: gid(0x101, ep), Off: 4096, Len: 1 << 20}); err != nil {
		t.Fatalf("mirrored punch: %v", err)
	}
	got := p.sameCopies(0x101)
	if !allZero(got[4096 : 4096+1<<20]) {
		t.Fatal("punched range does not read as zeros")
	}
	if err := p.a.call(rpc.SRemoveMany, &rpc.ChunksReq{Chunks: []rpc.ChunkID{gid(0x100, ep), gid(0x101, ep)}}); err != nil {
		t.Fatalf("mirrored remove: %v", err)
	}
	for _, ino := range []uint64{0x100, 0x101} {
		if st := p.b.stat(p.tb, ino); st.Exists {
			t.Fatalf("chunk %x still on the secondary after a mirrored remove", ino)
		}
		if _, err := os.Stat(dataPath(p.a.dirs[0], ino)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("chunk %x still on the primary after a mirrored remove: %v", ino, err)
		}
	}
	// The in-sync secondary serves reads of the group's chunks.
	if err := p.gwrite(p.a, 0x102, 0, []byte("both"), false); err != nil {
		t.Fatal(err)
	}
	var rr rpc.ReadResp
	if err := p.b.cl.Call(ctx, rpc.SRead, &rpc.ReadReq{Chunk: gid(0x102, ep), Len: 4}, &rr); err != nil || string(rr.Data) != "both" {
		t.Fatalf("read at the in-sync secondary: %q, %v", rr.Data, err)
	}
}

// TestMirrorEpochChecks: an older epoch is refused with ESTALE; a newer
// one than the store and the service know with EAGAIN; a group with no
// copy here with ESTALE.
func TestMirrorEpochChecks(t *testing.T) {
	p := newMirrorPair(t, nil)
	g := p.meta.group(1)
	g.Epoch = 3
	p.meta.setGroup(g)
	p.push()
	for _, c := range []struct {
		id   rpc.ChunkID
		want syscall.Errno
	}{
		{gid(1, 2), syscall.ESTALE},
		{gid(1, 9), syscall.EAGAIN},
		{rpc.ChunkID{Target: rpc.GroupBit | 7, Ino: 1, Epoch: 1}, syscall.ESTALE},
	} {
		err := p.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: c.id, Data: []byte("x")}, &rpc.WriteResp{})
		if !errors.Is(err, c.want) {
			t.Errorf("write to group %d at epoch %d: %v, want %v", c.id.Target&^rpc.GroupBit, c.id.Epoch, err, c.want)
		}
	}
	// A newer epoch the service knows: the store refreshes and serves it.
	g.Epoch = 4
	p.meta.setGroup(g)
	if err := p.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: gid(1, 4), Data: []byte("x")}, &rpc.WriteResp{}); err != nil {
		t.Fatalf("write at an epoch the store learns on demand: %v", err)
	}
	if _, ok := p.a.s.groups.peerOf(1); !ok {
		t.Fatal("peerOf: group 1 unknown")
	}
	if pe, _ := p.a.s.groups.peerOf(1); pe.Epoch != 4 || !pe.Primary || pe.PeerTarget != p.tb || pe.PeerAddr != p.b.s.Addr() || !pe.InSync {
		t.Fatalf("peerOf after refresh: %+v", pe)
	}
}

// TestMirrorDeposedPrimaryRefused: after a failover the old primary, which
// has not heard of it, forwards a write; the promoted secondary refuses
// the old epoch, and the old primary answers ESTALE.
func TestMirrorDeposedPrimaryRefused(t *testing.T) {
	p := newMirrorPair(t, nil)
	if err := p.gwrite(p.a, 5, 0, []byte("before"), true); err != nil {
		t.Fatal(err)
	}
	// Failover: b primary, epoch 2, degraded; only b hears of it.
	p.meta.setGroup(rpc.GroupInfo{ID: 1, Epoch: 2, Primary: p.tb, Secondary: p.ta, State: rpc.GroupDegraded})
	p.meta.push(60000, p.b.s)
	err := p.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: gid(5, 1), Data: []byte("AFTER!")}, &rpc.WriteResp{})
	if !errors.Is(err, syscall.ESTALE) {
		t.Fatalf("deposed primary's write: %v, want ESTALE", err)
	}
	if got := p.b.mustRead(p.tb, 5, 0, 16); string(got) != "before" {
		t.Fatalf("promoted secondary's copy changed by the deposed primary: %q", got)
	}
	// The old primary learnt the new map on the way.
	if pe, ok := p.a.s.groups.peerOf(1); !ok || pe.Primary || pe.Epoch != 2 {
		t.Fatalf("old primary's map after the refusal: %+v %v", pe, ok)
	}
}

// TestMirrorLeaseExpiry: a primary whose lease ran out refuses mutations
// and reads with EAGAIN; a heartbeat answer renews it.
func TestMirrorLeaseExpiry(t *testing.T) {
	p := newMirrorPair(t, nil)
	p.meta.push(100, p.a.s)
	p.a.s.groups.expireLease()
	ep := p.epoch()
	err := p.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: gid(1, ep), Data: []byte("x")}, &rpc.WriteResp{})
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("write without a lease: %v, want EAGAIN", err)
	}
	var rr rpc.ReadResp
	if err := p.a.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: gid(1, ep), Len: 1}, &rr); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("read at the primary without a lease: %v, want EAGAIN", err)
	}
	// A lease that runs out by itself.
	p.meta.push(150, p.a.s)
	if err := p.gwrite(p.a, 1, 0, []byte("x"), false); err != nil {
		t.Fatalf("write with a fresh lease: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := p.gwrite(p.a, 1, 0, []byte("x"), false)
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("write after the lease should have run out: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// degradePair writes with b's server closed: the primary reports the
// secondary lost, adopts the degraded epoch and acknowledges. Returns the
// data written to chunk 0x200 (regions 0 and 5 of it changed).
func degradePair(t *testing.T, p *mirrorPair) {
	t.Helper()
	// Something both copies have before the secondary goes.
	base := pattern(9, 8<<20)
	for off := 0; off < len(base); off += 1 << 20 {
		if err := p.gwrite(p.a, 0x200, uint64(off), base[off:off+1<<20], false); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.gwrite(p.a, 0x201, 0, []byte("doomed"), false); err != nil {
		t.Fatal(err)
	}
	p.b.stop()
	start := time.Now()
	if err := p.gwrite(p.a, 0x200, 5<<20+100, []byte("while away"), false); err != nil {
		t.Fatalf("write with the secondary down: %v", err)
	}
	// Not acknowledged before the secondary's lease ran out (it might be
	// alive and serve reads as in sync until then).
	if took := time.Since(start); took < testDegradeWait {
		t.Fatalf("write acknowledged %v after the degrade, before the secondary's lease (%v) ran out", took, testDegradeWait)
	}
	if g := p.meta.group(1); g.State != rpc.GroupDegraded || g.Epoch != 2 {
		t.Fatalf("group after the loss: %+v", g)
	}
	if n := len(p.meta.reported(rpc.MirrorSecondaryLost)); n != 1 {
		t.Fatalf("%d secondary-lost reports, want 1", n)
	}
	// Degraded: recorded, not forwarded.
	if err := p.gwrite(p.a, 0x200, 100, []byte("degraded"), true); err != nil {
		t.Fatalf("write in the degraded epoch: %v", err)
	}
	if err := p.a.call(rpc.SRemove, &rpc.ChunkReq{Chunk: gid(0x201, p.epoch())}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.call(rpc.STruncate, &rpc.TruncateReq{Chunk: gid(0x202, p.epoch()), Size: 3 << 20}); err != nil {
		t.Fatal(err)
	}
}

// TestMirrorSecondaryLostRecordsDurably: a write that cannot be forwarded
// degrades the group through the service; the changes are in mirror.log
// on disk, and still named after the primary's server is killed and its
// target opened again.
func TestMirrorSecondaryLostRecordsDurably(t *testing.T) {
	p := newMirrorPair(t, nil)
	degradePair(t, p)
	recs, _, err := decodeMirrorLog(mustReadFile(t, filepath.Join(p.a.dirs[0], mirrorLogName)))
	if err != nil {
		t.Fatal(err)
	}
	set := newChangeSet()
	for _, r := range recs {
		if r.group == 1 {
			set.add(r)
		}
	}
	if !set.begun || set.peer != p.tb {
		t.Fatalf("no begin record for secondary %d: %+v", p.tb, set)
	}
	c := set.inos[0x200]
	if c == nil || len(c.regions) != 2 {
		t.Fatalf("chunk 0x200's regions on disk: %+v, want 0 and 5", c)
	}
	if _, ok := c.regions[5]; !ok {
		t.Fatal("region 5 not recorded")
	}
	if c := set.inos[0x201]; c == nil || !c.hasTrunc || c.minTrunc != 0 {
		t.Fatalf("remove not recorded: %+v", c)
	}
	if c := set.inos[0x202]; c == nil || !c.hasTrunc || c.minTrunc != 3<<20 {
		t.Fatalf("truncate not recorded: %+v", c)
	}
	p.a.crash()
	p.a.start()
	begun, chunks := p.a.s.groups0Pending(p.ta)
	if !begun || chunks != 3 {
		t.Fatalf("after reopening the target: begun %v, %d chunks recorded; want a begin and 3", begun, chunks)
	}
}

// groups0Pending answers what target tgt's mirror.log holds for group 1.
func (s *Server) groups0Pending(tgt uint32) (bool, int) {
	return (*s.byID.Load())[tgt].mlog.pending(1)
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMirrorReportFailsNoAck: when the service cannot be told of the
// lost secondary, the write is answered EAGAIN, not acknowledged.
func TestMirrorReportFailsNoAck(t *testing.T) {
	p := newMirrorPair(t, nil)
	p.meta.mu.Lock()
	p.meta.failReport = true
	p.meta.mu.Unlock()
	p.b.stop()
	if err := p.gwrite(p.a, 1, 0, []byte("x"), false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("write with the secondary down and no report: %v, want EAGAIN", err)
	}
}

// resyncPair brings b back and marks the group resyncing; waits for the
// resync to end (the service's group in sync).
func resyncPair(t *testing.T, p *mirrorPair) {
	t.Helper()
	p.b.start()
	p.tb = p.b.s.TargetIDs()[0]
	g := p.meta.group(1)
	g.State = rpc.GroupResyncing
	g.Epoch++
	p.meta.setGroup(g)
	p.push()
}

// waitInSync waits until group 1 is in sync. A group degraded again
// meanwhile (a secondary restarted after an unclean stop hands its unsure
// chunks over, and its primary degrades the group) is set resyncing again,
// as the metadata service does once the secondary heartbeats.
func waitInSync(t *testing.T, p *mirrorPair, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for g := p.meta.group(1); g.State != rpc.GroupInSync; g = p.meta.group(1) {
		if time.Now().After(deadline) {
			t.Fatalf("resync did not end within %v: %+v", within, g)
		}
		if g.State == rpc.GroupDegraded {
			g.State = rpc.GroupResyncing
			g.Epoch++
			p.meta.setGroup(g)
			p.push()
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.push()
}

// TestMirrorResyncCopiesRecordedRegions: the returning secondary gets the
// recorded regions (and the remove and truncate), not the rest, and both
// copies end equal; the record is cleared.
func TestMirrorResyncCopiesRecordedRegions(t *testing.T) {
	p := newMirrorPair(t, nil)
	degradePair(t, p)
	resyncPair(t, p)
	waitInSync(t, p, 20*time.Second)
	for _, ino := range []uint64{0x200, 0x201, 0x202} {
		p.sameCopies(ino)
	}
	done := p.meta.reported(rpc.MirrorResyncDone)
	if len(done) != 1 {
		t.Fatalf("%d resync-done reports", len(done))
	}
	// Block 0 of regions 0 and 5 of 0x200 (the writes' blocks, not their
	// 1 MiB regions), nothing of 0x201 (gone) nor of 0x202 (a truncate).
	if done[0].Done != 2*blockSize {
		t.Fatalf("resync copied %d bytes, want %d", done[0].Done, 2*blockSize)
	}
	if begun, n := p.a.s.groups0Pending(p.ta); begun || n != 0 {
		t.Fatalf("record after the resync: begun %v, %d chunks", begun, n)
	}
	recs, _, err := decodeMirrorLog(mustReadFile(t, filepath.Join(p.a.dirs[0], mirrorLogName)))
	if err != nil || len(recs) != 0 {
		t.Fatalf("mirror.log after the resync: %d records, %v", len(recs), err)
	}
	// In sync again: writes reach both.
	if err := p.gwrite(p.a, 0x200, 0, []byte("again"), false); err != nil {
		t.Fatal(err)
	}
	p.sameCopies(0x200)
}

// TestMirrorResyncFullCopy: with no begin record for the secondary (a
// replaced target), every chunk is copied, and chunks the secondary has
// that the primary does not are removed there.
func TestMirrorResyncFullCopy(t *testing.T) {
	p := newMirrorPair(t, nil)
	for ino := uint64(1); ino <= 3; ino++ {
		if err := p.gwrite(p.a, ino, uint64(ino)<<20, pattern(int(ino), 100<<10), false); err != nil {
			t.Fatal(err)
		}
	}
	// The secondary has a chunk the primary never had (a stale copy).
	p.b.mustWrite(p.tb, 9, 0, []byte("stale"), false)
	g := p.meta.group(1)
	g.State, g.Epoch = rpc.GroupResyncing, g.Epoch+1
	p.meta.setGroup(g)
	p.push()
	waitInSync(t, p, 20*time.Second)
	for ino := uint64(1); ino <= 3; ino++ {
		p.sameCopies(ino)
	}
	if st := p.b.stat(p.tb, 9); st.Exists {
		t.Fatal("the secondary's stale chunk survived a full resync")
	}
}

// TestMirrorResyncChunkBornDuringListing is the loss the third soak run
// found: during a full resync, a chunk created after the primary listed
// its own chunks and forwarded to the secondary before the secondary's
// listing looked like a stale chunk of the secondary's ("gone here"). By
// the time the resync reached it, the chunk existed at the primary, so
// the head cut the secondary's copy to 0 — and with it every write
// forwarded so far — and copied nothing: the tail then extended it to the
// primary's length, all zeros, and the group went in sync with it.
func TestMirrorResyncChunkBornDuringListing(t *testing.T) {
	p := newMirrorPair(t, nil)
	for ino := uint64(1); ino <= 3; ino++ {
		if err := p.gwrite(p.a, ino, 0, pattern(int(ino), 100<<10), false); err != nil {
			t.Fatal(err)
		}
	}
	const born = 0x909d0
	data := pattern(7, 3<<20)
	var once sync.Once
	listed := func() {
		once.Do(func() {
			// Resyncing: forwarded to the secondary, not recorded.
			for off := 0; off < len(data); off += 1 << 20 {
				if err := p.gwrite(p.a, born, uint64(off), data[off:off+1<<20], false); err != nil {
					t.Errorf("write between the listings: %v", err)
				}
			}
		})
	}
	testHookResyncListed.Store(&listed)
	t.Cleanup(func() { testHookResyncListed.Store(nil) })
	g := p.meta.group(1)
	g.State, g.Epoch = rpc.GroupResyncing, g.Epoch+1
	p.meta.setGroup(g)
	p.push()
	waitInSync(t, p, 20*time.Second)
	for ino := uint64(1); ino <= 3; ino++ {
		p.sameCopies(ino)
	}
	if got := p.sameCopies(born); !bytes.Equal(got, data) {
		t.Fatalf("chunk %x after the resync: %d bytes, first difference from the written at %d", born, len(got), firstDiff(got, data))
	}
}

// TestMirrorResyncTruncateKeepsForwardedWrites: a chunk truncated while
// the secondary was away has its secondary's copy cut at the resync's
// head; writes forwarded past the cut between the taking of the record
// and the head (resyncing: forwarded, never recorded) must come back with
// the copy, not be cut with it.
func TestMirrorResyncTruncateKeepsForwardedWrites(t *testing.T) {
	p := newMirrorPair(t, nil)
	const ino = 0x500
	if err := p.gwrite(p.a, ino, 0, pattern(1, 4<<20), false); err != nil {
		t.Fatal(err)
	}
	p.b.stop()
	if err := p.a.call(rpc.STruncate, &rpc.TruncateReq{Chunk: gid(ino, p.epoch()), Size: 1<<20 + 100}); err != nil {
		t.Fatalf("truncate with the secondary down: %v", err)
	}
	if g := p.meta.group(1); g.State != rpc.GroupDegraded {
		t.Fatalf("group after the truncate: %+v", g)
	}
	late := pattern(2, 2<<20)
	var once sync.Once
	head := func(got uint64) {
		if got != ino {
			return
		}
		once.Do(func() {
			if err := p.gwrite(p.a, ino, 2<<20, late, false); err != nil {
				t.Errorf("write before the head: %v", err)
			}
		})
	}
	testHookResyncChunk.Store(&head)
	t.Cleanup(func() { testHookResyncChunk.Store(nil) })
	resyncPair(t, p)
	waitInSync(t, p, 20*time.Second)
	got := p.sameCopies(ino)
	want := append(pattern(1, 4<<20)[:1<<20+100], make([]byte, 2<<20-(1<<20+100))...)
	want = append(want, late...)
	if !bytes.Equal(got, want) {
		t.Fatalf("chunk after the resync: %d bytes, first difference from the expected at %d", len(got), firstDiff(got, want))
	}
}

// TestMirrorResyncFullResyncFlag: a group marked FullResync (its
// secondary was the primary until its disk failed) is copied whole even
// though the primary holds a begin record for that secondary: bytes the
// secondary lost that no record names are put right too.
func TestMirrorResyncFullResyncFlag(t *testing.T) {
	p := newMirrorPair(t, nil)
	for ino := uint64(1); ino <= 3; ino++ {
		if err := p.gwrite(p.a, ino, 0, pattern(int(ino), 300<<10), false); err != nil {
			t.Fatal(err)
		}
	}
	g := p.meta.group(1)
	g.State, g.Epoch, g.FullResync = rpc.GroupDegraded, g.Epoch+1, true
	p.meta.setGroup(g)
	p.push()
	if begun, _ := p.a.s.groups0Pending(p.ta); !begun {
		t.Fatal("the degraded primary recorded no begin for its secondary")
	}
	// What the failed disk lost: no record names it.
	p.b.mustWrite(p.tb, 2, 4096, []byte("lost on the failed disk"), false)
	g.State, g.Epoch = rpc.GroupResyncing, g.Epoch+1
	p.meta.setGroup(g)
	p.push()
	waitInSync(t, p, 20*time.Second)
	for ino := uint64(1); ino <= 3; ino++ {
		p.sameCopies(ino)
	}
	if g := p.meta.group(1); g.FullResync {
		t.Fatalf("FullResync still set in sync: %+v", g)
	}
}

// TestMirrorWritesDuringResyncNotOvertaken: a writer rewrites random
// ranges of recorded regions while the (throttled) resync copies them;
// after both end the copies are equal.
func TestMirrorWritesDuringResyncNotOvertaken(t *testing.T) {
	p := newMirrorPair(t, func(c *Config) { c.ResyncBytesPerSec = 16 << 20 })
	const ino, size = 0x300, 24 << 20
	if err := p.gwrite(p.a, ino, 0, []byte("x"), false); err != nil {
		t.Fatal(err)
	}
	p.b.stop()
	data := pattern(3, size)
	for off := 0; off < size; off += 1 << 20 {
		if err := p.gwrite(p.a, ino, uint64(off), data[off:off+1<<20], false); err != nil {
			t.Fatalf("degraded write at %d: %v", off, err)
		}
	}
	resyncPair(t, p)
	rng := rand.New(rand.NewPCG(1, 2))
	writes := 0
	deadline := time.Now().Add(30 * time.Second)
	for p.meta.group(1).State != rpc.GroupInSync && time.Now().Before(deadline) && writes < 5000 {
		off := rng.IntN(size - 256<<10)
		n := 1 + rng.IntN(256<<10)
		err := p.gwrite(p.a, ino, uint64(off), pattern(writes+10, n), false)
		if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.ESTALE) {
			t.Fatalf("write during the resync: %v", err)
		}
		if err != nil {
			p.push() // the map moved (resync done): learn it
		}
		writes++
	}
	waitInSync(t, p, 30*time.Second)
	t.Logf("%d writes during the resync", writes)
	p.sameCopies(ino)
}

// TestMirrorConcurrentOverlappingWrites: writers of overlapping ranges of
// one chunk at once leave both copies equal.
func TestMirrorConcurrentOverlappingWrites(t *testing.T) {
	p := newMirrorPair(t, nil)
	const ino = 0x400
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				off := uint64((w*7 + i*13) % 64 * 4096)
				if err := p.gwrite(p.a, ino, off, pattern(w*100+i, 64<<10), false); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	p.sameCopies(ino)
}

// TestMirrorSecondaryReadsOnlyInSync: a degraded group's secondary copy
// serves no reads (ESTALE).
func TestMirrorSecondaryReadsOnlyInSync(t *testing.T) {
	p := newMirrorPair(t, nil)
	g := p.meta.group(1)
	g.State, g.Epoch = rpc.GroupDegraded, 2
	p.meta.setGroup(g)
	p.push()
	var rr rpc.ReadResp
	err := p.b.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: gid(1, 2), Len: 1}, &rr)
	if !errors.Is(err, syscall.ESTALE) {
		t.Fatalf("read at a degraded group's secondary: %v, want ESTALE", err)
	}
}

// TestMirrorLogFormat: records round-trip; a torn tail is ignored and
// appends continue there; a damaged header refuses the open.
func TestMirrorLogFormat(t *testing.T) {
	dir := t.TempDir()
	l, err := openMirrorLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs := []mlRec{{kind: mlBegin, group: 2, arg: 7}, {kind: mlRegion, group: 2, ino: 5, arg: 3, blocks: allBlocks}, {kind: mlTruncate, group: 2, ino: 6, arg: 4096}}
	if err := l.record(recs); err != nil {
		t.Fatal(err)
	}
	if err := l.record(recs[1:2]); err != nil { // already named: no write
		t.Fatal(err)
	}
	l.close()
	path := filepath.Join(dir, mirrorLogName)
	b := mustReadFile(t, path)
	if len(b) != mirrorLogHeaderBytes+3*mirrorLogRecordBytes {
		t.Fatalf("log of %d bytes, want %d", len(b), mirrorLogHeaderBytes+3*mirrorLogRecordBytes)
	}
	// A torn fourth record.
	if err := os.WriteFile(path, append(b, make([]byte, 20)...), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = openMirrorLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	if begun, n := l.pending(2); !begun || n != 2 {
		t.Fatalf("reopened: begun %v, %d chunks", begun, n)
	}
	if err := l.record(regionRecs(2, 8, 0, 1)); err != nil {
		t.Fatal(err)
	}
	l.close()
	got, _, err := decodeMirrorLog(mustReadFile(t, path))
	if err != nil || len(got) != 4 || got[3].ino != 8 {
		t.Fatalf("after an append over the torn tail: %+v, %v", got, err)
	}
	b = mustReadFile(t, path)
	b[3] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openMirrorLog(dir); !errors.Is(err, ErrFormat) {
		t.Fatalf("open with a damaged header: %v, want ErrFormat", err)
	}
}

// TestMirrorMapFromHeartbeats: the real heartbeat loop decodes the
// service's answer (ServerHeartbeatResp) into the group map and the lease;
// when heartbeats stop being answered the lease runs out and the primary
// refuses writes (EAGAIN); answered again, it serves them.
func TestMirrorMapFromHeartbeats(t *testing.T) {
	meta := newStandinMeta(t)
	meta.mu.Lock()
	meta.leaseMs = 400
	meta.mu.Unlock()
	cfg := func(c *Config) {
		c.MetaAddr = meta.addr
		c.HeartbeatInterval = 50 * time.Millisecond
	}
	a, b := newEnv(t, 1, cfg), newEnv(t, 1, cfg)
	ta, tb := a.s.TargetIDs()[0], b.s.TargetIDs()[0]
	meta.setGroup(rpc.GroupInfo{ID: 1, Epoch: 4, Primary: ta, Secondary: tb, State: rpc.GroupInSync})
	write := func() error {
		return a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: gid(1, 4), Data: []byte("hb")}, &rpc.WriteResp{})
	}
	deadline := time.Now().Add(10 * time.Second)
	until(t, deadline, "the group map learnt from heartbeats", func() (bool, error) {
		pa, oka := a.s.groups.peerOf(1)
		pb, okb := b.s.groups.peerOf(1)
		return oka && okb && pa.Primary && !pb.Primary && pa.Epoch == 4 && pa.PeerAddr == b.s.Addr() && write() == nil, nil
	})
	meta.mu.Lock()
	meta.failBeats = true
	meta.mu.Unlock()
	until(t, deadline, "EAGAIN once the lease ran out without answered heartbeats", func() (bool, error) {
		err := write()
		if errors.Is(err, syscall.EAGAIN) {
			return true, nil
		}
		return false, err
	})
	meta.mu.Lock()
	meta.failBeats = false
	meta.mu.Unlock()
	until(t, deadline, "writes served once heartbeats are answered again", func() (bool, error) { return write() == nil, nil })
	if got := b.mustRead(tb, 1, 0, 2); string(got) != "hb" {
		t.Fatalf("secondary copy %q", got)
	}
}

// until calls f every 20 ms until it answers done, failing the test on an
// error or at deadline.
func until(t *testing.T, deadline time.Time, what string, f func() (bool, error)) {
	t.Helper()
	for {
		done, err := f()
		switch {
		case err != nil:
			t.Fatalf("waiting for %s: %v", what, err)
		case done:
			return
		case time.Now().After(deadline):
			t.Fatalf("no %s by the deadline", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMirrorSuspectsAfterUncleanStop: a primary killed after applying a
// write it did not forward (here: written to its target directly) finds
// the chunk in its intent log when it opens again; once the map says it
// is the primary of an in-sync group it copies that chunk to the
// secondary. A secondary in the same position hands its suspects to the
// primary, which degrades the group; its resync makes the copies equal.
func TestMirrorSuspectsAfterUncleanStop(t *testing.T) {
	p := newMirrorPair(t, nil)
	const ino = 0x500
	if err := p.gwrite(p.a, ino, 0, pattern(1, 3<<20), true); err != nil {
		t.Fatal(err)
	}
	// The chunk is clean (synced): its next mutation is recorded in the
	// intent log. (A chunk created since its last sync is not: its own
	// dirty state is its record — such a chunk is no suspect.)
	p.a.mustWrite(p.ta, ino, 2<<20+7, []byte("applied, never forwarded"), false)
	p.a.mustWrite(p.ta, ino, 3<<20, []byte("longer"), false)
	p.b.mustWrite(p.tb, ino, 0, []byte("secondary's own"), false)
	p.a.crash()
	p.b.crash()
	// Each store's first heartbeat (at once) brings the map, and the
	// suspects are dealt with then; a push does the same.
	p.a.start()
	p.b.start()
	p.push()
	until(t, time.Now().Add(20*time.Second), "suspects dealt with on both copies", func() (bool, error) {
		p.push() // a heartbeat answer: a hand-over or copy that failed is tried again
		_, na := p.a.s.groups0PendingOf(p.ta, suspectGroup)
		_, nb := p.b.s.groups0PendingOf(p.tb, suspectGroup)
		return na == 0 && nb == 0 && !(*p.a.s.byID.Load())[p.ta].suspectPush.Load() &&
			!(*p.b.s.byID.Load())[p.tb].suspectPush.Load(), nil
	})
	// The secondary's hand-over degraded the group: its resync.
	if g := p.meta.group(1); g.State != rpc.GroupDegraded {
		t.Fatalf("group after the secondary handed its suspects over: %+v", g)
	}
	startResync(p)
	waitInSync(t, p, 20*time.Second)
	p.sameCopies(ino)
	recs, _, err := decodeMirrorLog(mustReadFile(t, filepath.Join(p.a.dirs[0], mirrorLogName)))
	if err != nil || len(recs) != 0 {
		t.Fatalf("primary's mirror.log after the copy: %+v, %v", recs, err)
	}
}

// startResync marks the stand-in's degraded group 1 resyncing (as the
// service does when the secondary's server heartbeats) and tells the
// stores.
func startResync(p *mirrorPair) {
	g := p.meta.group(1)
	g.State, g.Epoch = rpc.GroupResyncing, g.Epoch+1
	p.meta.setGroup(g)
	p.push()
}

// TestMirrorSecondarySuspectsRecopied: a secondary that applied a
// forwarded write without syncing it and lost it in a crash (the write
// put back to the old bytes on its copy before the crash: a page cache
// cannot be lost here) refuses reads of the chunk once it is back — while
// the primary cannot take the hand-over, the group stays in sync and the
// read gets EAGAIN, never the old bytes —, then hands the chunk to the
// primary, which degrades the group; after the resync both copies are
// the written bytes.
func TestMirrorSecondarySuspectsRecopied(t *testing.T) {
	p := newMirrorPair(t, nil)
	const ino, other = 0x510, 0x511
	old := pattern(2, 2<<20)
	if err := p.gwrite(p.a, ino, 0, old, true); err != nil {
		t.Fatal(err)
	}
	if err := p.gwrite(p.a, other, 0, []byte("untouched since its sync"), true); err != nil {
		t.Fatal(err)
	}
	// Acknowledged, not synced (the client did not fsync); the primary's
	// background sync would make it durable there.
	fresh := pattern(3, 64<<10)
	if err := p.gwrite(p.a, ino, 1<<20+4096, fresh, false); err != nil {
		t.Fatal(err)
	}
	// The secondary loses it.
	p.b.mustWrite(p.tb, ino, 1<<20+4096, old[1<<20+4096:1<<20+4096+len(fresh)], false)
	p.b.crash()
	p.meta.mu.Lock()
	p.meta.failReport = true // the primary cannot degrade the group: the hand-over fails
	p.meta.mu.Unlock()
	p.b.start()
	p.push()
	// The heartbeat answer started the hand-over: wait for it to end.
	until(t, time.Now().Add(10*time.Second), "the end of the hand-over", func() (bool, error) {
		return !(*p.b.s.byID.Load())[p.tb].suspectPush.Load(), nil
	})
	read := func(ino uint64) ([]byte, error) {
		var resp rpc.ReadResp
		err := p.b.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: gid(ino, p.epoch()), Off: 1 << 20, Len: 128 << 10}, &resp)
		return resp.Data, err
	}
	if got, err := read(ino); !errors.Is(err, syscall.EAGAIN) {
		stale := len(got) >= 4096+len(fresh) && bytes.Equal(got[4096:4096+len(fresh)], old[1<<20+4096:1<<20+4096+len(fresh)])
		t.Fatalf("read of the suspect chunk at the secondary: %v (%d bytes, the lost write's old bytes: %v), want EAGAIN", err, len(got), stale)
	}
	var resp rpc.ReadResp
	if err := p.b.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: gid(other, p.epoch()), Len: 8}, &resp); err != nil {
		t.Fatalf("read of a chunk that is no suspect at the in-sync secondary: %v", err)
	}
	if g := p.meta.group(1); g.State != rpc.GroupInSync || len(p.meta.reported(rpc.MirrorSecondaryLost)) == 0 {
		t.Fatalf("group after a failed degrade: %+v (reports %+v)", g, p.meta.reported(rpc.MirrorSecondaryLost))
	}
	p.meta.mu.Lock()
	p.meta.failReport = false
	p.meta.mu.Unlock()
	until(t, time.Now().Add(10*time.Second), "the hand-over", func() (bool, error) {
		p.push()
		_, n := p.b.s.groups0PendingOf(p.tb, suspectGroup)
		return n == 0 && !(*p.b.s.byID.Load())[p.tb].suspectPush.Load(), nil
	})
	if g := p.meta.group(1); g.State != rpc.GroupDegraded {
		t.Fatalf("group after the hand-over: %+v", g)
	}
	if _, err := read(ino); !errors.Is(err, syscall.ESTALE) && !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("read at the secondary of a degraded group: %v", err)
	}
	startResync(p)
	waitInSync(t, p, 20*time.Second)
	got := p.sameCopies(ino)
	if !bytes.Equal(got[1<<20+4096:1<<20+4096+len(fresh)], fresh) {
		t.Fatal("the copies are equal but lack the acknowledged write")
	}
	p.sameCopies(other)
}

// TestMirrorReturningPrimarySuspectsRecopied: a primary killed with a
// local change it never forwarded comes back as the secondary (its group
// failed over meanwhile); it hands the chunk to the new primary, whose
// resync copies it whole as well as what it recorded itself: both copies
// equal after.
func TestMirrorReturningPrimarySuspectsRecopied(t *testing.T) {
	p := newMirrorPair(t, nil)
	const ino, ino2 = 0x520, 0x521
	if err := p.gwrite(p.a, ino, 0, pattern(4, 3<<20), true); err != nil {
		t.Fatal(err)
	}
	if err := p.gwrite(p.a, ino2, 0, pattern(5, 1<<20), true); err != nil {
		t.Fatal(err)
	}
	// Applied at the primary, never forwarded, no client answered.
	p.a.mustWrite(p.ta, ino, 2<<20+100, []byte("the old primary's own change"), false)
	p.a.crash()
	// The service promotes the secondary.
	g := p.meta.group(1)
	g.Primary, g.Secondary, g.State, g.Epoch = p.tb, p.ta, rpc.GroupDegraded, g.Epoch+1
	p.meta.setGroup(g)
	p.meta.push(60000, p.b.s)
	if err := p.gwrite(p.b, ino2, 4096, []byte("written while the old primary was away"), false); err != nil {
		t.Fatal(err)
	}
	p.a.start()
	p.push()
	until(t, time.Now().Add(10*time.Second), "the hand-over", func() (bool, error) {
		p.push()
		_, n := p.a.s.groups0PendingOf(p.ta, suspectGroup)
		return n == 0 && !(*p.a.s.byID.Load())[p.ta].suspectPush.Load(), nil
	})
	startResync(p)
	waitInSync(t, p, 20*time.Second)
	p.sameCopies(ino)
	p.sameCopies(ino2)
}

// groups0PendingOf answers what target tgt's mirror.log holds for group.
func (s *Server) groups0PendingOf(tgt, group uint32) (bool, int) {
	return (*s.byID.Load())[tgt].mlog.pending(group)
}

// TestMirrorSecondaryFullDegrades: a secondary whose target is full
// (ENOSPC) is reported lost like an unreachable one; the write is
// acknowledged in the degraded epoch and recorded.
func TestMirrorSecondaryFullDegrades(t *testing.T) {
	p := newMirrorPair(t, nil)
	p.b.stop()
	p.b.cfg.ReserveBytes = 1 << 62 // every write would eat into the reserve
	p.b.start()
	p.push()
	if err := p.gwrite(p.a, 0x600, 0, []byte("primary only"), false); err != nil {
		t.Fatalf("write with a full secondary: %v", err)
	}
	if g := p.meta.group(1); g.State != rpc.GroupDegraded {
		t.Fatalf("group after the secondary answered ENOSPC: %+v", g)
	}
	if lost := p.meta.reported(rpc.MirrorSecondaryLost); len(lost) != 1 || lost[0].Target != p.ta {
		t.Fatalf("secondary-lost reports: %+v", lost)
	}
	if _, n := p.a.s.groups0Pending(p.ta); n != 1 {
		t.Fatalf("%d chunks recorded, want 1", n)
	}
}

// TestMirrorRefreshShared: requests of an epoch newer than the store knows
// that arrive while the service is slow to answer — and then fails — share
// the refresh under way (or the one after it) instead of each making one
// in turn.
func TestMirrorRefreshShared(t *testing.T) {
	p := newMirrorPair(t, nil)
	p.meta.mu.Lock()
	p.meta.listDelay = 500 * time.Millisecond
	p.meta.listFail = true
	p.meta.lists = 0
	p.meta.mu.Unlock()
	const n = 10
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- p.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: gid(1, 99), Data: []byte("x")}, &rpc.WriteResp{})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("write at an epoch nobody knows: %v, want EAGAIN", err)
		}
	}
	p.meta.mu.Lock()
	lists := p.meta.lists
	p.meta.mu.Unlock()
	if lists > 2 {
		t.Fatalf("%d requests made %d MListGroups calls, want at most 2", n, lists)
	}
}

// TestMirrorResyncInterrupted: the secondary goes away again in the middle
// of a resync; a write then degrades the group again, the resync stops and
// gives its records back; the next resync finishes and the copies end
// equal.
func TestMirrorResyncInterrupted(t *testing.T) {
	p := newMirrorPair(t, func(c *Config) { c.ResyncBytesPerSec = 4 << 20 })
	const ino, size = 0x700, 16 << 20
	if err := p.gwrite(p.a, ino, 0, []byte("x"), false); err != nil {
		t.Fatal(err)
	}
	p.b.stop()
	data := pattern(7, size)
	for off := 0; off < size; off += 1 << 20 {
		if err := p.gwrite(p.a, ino, uint64(off), data[off:off+1<<20], false); err != nil {
			t.Fatal(err)
		}
	}
	resyncPair(t, p)
	deadline := time.Now().Add(20 * time.Second)
	until(t, deadline, "resync progress", func() (bool, error) {
		m := &dto.Metric{}
		if err := p.a.s.mm.resyncBytes.WithLabelValues("1").Write(m); err != nil {
			return false, err
		}
		return m.GetCounter().GetValue() > 0, nil
	})
	p.b.stop()
	until(t, deadline, "a write acknowledged in a new degraded epoch", func() (bool, error) {
		err := p.gwrite(p.a, ino, 3, []byte("again away"), false)
		if errors.Is(err, syscall.ESTALE) || errors.Is(err, syscall.EAGAIN) {
			return false, nil // the map moved: the next try uses the new epoch
		}
		return err == nil && p.meta.group(1).State == rpc.GroupDegraded, err
	})
	until(t, deadline, "the resync's records given back", func() (bool, error) {
		_, n := p.a.s.groups0Pending(p.ta)
		return n == 1, nil
	})
	if n := len(p.meta.reported(rpc.MirrorResyncDone)); n != 0 {
		t.Fatalf("%d resync-done reports for an interrupted resync", n)
	}
	resyncPair(t, p)
	waitInSync(t, p, 30*time.Second)
	if got := p.sameCopies(ino); !bytes.Equal(got[3:13], []byte("again away")) {
		t.Fatalf("copies equal but without the last write: %q", got[3:13])
	}
}

// TestMirrorLockRangeHoldsForwards: while a repair holds a range of the
// secondary's copy (lockRange), a forwarded write of that range waits; a
// write of another range does not.
func TestMirrorLockRangeHoldsForwards(t *testing.T) {
	p := newMirrorPair(t, nil)
	unlock, err := p.b.s.lockRange(p.tb, 0x800, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.gwrite(p.a, 0x800, 2<<20, []byte("elsewhere"), false); err != nil {
		t.Fatalf("write of another region while a range is held: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- p.gwrite(p.a, 0x800, 100, []byte("held"), false) }()
	select {
	case err := <-done:
		t.Fatalf("write of the held range answered while held: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p.sameCopies(0x800)
}

// TestMirrorReadsNotBehindForwards: a read of a group chunk takes no
// ordering lock — at the primary and at the in-sync secondary it is served
// while a mutation of the same chunk waits for its range (held here as a
// forward or a resync copy holds it), and returns the bytes acknowledged
// before.
func TestMirrorReadsNotBehindForwards(t *testing.T) {
	p := newMirrorPair(t, nil)
	if err := p.gwrite(p.a, 0x900, 0, []byte("acknowledged"), false); err != nil {
		t.Fatal(err)
	}
	unlock, err := p.a.s.lockRange(p.ta, 0x900, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { held <- p.gwrite(p.a, 0x900, 0, []byte("later write!"), false) }()
	for _, e := range []*env{p.a, p.b} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var rr rpc.ReadResp
		err := e.cl.Call(ctx, rpc.SRead, &rpc.ReadReq{Chunk: gid(0x900, p.epoch()), Len: 12}, &rr)
		cancel()
		if err != nil || string(rr.Data) != "acknowledged" {
			t.Fatalf("read at %s while the chunk's range is held: %q, %v; want the acknowledged bytes at once", e.s.Addr(), rr.Data, err)
		}
	}
	select {
	case err := <-held:
		t.Fatalf("the write of the held range answered while held: %v", err)
	default:
	}
	unlock()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	p.sameCopies(0x900)
}

// TestHeartbeatEvery: a server with mirror groups heartbeats every third
// of its lease when that is shorter than its configured period (never
// under 100 ms); without a lease, at its period.
func TestHeartbeatEvery(t *testing.T) {
	for _, c := range []struct {
		interval time.Duration
		leaseMs  uint32
		want     time.Duration
	}{
		{time.Second, 0, time.Second},
		{time.Second, 1333, 444333333},
		{time.Second, 6000, time.Second},
		{time.Second, 150, 100 * time.Millisecond},
		{200 * time.Millisecond, 1333, 200 * time.Millisecond},
	} {
		if got := heartbeatEvery(c.interval, c.leaseMs); got != c.want {
			t.Errorf("heartbeatEvery(%v, %d) = %v, want %v", c.interval, c.leaseMs, got, c.want)
		}
	}
}

// TestMirrorQueuedWritesAfterDegrade: writes of one region queued behind
// the chunk's ordering lock while the secondary stops answering (its range
// held) do not each wait a forward timeout of their own: once the first
// one degrades the group, the others take the degraded path at once, and
// every write is answered within the bound a client waits (before, six
// queued writes took six forward timeouts, and the client gave up: EIO).
func TestMirrorQueuedWritesAfterDegrade(t *testing.T) {
	// Over TCP, as between processes: an in-process forward waits for
	// the handler it lent its bytes to, so it would never time out.
	p := newMirrorPairNet(t, nil, true)
	unlock, err := p.b.s.lockRange(p.tb, 0x900, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	const writers = 6
	ctx, cancel := context.WithTimeout(context.Background(), 3*forwardTimeout)
	defer cancel()
	epoch := p.epoch()
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			req := &rpc.WriteReq{Chunk: gid(0x900, epoch), Off: uint64(i) * 4096, Data: bytes.Repeat([]byte{byte('a' + i)}, 4096)}
			err := p.a.cl.Call(ctx, rpc.SWrite, req, &rpc.WriteResp{})
			if rpc.ErrnoOf(err) == syscall.ESTALE { // the client's answer: re-read the map, send again
				req.Chunk = gid(0x900, p.epoch())
				err = p.a.cl.Call(ctx, rpc.SWrite, req, &rpc.WriteResp{})
			}
			errs <- err
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatalf("a write queued while the secondary hung: %v", err)
		}
	}
	if g := p.meta.group(1); g.State != rpc.GroupDegraded {
		t.Fatalf("group after the secondary hung: %+v", g)
	}
	for i := range writers {
		if got := p.a.mustRead(p.ta, 0x900, uint64(i)*4096, 4096); !bytes.Equal(got, bytes.Repeat([]byte{byte('a' + i)}, 4096)) {
			t.Fatalf("block %d on the primary: %q…", i, got[:8])
		}
	}
}

// TestMirrorDegradeByServiceEndsForwards: a forward waiting on a secondary
// that does not answer (a stopped process) is given up as soon as the
// group map says the metadata service degraded the group with this server
// still primary: the write takes the degraded path (recorded, answered)
// instead of waiting out forwardTimeout (5 s, longer than the call's 3 s
// here).
func TestMirrorDegradeByServiceEndsForwards(t *testing.T) {
	p := newMirrorPairNet(t, nil, true)
	unlock, err := p.b.s.lockRange(p.tb, 0x910, 0, 1<<20) // the secondary holds the forward
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), forwardTimeout*3/5)
	defer cancel()
	data := bytes.Repeat([]byte("f"), 4096)
	done := make(chan error, 1)
	go func() {
		done <- p.a.cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: gid(0x910, p.epoch()), Data: data}, &rpc.WriteResp{})
	}()
	for i := 0; p.a.s.forwards.count(1) == 0; i++ {
		if i == 200 {
			t.Fatal("the write's forward never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	g := p.meta.group(1)
	g.Epoch++
	g.State = rpc.GroupDegraded
	p.meta.setGroup(g)
	p.meta.push(60000, p.a.s) // only the primary hears: the secondary is "stopped"
	if err := <-done; err != nil {
		t.Fatalf("the write whose forward hung, once the group was degraded: %v", err)
	}
	if n := p.a.s.forwards.count(1); n != 0 {
		t.Fatalf("%d forwards still in flight", n)
	}
	if begun, chunks := p.a.s.groups0Pending(p.ta); !begun || chunks != 1 {
		t.Fatalf("mirror.log after the degrade: begun %v, %d chunks; want a begin and chunk 0x910", begun, chunks)
	}
	if got := p.a.mustRead(p.ta, 0x910, 0, 4096); !bytes.Equal(got, data) {
		t.Fatalf("the primary's copy: %q…", got[:8])
	}
}
