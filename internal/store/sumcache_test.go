package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// cachedPages is how many sums pages chunk ino of target 1 holds now.
func cachedPages(t *testing.T, e *env, ino uint64) int {
	t.Helper()
	tg, err := e.s.target(1, ino)
	if err != nil {
		t.Fatal(err)
	}
	c := e.s.cache.lookup(tg, ino)
	if c == nil {
		t.Fatalf("chunk %x not open", ino)
	}
	defer e.s.cache.release(c)
	if c.inl.Load() != nil {
		t.Fatalf("chunk %x has inline sums, want a sidecar", ino)
	}
	c.pages.mu.Lock()
	defer c.pages.mu.Unlock()
	return len(c.pages.m)
}

// A sidecar chunk whose sums a read keeps in memory still checks every
// block it returns: a bit flipped in the data file afterwards answers EIO,
// as before the sums were kept, and the blocks around it still read.
func TestSumsCacheStillCatchesCorruption(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	const ino = 0xcafe
	data := pattern(3, 3<<20)
	e.mustWrite(1, ino, 0, data, true)
	for _, off := range []uint64{0, 1<<20 + 4096, 2<<20 + 8192} {
		if b := e.mustRead(1, ino, off, 4096); !bytes.Equal(b, data[off:off+4096]) {
			t.Fatalf("read at %d wrong", off)
		}
	}
	if n := cachedPages(t, e, ino); n != 3 {
		t.Fatalf("%d sums pages kept after reads of three regions, want 3", n)
	}
	// Changed behind the server, in the page cache the server reads from.
	bad := int64(1<<20 + 4096 + 100)
	flipBit(t, dataPath(e.dirs[0], ino), bad)
	_, err := e.read(1, ino, 1<<20+4096, 4096)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a corrupt block whose sums are kept in memory: %v, want EIO", err)
	}
	if !strings.Contains(logs.String(), "checksum mismatch") {
		t.Fatalf("no checksum mismatch logged:\n%s", logs.String())
	}
	// The same through a read spanning regions, and the neighbours.
	if _, err := e.read(1, ino, 1<<20-4096, 3<<20); !errors.Is(err, syscall.EIO) {
		t.Fatalf("long read over the corrupt block: %v, want EIO", err)
	}
	if b := e.mustRead(1, ino, 1<<20, 4096); !bytes.Equal(b, data[1<<20:1<<20+4096]) {
		t.Fatal("block before the corrupt one wrong")
	}
	if b := e.mustRead(1, ino, 1<<20+8192, 4096); !bytes.Equal(b, data[1<<20+8192:1<<20+12288]) {
		t.Fatal("block after the corrupt one wrong")
	}
}

// Writes, punches and truncates of a sidecar chunk drop the kept sums of
// what they change: random changes between reads of a chunk spanning four
// regions never answer a stale sum (a false EIO) or stale bytes.
func TestSumsCacheFollowsChanges(t *testing.T) {
	e := newEnv(t, 1, nil)
	const ino = 0xd00d
	const span = 4 << 20
	rng := rand.New(rand.NewPCG(7, 11))
	model := pattern(5, 3<<20)
	e.mustWrite(1, ino, 0, model, false)
	check := func(step int, what string) {
		t.Helper()
		// Reads that fill pages, then a whole read.
		for range 4 {
			off := rng.Int64N(span)
			n := 1 + rng.Int64N(64<<10)
			got, err := e.read(1, ino, uint64(off), uint32(n))
			if err != nil {
				t.Fatalf("step %d (after %s): read %d+%d: %v", step, what, off, n, err)
			}
			want := []byte{}
			if off < int64(len(model)) {
				want = model[off:min(off+n, int64(len(model)))]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("step %d (after %s): read %d+%d: got %d bytes, first difference at %d", step, what, off, n, len(got), firstDiff(got, want))
			}
		}
		got := e.mustRead(1, ino, 0, span)
		if !bytes.Equal(got, model) {
			t.Fatalf("step %d (after %s): whole chunk: %d bytes, want %d, first difference at %d", step, what, len(got), len(model), firstDiff(got, model))
		}
	}
	check(0, "the first write")
	for step := 1; step <= 60; step++ {
		var what string
		switch k := rng.IntN(10); {
		case k < 6: // write: unaligned, often across a region boundary
			off := rng.Int64N(span - 256<<10)
			n := 1 + rng.Int64N(256<<10)
			b := pattern(100+step, int(n))
			e.mustWrite(1, ino, uint64(off), b, rng.IntN(4) == 0)
			if grow := off + n; grow > int64(len(model)) {
				model = append(model, make([]byte, grow-int64(len(model)))...)
			}
			copy(model[off:], b)
			what = "write"
		case k < 8: // punch
			off := rng.Int64N(span)
			n := 1 + rng.Int64N(1<<20)
			if err := e.call(rpc.SPunch, &rpc.PunchReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Off: uint64(off), Len: uint64(n)}); err != nil {
				t.Fatalf("punch: %v", err)
			}
			if off < int64(len(model)) {
				clear(model[off:min(off+n, int64(len(model)))])
			}
			what = "punch"
		default: // truncate, down or up
			size := rng.Int64N(span)
			if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Size: uint64(size)}); err != nil {
				t.Fatalf("truncate: %v", err)
			}
			if size <= int64(len(model)) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-int64(len(model)))...)
			}
			what = "truncate"
		}
		check(step, what)
	}
}

// Readers filling pages while writers change the same regions never see a
// stale sum: no read fails, and once the writers stopped every byte is
// the last write's.
func TestSumsCacheConcurrentReadersWriters(t *testing.T) {
	e := newEnv(t, 1, nil)
	const ino = 0xfeed
	const span = 4 << 20
	e.mustWrite(1, ino, 0, pattern(9, span), false)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var stop atomic.Bool
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer stop.Store(true)
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := range 150 {
				// 64 KiB pieces of the writer's own half, unaligned.
				off := int64(w)*span/2 + rng.Int64N(span/2-64<<10)
				if err := e.write(1, ino, uint64(off), pattern(1000*w+i, 64<<10-rng.IntN(3000)), false); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 5))
			for i := 0; i < 5000 && !stop.Load(); i++ {
				off := rng.Int64N(span - 8192)
				if _, err := e.read(1, ino, uint64(off), uint32(1+rng.IntN(8192))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent reads and writes: %v", err)
	}
	// Every page now filled after the last write agrees with the data.
	for off := uint64(0); off < span; off += 1 << 20 {
		if _, err := e.read(1, ino, off, 1<<20); err != nil {
			t.Fatalf("read after the writers: %v", err)
		}
	}
}
