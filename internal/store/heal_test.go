package store

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// The tests here pair two real stores on loopback into a mirror group
// (healPair; newHealPair in heal_pair_test.go makes the group view), and
// write the same bytes to both copies directly, by their targets' own ids.
// Corruption is made by flipping bytes in one copy's chunk file behind the
// store's back.

// healPair is two stores holding the two copies of a group, one target
// each: pri the primary (target tp), sec the secondary (target ts).
type healPair struct {
	t        *testing.T
	pri, sec *env
	tp, ts   uint32
	group    uint32 // without GroupBit
	// epoch answers the group's current epoch; setSync makes both stores
	// see the group in sync or not, in a new epoch; splitEpochs makes the
	// secondary see a newer epoch than the primary (a switch under way).
	epoch       func() uint64
	setSync     func(inSync bool)
	splitEpochs func()
	// write writes to both copies as a client's write of the group does
	// (through the primary's forwarding where there is one).
	write func(ino, off uint64, data []byte) error
	// copyBadReports, when set, counts the MirrorCopyBad reports the
	// metadata service received.
	copyBadReports func() int
	// chunks: ino -> content written to both copies
	chunks map[uint64][]byte
}

// put writes data as chunk ino on both copies, synced.
func (m *healPair) put(ino uint64, data []byte) {
	m.pri.mustWrite(m.tp, ino, 0, data, true)
	m.sec.mustWrite(m.ts, ino, 0, data, true)
	m.chunks[ino] = data
}

// read reads chunk ino of the group through e's store.
func (m *healPair) read(e *env, ino, off uint64, n uint32) ([]byte, error) {
	var resp rpc.ReadResp
	err := e.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{
		Chunk: rpc.ChunkID{Target: rpc.GroupBit | m.group, Ino: ino, Epoch: m.epoch()}, Off: off, Len: n}, &resp)
	return resp.Data, err
}

// readRetrying is read, asked again while the store answers EAGAIN (its
// copy's bad blocks wait for the other copy, which is busy repairing the
// same region from this one: a try-lock refuses rather than deadlock), as
// the client does within its bounded wait; at most 100 times, 10 ms apart.
func (m *healPair) readRetrying(e *env, ino, off uint64, n uint32) ([]byte, error) {
	for i := 0; ; i++ {
		got, err := m.read(e, ino, off, n)
		if rpc.ErrnoOf(err) != syscall.EAGAIN || i == 99 {
			return got, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readAll reads every chunk through e's store 1 MiB at a time and checks
// the bytes; it answers the first error.
func (m *healPair) readAll(t *testing.T, e *env) error {
	t.Helper()
	for ino, want := range m.chunks {
		for off := 0; off < len(want); off += 1 << 20 {
			got, err := m.read(e, ino, uint64(off), 1<<20)
			if err != nil {
				return err
			}
			if w := want[off:min(off+1<<20, len(want))]; !bytes.Equal(got, w) {
				t.Fatalf("chunk %x at %d: read %d bytes, not the bytes written (want %d)", ino, off, len(got), len(w))
			}
		}
	}
	return nil
}

// onDisk checks that e's copy of every chunk holds the bytes written.
func (m *healPair) onDisk(t *testing.T, e *env, who string) {
	t.Helper()
	for ino, want := range m.chunks {
		got, err := os.ReadFile(dataPath(e.dirs[0], ino))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			n := 0
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					n++
				}
			}
			t.Fatalf("%s copy of chunk %x: %d bytes differ from what was written (length %d, want %d)", who, ino, n, len(got), len(want))
		}
	}
}

