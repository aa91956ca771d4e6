package test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
	"github.com/stratafs/strata/internal/testutil/history"
)

// historySeed is -seed, or the time: printed so that a failure replays.
func historySeed(t *testing.T) int64 {
	seed := *randSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay: go test ./test -run '%s$' -seed %d)", seed, t.Name(), seed)
	return seed
}

// The recorders' operation mixes. Two known anomalies of the mount (not
// of the metadata service) keep opens and unlinks of one name apart, and
// truncate out: see TestHistoryKnownAnomalies.
var (
	// namespaceKinds: creates, unlinks, renames and stats: what the
	// metadata service alone answers.
	namespaceKinds = []history.Kind{history.Create, history.Unlink, history.Rename, history.Stat}
	// contentKinds: files created once, then written, read and stat'ed.
	contentKinds = []history.Kind{history.Create, history.Write, history.Read, history.Stat}
)

// checkHistory checks a recorded history for linearizability and
// exactly-once, and that no operation returned an error to the
// application (the recorders' unknown outcomes).
func checkHistory(t *testing.T, name string, h *history.History) {
	t.Helper()
	ops := h.Ops()
	counts := history.Counts(ops)
	t.Logf("%s: %d operations: %v", name, len(ops), counts)
	for _, op := range ops {
		if op.Out.Status == history.Unknown {
			t.Errorf("%s: client %d %v failed: %s", name, op.Client, op.In, op.Out.Err)
		}
	}
	if counts[history.OK] < 20 {
		t.Errorf("%s: only %d operations succeeded: the recorders hardly ran", name, counts[history.OK])
	}
	if err := history.Check(ops, t.Name()+"-"+name); err != nil {
		t.Error(err)
	}
	if err := history.ExactlyOnce(ops); err != nil {
		t.Error(err)
	}
}

// startHistories starts one recorder group per mix, on directories of
// root; the returned wait gives their histories by name.
func startHistories(t *testing.T, root string, seed int64, d time.Duration, mixes map[string][]history.Kind, workers int) (wait func() map[string]*history.History) {
	t.Helper()
	type result struct {
		name string
		h    *history.History
		err  error
	}
	done := make(chan result, len(mixes))
	for name, kinds := range mixes {
		cfg := history.Config{Root: filepath.Join(root, name), Workers: workers, Seed: seed, Duration: d, Stall: 30 * time.Second, Kinds: kinds}
		go func() {
			h, err := history.Run(cfg)
			done <- result{name, h, err}
		}()
	}
	timeout := time.After(d + 45*time.Second)
	return func() map[string]*history.History {
		t.Helper()
		out := map[string]*history.History{}
		for range mixes {
			select {
			case r := <-done:
				if r.err != nil {
					t.Fatalf("%s: %v", r.name, r.err)
				}
				out[r.name] = r.h
			case <-timeout:
				t.Fatal("recorders did not finish")
			}
		}
		return out
	}
}

var historyMixes = map[string][]history.Kind{"namespace": namespaceKinds, "content": contentKinds}

// startHistoryUp starts a single-voter strata up for a history test.
func startHistoryUp(t *testing.T) string {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	p := startUp(t, bin, dir, filepath.Join(dir, "data"), mnt)
	t.Cleanup(func() {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("stop strata up: %v", err)
		}
		testutil.ForceUnmount(mnt)
		if t.Failed() {
			t.Logf("strata up log:\n%s", p.Tail(40))
		}
	})
	return mnt
}

// Recorders on the mount of a single-voter strata up (4 on the namespace,
// 4 on file contents): the histories are linearizable and every create
// and unlink took effect exactly once.
func TestHistoryOnStrataUp(t *testing.T) {
	mnt := startHistoryUp(t)
	for name, h := range startHistories(t, mnt, historySeed(t), 4*time.Second, historyMixes, 4)() {
		checkHistory(t, name, h)
	}
}

// The same on a cluster of processes whose metadata service is killed
// (kill -9) and restarted twice mid-run: the mount's client retries each
// call, with the same (client, seq), on the restarted service, so no
// operation fails, the histories are linearizable and every create and
// unlink took effect exactly once.
func TestHistoryAcrossMetaKill(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1})
	wait := startHistories(t, c.Mount(0), historySeed(t), 10*time.Second, historyMixes, 3)
	for range 2 {
		time.Sleep(2500 * time.Millisecond)
		t.Logf("kill -9 of the metadata service (pid %d)", c.Meta.Pid())
		c.Meta.Kill()
		start := time.Now()
		c.StartMeta()
		t.Logf("metadata service back after %v", time.Since(start).Round(time.Millisecond))
	}
	for name, h := range wait() {
		checkHistory(t, name, h)
	}
}

// TestHistoryKnownAnomalies runs every kind of operation on one set of
// names, truncate included, on a strata up mount. It fails today in two
// ways, both in the mount rather than the metadata service, so it runs
// only with STRATA_HISTORY_KNOWN=1 (to check a fix):
//
//   - an open (read or write) of a name whose unlink is in flight on
//     another thread answers ENOENT (the client's open of the removed
//     inode), while the kernel still holds the name's entry, so a stat
//     right after it finds the file again;
//   - an O_TRUNC open racing a write on another descriptor can leave the
//     file at the written size but with zeros instead of the data.
func TestHistoryKnownAnomalies(t *testing.T) {
	if os.Getenv("STRATA_HISTORY_KNOWN") != "1" {
		t.Skip("known anomalies of the mount; STRATA_HISTORY_KNOWN=1 runs it")
	}
	mnt := startHistoryUp(t)
	all := map[string][]history.Kind{"all": nil}
	for name, h := range startHistories(t, mnt, historySeed(t), 4*time.Second, all, 4)() {
		checkHistory(t, name, h)
	}
}
