package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// leafDirs lists the fan-out leaf directories under target directory dir
// (chunks/XX/YY, relative to chunks/) that hold at least one file.
func leafDirs(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	chunks := filepath.Join(dir, chunksDir)
	err := filepath.WalkDir(chunks, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(chunks, filepath.Dir(p))
			if !slices.Contains(out, rel) {
				out = append(out, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// listAll lists target tgt's chunks through SListChunks, in pages of at
// least perPage chunks, as fsck does; it returns them and the page count.
func listAll(t *testing.T, e *env, tgt, perPage uint32) (map[uint64]uint64, int) {
	t.Helper()
	got := map[uint64]uint64{}
	for from, pages := uint32(0), 1; ; pages++ {
		var r rpc.ListChunksResp
		if err := e.cl.Call(context.Background(), rpc.SListChunks, &rpc.ListChunksReq{Target: tgt, From: from, Max: perPage}, &r); err != nil {
			t.Fatal(err)
		}
		for i, ino := range r.Inos {
			if _, dup := got[ino]; dup {
				t.Fatalf("chunk %x listed twice", ino)
			}
			got[ino] = r.Bytes[i]
		}
		if r.Done {
			return got, pages
		}
		if r.Next <= from {
			t.Fatalf("listing from %d does not advance (next %d)", from, r.Next)
		}
		from = r.Next
	}
}

func readIdentityFile(t *testing.T, dir string) identity {
	t.Helper()
	var id identity
	if err := json.Unmarshal([]byte(readFileString(t, filepath.Join(dir, identityName))), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestChunkLayoutRuns: a new target records chunk layout 2 and keeps a run
// of 256 consecutive inodes in one leaf directory, chunks/<byte 2>/<byte 1>;
// inodes 2^24 apart share a leaf and are both listed.
func TestChunkLayoutRuns(t *testing.T) {
	e := newEnv(t, 1, nil)
	if id := readIdentityFile(t, e.dirs[0]); id.Format != 4 || id.ChunkLayout != 2 || id.ChunkSums != sumsInline {
		t.Fatalf("new target has format version %d, chunk layout %d, chunk sums %d; want 4, 2 and 2", id.Format, id.ChunkLayout, id.ChunkSums)
	}
	want := map[uint64]uint64{}
	for ino := uint64(0x3400); ino <= 0x34ff; ino++ {
		want[ino] = 10
	}
	want[0x3500] = 11
	want[0x453412] = 12
	want[0x1003401] = 13 // 2^24 above 0x3401
	for ino, n := range want {
		e.mustWrite(1, ino, 0, pattern(int(ino), int(n)), false)
	}
	if got, wantDirs := leafDirs(t, e.dirs[0]), []string{"00/34", "00/35", "45/34"}; !slices.Equal(got, wantDirs) {
		t.Fatalf("chunk files in directories %q, want %q", got, wantDirs)
	}
	for _, c := range []struct {
		ino uint64
		rel string
	}{{0x3400, "00/34/0000000000003400"}, {0x34ff, "00/34/00000000000034ff"}, {0x3500, "00/35/0000000000003500"},
		{0x453412, "45/34/0000000000453412"}, {0x1003401, "00/34/0000000001003401"}} {
		if _, err := os.Stat(filepath.Join(e.dirs[0], chunksDir, c.rel+".data")); err != nil {
			t.Errorf("chunk %x: %v", c.ino, err)
		}
	}
	if got, _ := listAll(t, e, 1, 1); !maps.Equal(got, want) {
		t.Fatalf("listed %d chunks, want %d: %v", len(got), len(want), got)
	}
	if err := e.call(rpc.SRemove, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0x3401}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.dirs[0], chunksDir, "00/34/0000000000003401.data")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removed chunk's data file: %v", err)
	}
	if b := e.mustRead(1, 0x1003401, 0, 13); string(b) != string(pattern(0x1003401, 13)) {
		t.Fatalf("chunk 1003401 after removing its neighbour 3401 reads %q", b)
	}
}

// TestChunkLayoutDirOf: under layout 2 every run of 256 consecutive inodes
// shares a directory and 65,536 consecutive inodes fill every directory
// once; layout 1 keeps its old mapping.
func TestChunkLayoutDirOf(t *testing.T) {
	seen := map[uint32]int{}
	base := uint64(7) << 32
	for ino := base; ino < base+fanOutDirs*256; ino++ {
		d := layoutRuns.dirOf(ino)
		if d >= fanOutDirs {
			t.Fatalf("ino %x: directory %d out of range", ino, d)
		}
		if ino%256 != 0 && d != layoutRuns.dirOf(ino-1) {
			t.Fatalf("inodes %x and %x in different directories", ino-1, ino)
		}
		seen[d]++
	}
	if len(seen) != fanOutDirs {
		t.Fatalf("2^24 consecutive inodes use %d directories, want %d", len(seen), fanOutDirs)
	}
	for d, n := range seen {
		if n != 256 {
			t.Fatalf("directory %d holds %d of them, want 256", d, n)
		}
	}
	if got := layoutLowBytes.dirOf(0xabcd1234); got != 0x3412 {
		t.Fatalf("layout 1 puts ino abcd1234 in directory %x, want 3412 (chunks/34/12)", got)
	}
	if got := layoutRuns.dirOf(0xabcd1234); got != 0xcd12 {
		t.Fatalf("layout 2 puts ino abcd1234 in directory %x, want cd12 (chunks/cd/12)", got)
	}
}

// copyTree copies the directory tree src to dst (which must not exist).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// TestChunkLayoutOldTargets: a target made by a build before layout 2
// (testdata/target-v1: three synced chunks 0x1234, 0x1235, 0x10034 of
// pattern(ino, 5000+ino&0xff) bytes, written by the format 1 code; and the
// same as format 2 made it, with no log yet) keeps its layout when opened
// and upgraded: its chunks read back, new chunks go to the old paths,
// removes find them, the listing and the inode ceiling scan walk them, and
// a restart serves it the same way.
func TestChunkLayoutOldTargets(t *testing.T) {
	for _, format := range []int{1, 2} {
		t.Run(fmt.Sprintf("format=%d", format), func(t *testing.T) { testOldTarget(t, format) })
	}
}

func testOldTarget(t *testing.T, format int) {
	dir := filepath.Join(t.TempDir(), "target")
	copyTree(t, filepath.Join("testdata", "target-v1"), dir)
	// As written by a release before ceilings were recorded: the open
	// scans the old tree for them.
	id := readIdentityFile(t, dir)
	id.InoCeiling = 0
	id.Format = format
	if err := writeIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, 0, func(c *Config) { c.Targets = []string{dir} })
	if got := readIdentityFile(t, dir); got.Format != 4 || got.ChunkLayout != 1 || got.ChunkSums != sumsInline || got.UUID != id.UUID || got.InoCeiling != 2*rpc.InoCeilingStep {
		t.Fatalf("old target's identity after open: %+v, want format 4, chunk layout 1, chunk sums 2, uuid %s, ceiling %d", got, id.UUID, 2*rpc.InoCeilingStep)
	}
	size := func(ino uint64) int { return 5000 + int(ino&0xff) }
	for _, ino := range []uint64{0x1234, 0x1235, 0x10034} {
		if b := e.mustRead(1, ino, 0, uint32(size(ino))); string(b) != string(pattern(int(ino), size(ino))) {
			t.Fatalf("old chunk %x reads %d bytes that differ from what was written", ino, len(b))
		}
	}
	e.mustWrite(1, 0x1236, 0, pattern(0x1236, 100), false)
	e.mustWrite(1, 0x1234, 4000, []byte("overwritten"), false)
	if err := e.call(rpc.SRemove, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 0x1235}}); err != nil {
		t.Fatal(err)
	}
	if got, want := leafDirs(t, dir), []string{"34/00", "34/12", "36/12"}; !slices.Equal(got, want) {
		t.Fatalf("old target's chunk files in %q, want %q (layout 1 paths)", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, chunksDir, "36/12/0000000000001236.data")); err != nil {
		t.Fatalf("new chunk on an old target: %v", err)
	}
	// The upgraded target's new small chunk keeps its sums inline; its
	// old chunks keep their sidecars, also when written.
	if _, _, found := inlineOf(t, dir, 0x1236); !found {
		t.Fatal("new chunk on an upgraded target has no inline sums")
	}
	if _, err := os.Stat(filepath.Join(dir, chunksDir, "36/12/0000000000001236.sum")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("new small chunk on an upgraded target has a sidecar: %v", err)
	}
	if _, _, found := inlineOf(t, dir, 0x1234); found {
		t.Fatal("old chunk got inline sums")
	}
	want := map[uint64]uint64{0x1234: 5052, 0x1236: 100, 0x10034: 5052}
	if got, _ := listAll(t, e, 1, 1); !maps.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	// fsck's removal of orphans, the reaper's batches.
	if err := e.call(rpc.SRemoveMany, &rpc.ChunksReq{Chunks: []rpc.ChunkID{{Target: 1, Ino: 0x10034}}}); err != nil {
		t.Fatal(err)
	}
	delete(want, 0x10034)
	if got, _ := listAll(t, e, 1, 1); !maps.Equal(got, want) {
		t.Fatalf("after removing 10034 listed %v, want %v", got, want)
	}

	e.restart()
	if got := readIdentityFile(t, dir); got.Format != 4 || got.ChunkLayout != 1 {
		t.Fatalf("old target's identity after a restart: %+v", got)
	}
	wantData := pattern(0x1234, size(0x1234))
	copy(wantData[4000:], "overwritten")
	if b := e.mustRead(1, 0x1234, 0, uint32(len(wantData))); string(b) != string(wantData) {
		t.Fatal("old chunk 1234 after overwrite and restart differs")
	}
	if b := e.mustRead(1, 0x1236, 0, 100); string(b) != string(pattern(0x1236, 100)) {
		t.Fatal("new chunk 1236 on the old target differs after a restart")
	}
	if got, _ := listAll(t, e, 1, 1); !maps.Equal(got, want) {
		t.Fatalf("after a restart listed %v, want %v", got, want)
	}
}

// TestChunkLayoutUnknownRefused: a target of a chunk layout or format
// version this build does not know is refused with a message naming it,
// and left untouched.
func TestChunkLayoutUnknownRefused(t *testing.T) {
	for _, c := range []struct{ ident, want string }{
		{`{"format": 3, "chunk_layout": 3, "uuid": "6c3e0f5a-0000-4000-8000-000000000000"}`, "chunk layout 3, this build knows only layouts 1 and 2"},
		{`{"format": 3, "uuid": "6c3e0f5a-0000-4000-8000-000000000000"}`, "format version 3 names no chunk layout"},
		{`{"format": 4, "chunk_layout": 2, "uuid": "6c3e0f5a-0000-4000-8000-000000000000"}`, "format version 4 names no chunk sums form"},
		{`{"format": 4, "chunk_layout": 2, "chunk_sums": 3, "uuid": "6c3e0f5a-0000-4000-8000-000000000000"}`, "chunk sums form 3, this build knows only forms 1 and 2"},
		{`{"format": 5, "chunk_layout": 2, "chunk_sums": 2, "uuid": "6c3e0f5a-0000-4000-8000-000000000000"}`, "format version 5, this build serves only versions 1 to 4"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, identityName), []byte(c.ident), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Targets = []string{dir}
		cfg.ClusterKey = testKey
		s, err := Open(cfg)
		if err == nil {
			s.Close()
			t.Fatalf("%s: target opened", c.ident)
		}
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", c.ident, err, c.want)
		}
		if got := readFileString(t, filepath.Join(dir, identityName)); got != c.ident {
			t.Fatalf("%s: identity file changed to %s", c.ident, got)
		}
		if _, err := os.Stat(filepath.Join(dir, chunksDir)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: refused target got a chunk tree: %v", c.ident, err)
		}
	}
}
