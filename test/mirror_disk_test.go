package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/faultfs"
	"github.com/stratafs/strata/internal/testutil"
)

// mirrorGroupStatus is one entry of strata status --json "mirror_groups".
type mirrorGroupStatus struct {
	ID              uint32 `json:"id"`
	PrimaryServer   string `json:"primary_server"`
	SecondaryServer string `json:"secondary_server"`
	PrimaryTarget   uint32 `json:"primary_target"`
	SecondaryTarget uint32 `json:"secondary_target"`
	State           string `json:"state"`
	Epoch           uint64 `json:"epoch"`
}

// strataCLI runs a strata admin command against c, bounded.
func strataCLI(t *testing.T, c *testutil.ProcCluster, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args = append(args, "--meta", c.MetaAddr, "--key-file", c.KeyFile)
	return exec.CommandContext(ctx, c.Bin, args...).CombinedOutput()
}

// mirrorGroup answers group id as strata status --json shows it.
func mirrorGroup(t *testing.T, c *testutil.ProcCluster, id uint32) (mirrorGroupStatus, error) {
	t.Helper()
	out, err := strataCLI(t, c, "status", "--json")
	if err != nil {
		return mirrorGroupStatus{}, fmt.Errorf("strata status: %v: %s", err, out)
	}
	var doc struct {
		Groups []mirrorGroupStatus `json:"mirror_groups"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return mirrorGroupStatus{}, fmt.Errorf("status json: %v", err)
	}
	for _, g := range doc.Groups {
		if g.ID == id {
			return g, nil
		}
	}
	return mirrorGroupStatus{}, fmt.Errorf("no mirror group %d in %s", id, out)
}

// waitMirrorGroup polls group id until ok accepts it, for at most d.
func waitMirrorGroup(t *testing.T, c *testutil.ProcCluster, id uint32, what string, d time.Duration, ok func(mirrorGroupStatus) bool) mirrorGroupStatus {
	t.Helper()
	var g mirrorGroupStatus
	if err := testutil.WaitFor(d, func() error {
		var err error
		if g, err = mirrorGroup(t, c, id); err != nil {
			return err
		}
		if !ok(g) {
			return fmt.Errorf("group %+v", g)
		}
		return nil
	}); err != nil {
		for _, s := range c.Stores {
			t.Logf("%s log:\n%s", s.Name, s.Tail(40))
		}
		t.Fatalf("mirror group %d never %s: %v", id, what, err)
	}
	return g
}

// TestMirrorPrimaryDiskFails: two storage servers of one target each,
// paired into a mirror group whose primary's target sits on a fault file
// system. When that disk fails fsync, later write, and later turns
// read-only, the application's
// writes and fsyncs still succeed: the primary reports its own copy
// failed and the secondary takes over (status shows the new primary and a
// higher epoch). Once the disk is well again the failed copy is resynced
// whole and the group is in sync; every byte written reads back right
// (also with the page cache dropped), and strata scrub finds both copies
// equal.
func TestMirrorPrimaryDiskFails(t *testing.T) {
	requireMirror(t)
	disk := testutil.MountFaultFS(t, t.TempDir(), "disk")
	pDir := filepath.Join(disk.Dir, "t0")
	sDir := filepath.Join(t.TempDir(), "t0")
	for _, d := range []string{pDir, sDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 1,
		TargetDirs: [][]string{{pDir}, {sDir}}, MetaArgs: []string{"--failover-timeout", "2s"},
		MountArgs: []string{"--io-timeout", "30s"}})
	st, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	var pT, sT uint32
	for _, tg := range st.Targets {
		switch tg.Path {
		case pDir:
			pT = tg.ID
		case sDir:
			sT = tg.ID
		}
	}
	if pT == 0 || sT == 0 {
		t.Fatalf("targets %q and %q not both registered: %+v", pDir, sDir, st.Targets)
	}
	if out, err := strataCLI(t, c, "mirror", "create", "--targets", fmt.Sprintf("%d,%d", pT, sT)); err != nil {
		t.Fatalf("mirror create: %v: %s", err, out)
	}
	const gid = 1
	g0 := waitMirrorGroup(t, c, gid, "in sync with the fault disk's target as primary", 20*time.Second, func(g mirrorGroupStatus) bool {
		return g.State == "in_sync" && g.PrimaryTarget == pT
	})
	dir := filepath.Join(c.Mount(0), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(c.Bin, "stripe", "set", "--mirror", dir).CombinedOutput(); err != nil {
		t.Fatalf("stripe set --mirror: %v: %s", err, out)
	}

	rng := rand.New(rand.NewSource(21))
	want := map[string][]byte{}
	write := func(name string, n int) {
		t.Helper()
		data := make([]byte, n)
		rng.Read(data)
		if err := diskWriteFsync(t, filepath.Join(dir, name), data); err != nil {
			t.Fatalf("write and fsync %s: %v (the application must see no error)", name, err)
		}
		want[name] = data
	}
	check := func(when string) {
		t.Helper()
		for name, data := range want {
			got, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatalf("%s: read %s: %v", when, name, err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("%s: %s reads back wrong: %d bytes, want %d; first difference at %d", when, name, len(got), len(data), firstDiffAt(got, data))
			}
		}
	}
	for i := range 4 {
		write("before-"+strconv.Itoa(i), 3<<20+i*4096+17)
	}

	// eio-fsync, then eio-write, then read-only, on the primary's disk.
	prev := g0
	for round, mode := range []faultfs.Mode{faultfs.EIOFsync, faultfs.EIOWrite, faultfs.ReadOnly} {
		if round > 0 {
			// Make the fault disk's copy the primary again (planned).
			if out, err := strataCLI(t, c, "mirror", "fail-over", strconv.Itoa(gid)); err != nil {
				t.Fatalf("mirror fail-over: %v: %s", err, out)
			}
			prev = waitMirrorGroup(t, c, gid, "back on the fault disk's target", 20*time.Second, func(g mirrorGroupStatus) bool {
				return g.State == "in_sync" && g.PrimaryTarget == pT
			})
		}
		disk.SetMode(t, mode)
		start := time.Now()
		for i := range 3 {
			write(fmt.Sprintf("during-%s-%d", mode, i), 1<<20+i*333)
		}
		t.Logf("%s: 3 writes+fsync in %v", mode, time.Since(start).Round(time.Millisecond))
		g := waitMirrorGroup(t, c, gid, "switched to the healthy copy", 10*time.Second, func(g mirrorGroupStatus) bool {
			return g.PrimaryTarget == sT && g.Epoch > prev.Epoch
		})
		if g.State == "in_sync" {
			t.Fatalf("%s: group in sync right after its primary's disk failed: %+v", mode, g)
		}
		check("disk failing (" + string(mode) + ")")
		disk.SetMode(t, faultfs.OK)
		write("after-"+string(mode), 2<<20+5)
		waitMirrorGroup(t, c, gid, "in sync again after the disk healed", 90*time.Second, func(g mirrorGroupStatus) bool {
			return g.State == "in_sync" && g.PrimaryTarget == sT
		})
		check("in sync again (" + string(mode) + ")")
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200); err != nil {
			t.Logf("cannot drop the page cache (%v): read back through whatever is cached", err)
		}
		check("caches dropped (" + string(mode) + ")")
		if out, err := strataCLI(t, c, "scrub", "--rate", "0"); err != nil {
			t.Fatalf("scrub after the resync (%s): %v:\n%s", mode, err, out)
		}
	}
}

// firstDiffAt is the first offset where a and b differ (or the shorter
// length).
func firstDiffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
