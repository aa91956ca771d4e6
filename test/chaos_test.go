package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// TestChaosFailover runs `strata chaos` as the soak does, bounded: three
// metadata voters, two stores and a mount as real processes, a load of
// four workers creating, stat'ing and removing files and a writer
// fsyncing 1 MiB records, and faults drawn from a seed (kill -9 of the
// leader and of a follower, SIGSTOP of the leader). The load must see no
// error, and afterwards the files must be exactly the acknowledged creates
// minus the acknowledged removes, every fsync'ed record as written, and
// the history recorders' segments linearizable and exactly-once.
// STRATA_CHAOS_SEED replays a schedule.
func TestChaosFailover(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STRATA_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("STRATA_CHAOS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (replay: STRATA_CHAOS_SEED=%d)", seed, seed)
	dir := filepath.Join(t.TempDir(), "chaos")
	report := filepath.Join(t.TempDir(), "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "chaos", "--dir", dir, "--trials", "4", "--min-gap", "2s", "--max-gap", "4s",
		"--faults", "kill-leader,kill-follower,stop-leader", "--seed", strconv.FormatUint(seed, 10), "--json", report, "--keep")
	out, err := cmd.CombinedOutput()
	t.Logf("strata chaos:\n%s", out)
	if err != nil {
		logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("--- %s (tail)\n%s", filepath.Base(l), b)
		}
		t.Fatalf("strata chaos (seed %d): %v", seed, err)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Trials []struct {
			Fault        string  `json:"fault"`
			StallSeconds float64 `json:"stall_seconds"`
		} `json:"trials"`
		Ops             int      `json:"ops"`
		ErrorCount      int      `json:"error_count"`
		Linearizable    *bool    `json:"linearizable"`
		HistorySegments int      `json:"history_segments"`
		HistoryFailures []string `json:"history_failures"`
		Check           struct {
			Files   int `json:"files"`
			Records int `json:"records"`
		} `json:"check"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report: %v", err)
	}
	if rep.Linearizable == nil || !*rep.Linearizable || rep.HistorySegments == 0 {
		t.Fatalf("report (seed %d): %d history segments, failures %v", seed, rep.HistorySegments, rep.HistoryFailures)
	}
	if len(rep.Trials) != 4 || rep.ErrorCount != 0 || rep.Ops == 0 || rep.Check.Records == 0 {
		t.Fatalf("report (seed %d): %d trials, %d ops, %d errors, %d records checked; want 4 trials, ops, no errors, records", seed, len(rep.Trials), rep.Ops, rep.ErrorCount, rep.Check.Records)
	}
	os.RemoveAll(dir)
}