// flipBlocks corrupts n distinct random blocks of e's copies (one byte
// each, inside the chunk's length), skipping the blocks in avoid; it
// answers the blocks flipped, as (ino, block) pairs.
func (m *healPair) flipBlocks(t *testing.T, e *env, rng *rand.Rand, n int, avoid map[[2]uint64]bool) map[[2]uint64]bool {
	t.Helper()
	var inos []uint64
	for ino := range m.chunks {
		inos = append(inos, ino)
	}
	flipped := map[[2]uint64]bool{}
	for len(flipped) < n {
		ino := inos[rng.IntN(len(inos))]
		size := len(m.chunks[ino])
		b := uint64(rng.IntN(int(blocks(int64(size)))))
		key := [2]uint64{ino, b}
		if flipped[key] || avoid[key] {
			continue
		}
		flipped[key] = true
		off := int64(b)*blockSize + int64(rng.IntN(min(blockSize, size-int(b)*blockSize)))
		flipBit(t, dataPath(e.dirs[0], ino), off)
	}
	return flipped
}

// fill writes three chunks to both copies.
func (m *healPair) fill() {
	m.put(0x1001, pattern(1, 6<<20+1234)) // sidecar sums, a partial last block
	m.put(0x1002, pattern(2, 3<<20))
	m.put(0x2003, pattern(3, 40<<10+17)) // inline sums
}

// scrub scrubs the primary's copy against the secondary's, all of it.
func (m *healPair) scrub(repair bool) rpc.ScrubResp {
	t := m.t
	t.Helper()
	var total rpc.ScrubResp
	for from, i := uint32(0), 0; ; i++ {
		if i > 1000 {
			t.Fatal("scrub does not finish")
		}
		var r rpc.ScrubResp
		if err := m.pri.cl.Call(context.Background(), rpc.SScrub, &rpc.ScrubReq{Target: m.tp, From: from, Max: 2, Repair: repair, Group: m.group}, &r); err != nil {
			t.Fatalf("scrub: %v", err)
		}
		v, tv := reflect.ValueOf(r), reflect.ValueOf(&total).Elem()
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.Uint64 {
				tv.Field(i).SetUint(tv.Field(i).Uint() + f.Uint())
			}
		}
		total.Problems = append(total.Problems, r.Problems...)
		if r.Done {
			return total
		}
		if r.Next <= from {
			t.Fatalf("scrub does not advance past %d", from)
		}
		from = r.Next
	}
}

// TestSelfHealingRead: 100 blocks flipped at random on one copy; every
// read, through either copy, returns the bytes written, and the bad copy
// is rewritten.
func TestSelfHealingRead(t *testing.T) {
	for _, bad := range []string{"primary", "secondary"} {
		t.Run(bad, func(t *testing.T) {
			logs := captureLogs(t)
			rng := rand.New(rand.NewPCG(uint64(len(bad)), 21))
			m := newHealPair(t)
			m.fill()
			badE, goodE := m.pri, m.sec
			if bad == "secondary" {
				badE, goodE = m.sec, m.pri
			}
			m.flipBlocks(t, badE, rng, 100, nil)
			if err := m.readAll(t, goodE); err != nil {
				t.Fatalf("read through the good copy: %v", err)
			}
			if err := m.readAll(t, badE); err != nil {
				t.Fatalf("read through the bad copy: %v", err)
			}
			m.onDisk(t, badE, bad)
			m.onDisk(t, goodE, "good")
			if got := counterValue(t, badE.s.heal.repairs.WithLabelValues("read")); got != 100 {
				t.Errorf("strata_mirror_repairs_total{kind=read} = %v, want 100", got)
			}
			if !strings.Contains(logs.String(), "repaired from peer") {
				t.Errorf("no log line of the repair")
			}
			if m.copyBadReports != nil {
				if err := testutil.WaitFor(10*time.Second, func() error {
					if n := m.copyBadReports(); n == 0 {
						return errors.New("no MirrorCopyBad report reached the metadata service")
					}
					return nil
				}); err != nil {
					t.Error(err)
				}
			}
			// Nothing is left to find.
			if r := m.scrub(false); r.BadBlocks != 0 || r.Chunks != 3 {
				t.Fatalf("scrub after the healing reads: %+v", r)
			}
			// Unmirrored reads of the repaired copy verify too.
			for ino, want := range m.chunks {
				tgt := m.tp
				if badE == m.sec {
					tgt = m.ts
				}
				if got := badE.mustRead(tgt, ino, 0, uint32(len(want))); !bytes.Equal(got, want) {
					t.Fatalf("chunk %x read as target %d: wrong bytes", ino, tgt)
				}
			}
		})
	}
}

