package store

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

var seedFlag = flag.Uint64("seed", 0, "seed for randomized tests (0: time-based)")

// TestModelRandomOps runs random writes, reads, truncates, punches, syncs
// and restarts against an in-memory model of each chunk.
func TestModelRandomOps(t *testing.T) { modelRandomOps(t, 3<<20, 300<<10) }

// TestModelRandomOpsSmall: the same on chunks around the inline sums limit
// (inlinesums.go), so that inline chunks are written, truncated, punched,
// recovered and moved to sidecars.
func TestModelRandomOpsSmall(t *testing.T) {
	modelRandomOps(t, 2*inlineMaxBlocks*blockSize, inlineMaxBlocks*blockSize/2)
}

func modelRandomOps(t *testing.T, maxOff, bigLen int) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	e := newEnv(t, 2, nil)
	models := map[[2]uint64][]byte{} // (target, ino) -> content
	offLen := func() (uint64, int) {
		var n int
		switch rng.IntN(4) {
		case 0:
			n = 1 + rng.IntN(100)
		case 1:
			n = blockSize
		case 2:
			n = 1 + rng.IntN(3*blockSize)
		default:
			n = 1 + rng.IntN(bigLen)
		}
		off := uint64(rng.IntN(maxOff))
		if rng.IntN(3) == 0 {
			off &^= blockSize - 1
		}
		return off, n
	}
	for i := 0; i < 1500; i++ {
		tgt := uint32(1 + rng.IntN(2))
		ino := uint64(1 + rng.IntN(4))
		key := [2]uint64{uint64(tgt), ino}
		m := models[key]
		switch op := rng.IntN(100); {
		case op < 40:
			off, n := offLen()
			data := pattern(i, n)
			e.mustWrite(tgt, ino, off, data, rng.IntN(10) == 0)
			if end := int(off) + n; end > len(m) {
				m = append(m, make([]byte, end-len(m))...)
			}
			copy(m[off:], data)
		case op < 75:
			off, n := offLen()
			got := e.mustRead(tgt, ino, off, uint32(n))
			var want []byte
			if int(off) < len(m) {
				want = m[off:min(len(m), int(off)+n)]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("op %d: read t%d ino %d off %d len %d: got %d bytes, want %d (first diff at %d)", i, tgt, ino, off, n, len(got), len(want), firstDiff(got, want))
			}
		case op < 83:
			size := uint64(rng.IntN(maxOff))
			if rng.IntN(4) == 0 {
				size = 0
			}
			if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}, Size: size}); err != nil {
				t.Fatalf("op %d truncate: %v", i, err)
			}
			if int(size) < len(m) {
				m = m[:size]
			} else {
				m = append(m, make([]byte, int(size)-len(m))...)
			}
		case op < 90:
			off, n := offLen()
			if err := e.call(rpc.SPunch, &rpc.PunchReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}, Off: off, Len: uint64(n)}); err != nil {
				t.Fatalf("op %d punch: %v", i, err)
			}
			if int(off) < len(m) {
				clear(m[off:min(len(m), int(off)+n)])
			}
		case op < 95:
			if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}}); err != nil {
				t.Fatalf("op %d sync: %v", i, err)
			}
		case op < 97:
			if err := e.call(rpc.SRemove, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}}); err != nil {
				t.Fatalf("op %d remove: %v", i, err)
			}
			m = nil
		case op < 98:
			e.restart()
		default:
			e.crash()
			e.start()
		}
		models[key] = m
		if st := e.stat(tgt, ino); st.Size != uint64(len(m)) {
			t.Fatalf("op %d: chunk size %d, model %d", i, st.Size, len(m))
		}
	}
	// Full read-back of everything, before and after a restart.
	for round := 0; round < 2; round++ {
		for key, m := range models {
			got := e.mustRead(uint32(key[0]), key[1], 0, uint32(maxOff*2))
			if !bytes.Equal(got, m) {
				t.Fatalf("round %d: chunk %v: %d bytes, want %d, first diff at %d", round, key, len(got), len(m), firstDiff(got, m))
			}
		}
		e.restart()
	}
}

func firstDiff(a, b []byte) int {
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// SSyncStat answers what SChunkStat answers after the sync: nothing for an
// absent chunk (known to take no space), the length and space of a written
// one; an unknown target is an error, not an empty answer.
func TestSyncStat(t *testing.T) {
	e := newEnv(t, 1, nil)
	syncStat := func(tgt uint32, ino uint64) (rpc.ChunkStatResp, error) {
		var r rpc.ChunkStatResp
		err := e.cl.Call(context.Background(), rpc.SSyncStat, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}}, &r)
		return r, err
	}
	if st, err := syncStat(1, 9); err != nil || st.Exists || st.Size != 0 || !st.HasAlloc || st.Alloc != 0 {
		t.Fatalf("absent chunk: %+v, %v", st, err)
	}
	e.mustWrite(1, 9, 0, bytes.Repeat([]byte{1}, 64<<10), false)
	e.mustWrite(1, 9, 3<<20, []byte("tail"), false)
	st, err := syncStat(1, 9)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.stat(1, 9); st != want || !st.Exists || st.Size != 3<<20+4 || st.Alloc < 64<<10 || st.Alloc >= 1<<20 {
		t.Fatalf("sync stat %+v, chunk stat %+v: want equal, 3 MiB+4 long, 64 KiB+ of space", st, want)
	}
	if _, err := syncStat(7, 9); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("unknown target: %v, want ENOENT", err)
	}
}

