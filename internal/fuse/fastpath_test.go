package fuse

import (
	"os"
	"path/filepath"
	"syscall"
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

// TestAtimeSeenFromSecondMount: a read moves the file's atime (relatime)
// without a setattr of its own; the mount that read shows it at once, and
// a second mount once the batch went (here at an fsync of the directory).
func TestAtimeSeenFromSecondMount(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 1)
	a, ca := tc.mount(nil)
	b, _ := tc.mount(nil)
	p := filepath.Join(a, "f")
	must(t, os.WriteFile(p, []byte("data"), 0o644))
	var st0 syscall.Stat_t
	must(t, syscall.Stat(p, &st0))
	setattrs := ca.Calls("meta", rpc.MSetAttr)
	_, err := os.ReadFile(p)
	must(t, err)
	if d := ca.Calls("meta", rpc.MSetAttr) - setattrs; d != 0 {
		t.Fatalf("a read sent %d setattrs", d)
	}
	d, err := os.Open(a)
	must(t, err)
	must(t, d.Sync()) // fsyncdir: sends the access times noted
	must(t, d.Close())
	var st syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(b, "f"), &st))
	if st.Atim.Nano() <= st0.Mtim.Nano() {
		t.Fatalf("second mount: atime %d not after mtime %d", st.Atim.Nano(), st0.Mtim.Nano())
	}
	if st.Ctim != st0.Ctim {
		t.Fatalf("second mount: ctime moved on a read (%v → %v)", st0.Ctim, st.Ctim)
	}
}