// TestScrubRepairsBothCopies: blocks flipped on both copies (never the
// same block); a scrub without --repair finds them all and changes
// nothing, one with it repairs them all, and a third finds none.
func TestScrubRepairsBothCopies(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 21))
	m := newHealPair(t)
	m.fill()
	onPri := m.flipBlocks(t, m.pri, rng, 60, nil)
	m.flipBlocks(t, m.sec, rng, 40, onPri)

	r := m.scrub(false)
	if r.Chunks != 3 || r.BadBlocks != 100 || r.Repaired != 0 || r.Unrepairable != 0 || r.Mismatched != 0 || r.PeerMissing != 0 {
		t.Fatalf("scrub without repair: %+v", r)
	}
	if r.Bytes != uint64(6<<20+1234+3<<20+40<<10+17) {
		t.Errorf("scrub counted %d bytes", r.Bytes)
	}
	r = m.scrub(true)
	if r.BadBlocks != 100 || r.Repaired != 100 || r.Unrepairable != 0 {
		t.Fatalf("scrub --repair: %+v", r)
	}
	m.onDisk(t, m.pri, "primary")
	m.onDisk(t, m.sec, "secondary")
	if r := m.scrub(true); r.BadBlocks != 0 || r.Repaired != 0 || r.Chunks != 3 {
		t.Fatalf("second scrub: %+v", r)
	}
	got := counterValue(t, m.pri.s.heal.repairs.WithLabelValues("scrub")) + counterValue(t, m.sec.s.heal.repairs.WithLabelValues("scrub"))
	if got != 100 {
		t.Errorf("strata_mirror_repairs_total{kind=scrub} on both stores = %v, want 100", got)
	}
}