// A write's answer carries the chunk's space after it, what SChunkStat
// answers then: a small file's first write, a sparse one far out, and a
// synced one.
func TestWriteAnswersSpace(t *testing.T) {
	e := newEnv(t, 1, nil)
	write := func(off uint64, n int, sync bool) rpc.WriteResp {
		t.Helper()
		var r rpc.WriteResp
		req := &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 9}, Off: off, Sync: sync, Data: bytes.Repeat([]byte{1}, n)}
		if err := e.cl.Call(context.Background(), rpc.SWrite, req, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, w := range []struct {
		off  uint64
		n    int
		sync bool
	}{{0, 3901, false}, {5 << 20, 64 << 10, false}, {1 << 20, 4096, true}} {
		got := write(w.off, w.n, w.sync)
		want := e.stat(1, 9)
		if !got.HasAlloc || got.Alloc != want.Alloc || got.Alloc < uint64(w.n) {
			t.Fatalf("write of %d bytes at %d answered %+v; the chunk's stat says %+v", w.n, w.off, got, want)
		}
	}
}

func TestHolesTruncatePunchStat(t *testing.T) {
	e := newEnv(t, 1, nil)
	if st := e.stat(1, 9); st.Exists || st.Size != 0 || !st.HasAlloc || st.Alloc != 0 {
		t.Fatalf("absent chunk stat %+v", st)
	}
	if b := e.mustRead(1, 9, 0, 100); len(b) != 0 {
		t.Fatalf("absent chunk read %d bytes", len(b))
	}
	e.mustWrite(1, 9, 1<<20, []byte("tail"), false)
	if st := e.stat(1, 9); !st.Exists || st.Size != 1<<20+4 || !st.HasAlloc || st.Alloc < 4 || st.Alloc >= 1<<20 {
		t.Fatalf("stat %+v, want the space of the written tail only (the rest is a hole)", st)
	}
	b := e.mustRead(1, 9, 0, 2<<20)
	if len(b) != 1<<20+4 || !bytes.Equal(b[:1<<20], make([]byte, 1<<20)) || string(b[1<<20:]) != "tail" {
		t.Fatalf("hole read wrong: %d bytes", len(b))
	}
	// Truncate down into a block, then up: the cut bytes read as zeros.
	e.mustWrite(1, 9, 0, bytes.Repeat([]byte{0xaa}, 10000), false)
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 9}, Size: 5000}); err != nil {
		t.Fatal(err)
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 9}, Size: 9000}); err != nil {
		t.Fatal(err)
	}
	b = e.mustRead(1, 9, 0, 20000)
	if len(b) != 9000 || !bytes.Equal(b[:5000], bytes.Repeat([]byte{0xaa}, 5000)) || !bytes.Equal(b[5000:], make([]byte, 4000)) {
		t.Fatalf("truncate down/up: %d bytes", len(b))
	}
	// Punch an unaligned range.
	if err := e.call(rpc.SPunch, &rpc.PunchReq{Chunk: rpc.ChunkID{Target: 1, Ino: 9}, Off: 100, Len: 4500}); err != nil {
		t.Fatal(err)
	}
	b = e.mustRead(1, 9, 0, 5000)
	want := bytes.Repeat([]byte{0xaa}, 5000)
	clear(want[100:4600])
	if !bytes.Equal(b, want) {
		t.Fatalf("punch: first diff at %d", firstDiff(b, want))
	}
	// Truncate of an absent chunk to 0 is a no-op; to N creates it.
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 10}, Size: 0}); err != nil {
		t.Fatal(err)
	}
	if st := e.stat(1, 10); st.Exists {
		t.Fatal("truncate to 0 created a chunk")
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 10}, Size: 12345}); err != nil {
		t.Fatal(err)
	}
	if st := e.stat(1, 10); !st.Exists || st.Size != 12345 {
		t.Fatalf("truncate up of absent chunk: %+v", st)
	}
	// Remove, twice (absent is fine).
	for i := 0; i < 2; i++ {
		if err := e.call(rpc.SRemove, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 9}}); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.stat(1, 9); st.Exists {
		t.Fatal("removed chunk exists")
	}
	if _, err := os.Stat(dataPath(e.dirs[0], 9)); !os.IsNotExist(err) {
		t.Fatalf("data file still there: %v", err)
	}
}

