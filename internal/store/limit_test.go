package store

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// A chunk grows to layout.MaxChunkBytes and no further: a write or
// truncate past it is refused with EFBIG before anything is written (it
// used to reach the file system, which cut the data file back after its
// EFBIG, and the client had acknowledged the write long before).
func TestChunkLimit(t *testing.T) {
	e := newEnv(t, 1, nil)
	const L = layout.MaxChunkBytes
	// Refused before the chunk is touched: a new one is not even made.
	if err := e.write(1, 6, L, []byte("a"), false); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write at the chunk limit: %v, want EFBIG", err)
	}
	if _, err := os.Stat(dataPath(e.dirs[0], 6)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused write made a chunk: %v", err)
	}
	e.mustWrite(1, 5, 0, []byte("head"), false)
	if err := e.write(1, 5, L-1, []byte("ab"), false); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write across the chunk limit: %v, want EFBIG", err)
	}
	if err := e.write(1, 5, L, []byte("a"), false); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write at the chunk limit: %v, want EFBIG", err)
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 5}, Size: L + 1}); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("truncate past the chunk limit: %v, want EFBIG", err)
	}
	if st, err := os.Stat(dataPath(e.dirs[0], 5)); err != nil || st.Size() != 4 {
		t.Fatalf("after refused growth: data file %v, %v; want 4 bytes", st, err)
	}
	// The last byte below the limit is stored (sparse).
	e.mustWrite(1, 5, L-1, []byte("z"), true)
	if b := e.mustRead(1, 5, L-1, 1); string(b) != "z" {
		t.Fatalf("last byte: %q", b)
	}
	if err := e.call(rpc.STruncate, &rpc.TruncateReq{Chunk: rpc.ChunkID{Target: 1, Ino: 5}, Size: 4}); err != nil {
		t.Fatal(err)
	}
}

// checkMaxFile passes on a file system that holds the largest chunk and
// leaves no probe behind (nor one a crash left).
func TestCheckMaxFile(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, ".maxfile-probe-123"), nil, 0o644))
	must(checkMaxFile(dir))
	left, err := filepath.Glob(filepath.Join(dir, ".maxfile-probe-*"))
	must(err)
	if len(left) != 0 {
		t.Fatalf("probes left: %v", left)
	}
}
