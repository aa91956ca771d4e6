package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/stratafs/strata/internal/bench"
	"github.com/stratafs/strata/internal/bench/peers"
)

// benchFlags holds the raw flags of `strata bench` and its subcommands;
// config() turns the ones the user set into a bench.Config.
type benchFlags struct {
	quick                                  bool
	workloads, threads, clients            string
	size, randomSize, sharedSize, transfer string
	randomRuntime, phaseTimeout            time.Duration
	filesPerDir, dirsPerThread, repeat     int
	metaSync, odirect, fio                 bool
	smallSize                              string
	filesPerThread                         int
	smallShared, smallFsync                bool
	limitDir, fioSize, label               string
	seed                                   uint64
	jsonPath, outDir                       string
	strataData                             string
}

func (f *benchFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.quick, "quick", false, "small sizes and a short sweep (about a minute); other flags override")
	fl.StringVar(&f.workloads, "workloads", strings.Join(bench.Workloads, ","), "workloads to run: "+strings.Join(bench.Workloads, ","))
	fl.StringVar(&f.threads, "threads", "1,2,4", "thread counts to sweep, e.g. 1,2,4,8 or 1-64 (doubling)")
	fl.StringVar(&f.clients, "clients", "1", "client process counts to sweep; threads are dealt round-robin to clients")
	fl.StringVar(&f.size, "size", "2G", "seq: total data, split evenly across threads")
	fl.StringVar(&f.randomSize, "random-size", "1G", "random: file size per thread")
	fl.DurationVar(&f.randomRuntime, "random-runtime", 15*time.Second, "random: duration of each phase")
	fl.StringVar(&f.sharedSize, "shared-size", "2G", "shared: size of the N-to-1 file")
	fl.StringVar(&f.transfer, "transfer", "4M", "shared: transfer size of each write and read")
	fl.IntVar(&f.filesPerDir, "files-per-dir", 1000, "meta: files per directory")
	fl.IntVar(&f.dirsPerThread, "dirs-per-thread", 5, "meta: directories per thread (unique per thread)")
	fl.BoolVar(&f.metaSync, "meta-sync", true, "meta: fsync each created file (mdtest -y)")
	fl.StringVar(&f.smallSize, "smallfile-size", "3901", "smallfile: size of each file (IO500's 3,901 bytes)")
	fl.IntVar(&f.filesPerThread, "files-per-thread", 2000, "smallfile: files each thread creates, reads back and removes")
	fl.BoolVar(&f.smallShared, "smallfile-shared", true, "smallfile: all threads' files in one directory (false: a directory per thread)")
	fl.BoolVar(&f.smallFsync, "smallfile-fsync", false, "smallfile: fsync each file before its close (the durable baseline)")
	fl.BoolVar(&f.odirect, "odirect", true, "random: use O_DIRECT when the file system accepts it")
	fl.IntVar(&f.repeat, "repeat", 1, "run every phase N times and report the median")
	fl.BoolVar(&f.fio, "fio", true, "measure the raw limit of the backing directory with fio first")
	fl.StringVar(&f.limitDir, "limit-dir", "", "directory for the fio limit (default: the benchmarked path's disk; on a Strata mount of a local strata up, its data directory)")
	fl.StringVar(&f.fioSize, "fio-size", "512M", "fio: sequential file size per job (4 jobs)")
	fl.DurationVar(&f.phaseTimeout, "phase-timeout", 15*time.Minute, "abort a phase that runs longer than this")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of random offsets and stat order")
	fl.StringVar(&f.label, "label", "", "system label of the results (default: the path's base name)")
	fl.StringVar(&f.jsonPath, "json", "", "write the JSON results here (default OUT/results.json)")
	fl.StringVar(&f.strataData, "strata-data", "", "on a Strata mount: the --data directory of its strata up, so the shared file is striped over every live target strata status lists (default: stripe count 0, all targets up to 8)")
	fl.StringVar(&f.outDir, "out", "", "directory for plots and report.html (default: the JSON file's directory, else bench-results/ in the working directory, which .gitignore ignores)")
}

// config builds the bench configuration: the default or quick preset, with
// every flag the user set on top.
func (f *benchFlags) config(cmd *cobra.Command) (bench.Config, error) {
	return f.configFrom(cmd, bench.DefaultConfig())
}