// flipBit flips one bit of the file at off.
func flipBit(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// SSeek: SEEK_DATA and SEEK_HOLE on a chunk file, including an absent
// chunk (all hole), a punched range, offsets past the end and bad input.
func TestSeekDataHole(t *testing.T) {
	e := newEnv(t, 1, nil)
	seek := func(ino, off uint64, data bool) rpc.SeekResp {
		t.Helper()
		var r rpc.SeekResp
		if err := e.cl.Call(t.Context(), rpc.SSeek, &rpc.SeekReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Off: off, Data: data}, &r); err != nil {
			t.Fatalf("seek %d data=%v: %v", off, data, err)
		}
		return r
	}
	if r := seek(7, 0, true); r.Found {
		t.Fatalf("SEEK_DATA in an absent chunk = %+v, want none", r)
	}
	if r := seek(7, 123, false); !r.Found || r.Off != 123 {
		t.Fatalf("SEEK_HOLE in an absent chunk = %+v, want 123", r)
	}
	const K = 4096
	e.mustWrite(1, 7, 0, bytes.Repeat([]byte{1}, 8*K), false)    // [0, 8K)
	e.mustWrite(1, 7, 64*K, bytes.Repeat([]byte{2}, 8*K), false) // [64K, 72K)
	if err := e.call(rpc.SPunch, &rpc.PunchReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Off: 4 * K, Len: 4 * K}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off   uint64
		data  bool
		want  uint64
		found bool
	}{
		{0, true, 0, true}, {0, false, 4 * K, true}, {4 * K, true, 64 * K, true}, {5 * K, false, 5 * K, true},
		{10 * K, true, 64 * K, true}, {64 * K, false, 72 * K, true}, {70 * K, true, 70 * K, true},
		{72 * K, true, 0, false}, {72 * K, false, 72 * K, true}, {1 << 30, false, 1 << 30, true}, {1 << 30, true, 0, false},
	} {
		r := seek(7, c.off, c.data)
		if r.Found != c.found || (c.found && r.Off != c.want) {
			t.Errorf("seek(%d, data=%v) = %+v, want found=%v off %d", c.off, c.data, r, c.found, c.want)
		}
	}
	// A chunk ending inside a block: the rest of that block is data (as
	// in a local file), the hole starts at the block's end.
	e.mustWrite(1, 8, 0, bytes.Repeat([]byte{3}, 5000), false)
	for _, c := range []struct {
		off   uint64
		data  bool
		want  uint64
		found bool
	}{
		{0, false, 2 * K, true}, {6000, true, 6000, true}, {6000, false, 2 * K, true}, {2 * K, true, 0, false}, {2 * K, false, 2 * K, true},
	} {
		if r := seek(8, c.off, c.data); r.Found != c.found || (c.found && r.Off != c.want) {
			t.Errorf("chunk ending mid-block: seek(%d, data=%v) = %+v, want found=%v off %d", c.off, c.data, r, c.found, c.want)
		}
	}
	var r rpc.SeekResp
	if err := e.cl.Call(t.Context(), rpc.SSeek, &rpc.SeekReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Off: 1 << 62, Data: true}, &r); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("seek beyond the chunk limit: %v, want EINVAL", err)
	}
	if err := e.cl.Call(t.Context(), rpc.SSeek, &rpc.SeekReq{Chunk: rpc.ChunkID{Target: 99, Ino: 7}, Data: true}, &r); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("seek on an unknown target: %v, want ENOENT", err)
	}
}

