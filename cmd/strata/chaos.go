package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/stratafs/strata/internal/chaos"
	"github.com/stratafs/strata/internal/meta"
)

func init() {
	var (
		dir, faults, jsonPath, recordSize, syncPolicy, hosts string
		voters, stores, workers, trials                      int
		targetsPerStore, writers, readers                    int
		seed                                                 uint64
		duration, minGap, maxGap, hold, delay                time.Duration
		storeHold, resyncBound, failoverTimeout              time.Duration
		sessionLease                                         time.Duration
		lockers                                              int
		keep, histories, mirror                              bool
	)
	cmd := &cobra.Command{
		Use:   "chaos --dir DIR [--trials N | --duration D]",
		Short: "Run a multi-voter cluster under load and inject faults; report stalls, errors and lost or doubled files",
		Long: `Start a cluster of real processes on loopback or --hosts netns (--voters metadata voters, --stores
storage servers, one FUSE mount), run a load on the mount (--workers creating, stat'ing and
removing files, and a writer appending --record-size records with an fsync each), and inject
faults drawn from --seed: kill -9 of the leader, of a follower, or SIGSTOP of the leader.
With --hosts netns each voter runs on a host of its own (a network namespace; the stores
and the mount on one more), and the network faults can be drawn too: partition-leader
(the leader's link down, both directions), one-way (what the leader sends to the other
voters is dropped, or what they send to it), link-down of a follower, delay of what the
leader sends (--delay). Each fault lasts --hold (kills: until a new leader is named); each
trial waits for a leader, restarts or heals what it broke and waits for the victim to catch
up. The namespaces are deleted at the end, and a dead run's are removed at the next start.
At the end the load stops and is checked: every error it saw, the longest operation of each
trial (the stall a job felt), and whether the files that exist are exactly the acknowledged
creates minus the acknowledged removes, every fsync'ed record reads back as written, and
(--histories) the recorders' histories are linearizable (porcupine) and exactly-once; and a
deposed leader that still runs (stop-leader, partition-leader, one-way, delay), asked directly for a
file its successor created, must refuse rather than answer from its stale state.

With --mirror the cluster is mirrored (issue 21): --stores storage servers (default 4) of
--targets-per-store targets (default 2), each store on a host of its own with --hosts netns,
paired into mirror groups (strata mirror create --auto) once registered, the load's data
directories marked mirrored (strata stripe set --mirror); the load gets --writers writers
of fsync'ed records (default 4) and --readers readers of random 4 KiB (default 4) that
check every byte, of files written before the load and of acknowledged records. The mirror
faults pick a group from strata status --json "mirror_groups": kill-primary, kill-secondary
(kill -9 of the server), stop-primary (SIGSTOP for --store-hold, longer than the failover
timeout, then SIGCONT), partition-primary (netns: the primary's host cut from the voters
only), link-down-store (netns: the primary's host's link down), disk-eio-primary and
disk-full-secondary (the target on a fault file system fails with EIO, or is full, for
--store-hold; then the disk heals, and the server restarts if its groups are not back in
sync 30 s later), disk-slow-primary (for --store-hold every data operation of the target
waits --delay), kill-primary-leader (kill -9 of a primary's server, and of the metadata
leader a second later: the next leader switches), heartbeat-loss-primary (for --store-hold the
primary's server sends no heartbeat — a failpoint switched through its STRATA_FAILPOINTS_FILE —
while everything else it exchanges with the voters, the clients and the other stores goes on);
and kill-all (any cluster) is a power
loss: the load paused after acknowledged operations, every process killed with SIGKILL,
restarted, every acknowledged record read back. Each mirror trial waits for the group's new primary
(the faults that depose one), restarts or repairs what it broke and waits (--resync-bound)
for every group to be in sync again: its resync time. A deposed primary that still runs
(stop-primary, partition-primary, heartbeat-loss-primary) is sent writes in its old epoch directly, from before the
fault is undone until 2 s after: it must refuse them all (no split brain).
kill-lock-client (any cluster) is a client dying with locks held: the cluster gets a second
mount (a client of its own) and the load --lockers lockers (default 2), each taking and releasing
a write lock on a byte range of its file in a loop (F_SETLK polled: bounded waits) and checking
mutual exclusion (whoever gets the lock must find the range stamped FREE by the last holder,
stamps it HELD, fsyncs, and finds it unchanged before it lets go); a lock holder process on the
second mount takes those locks, and the second mount's process is killed with SIGKILL. The
holder's reads on its dead mount must fail, not hang (no D state); the metadata service must
release the dead client's locks once its session lease (--session-lease) runs out: every locker
must hold its lock again within the lease + 5 s of the kill (the trial's lock wait and stall);
then the second mount starts again on its stale mount point. In every trial a locker's wait is
held to that bound, not to the 5 s stall bar of the totals (a new leader holds new locks back
for up to a lease for sessions that do not reclaim theirs, such as a dead mount's).
partition-primary cuts everything the primary's server exchanges with the voters (heartbeats,
and also its group map refreshes, mirror reports and the orphan reaper's calls to it), not the
heartbeats alone: heartbeat-loss-primary is that.
Exit status 1 when anything was lost, doubled, corrupted, read stale, an operation failed,
a lock was held by two at once, or a trial found a problem (no switch, no resync within the
bound, a dead client's locks not released within the bound).`,
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
			if hosts != chaos.Loopback && hosts != chaos.Netns {
				return usagef("chaos: --hosts %q: want %s or %s", hosts, chaos.Loopback, chaos.Netns)
			}
			var fs []chaos.Fault
			shaped, disks, lockClient := false, false, false
			for _, f := range strings.Split(faults, ",") {
				ft := chaos.Fault(strings.TrimSpace(f))
				if !slices.Contains(chaos.Faults, ft) {
					return usagef("chaos: --faults: unknown fault %q (want %s)", f, faultNames())
				}
				if ft.OnNetwork() && hosts != chaos.Netns {
					return usagef("chaos: --faults: %s needs --hosts %s", ft, chaos.Netns)
				}
				if ft.Mirrored() && !mirror {
					return usagef("chaos: --faults: %s needs --mirror", ft)
				}
				shaped = shaped || ft == chaos.Delay
				disks = disks || ft.OnDisk()
				lockClient = lockClient || ft == chaos.KillLockClient
				fs = append(fs, ft)
			}
			if mirror {
				if !cmd.Flags().Changed("stores") {
					stores = 4
				}
				if !cmd.Flags().Changed("targets-per-store") {
					targetsPerStore = 2
				}
				if !cmd.Flags().Changed("writers") {
					writers = 4
				}
				if !cmd.Flags().Changed("readers") {
					readers = 4
				}
			}
			if lockClient && !cmd.Flags().Changed("lockers") {
				lockers = 2
			}
			if lockClient && lockers <= 0 {
				return usagef("chaos: --faults: %s needs --lockers of at least 1", chaos.KillLockClient)
			}
			var metaFlags []string
			if failoverTimeout > 0 {
				metaFlags = append(metaFlags, "--failover-timeout", failoverTimeout.String())
			}
			if sessionLease > 0 {
				metaFlags = append(metaFlags, "--session-lease", sessionLease.String())
			} else {
				sessionLease = meta.DefaultConfig().SessionLease
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
			what := ""
			if mirror {
				what = fmt.Sprintf(" of %d targets, mirrored,", targetsPerStore)
			}
			fmt.Fprintf(os.Stderr, "chaos: starting %d voters, %d stores%s and a mount under %s\n", voters, stores, what, dir)
			ccfg := chaos.ClusterConfig{Bin: self, Dir: dir, Voters: voters, Stores: stores, TargetsPerStore: targetsPerStore,
				MountFlags: []string{"--sync-policy", syncPolicy}, MetaFlags: metaFlags, Hosts: hosts, Shaped: shaped,
				Mirror: mirror, FaultDisks: disks, LockClient: lockClient}
			if mirror {
				// The whole namespace: the writers' and readers' files, the
				// lockers' lock files and the histories' files all stay
				// reachable through a disk's failure (with only the data
				// directories mirrored, a failed disk gave the lockers EIO).
				ccfg.MirrorDirs = []string{"."}
			}
			c, err := chaos.StartCluster(ctx, ccfg)
			if err != nil {
				return err
			}
			defer func() {
				c.Stop()
				if !keep {
					os.RemoveAll(dir)
				}
			}()
			lcfg := chaos.LoadConfig{Dir: filepath.Join(c.Mount, "chaos"), Workers: workers, RecordBytes: int(rec), Writers: writers, Readers: readers,
				Lockers: lockers}
			if mirror {
				lcfg.MaxWriterBytes = 64 << 20 // 4 writers × 3 files kept × 2 copies
			}
			l, err := chaos.StartLoad(lcfg)
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
			if duration > 0 { // counted from here: the start of the cluster is not the soak's
				var cancel context.CancelFunc
				runCtx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
				trials = 0
			}
			rep, err := chaos.Run(runCtx, c, l, hist, chaos.Schedule{Seed: seed, Faults: fs, MinGap: minGap, MaxGap: maxGap, Hold: hold, Delay: delay,
				StoreHold: storeHold, ResyncBound: resyncBound, SessionLease: sessionLease}, trials, os.Stderr)
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
			if n := len(rep.StaleReads); n > 0 {
				bad = append(bad, fmt.Sprintf("%d stale reads from a deposed leader (first: %s)", n, rep.StaleReads[0]))
			}
			if n := len(rep.ProbeErrors); n > 0 {
				bad = append(bad, fmt.Sprintf("%d deposed-leader probes could not run (first: %s)", n, rep.ProbeErrors[0]))
			}
			if n := len(rep.Check.Bad); n > 0 {
				bad = append(bad, fmt.Sprintf("%d fsync'ed records bad (first: %s)", n, rep.Check.Bad[0]))
			}
			if n := rep.Check.CorruptReads; n > 0 {
				bad = append(bad, fmt.Sprintf("%d reads corrupt or stale (first: %s)", n, rep.Check.Corrupt[0]))
			}
			if n := len(rep.SplitBrain); n > 0 {
				bad = append(bad, fmt.Sprintf("%d writes acknowledged by a deposed primary (first: %s)", n, rep.SplitBrain[0]))
			}
			if n := len(rep.Check.LockViolations); n > 0 {
				bad = append(bad, fmt.Sprintf("%d locks held by two at once (first: %s)", n, rep.Check.LockViolations[0]))
			}
			if n := len(rep.Problems); n > 0 {
				bad = append(bad, fmt.Sprintf("%d problems in the trials (first: %s)", n, rep.Problems[0]))
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
	f.IntVar(&stores, "stores", 2, "storage servers (default 4 with --mirror)")
	f.IntVar(&targetsPerStore, "targets-per-store", 1, "targets of each storage server (default 2 with --mirror)")
	f.BoolVar(&mirror, "mirror", false, "a mirrored cluster: targets paired into mirror groups, the load's data on them; the mirror faults")
	f.IntVar(&workers, "workers", 4, "load: workers creating, stat'ing and removing files")
	f.StringVar(&recordSize, "record-size", "1M", "load: size of the writers' fsync'ed records (0: no writer)")
	f.IntVar(&writers, "writers", 1, "load: writers appending fsync'ed records (default 4 with --mirror)")
	f.IntVar(&readers, "readers", 0, "load: readers of random 4 KiB, checking every byte (default 4 with --mirror)")
	f.DurationVar(&storeHold, "store-hold", 6*time.Second, "how long stop-primary, partition-primary, link-down-store, heartbeat-loss-primary and the disk faults last")
	f.DurationVar(&resyncBound, "resync-bound", 180*time.Second, "how long a mirror trial waits for every group to be in sync again")
	f.DurationVar(&failoverTimeout, "failover-timeout", 0, "the voters' --failover-timeout (0: their default)")
	f.DurationVar(&sessionLease, "session-lease", 0, "the voters' --session-lease (0: their default, 15s); kill-lock-client's bound is this + 5s")
	f.IntVar(&lockers, "lockers", 0, "load: lock files, each with a locker taking a write lock on a range of it in a loop and checking mutual exclusion (default 2 with kill-lock-client)")
	f.StringVar(&syncPolicy, "sync-policy", "sync", "the mount's --sync-policy")
	f.IntVar(&trials, "trials", 0, "number of faults to inject")
	f.DurationVar(&duration, "duration", 0, "inject faults until this much time has passed (the soak; instead of --trials)")
	f.Uint64Var(&seed, "seed", 0, "seed of the fault schedule (default: from the clock; printed, and replays the schedule)")
	f.StringVar(&faults, "faults", string(chaos.KillLeader), "faults to draw from: "+faultNames()+" (comma-separated; partition-leader, one-way, link-down, delay, partition-primary and link-down-store need --hosts netns; the faults of a primary, a secondary or a store need --mirror; kill-lock-client works on any cluster)")
	f.StringVar(&hosts, "hosts", chaos.Loopback, "where the processes run: loopback, or netns (each voter in a network namespace of its own, the stores and the mount in another)")
	f.DurationVar(&delay, "delay", 300*time.Millisecond, "what the delay fault adds to each packet the leader's host sends, and disk-slow-primary to each data operation of the target")
	f.DurationVar(&minGap, "min-gap", 3*time.Second, "shortest load time between trials")
	f.DurationVar(&maxGap, "max-gap", 6*time.Second, "longest load time between trials")
	f.DurationVar(&hold, "hold", 3*time.Second, "how long stop-leader keeps the leader stopped, and a partition, a link down or a delay lasts")
	f.StringVar(&jsonPath, "json", "", "write the report as JSON to this file")
	f.BoolVar(&histories, "histories", true, "also run linearizability recorders on the mount (namespace operations, checked with porcupine in 5 s segments)")
	f.BoolVar(&keep, "keep", false, "keep --dir (data and logs) at the end")
	cmd.AddCommand(holdLocksCmd())
	rootCmd.AddCommand(cmd)
}

// holdLocksCmd is the kill-lock-client fault's lock holder, a process of
// its own on the cluster's second mount (hidden: chaos runs it).
func holdLocksCmd() *cobra.Command {
	var hc chaos.HolderConfig
	cmd := &cobra.Command{
		Use:    "hold-locks --name NAME FILE...",
		Short:  "Take the chaos lockers' write locks on FILEs, stamp them and hold them until killed",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if hc.Name == "" || strings.ContainsAny(hc.Name, " \n") {
				return usagef("chaos hold-locks: --name NAME (no spaces) is required")
			}
			hc.Files = args
			return chaos.HoldLocks(hc, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&hc.Name, "name", "", "the holder's name in the ranges it stamps")
	cmd.Flags().DurationVar(&hc.Max, "max", 10*time.Minute, "exit after this long if not killed before")
	return cmd
}

// faultNames lists the faults for the help and the errors.
func faultNames() string {
	var names []string
	for _, f := range chaos.Faults {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}
