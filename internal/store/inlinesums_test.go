package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rpc"
)

// hasSidecar reports whether ino's chunk in dir has a .sum file.
func hasSidecar(t *testing.T, dir string, ino uint64) bool {
	t.Helper()
	_, err := os.Stat(sumPath(dir, ino))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// A small chunk is its data file alone, its sums and dirty flag in the
// file's attribute; it reads back, syncs clean, lists and removes like any
// chunk. One that grows past the inline limit (by a write or a truncate)
// moves its sums to a sidecar and keeps reading right; a larger new chunk
// gets a sidecar at once.
func TestSmallChunkIsOneFile(t *testing.T) {
	e := newEnv(t, 1, nil)
	dir := e.dirs[0]
	small := pattern(1, 3901)
	e.mustWrite(1, 1, 0, small, false)
	if hasSidecar(t, dir, 1) {
		t.Fatal("small chunk has a sidecar")
	}
	flags, sums, found := inlineOf(t, dir, 1)
	if !found || flags&flagDirty == 0 || len(sums) != 4 || getU32(sums) != storedSum(small) {
		t.Fatalf("inline sums after a write: found %v, flags %x, sums %x; want dirty and the block's sum %08x", found, flags, sums, storedSum(small))
	}
	if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 1}}); err != nil {
		t.Fatal(err)
	}
	if f := chunkFlags(t, dir, 1); f&flagDirty != 0 {
		t.Fatalf("small chunk dirty after a sync: %x", f)
	}
	if got := e.mustRead(1, 1, 0, 8192); !bytes.Equal(got, small) {
		t.Fatal("small chunk reads back wrong")
	}

	// Growth by a write: 40 KiB fits, 60 KiB does not.
	mid := pattern(2, 40<<10)
	e.mustWrite(1, 2, 0, mid, false)
	if hasSidecar(t, dir, 2) {
		t.Fatal("40 KiB chunk has a sidecar")
	}
	more := pattern(3, 20<<10)
	e.mustWrite(1, 2, 40<<10, more, false)
	if !hasSidecar(t, dir, 2) {
		t.Fatal("chunk grown to 60 KiB has no sidecar")
	}
	if _, _, found := inlineOf(t, dir, 2); found {
		t.Fatal("chunk moved to a sidecar keeps its inline sums")
	}
	want2 := append(append([]byte(nil), mid...), more...)
	if got := e.mustRead(1, 2, 0, 1<<20); !bytes.Equal(got, want2) {
		t.Fatalf("chunk moved to a sidecar reads wrong: first diff at %d", firstDiff(got, want2))
	}
	// Growth by a truncate, and a punch and a shrink while inline.
	e.mustWrite(1, 3, 0, mid, false)
	if err := e.call(rpc.SPunch, &rpc.PunchReq{Chunk: rpc.ChunkID{Target: 1, Ino: 3}, Off: 1000, Len: 12000}); err != nil {
		t.Fatal(err)
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 3}, Size: 30000}); err != nil {
		t.Fatal(err)
	}
	want3 := append([]byte(nil), mid[:30000]...)
	clear(want3[1000:13000])
	if hasSidecar(t, dir, 3) {
		t.Fatal("punched and shrunk small chunk has a sidecar")
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 3}, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if !hasSidecar(t, dir, 3) {
		t.Fatal("chunk truncated up to 1 MiB has no sidecar")
	}
	want3 = append(want3, make([]byte, 1<<20-30000)...)
	if got := e.mustRead(1, 3, 0, 2<<20); !bytes.Equal(got, want3) {
		t.Fatalf("chunk truncated up reads wrong: first diff at %d", firstDiff(got, want3))
	}
	// A large first write: a sidecar at once, no attribute ever.
	e.mustWrite(1, 4, 0, pattern(4, 1<<20), false)
	if _, _, found := inlineOf(t, dir, 4); found || !hasSidecar(t, dir, 4) {
		t.Fatalf("1 MiB chunk: inline %v, sidecar %v", found, hasSidecar(t, dir, 4))
	}

	want := map[uint64]uint64{1: 3901, 2: 60 << 10, 3: 1 << 20, 4: 1 << 20}
	if got, _ := listAll(t, e, 1, 100); !maps.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	e.restart()
	for ino, w := range map[uint64][]byte{1: small, 2: want2, 3: want3} {
		if got := e.mustRead(1, ino, 0, 2<<20); !bytes.Equal(got, w) {
			t.Fatalf("chunk %d after a restart: first diff at %d", ino, firstDiff(got, w))
		}
		if f := chunkFlags(t, dir, ino); f&flagDirty != 0 {
			t.Fatalf("chunk %d dirty after a clean stop", ino)
		}
	}
	if err := e.call(rpc.SRemove, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dataPath(dir, 1)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removed small chunk: %v", err)
	}
	delete(want, 1)
	if got, _ := listAll(t, e, 1, 100); !maps.Equal(got, want) {
		t.Fatalf("after a remove listed %v, want %v", got, want)
	}
}