func TestCorruptionGivesEIO(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	data := pattern(1, 64<<10)
	e.mustWrite(1, 0xbeef, 0, data, true)
	e.stop()
	flipBit(t, dataPath(e.dirs[0], 0xbeef), 10000)
	e.start()
	_, err := e.read(1, 0xbeef, 9000, 2000)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of corrupt block: want EIO, got %v", err)
	}
	if !strings.Contains(err.Error(), e.dirs[0]) || !strings.Contains(err.Error(), "beef") {
		t.Fatalf("error does not name target and chunk: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "checksum mismatch") || !strings.Contains(out, e.dirs[0]) ||
		!strings.Contains(out, "ino=beef") || !strings.Contains(out, "offset=8192") {
		t.Fatalf("log line does not name target, inode and offset:\n%s", out)
	}
	// Other blocks still read fine, also around the bad one.
	if b := e.mustRead(1, 0xbeef, 0, 8192); !bytes.Equal(b, data[:8192]) {
		t.Fatal("good region wrong")
	}
	if b := e.mustRead(1, 0xbeef, 12288, 64<<10); !bytes.Equal(b, data[12288:]) {
		t.Fatal("good region wrong")
	}
	// A write covering part of the bad block must not launder it.
	if err := e.write(1, 0xbeef, 8200, []byte("x"), false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("partial write over corrupt block: want EIO, got %v", err)
	}
	// A write replacing the whole block heals it.
	e.mustWrite(1, 0xbeef, 8192, data[8192:12288], false)
	if b := e.mustRead(1, 0xbeef, 0, 64<<10); !bytes.Equal(b, data) {
		t.Fatal("healed chunk wrong")
	}
}

func TestCrashConsistency(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	data := pattern(2, 32<<10)
	// Chunk 1: synced, then an unsynced write whose sums never reach the
	// disk: we write different bytes straight into the data file while
	// the dirty flag is set, then crash.
	e.mustWrite(1, 1, 0, data, true)
	e.mustWrite(1, 1, 4096, []byte("unsynced"), false)
	// Chunk 2: synced and clean; its data changes behind the server's back.
	e.mustWrite(1, 2, 0, data, true)
	e.crash()
	behind := []byte("written behind the server's back")
	for _, ino := range []uint64{1, 2} {
		f, err := os.OpenFile(dataPath(e.dirs[0], ino), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(behind, 20000); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	e.start()
	want := append([]byte(nil), data...)
	copy(want[4096:], "unsynced")
	copy(want[20000:], behind)
	got, err := e.read(1, 1, 0, 64<<10)
	if err != nil {
		t.Fatalf("dirty chunk after crash: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("dirty chunk after crash: first diff at %d", firstDiff(got, want))
	}
	if !strings.Contains(logs.String(), "recomputed chunk checksums") {
		t.Fatal("no recovery log line")
	}
	if _, err := e.read(1, 2, 16384, 8192); !errors.Is(err, syscall.EIO) {
		t.Fatalf("clean chunk changed behind the server: want EIO, got %v", err)
	}
	// After recovery the flag is clear on disk.
	if flags := chunkFlags(t, e.dirs[0], 1); flags&flagDirty != 0 {
		t.Fatalf("sidecar still dirty after recovery: %x", flags)
	}
	// A chunk whose sidecar vanished (crash right after creation) recovers too.
	e.mustWrite(1, 3, 0, data, false)
	e.crash()
	removeSums(t, e.dirs[0], 3)
	e.start()
	if got := e.mustRead(1, 3, 0, 64<<10); !bytes.Equal(got, data) {
		t.Fatal("chunk without sidecar wrong after recovery")
	}
}

func sidecarFlags(t *testing.T, path string) uint16 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, st, err := decodeSumHeader(b, 0)
	if st == headerMissing {
		t.Fatalf("sidecar %s has no header", path)
	}
	_ = err // the inode check fails for ino 0; flags are decoded before it
	return h.flags
}

func TestEvictedDirtyChunksStayConsistent(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, func(c *Config) { c.MaxOpenChunks = 4 })
	for ino := uint64(1); ino <= 40; ino++ {
		e.mustWrite(1, ino, ino*100, pattern(int(ino), 5000), false)
	}
	for ino := uint64(1); ino <= 40; ino++ {
		got := e.mustRead(1, ino, 0, 1<<20)
		if !bytes.Equal(got[ino*100:], pattern(int(ino), 5000)) {
			t.Fatalf("ino %d wrong", ino)
		}
	}
	if strings.Contains(logs.String(), "recomputed") {
		t.Fatal("eviction of dirty chunks caused a recomputation")
	}
	e.restart() // clean close syncs and clears every chunk, open or not
	for ino := uint64(1); ino <= 40; ino++ {
		if f := chunkFlags(t, e.dirs[0], ino); f&flagDirty != 0 {
			t.Fatalf("ino %d still dirty after clean close", ino)
		}
	}
	if strings.Contains(logs.String(), "recomputed") {
		t.Fatal("restart after clean close recomputed")
	}
}

func TestConcurrentDisjointWriters(t *testing.T) {
	e := newEnv(t, 1, nil)
	const writers, rounds, piece = 8, 64, 1000 // pieces of 1000 bytes share 4 KiB blocks
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				off := uint64(r*writers*piece + w*piece)
				if err := e.write(1, 77, off, pattern(r*writers+w, piece), r%16 == 0); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	// Readers run alongside: they must never see a checksum error.
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	for i := 0; i < 2; i++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.read(1, 77, 0, writers*rounds*piece); err != nil {
					errs <- fmt.Errorf("concurrent read: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := make([]byte, 0, writers*rounds*piece)
	for i := 0; i < writers*rounds; i++ {
		want = append(want, pattern(i, piece)...)
	}
	for pass := 0; pass < 2; pass++ {
		got := e.mustRead(1, 77, 0, uint32(len(want)+1))
		if !bytes.Equal(got, want) {
			t.Fatalf("pass %d: first diff at %d", pass, firstDiff(got, want))
		}
		e.restart()
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, 1, nil)
	err := e.write(7, 1, 0, []byte("x"), false)
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "target 7") {
		t.Fatalf("unknown target: %v", err)
	}
	if _, err := e.read(7, 1, 0, 1); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("unknown target read: %v", err)
	}
	if err := e.write(1, 1, 1<<50, []byte("x"), false); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("huge offset write: %v", err)
	}
	if err := e.write(1, 1, ^uint64(0)-1, []byte("xyz"), false); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("wrapping offset write: %v", err)
	}
	if _, err := e.read(1, 1, 1<<51, 10); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("huge offset read: %v", err)
	}
	if _, err := e.read(1, 1, 0, 1<<30); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("huge read length: %v", err)
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 1}, Size: 1 << 60}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("huge truncate: %v", err)
	}
	if err := e.call(rpc.SPunch, &rpc.PunchReq{Chunk: rpc.ChunkID{Target: 1, Ino: 1}, Off: 1, Len: ^uint64(0)}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("huge punch: %v", err)
	}
	if err := e.cl.Call(t.Context(), rpc.SWrite, rawMsg{0xff, 0xff, 0xff}, &rpc.Empty{}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("malformed write: %v", err)
	}
	// The server still serves.
	e.mustWrite(1, 1, 0, []byte("ok"), false)
}

