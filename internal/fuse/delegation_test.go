package fuse

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// waitHolding waits until mount A (client c) holds directory dir's create
// delegation.
func waitHolding(t *testing.T, c *client.Client, dir uint64) {
	t.Helper()
	if err := testutil.WaitFor(10*time.Second, func() error {
		if !c.Holding(dir) {
			return errors.New("mount A does not hold the delegation")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCreateDelegationMounts: a mount with --create-delegation creating,
// writing and closing files in one directory gets the directory's
// delegation; a second mount's reads there recall it and see every file
// with its content; a name the second mount makes afterwards is seen by
// the first; the mount without the option never asks.
func TestCreateDelegationMounts(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	a, ca := tc.mount(func(c *client.Config) { c.CreateDelegation = true; c.SyncPolicy = client.SyncPolicyAsync })
	b, cb := tc.mount(nil)
	d := filepath.Join(a, "d")
	must(t, os.Mkdir(d, 0o755))
	var st syscall.Stat_t
	must(t, syscall.Stat(d, &st))
	const n = 40
	content := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("file %d;", i)), i+1) }
	for i := 0; i < n; i++ {
		must(t, os.WriteFile(filepath.Join(d, fmt.Sprint("f", i)), content(i), 0o644))
	}
	waitHolding(t, ca, st.Ino)
	// Held: A answers its lookups of new names and its creates itself;
	// its own renames, unlinks, stats and listings there see them.
	local := ca.Ops("create_local")
	for i := 0; i < n; i++ {
		must(t, os.WriteFile(filepath.Join(d, fmt.Sprint("g", i)), content(i), 0o644))
	}
	if ca.Ops("create_local") == local {
		t.Fatal("A answered none of its creates itself under the delegation")
	}
	if _, err := os.Stat(filepath.Join(d, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name on A: %v", err)
	}
	must(t, os.Rename(filepath.Join(d, "g0"), filepath.Join(d, "renamed")))
	must(t, os.Remove(filepath.Join(d, "g1")))
	for i := 2; i < n; i++ {
		fi, err := os.Stat(filepath.Join(d, fmt.Sprint("g", i)))
		if err != nil || fi.Size() != int64(len(content(i))) {
			t.Fatalf("g%d on A: %v, %v", i, fi, err)
		}
	}
	if ents, err := os.ReadDir(d); err != nil || len(ents) != 2*n-1 {
		t.Fatalf("A lists %d entries (%v), want %d", len(ents), err, 2*n-1)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprint("g", i)
		switch i {
		case 0:
			name = "renamed"
		case 1:
			if _, err := os.Stat(filepath.Join(b, "d", name)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("B sees g1, removed by A: %v", err)
			}
			continue
		}
		got, err := os.ReadFile(filepath.Join(b, "d", name))
		if err != nil || !bytes.Equal(got, content(i)) {
			t.Fatalf("%s read from B: %d bytes, %v; want %d", name, len(got), err, len(content(i)))
		}
	}
	for i := 0; i < n; i++ {
		got, err := os.ReadFile(filepath.Join(b, "d", fmt.Sprint("f", i)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, content(i)) {
			t.Fatalf("f%d read from B: %d bytes, want %d", i, len(got), len(content(i)))
		}
	}
	if ca.Holding(st.Ino) {
		t.Fatal("A holds the delegation after B's reads were answered")
	}
	must(t, os.WriteFile(filepath.Join(b, "d", "fromB"), []byte("b"), 0o644))
	if _, err := os.Stat(filepath.Join(d, "fromB")); err != nil {
		t.Fatalf("A does not see B's file after the recall: %v", err)
	}
	if ca.Calls("meta", rpc.MDelegate) == 0 || ca.Calls("meta", rpc.MReturnDelegation) == 0 {
		t.Fatalf("A: %d MDelegate, %d MReturnDelegation calls, want both", ca.Calls("meta", rpc.MDelegate), ca.Calls("meta", rpc.MReturnDelegation))
	}
	if n := cb.Calls("meta", rpc.MDelegate); n != 0 {
		t.Fatalf("B (option off) made %d MDelegate calls", n)
	}
}