// TestBadOnBothCopies: a block bad on both copies is unrepairable: reads
// of it answer EIO through either copy, the scrub reports it, and its
// neighbours still read. So does a bad block while the group is not in
// sync; while the other copy is in another epoch the read answers EAGAIN
// (try again).
func TestBadOnBothCopies(t *testing.T) {
	m := newHealPair(t)
	m.fill()
	const ino, blk = 0x1001, 300
	flipBit(t, dataPath(m.pri.dirs[0], ino), blk*blockSize+5)
	flipBit(t, dataPath(m.sec.dirs[0], ino), blk*blockSize+4000)
	for _, e := range []*env{m.pri, m.sec} {
		if _, err := m.read(e, ino, blk*blockSize-100, 200); !errors.Is(err, syscall.EIO) {
			t.Fatalf("read of a block bad on both copies: want EIO, got %v", err)
		}
		if got, err := m.read(e, ino, 0, blk*blockSize); err != nil || !bytes.Equal(got, m.chunks[ino][:blk*blockSize]) {
			t.Fatalf("read before the bad block: %v", err)
		}
	}
	r := m.scrub(true)
	if r.BadBlocks != 2 || r.Unrepairable != 2 || r.Repaired != 0 || len(r.Problems) == 0 || !strings.Contains(r.Problems[0], "both copies") {
		t.Fatalf("scrub of a block bad on both copies: %+v", r)
	}

	// A bad block on one copy of a group out of sync stays bad.
	const ino2 = 0x1002
	flipBit(t, dataPath(m.pri.dirs[0], ino2), 10)
	m.setSync(false)
	if _, err := m.read(m.pri, ino2, 0, 4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a bad block, group out of sync: want EIO, got %v", err)
	}
	// The other copy in another epoch (a switch under way): try again.
	m.setSync(true)
	m.splitEpochs()
	if _, err := m.read(m.pri, ino2, 0, 4096); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("read of a bad block, the other copy in a newer epoch: want EAGAIN, got %v", err)
	}
	m.setSync(true)
	if got, err := m.read(m.pri, ino2, 0, 4096); err != nil || !bytes.Equal(got, m.chunks[ino2][:4096]) {
		t.Fatalf("read of a bad block, group in sync again: %v", err)
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestSelfHealingReadsRaceWrites: healing reads of one copy while whole
// blocks are written to both copies (the primary first, as forwarding
// does): a repair never puts older bytes over a newer write, so both
// copies end with every write.
func TestSelfHealingReadsRaceWrites(t *testing.T) {
	for _, bad := range []string{"primary", "secondary"} {
		t.Run(bad, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(len(bad)), 77))
			m := newHealPair(t)
			const ino = 0x3003
			model := pattern(4, 2<<20)
			m.put(ino, append([]byte(nil), model...))
			badE := m.pri
			if bad == "secondary" {
				badE = m.sec
			}
			m.flipBlocks(t, badE, rng, 200, nil)

			done := make(chan struct{})
			var reads atomic.Int64
			var wg sync.WaitGroup
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 1000; i++ {
						select {
						case <-done:
							return
						default:
						}
						off := uint64(i%8) << 18
						if _, err := m.read(badE, ino, off, 1<<18); err != nil {
							t.Errorf("healing read at %d: %v", off, err)
							return
						}
						reads.Add(1)
					}
				}()
			}
			for i := 0; i < 300; i++ {
				b := rng.IntN(len(model)/blockSize - 4)
				n := 1 + rng.IntN(4)
				data := pattern(1000+i, n*blockSize)
				if err := m.write(ino, uint64(b*blockSize), data); err != nil {
					t.Fatalf("write: %v", err)
				}
				copy(model[b*blockSize:], data)
				time.Sleep(200 * time.Microsecond)
			}
			close(done)
			wg.Wait()
			t.Logf("healing reads during the writes: %d", reads.Load())
			m.chunks[ino] = model
			if err := m.readAll(t, badE); err != nil {
				t.Fatalf("final read through the bad copy: %v", err)
			}
			m.onDisk(t, m.pri, "primary")
			m.onDisk(t, m.sec, "secondary")
		})
	}
}