type rawMsg []byte

func (r rawMsg) Encode(e *rpc.Enc) { e.B = append(e.B, r...) }
func (r rawMsg) Decode(d *rpc.Dec) {}

// A client's sync that arrives after the store was killed must make the
// unsynced writes of the dead process durable (the chunk is recovered,
// which syncs), not answer from a clean cache.
func TestSyncAfterCrashRecovers(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	e.mustWrite(1, 5, 0, pattern(3, 10000), false)
	e.crash()
	e.start()
	if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 5}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "recomputed chunk checksums") {
		t.Fatal("sync of a crashed dirty chunk did not recover it")
	}
	if f := chunkFlags(t, e.dirs[0], 5); f&flagDirty != 0 {
		t.Fatal("still dirty after sync")
	}
	if got := e.mustRead(1, 5, 0, 20000); !bytes.Equal(got, pattern(3, 10000)) {
		t.Fatal("data wrong")
	}
}

func FuzzSumHeader(f *testing.F) {
	h := sumHeader{version: sumFormat, flags: flagDirty, block: blockSize, ino: 7}.encode()
	f.Add(h[:])
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, st, err := decodeSumHeader(b, 7)
		if st == headerOK {
			if err != nil || got.version != sumFormat || got.block != blockSize || got.ino != 7 {
				t.Fatalf("accepted bad header %+v %v", got, err)
			}
			if again := got.encode(); !bytes.Equal(again[:], b[:sumHeaderBytes]) {
				t.Fatal("round trip differs")
			}
		}
	})
}

// A write that creates a chunk must succeed while readers keep finding the
// chunk absent: their failed opens may not be mistaken for the creator's.
func TestCreateWhileReadersFindChunkAbsent(t *testing.T) {
	e := newEnv(t, 1, nil)
	for ino := uint64(100); ino < 160; ino++ {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 100000; n++ {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := e.read(1, ino, 0, 4096); err != nil {
						errs <- fmt.Errorf("read of ino %d: %w", ino, err)
						return
					}
				}
			}()
		}
		err := e.write(1, ino, 0, pattern(int(ino), 3000), false)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("write creating ino %d beside readers: %v", ino, err)
		}
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := e.mustRead(1, ino, 0, 4096); !bytes.Equal(got, pattern(int(ino), 3000)) {
			t.Fatalf("ino %d: read back differs", ino)
		}
	}
}

// TestDirectReadIntoCallerBuffer: an in-process caller that owns its
// buffer (ReadResp.Direct) gets aligned reads placed straight into it and
// verified there; unaligned and short reads are still right; a flipped bit
// still gives EIO, never the bad bytes as an answer.
func TestDirectReadIntoCallerBuffer(t *testing.T) {
	captureLogs(t)
	e := newEnv(t, 1, nil)
	data := pattern(3, 1<<20+5000) // the last block is partial
	e.mustWrite(1, 0xd1, 0, data, true)
	read := func(off uint64, n uint32) ([]byte, []byte, error) {
		into := make([]byte, n)
		resp := rpc.ReadResp{Into: into, Direct: true}
		err := e.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0xd1}, Off: off, Len: n}, &resp)
		return resp.Data, into, err
	}
	for _, c := range []struct {
		off     uint64
		n       uint32
		aliases bool
	}{
		{0, 1 << 20, true},        // aligned: read in place
		{4096, 8192, true},        // aligned, inside
		{100, 8192, false},        // unaligned start: through the store's buffer
		{1 << 20, 8192, false},    // past the end's partial block: short answer
		{1<<20 + 4096, 904, true}, // the partial last block exactly
	} {
		got, into, err := read(c.off, c.n)
		if err != nil {
			t.Fatalf("read %d+%d: %v", c.off, c.n, err)
		}
		end := min(int(c.off)+int(c.n), len(data))
		if !bytes.Equal(got, data[c.off:end]) {
			t.Fatalf("read %d+%d: wrong bytes (%d of %d)", c.off, c.n, len(got), end-int(c.off))
		}
		if len(got) > 0 && &got[0] != &into[0] {
			t.Fatalf("read %d+%d: answer does not alias Into", c.off, c.n)
		}
	}
	e.stop()
	flipBit(t, dataPath(e.dirs[0], 0xd1), 5000)
	e.start()
	if _, _, err := read(0, 1<<20); !errors.Is(err, syscall.EIO) {
		t.Fatalf("direct read of a corrupt block: want EIO, got %v", err)
	}
}