func (f *benchFlags) configFrom(cmd *cobra.Command, c bench.Config) (bench.Config, error) {
	if f.quick {
		c = bench.QuickConfig()
	}
	set := func(name string) bool { return cmd.Flags().Changed(name) }
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if set("workloads") {
		c.Workloads = strings.Split(f.workloads, ",")
	}
	if set("threads") {
		ts, err := bench.ParseSweep(f.threads)
		if err != nil {
			bad("--threads: %v", err)
		}
		c.Threads = ts
	}
	if set("clients") {
		cs, err := bench.ParseSweep(f.clients)
		if err != nil {
			bad("--clients: %v", err)
		}
		c.Clients = cs
	}
	size := func(name, v string, dst *int64) {
		if !set(name) {
			return
		}
		n, err := bench.ParseSize(v)
		if err != nil {
			bad("--%s: %v", name, err)
		}
		*dst = n
	}
	size("size", f.size, &c.SeqBytes)
	size("random-size", f.randomSize, &c.RandomFileBytes)
	size("shared-size", f.sharedSize, &c.SharedBytes)
	size("transfer", f.transfer, &c.TransferBytes)
	size("fio-size", f.fioSize, &c.FioBytes)
	size("smallfile-size", f.smallSize, &c.SmallFileBytes)
	if set("files-per-thread") {
		c.SmallFilesPerThread = f.filesPerThread
	}
	if set("smallfile-shared") {
		c.SmallFileShared = f.smallShared
	}
	if set("smallfile-fsync") {
		c.SmallFileFsync = f.smallFsync
	}
	if set("random-runtime") {
		c.RandomRuntime = f.randomRuntime
	}
	if set("phase-timeout") {
		c.PhaseTimeout = f.phaseTimeout
	}
	if set("files-per-dir") {
		c.FilesPerDir = f.filesPerDir
	}
	if set("dirs-per-thread") {
		c.DirsPerThread = f.dirsPerThread
	}
	if set("meta-sync") {
		c.MetaSync = f.metaSync
	}
	if set("odirect") {
		c.ODirect = f.odirect
	}
	if set("repeat") {
		c.Repeat = f.repeat
	}
	if set("fio") {
		c.Fio = f.fio
	}
	c.LimitDir = f.limitDir
	c.Seed = f.seed
	c.System = f.label
	c.Progress = os.Stderr
	exe, err := os.Executable()
	if err != nil {
		bad("find own executable: %v", err)
	}
	c.WorkerCommand = []string{exe, "bench", "worker"}
	c.Striper = bench.DefaultStriper{Binary: exe, DataDir: f.strataData}
	if len(errs) > 0 {
		return c, usagef("%s", strings.Join(errs, "; "))
	}
	return c, nil
}

// outputs resolves the JSON path and the output directory.
func (f *benchFlags) outputs() (jsonPath, outDir string) {
	jsonPath, outDir = f.jsonPath, f.outDir
	if outDir == "" {
		if jsonPath != "" {
			outDir = filepath.Dir(jsonPath)
		} else {
			outDir = "bench-results"
		}
	}
	if jsonPath == "" {
		jsonPath = filepath.Join(outDir, "results.json")
	}
	return jsonPath, outDir
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// writeDocument prints the tables and writes JSON, plots and HTML.
func writeDocument(doc *bench.Document, rep *bench.Report, jsonPath, outDir string) error {
	fmt.Println()
	bench.WriteTable(os.Stdout, doc.Results())
	if len(doc.Runs) > 1 || len(bench.Systems(doc.Results())) > 1 {
		fmt.Println()
		doc.WriteComparison(os.Stdout)
	}
	fmt.Println()
	doc.WritePeaks(os.Stdout)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	var written []string
	if rep != nil {
		if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
			return err
		}
		if err := rep.WriteJSON(jsonPath); err != nil {
			return err
		}
		written = append(written, jsonPath)
	}
	paths, err := doc.WriteFiles(outDir)
	written = append(written, paths...)
	fmt.Fprintf(os.Stderr, "\nwrote %s\n", strings.Join(written, " "))
	return err
}

