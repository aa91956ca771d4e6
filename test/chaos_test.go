package test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/netns"
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
	rep, seed := runChaos(t, "--trials", "4", "--faults", "kill-leader,kill-follower,stop-leader")
	if len(rep.Trials) != 4 || rep.ErrorCount != 0 || rep.Ops == 0 || rep.Check.Records == 0 {
		t.Fatalf("report (seed %d): %d trials, %d ops, %d errors, %d records checked; want 4 trials, ops, no errors, records", seed, len(rep.Trials), rep.Ops, rep.ErrorCount, rep.Check.Records)
	}
}

// TestChaosNetworkFaults runs `strata chaos --hosts netns`, bounded: each
// voter on a network namespace of its own, the stores and the mount on
// another, and four faults drawn from partition-leader, one-way, link-down
// and stop-leader. As for the process faults, the load must see no error,
// the files and records must be exactly as acknowledged and the history
// segments linearizable and exactly-once; and every deposed leader that
// still runs must refuse the lookups the probe sends it alone of a file
// its successor committed (a stale "no such file" fails the run: checked
// with a build whose leaders answer reads without the lease, caught in 2
// of 3 stop-leader trials, where the histories stayed linearizable). The
// run must delete its namespaces, and remove at its start those a dead
// run left (one is planted).
func TestChaosNetworkFaults(t *testing.T) {
	if err := netns.Check(false); err != nil {
		t.Skip(err)
	}
	testutil.RequireNft(t)
	// A dead run's leftover: a namespace named after a PID that ended.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	leftover := netns.OwnedPrefix("strata-chaos-", dead.Process.Pid) + "m1"
	if out, err := exec.Command("ip", "netns", "add", leftover).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", leftover).Run() })
	before := chaosNamespaces(t)
	rep, seed := runChaos(t, "--hosts", "netns", "--trials", "4", "--faults", "partition-leader,one-way,link-down,stop-leader")
	if len(rep.Trials) != 4 || rep.ErrorCount != 0 || rep.Ops == 0 || rep.Check.Records == 0 {
		t.Fatalf("report (seed %d): %d trials, %d ops, %d errors, %d records checked; want 4 trials, ops, no errors, records", seed, len(rep.Trials), rep.Ops, rep.ErrorCount, rep.Check.Records)
	}
	for _, tr := range rep.Trials {
		switch tr.Fault {
		case "partition-leader", "one-way", "stop-leader":
			if tr.NewLeader == tr.Victim {
				t.Errorf("%s of %s: the leader after it is the victim", tr.Fault, tr.Victim)
			}
			if tr.Probe == nil || tr.Probe.Asked == 0 || len(tr.Probe.Stale) > 0 {
				t.Errorf("%s of %s: probe of the deposed leader %+v", tr.Fault, tr.Victim, tr.Probe)
			}
		case "link-down":
		default:
			t.Errorf("trial of fault %q", tr.Fault)
		}
	}
	after := chaosNamespaces(t)
	if !slices.Contains(before, leftover) || slices.Contains(after, leftover) {
		t.Errorf("the planted leftover %s: before the run %v, after %v", leftover, before, after)
	}
	for _, ns := range after {
		if !slices.Contains(before, ns) {
			t.Errorf("namespace %s left by the run", ns)
		}
	}
}

// TestChaosNetworkFaultsNeedHosts: a network fault without --hosts netns,
// a mirror fault without --mirror, or an unknown --hosts, is a usage error (exit status 2) naming the
// problem, before anything starts.
func TestChaosNetworkFaultsNeedHosts(t *testing.T) {
	bin := testutil.Binary(t)
	for _, c := range []struct{ args, want string }{
		{"--faults kill-leader,one-way", "one-way needs --hosts netns"},
		{"--faults partition-leader --hosts loopback", "partition-leader needs --hosts netns"},
		{"--hosts lan", `--hosts "lan"`},
		{"--faults drop-all --hosts netns", `unknown fault "drop-all"`},
		{"--faults kill-primary", "kill-primary needs --mirror"},
		{"--mirror --faults partition-primary", "partition-primary needs --hosts netns"},
	} {
		dir := t.TempDir()
		args := append([]string{"chaos", "--dir", dir, "--trials", "1"}, strings.Fields(c.args)...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("strata %s: %v, %s; want exit status 2 and %q", strings.Join(args, " "), err, out, c.want)
		}
	}
}

// chaosNamespaces lists the network namespaces strata chaos names.
func chaosNamespaces(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "strata-chaos-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// chaosReport is what the tests read of `strata chaos --json`.
type chaosReport struct {
	Trials []struct {
		Fault        string  `json:"fault"`
		Victim       string  `json:"victim"`
		NewLeader    string  `json:"new_leader"`
		StallSeconds float64 `json:"stall_seconds"`
		// Mirror faults.
		Group         uint32   `json:"group"`
		NewPrimary    string   `json:"new_primary"`
		SwitchSeconds float64  `json:"switch_seconds"`
		ResyncSeconds float64  `json:"resync_seconds"`
		Problems      []string `json:"problems"`
		Fence         *struct {
			Asked    int      `json:"asked"`
			Refused  int      `json:"refused"`
			Accepted []string `json:"accepted"`
		} `json:"fence"`
		Probe *struct {
			Asked int      `json:"asked"`
			Stale []string `json:"stale"`
		} `json:"probe"`
	} `json:"trials"`
	StaleReads      []string `json:"stale_reads"`
	Ops             int      `json:"ops"`
	ErrorCount      int      `json:"error_count"`
	Linearizable    *bool    `json:"linearizable"`
	HistorySegments int      `json:"history_segments"`
	HistoryFailures []string `json:"history_failures"`
	Check           struct {
		Files        int      `json:"files"`
		Records      int      `json:"records"`
		Lost         []string `json:"lost"`
		Extra        []string `json:"extra"`
		Bad          []string `json:"bad"`
		Reads        int      `json:"reads"`
		CorruptReads int      `json:"corrupt_reads"`
	} `json:"check"`
	Problems   []string `json:"problems"`
	SplitBrain []string `json:"split_brain"`
}

// runChaos runs `strata chaos` with args and a seed (STRATA_CHAOS_SEED
// replays one), fails the test if it fails or its history segments are
// not all linearizable or any acknowledged file was lost or doubled, and
// returns its report.
func runChaos(t *testing.T, args ...string) (*chaosReport, uint64) {
	t.Helper()
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
	args = append([]string{"chaos", "--dir", dir, "--min-gap", "2s", "--max-gap", "4s",
		"--seed", strconv.FormatUint(seed, 10), "--json", report, "--keep"}, args...)
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	t.Logf("strata %s:\n%s", strings.Join(args, " "), out)
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
	var rep chaosReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report: %v", err)
	}
	if rep.Linearizable == nil || !*rep.Linearizable || rep.HistorySegments == 0 {
		t.Fatalf("report (seed %d): %d history segments, failures %v", seed, rep.HistorySegments, rep.HistoryFailures)
	}
	if len(rep.StaleReads) > 0 {
		t.Fatalf("report (seed %d): stale reads from deposed leaders: %v", seed, rep.StaleReads)
	}
	if len(rep.Check.Lost) > 0 || len(rep.Check.Extra) > 0 || rep.Check.Files == 0 {
		t.Fatalf("report (seed %d): %d files expected, lost %v, extra %v", seed, rep.Check.Files, rep.Check.Lost, rep.Check.Extra)
	}
	os.RemoveAll(dir)
	return &rep, seed
}