// An in-process caller lends its request buffer to a write. If it gives up
// (its I/O timeout) while the write reads that buffer, it must not return —
// and so reuse the buffer for another request — until the write is done
// with it: otherwise another request's bytes could be summed and written
// into this file. Here the caller gives up while the write holds its range
// (after it began using the bytes): the call must stay out until the write
// ends, fail, and leave the file holding the caller's bytes, which a refill
// of the buffer afterwards cannot change.
func TestAbandonedLentWriteHoldsItsCaller(t *testing.T) {
	e := newEnv(t, 1, nil)
	old := pattern(5, 3*blockSize)
	e.mustWrite(1, 0xab, 0, old, true)

	entered, release := make(chan struct{}), make(chan struct{})
	hook := func() {
		select {
		case entered <- struct{}{}:
			<-release
		default: // other writes (none here) pass
		}
	}
	testHookWriteLocked.Store(&hook)
	defer testHookWriteLocked.Store(nil)

	lent := pattern(6, 2*blockSize)
	mine := append([]byte(nil), lent...)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		res <- e.cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0xab}, Off: blockSize / 2, Data: lent}, &rpc.Empty{})
	}()
	<-entered
	cancel()
	select {
	case err := <-res:
		close(release)
		t.Fatalf("the caller returned (%v) while the write still read its buffer", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-res; err == nil {
		t.Fatal("the abandoned call reported success")
	}
	for i := range lent { // the buffer now serves another request
		lent[i] = 'X'
	}
	want := append([]byte(nil), old...)
	copy(want[blockSize/2:], mine)
	got := e.mustRead(1, 0xab, 0, 3*blockSize)
	if bytes.Contains(got, []byte("XXXXXXXX")) {
		t.Fatal("another request's bytes are readable in the file after an abandoned lent write")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("after the abandoned write: %d bytes differ from the caller's bytes over the old data", diffCount(got, want))
	}
	// The file stays writable and checked.
	e.mustWrite(1, 0xab, 0, old, true)
	if got := e.mustRead(1, 0xab, 0, 3*blockSize); !bytes.Equal(got, old) {
		t.Fatal("rewrite after the abandoned write reads back wrong")
	}
}

func diffCount(a, b []byte) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}

func waitUntil(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// A lent write abandoned while it waits for its range lock writes nothing:
// a later write of the same range may have been served meanwhile.
func TestAbandonedWaitingWriteWritesNothing(t *testing.T) {
	e := newEnv(t, 1, nil)
	old := pattern(7, 2*blockSize)
	e.mustWrite(1, 0xac, 0, old, true)
	tg, err := e.s.target(1, 0xac)
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.s.cache.get(tg, 0xac, false)
	if err != nil {
		t.Fatal(err)
	}
	mask := stripeMask(0, 2*blockSize)
	c.lock(mask, true) // hold the range: the next write waits
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	lent := pattern(8, 2*blockSize)
	go func() {
		res <- e.cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0xac}, Data: lent}, &rpc.Empty{})
	}()
	time.Sleep(20 * time.Millisecond) // it is waiting for the lock
	cancel()
	if err := <-res; err == nil {
		t.Fatal("the abandoned call reported success")
	}
	for i := range lent {
		lent[i] = 'X'
	}
	c.unlock(mask, true)
	e.s.cache.release(c)
	time.Sleep(100 * time.Millisecond) // the abandoned write gets the range and gives up
	if got := e.mustRead(1, 0xac, 0, 2*blockSize); !bytes.Equal(got, old) {
		t.Fatalf("a write abandoned before it began changed the range (%d bytes differ)", diffCount(got, old))
	}
	newer := pattern(9, 2*blockSize)
	e.mustWrite(1, 0xac, 0, newer, true)
	if got := e.mustRead(1, 0xac, 0, 2*blockSize); !bytes.Equal(got, newer) {
		t.Fatal("the next write reads back wrong")
	}
}

