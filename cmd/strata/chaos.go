package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/stratafs/strata/internal/chaos"
)

func init() {
	var (
		dir, faults, jsonPath, recordSize, syncPolicy string
		voters, stores, workers, trials               int
		seed                                          uint64
		duration, minGap, maxGap, hold                time.Duration
		keep, histories                               bool
	)
	cmd := &cobra.Command{
		Use:   "chaos --dir DIR [--trials N | --duration D]",
		Short: "Run a multi-voter cluster under load and inject faults; report stalls, errors and lost or doubled files",
		Long: `Start a cluster of real processes on loopback (--voters metadata voters, --stores
storage servers, one FUSE mount), run a load on the mount (--workers creating, stat'ing and
removing files, and a writer appending --record-size records with an fsync each), and inject
faults drawn from --seed: kill -9 of the leader, of a follower, or SIGSTOP of the leader.
Each trial waits for a new leader, restarts what it killed and waits for it to catch up.
At the end the load stops and is checked: every error it saw, the longest operation of each
trial (the stall a job felt), and whether the files that exist are exactly the acknowledged
creates minus the acknowledged removes, every fsync'ed record reads back as written, and
(--histories) the recorders' histories are linearizable (porcupine) and exactly-once.
Exit status 1 when anything was lost, doubled, corrupted, or an operation failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("chaos: --dir DIR is required")
			}
			if trials <= 0 && duration <= 0 {
				return usagef("chaos: give --trials N or --duration D")
			}
			rec, err := parseSize(recordSize)
			if err != nil {
				return usagef("chaos: --record-size %q: %v", recordSize, err)
			}
			var fs []chaos.Fault
			for _, f := range strings.Split(faults, ",") {
				switch ft := chaos.Fault(strings.TrimSpace(f)); ft {
				case chaos.KillLeader, chaos.KillFollower, chaos.StopLeader:
					fs = append(fs, ft)
				default:
					return usagef("chaos: --faults: unknown fault %q (want kill-leader, kill-follower, stop-leader)", f)
				}
			}
			if seed == 0 {
				seed = uint64(time.Now().UnixNano())
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			if dir, err = filepath.Abs(dir); err != nil {
				return err
			}
			if ents, _ := os.ReadDir(dir); len(ents) > 0 {
				return usagef("chaos: --dir %s is not empty", dir)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			fmt.Fprintf(os.Stderr, "chaos: starting %d voters, %d stores and a mount under %s\n", voters, stores, dir)
			c, err := chaos.StartCluster(ctx, chaos.ClusterConfig{Bin: self, Dir: dir, Voters: voters, Stores: stores,
				MountFlags: []string{"--sync-policy", syncPolicy}})
			if err != nil {
				return err
			}
			defer func() {
				c.Stop()
				if !keep {
					os.RemoveAll(dir)
				}
			}()
			l, err := chaos.StartLoad(chaos.LoadConfig{Dir: filepath.Join(c.Mount, "chaos"), Workers: workers, RecordBytes: int(rec)})
			if err != nil {
				return err
			}
			var hist *chaos.Histories
			if histories {
				if hist, err = chaos.StartHistories(filepath.Join(c.Mount, "history"), int64(seed), 5*time.Second); err != nil {
					return err
				}
			}
			runCtx := ctx
			if duration > 0 {
				trials = 0
			}
			rep, err := chaos.Run(runCtx, c, l, hist, chaos.Schedule{Seed: seed, Faults: fs, MinGap: minGap, MaxGap: maxGap, Hold: hold}, trials, os.Stderr)
			if jsonPath != "" && rep != nil {
				b, _ := json.MarshalIndent(rep, "", "  ")
				if werr := os.WriteFile(jsonPath, append(b, '\n'), 0o644); werr != nil {
					fmt.Fprintf(os.Stderr, "chaos: write %s: %v\n", jsonPath, werr)
				}
			}
			if err != nil {
				return err
			}
			var bad []string
			if rep.ErrorCount > 0 {
				bad = append(bad, fmt.Sprintf("%d operations failed (first: %s)", rep.ErrorCount, rep.ErrorsSeen[0]))
			}
			if n := len(rep.Check.Lost); n > 0 {
				bad = append(bad, fmt.Sprintf("%d acknowledged files lost (first: %s)", n, rep.Check.Lost[0]))
			}
			if n := len(rep.Check.Extra); n > 0 {
				bad = append(bad, fmt.Sprintf("%d files that should not exist (first: %s)", n, rep.Check.Extra[0]))
			}
			if n := len(rep.HistoryFailures); n > 0 {
				bad = append(bad, fmt.Sprintf("%d history segments failed the checks (first: %s)", n, rep.HistoryFailures[0]))
			}
			if n := len(rep.Check.Bad); n > 0 {
				bad = append(bad, fmt.Sprintf("%d fsync'ed records bad (first: %s)", n, rep.Check.Bad[0]))
			}
			if len(bad) > 0 {
				return fmt.Errorf("chaos (seed %d): %s", seed, strings.Join(bad, "; "))
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usagef("chaos: %v", err) })
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "empty work directory for the cluster's data, logs and mount (removed at the end unless --keep)")
	f.IntVar(&voters, "voters", 3, "metadata voters")
	f.IntVar(&stores, "stores", 2, "storage servers (one target each)")
	f.IntVar(&workers, "workers", 4, "load: workers creating, stat'ing and removing files")
	f.StringVar(&recordSize, "record-size", "1M", "load: size of the writer's fsync'ed records (0: no writer)")
	f.StringVar(&syncPolicy, "sync-policy", "sync", "the mount's --sync-policy")
	f.IntVar(&trials, "trials", 0, "number of faults to inject")
	f.DurationVar(&duration, "duration", 0, "inject faults until this much time has passed (the soak; instead of --trials)")
	f.Uint64Var(&seed, "seed", 0, "seed of the fault schedule (default: from the clock; printed, and replays the schedule)")
	f.StringVar(&faults, "faults", string(chaos.KillLeader), "faults to draw from: kill-leader, kill-follower, stop-leader (comma-separated)")
	f.DurationVar(&minGap, "min-gap", 3*time.Second, "shortest load time between trials")
	f.DurationVar(&maxGap, "max-gap", 6*time.Second, "longest load time between trials")
	f.DurationVar(&hold, "hold", 3*time.Second, "how long stop-leader keeps the leader stopped")
	f.StringVar(&jsonPath, "json", "", "write the report as JSON to this file")
	f.BoolVar(&histories, "histories", true, "also run linearizability recorders on the mount (namespace operations, checked with porcupine in 5 s segments)")
	f.BoolVar(&keep, "keep", false, "keep --dir (data and logs) at the end")
	rootCmd.AddCommand(cmd)
}