func init() {
	var f benchFlags
	benchCmd := &cobra.Command{
		Use:   "bench [flags] DIR",
		Short: "Benchmark a mounted path: seq, random, N-to-1, metadata and small-file workloads with plots and reports",
		Long: `Runs the HPC storage studies' methodology against DIR (any mounted file system):
  seq     N-to-N, one file per thread, 1 MiB records, fsync+close timed (IOzone -i0/-i1 -c -e)
  random  4 KiB records at random offsets, own file per thread, O_DIRECT when accepted (IOPS)
  shared  N-to-1, each thread writes then reads its own block of one file (IOR, fsync on close)
  meta    create (fsync, like mdtest -y), stat in random order, remove; unique dir per thread
  smallfile  IO500 mdtest-hard-style: create+write+close of 3,901-byte files, then
          stat+open+read+check+close, then remove; one shared directory (--smallfile-shared)
Each phase runs in fresh worker processes (readers never are the writers), the page cache is
dropped between phases when root, and every byte read is checked. fio measures the raw limit.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("bench: want exactly one directory, got %d arguments", len(args))
			}
			cfg, err := f.config(cmd)
			if err != nil {
				return err
			}
			cfg.Path = args[0]
			if st, err := os.Stat(cfg.Path); err != nil || !st.IsDir() {
				return usagef("bench: %s is not a directory", cfg.Path)
			}
			if err := cfg.Validate(); err != nil {
				return usagef("bench: %v", err)
			}
			ctx, cancel := signalContext()
			defer cancel()
			rep, err := bench.Run(ctx, cfg)
			if err != nil {
				if errors.Is(err, bench.ErrCorrupt) {
					return fmt.Errorf("VERIFICATION FAILED, no results written: %w", err)
				}
				return err
			}
			jsonPath, outDir := f.outputs()
			doc := &bench.Document{Title: "strata bench " + cfg.Path, Runs: []bench.NamedReport{{Name: rep.Results[0].System, Report: rep}}}
			return writeDocument(doc, rep, jsonPath, outDir)
		},
	}
	f.register(benchCmd)

	workerCmd := &cobra.Command{
		Use:    "worker",
		Short:  "internal: one client process of a benchmark phase (task on stdin, results on stdout)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.WorkerMain(os.Stdin, os.Stdout)
		},
	}

	var compare []string
	var reportOut string
	reportCmd := &cobra.Command{
		Use:   "report --compare [seeds] RUN.json [RUN.json ...]",
		Short: "Overlay benchmark runs (and the seed studies' figures) in one table, plots and HTML report",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			files := append(append([]string(nil), compare...), args...)
			doc := &bench.Document{Title: "strata bench report", Baselines: []string{"passthrough", "local"}}
			for _, a := range files {
				for _, name := range strings.Split(a, ",") {
					if name == "" {
						continue
					}
					if name == "seeds" {
						s, err := bench.LoadSeeds()
						if err != nil {
							return err
						}
						doc.Seeds = s
						continue
					}
					rep, err := bench.ReadReport(name)
					if err != nil {
						return err
					}
					doc.Runs = append(doc.Runs, bench.NamedReport{Name: strings.TrimSuffix(filepath.Base(name), ".json"), Report: rep})
				}
			}
			if len(doc.Runs) == 0 {
				return usagef("report: no run files given")
			}
			if reportOut == "" {
				reportOut = "bench-report"
			}
			return writeDocument(doc, nil, "", reportOut)
		},
	}
	reportCmd.Flags().StringSliceVar(&compare, "compare", nil, "runs to overlay: JSON files and/or the word seeds")
	reportCmd.Flags().StringVar(&reportOut, "out", "", "directory for plots and report.html (default ./bench-report)")

	var calSize string
	var calRounds int
	var calJSON string
	var calClients int
	calibrateCmd := &cobra.Command{
		Use:   "calibrate DIR",
		Short: "Compare the harness's seq workload with fio's identical pattern on DIR (overhead check)",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("calibrate: want exactly one directory")
			}
			n, err := bench.ParseSize(calSize)
			if err != nil {
				return usagef("--size: %v", err)
			}
			if calRounds < 1 {
				return usagef("--rounds must be >= 1")
			}
			cfg := bench.DefaultConfig()
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.WorkerCommand = []string{exe, "bench", "worker"}
			cfg.Path = args[0]
			cfg.Progress = os.Stderr
			ctx, cancel := signalContext()
			defer cancel()
			c, err := bench.Calibrate(ctx, cfg, n, calRounds, calClients)
			if err != nil {
				return err
			}
			fmt.Printf("seq, %d jobs x %s, 1 MiB, psync, fsync at end, page cache dropped before every phase; harness in %d process(es); median of %d rounds\n",
				c.Jobs, bench.FormatSize(c.BytesPerJob), c.Clients, c.Rounds)
			fmt.Printf("  write: fio %.1f MiB/s, strata bench %.1f MiB/s, ratio %.3f (median of per-round ratios %.3f)\n", c.FioWriteMiBps, c.BenchWriteMiBps, c.WriteRatio, c.WriteRatioPaired)
			fmt.Printf("  read:  fio %.1f MiB/s, strata bench %.1f MiB/s, ratio %.3f (median of per-round ratios %.3f)\n", c.FioReadMiBps, c.BenchReadMiBps, c.ReadRatio, c.ReadRatioPaired)
			fmt.Printf("  CPU s per GiB (user+sys): write fio %.3f, strata bench %.3f; read fio %.3f, strata bench %.3f\n",
				c.FioWriteCPUPerGiB, c.BenchWriteCPUPerGiB, c.FioReadCPUPerGiB, c.BenchReadCPUPerGiB)
			if calJSON != "" {
				b, _ := json.MarshalIndent(c, "", "  ")
				return os.WriteFile(calJSON, append(b, '\n'), 0o644)
			}
			return nil
		},
	}
	calibrateCmd.Flags().StringVar(&calSize, "size", "512M", "file size per job")
	calibrateCmd.Flags().IntVar(&calRounds, "rounds", 3, "alternating fio/harness rounds; medians are reported")
	calibrateCmd.Flags().StringVar(&calJSON, "json", "", "also write the calibration as JSON here")
	calibrateCmd.Flags().IntVar(&calClients, "clients", bench.FioJobs, "harness worker processes for the 4 threads (4 = one per thread, like fio's jobs; 1 = threads in one process)")

	benchCmd.AddCommand(workerCmd, reportCmd, calibrateCmd, peersCommand())
	rootCmd.AddCommand(benchCmd)
}

func peersCommand() *cobra.Command {
	var f benchFlags
	var dir, systems, upFlags string
	cmd := &cobra.Command{
		Use:   "peers",
		Short: "Set up local dir, passthrough FUSE, GlusterFS, MooseFS (and Strata) here and benchmark them side by side",
		Long: `Installs GlusterFS and MooseFS from Debian packages when missing, sets up on this machine
a local directory, a passthrough FUSE mount (strata passthrough), GlusterFS (one node, 2 bricks),
MooseFS (1 master, 2 chunkservers, in network namespaces) and a Strata local cluster (strata up,
when available), runs the same suite on each interleaved per workload, writes one comparison
report with ratios against passthrough FUSE and the local directory, and tears everything down,
also after a failure or Ctrl-C. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bc, err := f.configFrom(cmd, peers.DefaultBench())
			if err != nil {
				return err
			}
			bc.Path = dir // validated per system
			if err := bc.Validate(); err != nil {
				return usagef("bench peers: %v", err)
			}
			var syss []string
			for _, s := range strings.Split(systems, ",") {
				if s = strings.TrimSpace(s); s != "" {
					syss = append(syss, s)
				}
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			start := time.Now()
			rep, runErr := peers.Run(ctx, peers.Config{Bench: bc, Dir: dir, Systems: syss, Self: exe, Log: os.Stderr, UpFlags: strings.Fields(upFlags)})
			if rep == nil || len(rep.Results) == 0 {
				if runErr == nil {
					runErr = errors.New("no results")
				}
				return runErr
			}
			rep.Notes = append(rep.Notes, fmt.Sprintf("peers run took %s", time.Since(start).Round(time.Second)))
			if upFlags != "" {
				rep.Notes = append(rep.Notes, "strata up ran with "+strings.Join(strings.Fields(upFlags), " "))
			}
			if f.outDir == "" && f.jsonPath == "" {
				f.outDir = "bench-peers"
			}
			jsonPath, outDir := f.outputs()
			doc := &bench.Document{Title: "strata bench peers", Runs: []bench.NamedReport{{Name: "peers", Report: rep}},
				Baselines: []string{"passthrough", "local"}}
			if err := writeDocument(doc, rep, jsonPath, outDir); err != nil {
				return err
			}
			for _, n := range rep.Notes {
				fmt.Fprintf(os.Stderr, "note: %s\n", n)
			}
			return runErr
		},
	}
	f.register(cmd)
	d := peers.DefaultBench()
	for name, v := range map[string]string{"size": "1G", "random-size": "256M", "random-runtime": d.RandomRuntime.String(), "shared-size": "1G"} {
		cmd.Flags().Lookup(name).DefValue = v
	}
	cmd.Flags().StringVar(&dir, "dir", "/var/tmp/strata-bench-peers", "work directory on the disk under test (everything is created below it)")
	cmd.Flags().StringVar(&systems, "systems", strings.Join(peers.Systems, ","), "systems to include (also, when named: "+strings.Join(peers.Optional, ", ")+": strata up with three metadata voters, for the cost of the quorum; strata up --ha with files unmirrored and mirrored, for the cost of mirroring)")
	cmd.Flags().StringVar(&upFlags, "strata-up-flags", "", "extra flags for the Strata peer's strata up, e.g. \"--sync-policy async\" (default: none)")
	return cmd
}