// A chunk written as one sequential run has the write-out of every 4 MiB of
// the run started as it goes; random and interleaved writes start none, a
// single large write starts its own. What is written reads back either way.
func TestStreamingWritesStartWriteOut(t *testing.T) {
	e := newEnv(t, 1, nil)
	type span struct{ from, end int64 }
	var mu sync.Mutex
	var got []span
	hook := func(from, end int64) {
		mu.Lock()
		got = append(got, span{from, end})
		mu.Unlock()
	}
	testHookWriteOut.Store(&hook)
	defer testHookWriteOut.Store(nil)
	take := func() []span {
		mu.Lock()
		defer mu.Unlock()
		s := got
		got = nil
		return s
	}
	const mib = 1 << 20
	data := pattern(9, 10*mib)

	// Sequential 1 MiB writes, as a stripe of a streaming writer arrives.
	for k := 0; k < 10; k++ {
		e.mustWrite(1, 0x51, uint64(k*mib), data[k*mib:(k+1)*mib], false)
	}
	if s := take(); !slices.Equal(s, []span{{0, 4 * mib}, {4 * mib, 8 * mib}}) {
		t.Errorf("sequential run: write-outs %v, want [0,4M) and [4M,8M)", s)
	}
	// The same sizes at scattered offsets: no run reaches 4 MiB.
	for _, k := range []int{7, 2, 5, 0, 9, 3, 8, 1, 6, 4} {
		e.mustWrite(1, 0x52, uint64(k*mib), data[k*mib:(k+1)*mib], false)
	}
	if s := take(); len(s) != 0 {
		t.Errorf("scattered writes: write-outs %v, want none", s)
	}
	// A run broken by a write elsewhere starts over.
	e.mustWrite(1, 0x53, 0, data[:3*mib], false)
	e.mustWrite(1, 0x53, 8*mib, data[8*mib:9*mib], false)
	e.mustWrite(1, 0x53, 3*mib, data[3*mib:6*mib], false)
	if s := take(); len(s) != 0 {
		t.Errorf("broken run: write-outs %v, want none", s)
	}
	// One large write is a run of its own.
	e.mustWrite(1, 0x54, 3*mib, data[:6*mib], true)
	if s := take(); !slices.Equal(s, []span{{3 * mib, 9 * mib}}) {
		t.Errorf("one 6 MiB write: write-outs %v, want [3M,9M)", s)
	}
	for _, c := range []struct {
		ino  uint64
		off  uint64
		want []byte
	}{{0x51, 0, data}, {0x52, 0, data}, {0x54, 3 * mib, data[:6*mib]}} {
		if b := e.mustRead(1, c.ino, c.off, uint32(len(c.want))); !bytes.Equal(b, c.want) {
			t.Errorf("chunk %x reads back %d bytes differing", c.ino, diffCount(b, c.want))
		}
	}
}

// Creating chunks syncs nothing (the async policy promises no server sync
// per file); a sync of a chunk on its own makes every entry that leads to
// it durable:
// its directory, the fan-out directory above and chunks/ — also when
// another chunk's create made the directories, and when the chunk was
// evicted from the cache before its sync.
func TestChunkCreateSyncsNoDirectoryUntilSync(t *testing.T) {
	var mu sync.Mutex
	var synced []string
	hook := func(dir string) {
		if !strings.Contains(dir, chunksDir) {
			return // the identity file's (inode ceiling): once per step of inodes
		}
		mu.Lock()
		synced = append(synced, dir)
		mu.Unlock()
	}
	testHookSyncDir.Store(&hook)
	t.Cleanup(func() { testHookSyncDir.Store(nil) })
	noGroupSync(t) // each chunk syncs its own files and directories
	taken := func() []string {
		mu.Lock()
		defer mu.Unlock()
		s := synced
		synced = nil
		return s
	}
	e := newEnv(t, 1, func(c *Config) { c.MaxOpenChunks = 1 })
	taken()
	// ino 0x105 makes chunks/00/01; ino 0x1ff lands in the same one and
	// is evicted (one open chunk) when 0x10206 is created.
	for _, ino := range []uint64{0x105, 0x1ff, 0x10206} {
		e.mustWrite(1, ino, 0, pattern(int(ino), 3901), false)
	}
	if got := taken(); len(got) != 0 {
		t.Fatalf("creating chunks synced directories %q; want none before a sync", got)
	}
	chunks := filepath.Join(e.dirs[0], chunksDir)
	if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0x1ff}}); err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(chunks, "00", "01"), filepath.Join(chunks, "00"), chunks}
	if got := taken(); !slices.Equal(got, want) {
		t.Fatalf("sync of a chunk in directories another create made synced %q, want %q", got, want)
	}
	if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0x105}}); err != nil {
		t.Fatal(err)
	}
	if got := taken(); len(got) != 0 {
		t.Fatalf("second sync in synced directories synced %q again", got)
	}
	if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0x10206}}); err != nil {
		t.Fatal(err)
	}
	want = []string{filepath.Join(chunks, "01", "02"), filepath.Join(chunks, "01")}
	if got := taken(); !slices.Equal(got, want) {
		t.Fatalf("sync of a chunk in new directories synced %q, want %q", got, want)
	}
}

// noGroupSync makes every chunk sync its own files (as with much dirty
// memory) until the test ends.
func noGroupSync(t *testing.T) {
	old := groupSyncDirtyBound.Swap(0)
	t.Cleanup(func() { groupSyncDirtyBound.Store(old) })
}