// TestBothCopiesHealOneRegion: each copy has bad blocks (different ones)
// in the same 1 MiB region, read through both at once: each repairs from
// the other without the two waiting on each other for good.
func TestBothCopiesHealOneRegion(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 21))
	m := newHealPair(t)
	const ino = 0x4004
	m.put(ino, pattern(5, 1<<20))
	onPri := m.flipBlocks(t, m.pri, rng, 30, nil)
	m.flipBlocks(t, m.sec, rng, 30, onPri)
	var wg sync.WaitGroup
	for _, e := range []*env{m.pri, m.sec, m.pri, m.sec} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				got, err := m.readRetrying(e, ino, 0, 1<<20)
				if err != nil || !bytes.Equal(got, m.chunks[ino]) {
					t.Errorf("read %d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	m.onDisk(t, m.pri, "primary")
	m.onDisk(t, m.sec, "secondary")
}

// TestScrubPaced: a scrub at RateBytes reads no faster than that (a lower
// bound only: the span before each wait may go at once).
func TestScrubPaced(t *testing.T) {
	m := newHealPair(t)
	m.fill()
	const rate = 30 << 20
	start := time.Now()
	var r rpc.ScrubResp
	if err := m.pri.cl.Call(context.Background(), rpc.SScrub, &rpc.ScrubReq{Target: m.tp, Max: 100, RateBytes: rate, Group: m.group}, &r); err != nil {
		t.Fatal(err)
	}
	if !r.Done || r.Chunks != 3 {
		t.Fatalf("scrub: %+v", r)
	}
	// Every span but the last waits for the bytes before it: at least
	// (total - last span) / rate.
	min := time.Duration(float64(r.Bytes-40<<10-17) / rate * float64(time.Second))
	if took := time.Since(start); took < min*9/10 {
		t.Fatalf("scrub of %d bytes at %d B/s took %v, under %v", r.Bytes, rate, took, min)
	}
}

// TestHealBeforeWrite: a partial write over a bad block of a group chunk
// fails its edge verification; healWriteEdges repairs the block from the
// other copy and the write then succeeds, leaving the copies equal.
func TestHealBeforeWrite(t *testing.T) {
	m := newHealPair(t)
	const ino = 0x5005
	m.put(ino, pattern(6, 64<<10))
	flipBit(t, dataPath(m.sec.dirs[0], ino), 3*blockSize+100)
	flipBit(t, dataPath(m.sec.dirs[0], ino), 9*blockSize+7)
	s := m.sec.s
	off, data := int64(3*blockSize+50), pattern(7, 6*blockSize+100) // edges in blocks 3 and 9
	ctx := context.Background()
	werr := m.sec.write(m.ts, ino, uint64(off), data, false)
	if !errors.Is(werr, syscall.EIO) {
		t.Fatalf("partial write over bad blocks: want EIO, got %v", werr)
	}
	if !s.healWriteEdges(ctx, m.ts, ino, rpc.GroupBit|m.group, off, off+int64(len(data)), werr) {
		t.Fatal("healWriteEdges repaired nothing")
	}
	if err := m.sec.write(m.ts, ino, uint64(off), data, false); err != nil {
		t.Fatalf("write after the repair: %v", err)
	}
	m.pri.mustWrite(m.tp, ino, uint64(off), data, false)
	copy(m.chunks[ino][off:], data)
	if err := m.readAll(t, m.sec); err != nil {
		t.Fatal(err)
	}
	m.onDisk(t, m.sec, "secondary")
	if got := counterValue(t, s.heal.repairs.WithLabelValues("write")); got != 2 {
		t.Errorf("strata_mirror_repairs_total{kind=write} = %v, want 2", got)
	}
	// Not a checksum failure: nothing to do.
	if s.healWriteEdges(ctx, m.ts, ino, m.group, 0, 10, rpc.Errorf(syscall.ENOSPC, "full")) {
		t.Fatal("healWriteEdges acted on ENOSPC")
	}
}

// TestScrubUnderWrites: a scrub while the group is written finishes and
// finds no bad block (blocks caught between the two copies' writes may
// count as differing; they are re-checked once).
func TestScrubUnderWrites(t *testing.T) {
	m := newHealPair(t)
	m.fill()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(3, 3))
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if i > 100000 {
				done <- errors.New("writer did not stop")
				return
			}
			off := uint64(rng.IntN(3<<20)) &^ (blockSize - 1)
			if err := m.write(0x1002, off, pattern(i, blockSize*(1+rng.IntN(8)))); err != nil {
				done <- err
				return
			}
		}
	}()
	for i := 0; i < 3; i++ {
		r := m.scrub(true)
		if r.BadBlocks != 0 || r.Unrepairable != 0 || r.Chunks != 3 {
			t.Errorf("scrub %d under writes: %+v", i, r)
		}
		t.Logf("scrub %d under writes: %d blocks differing", i, r.Mismatched)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
}

// TestScrubFindsDifferingCopies: blocks that verify on both copies but
// differ (a write one copy missed) are reported, not repaired.
func TestScrubFindsDifferingCopies(t *testing.T) {
	m := newHealPair(t)
	m.fill()
	m.sec.mustWrite(m.ts, 0x1002, 5*blockSize, pattern(99, 3*blockSize), true)
	r := m.scrub(true)
	if r.Mismatched != 3 || r.BadBlocks != 0 || r.Repaired != 0 || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "differ") {
		t.Fatalf("scrub of copies that differ in 3 blocks: %+v", r)
	}
}
