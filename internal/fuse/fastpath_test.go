package fuse

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// TestWritesAskNoXattr: the kernel asks for security.capability before
// every write to a FUSE file. For a file this mount created the client
// answers without a metadata call; for one made elsewhere, only the first
// write asks.
func TestWritesAskNoXattr(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 1)
	a, ca := tc.mount(nil)
	b, _ := tc.mount(nil)
	must(t, os.Chmod(a, 0o777))
	writes := func(path string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
		must(t, err)
		for i := 0; i < 10; i++ {
			if _, err := f.Write([]byte("0123456789")); err != nil {
				t.Fatal(err)
			}
		}
		must(t, f.Close())
	}
	before := ca.Calls("meta", rpc.MGetXattr)
	writes(filepath.Join(a, "mine"))
	if d := ca.Calls("meta", rpc.MGetXattr) - before; d != 0 {
		t.Fatalf("10 writes to a file this mount created made %d GetXattr calls, want 0", d)
	}
	must(t, os.WriteFile(filepath.Join(b, "theirs"), nil, 0o644))
	before = ca.Calls("meta", rpc.MGetXattr)
	writes(filepath.Join(a, "theirs"))
	if d := ca.Calls("meta", rpc.MGetXattr) - before; d > 1 {
		t.Fatalf("10 writes to a file made elsewhere made %d GetXattr calls, want at most 1", d)
	}
}