// kill -9 between a small chunk's data write and its sums update: the
// data on disk is new, the attribute still holds the old sums and says
// clean (its dirty flag was never synced), and the intent log names the
// chunk. The chunk is recomputed, never reported as rot. A clean small
// chunk whose data changed behind the server, and one whose attribute is
// damaged, answer EIO.
func TestSmallChunkCrashBetweenDataAndSums(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	dir := e.dirs[0]
	old := pattern(1, 3901)
	e.mustWrite(1, 1, 0, old, true)
	e.mustWrite(1, 2, 0, old, true)
	e.mustWrite(1, 3, 0, old, true)
	_, oldSums, _ := inlineOf(t, dir, 1)
	e.mustWrite(1, 1, 0, pattern(2, 3901), false) // first mutation: recorded in the log
	e.crash()
	newer := pattern(3, 3901) // what reached the disk of a later write
	writeBehind(t, dir, 1, 0, newer)
	setInline(t, dir, 1, 0, oldSums) // the sums' update and the dirty flag lost
	writeBehind(t, dir, 2, 100, []byte("rot"))
	if err := unix.Setxattr(dataPath(dir, 3), inlineXattr, []byte("not sums"), 0); err != nil {
		t.Fatal(err)
	}
	e.start()
	if got, err := e.read(1, 1, 0, 8192); err != nil || !bytes.Equal(got, newer) {
		t.Fatalf("small chunk named in the intent log after a crash: %v (data equal: %v)", err, bytes.Equal(got, newer))
	}
	if out := logs.String(); !strings.Contains(out, "recomputed chunk checksums") || !strings.Contains(out, "intent log names chunks") {
		t.Fatalf("no recovery log lines:\n%s", out)
	}
	if f := chunkFlags(t, dir, 1); f&flagDirty != 0 {
		t.Fatalf("recovered small chunk still dirty: %x", f)
	}
	if _, err := e.read(1, 2, 0, 8192); !errors.Is(err, syscall.EIO) {
		t.Fatalf("clean small chunk changed behind the server: want EIO, got %v", err)
	}
	if _, err := e.read(1, 3, 0, 8192); !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "inline sums damaged") {
		t.Fatalf("small chunk with damaged inline sums: want EIO naming them, got %v", err)
	}
	// A small chunk's data file with no attribute at all (a crash right
	// after its creation) is recomputed too.
	e.mustWrite(1, 4, 0, old, false)
	e.crash()
	removeSums(t, dir, 4)
	e.start()
	if got := e.mustRead(1, 4, 0, 8192); !bytes.Equal(got, old) {
		t.Fatal("small chunk without sums wrong after recovery")
	}
}

// kill -9 while a small chunk's sums move to a sidecar (a write past the
// inline limit): whichever of the two copies the crash left, the chunk is
// recomputed into one form and reads what was written.
func TestSmallChunkCrashWhileMovingToSidecar(t *testing.T) {
	e := newEnv(t, 1, nil)
	dir := e.dirs[0]
	small := pattern(1, 3901)
	big := pattern(2, 100<<10)
	for _, ino := range []uint64{1, 2} {
		e.mustWrite(1, ino, 0, small, true)
	}
	_, smallSums, _ := inlineOf(t, dir, 1)
	for _, ino := range []uint64{1, 2} {
		e.mustWrite(1, ino, 0, big, false) // moves the sums to a sidecar
	}
	e.crash()
	// Chunk 1: the attribute's removal lost, the sidecar there.
	setInline(t, dir, 1, 0, smallSums)
	// Chunk 2: the sidecar lost, the old attribute there (clean).
	if err := os.Remove(sumPath(dir, 2)); err != nil {
		t.Fatal(err)
	}
	setInline(t, dir, 2, 0, smallSums)
	e.start()
	for _, ino := range []uint64{1, 2} {
		got, err := e.read(1, ino, 0, 1<<20)
		if err != nil || !bytes.Equal(got, big) {
			t.Fatalf("chunk %d after a crash while moving its sums: %v (first diff at %d)", ino, err, firstDiff(got, big))
		}
		if _, _, found := inlineOf(t, dir, ino); found || !hasSidecar(t, dir, ino) {
			t.Fatalf("chunk %d after recovery: inline sums %v, sidecar %v; want the sidecar alone", ino, found, hasSidecar(t, dir, ino))
		}
	}
	e.restart()
	for _, ino := range []uint64{1, 2} {
		if got := e.mustRead(1, ino, 0, 1<<20); !bytes.Equal(got, big) {
			t.Fatalf("chunk %d after a restart differs", ino)
		}
	}
}