// Syncs of many chunks on a target while a round runs share the next
// round: one syncfs for them all, and none of them is answered before
// that round (which began after they asked) has ended. The chunks are
// clean afterwards and the directories they made need no fsync of their
// own. The same holds for writes with Sync (a client's close under `sync`
// sends its last bytes so): the sync after the write joins the round, it
// does not fdatasync the chunk on its own.
func TestConcurrentSyncsShareOneRound(t *testing.T) {
	t.Run("SSync", func(t *testing.T) { testSyncsShareOneRound(t, false) })
	t.Run("SWrite with Sync", func(t *testing.T) { testSyncsShareOneRound(t, true) })
}

func testSyncsShareOneRound(t *testing.T, viaWrite bool) {
	if !syncfsReportsErrors {
		t.Skip("syncfs reports no errors on this kernel: no rounds")
	}
	old := groupSyncDirtyBound.Swap(1 << 62) // the machine's dirty memory is not this test's
	t.Cleanup(func() { groupSyncDirtyBound.Store(old) })
	var mu sync.Mutex
	var events []string
	rounds := 0
	release := make(chan struct{})
	hook := func() {
		mu.Lock()
		rounds++
		n := rounds
		events = append(events, fmt.Sprintf("round %d", n))
		mu.Unlock()
		if n == 1 {
			<-release
		}
	}
	testHookSyncfs.Store(&hook)
	t.Cleanup(func() { testHookSyncfs.Store(nil) })
	var dirSyncs atomic.Int32
	dirHook := func(string) { dirSyncs.Add(1) }
	testHookSyncDir.Store(&dirHook)
	t.Cleanup(func() { testHookSyncDir.Store(nil) })

	e := newEnv(t, 1, nil)
	const n = 9
	for i := uint64(1); i <= n; i++ {
		e.mustWrite(1, i, 0, pattern(int(i), 3901), false)
	}
	dirSyncs.Store(0)
	sync1 := func(ino uint64) error {
		if viaWrite {
			return e.write(1, ino, 3901, pattern(int(ino)+100, 3901), true)
		}
		return e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}})
	}
	first := make(chan error, 1)
	go func() { first <- sync1(1) }()
	waitFor(t, "the first round to start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rounds == 1
	})
	errs := make(chan error, n-1)
	for i := uint64(2); i <= n; i++ {
		go func() {
			err := sync1(i)
			mu.Lock()
			events = append(events, fmt.Sprintf("answered %d", i))
			mu.Unlock()
			errs <- err
		}()
	}
	tg := e.s.targets[0]
	waitFor(t, "the later syncs to join the next round", func() bool {
		return tg.gs.rounds.Waiting() == n-1
	})
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if rounds != 2 {
		t.Fatalf("%d syncs made %d rounds, want 2 (one running, one shared by the rest): %q", n, rounds, events)
	}
	if events[1] != "round 2" {
		t.Fatalf("a sync was answered before the round that covers it began: %q", events)
	}
	if d := dirSyncs.Load(); d != 0 {
		t.Fatalf("%d directory fsyncs besides the rounds", d)
	}
	for i := uint64(1); i <= n; i++ {
		if f := chunkFlags(t, e.dirs[0], i); f&flagDirty != 0 {
			t.Fatalf("chunk %d still dirty after its sync", i)
		}
		if viaWrite {
			want := append(pattern(int(i), 3901), pattern(int(i)+100, 3901)...)
			if got := e.mustRead(1, i, 0, 2*3901); !bytes.Equal(got, want) {
				t.Fatalf("chunk %d reads back %d bytes unlike the two writes", i, len(got))
			}
		}
	}
	tg.unsyncedDirs.Lock()
	defer tg.unsyncedDirs.Unlock()
	if len(tg.unsyncedDirs.m) != 0 {
		t.Fatalf("directories still recorded unsynced after the rounds: %v", tg.unsyncedDirs.m)
	}
}

// The targets of two servers of one process on one file system share its
// sync rounds (a syncfs covers both); a server stopped and opened again on
// its targets finds them unlocked although the other keeps the group.
func TestTargetsOfOneFileSystemShareRounds(t *testing.T) {
	e1, e2 := newEnv(t, 2, nil), newEnv(t, 1, nil)
	g := e1.s.targets[0].gs
	if e1.s.targets[0].fsid.Load() == 0 {
		t.Skip("the file system has no id")
	}
	if e1.s.targets[1].gs != g || e2.s.targets[0].gs != g {
		t.Fatal("targets on one file system got different sync-round groups")
	}
	e1.restart()
	if e1.s.targets[0].gs != e2.s.targets[0].gs {
		t.Fatal("a reopened target did not rejoin its file system's group")
	}
	e1.mustWrite(1, 3, 0, pattern(3, 3901), false)
	if err := e1.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 3}}); err != nil {
		t.Fatal(err)
	}
}