// A target made with the inline form off (chunk_sums 1: every chunk has
// a sidecar, as formats 1 to 3) keeps it across restarts.
func TestSidecarTargetsKeepSidecars(t *testing.T) {
	sidecarless(t)
	e := newEnv(t, 1, nil)
	if id := readIdentityFile(t, e.dirs[0]); id.Format != targetFormat || id.ChunkSums != sumsSidecar {
		t.Fatalf("identity %+v, want format %d, chunk sums %d", id, targetFormat, sumsSidecar)
	}
	inlineSumsForNewTargets.Store(true)
	e.restart()
	e.mustWrite(1, 1, 0, pattern(1, 3901), false)
	if _, _, found := inlineOf(t, e.dirs[0], 1); found || !hasSidecar(t, e.dirs[0], 1) {
		t.Fatal("small chunk on a sidecar target has no sidecar, or inline sums")
	}
}

func TestDecodeInline(t *testing.T) {
	sums := make([]byte, 4*inlineMaxBlocks)
	for i := range sums {
		sums[i] = byte(i)
	}
	for _, n := range []int{0, 1, inlineMaxBlocks} {
		f, s, err := decodeInline(encodeInline(flagDirty, sums[:4*n]))
		if err != nil || f != flagDirty || !bytes.Equal(s, sums[:4*n]) {
			t.Fatalf("%d sums: %x %x %v", n, f, s, err)
		}
	}
	good := encodeInline(0, sums[:8])
	for name, b := range map[string][]byte{
		"short":    good[:6],
		"odd":      append(good[:len(good):len(good)], 0),
		"too long": encodeInline(0, append(sums, 0, 0, 0, 0)),
		"crc":      append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^1),
		"version":  fixCRC(append([]byte{2}, good[1:]...)),
		"flags":    fixCRC(append([]byte{1, 0x80}, good[2:]...)),
	} {
		if _, _, err := decodeInline(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// fixCRC rewrites the trailing CRC32C of an inline value.
func fixCRC(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func FuzzInlineSums(f *testing.F) {
	f.Add(encodeInline(flagDirty, []byte{1, 2, 3, 4}))
	f.Add(encodeInline(0, nil))
	f.Add(encodeInline(0, make([]byte, 4*inlineMaxBlocks)))
	f.Fuzz(func(t *testing.T, b []byte) {
		flags, sums, err := decodeInline(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeInline(flags, sums), b) {
			t.Fatalf("decode(%x) = %x %x, which encodes differently", b, flags, sums)
		}
	})
}

// Writers of disjoint pieces of one inline chunk (pieces share blocks),
// readers and syncs at once: no reader ever sees a checksum error, and the
// chunk ends inline with every piece.
func TestSmallChunkConcurrentWritersReadersSyncs(t *testing.T) {
	e := newEnv(t, 1, nil)
	const writers, rounds, piece = 4, 40, 1000 // 40 KiB in all: inline
	want := make([]byte, writers*10*piece)
	errs := make(chan error, writers+3)
	done := make(chan struct{})
	var wg, bg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				off := (w*10 + r%10) * piece
				if err := e.write(1, 9, uint64(off), pattern(r*writers+w, piece), false); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	for w := 0; w < writers; w++ {
		for r := rounds - 10; r < rounds; r++ {
			copy(want[(w*10+r%10)*piece:], pattern(r*writers+w, piece))
		}
	}
	// loop runs f until done is closed or f fails.
	loop := func(f func() error) {
		defer bg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := f(); err != nil {
				errs <- err
				return
			}
		}
	}
	bg.Add(3)
	for i := 0; i < 2; i++ {
		go loop(func() error {
			if _, err := e.read(1, 9, 0, 64<<10); err != nil && !errors.Is(err, syscall.ENOENT) {
				return err
			}
			return nil
		})
	}
	go loop(func() error { return e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 9}}) })
	wg.Wait()
	close(done)
	bg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := e.mustRead(1, 9, 0, 64<<10); !bytes.Equal(got, want) {
		t.Fatalf("first diff at %d", firstDiff(got, want))
	}
	if hasSidecar(t, e.dirs[0], 9) {
		t.Fatal("40 KiB chunk has a sidecar")
	}
}
