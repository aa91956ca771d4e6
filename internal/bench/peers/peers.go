package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stratafs/strata/internal/bench"
)

// Systems are the peers in the order they are set up and run.
var Systems = []string{"local", "passthrough", "glusterfs", "moosefs", "strata"}

// Optional are systems run only when named: "strata-meta3" is Strata with
// three metadata voters (`strata up --meta-voters 3`), to measure the cost
// of the quorum against "strata" in the same run; "strata-mirror" is
// `strata up --ha` (every daemon a process, new files mirrored) and
// "strata-ha" the same cluster with unmirrored files, its baseline for the
// cost of mirroring.
// "strata-nfs" (`strata up --nfs`, a sync export), "strata-nfs-async" (the
// same, async) and "ganesha" (NFS-Ganesha on a local directory) are the
// NFS row: driven over NFSv3 by one user-space client
// (nfsdrive.go), their workloads are NFSWorkloads whatever --workloads
// says.
var Optional = []string{"strata-meta3", "strata-ha", "strata-mirror", "strata-nfs", "strata-nfs-async", "ganesha"}

// Config is one peers run.
type Config struct {
	// Bench is the suite template (sizes, sweep, worker command); Path and
	// System are set per peer.
	Bench bench.Config
	// Dir is the work directory on the disk under test; everything the run
	// creates lives below it.
	Dir string
	// Systems to include (default: all).
	Systems []string
	// Self is the strata binary (for passthrough and up).
	Self string
	// UpFlags are extra flags for `strata up` (e.g. --sync-policy async),
	// to compare Strata's settings against the same peers.
	UpFlags []string
	// Log receives progress notes (normally os.Stderr).
	Log io.Writer
}

// Run sets up every peer, runs the suite on each interleaved per workload,
// tears everything down and returns one report. Teardown also runs when ctx
// is cancelled (SIGINT/SIGTERM) or anything fails.
func Run(ctx context.Context, cfg Config) (rep *bench.Report, err error) {
	for _, f := range cfg.UpFlags {
		if name, _, _ := strings.Cut(f, "="); name == "--data" || name == "--mount" {
			return nil, fmt.Errorf("strata up flags: %s is the run's own", name)
		}
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("peers needs root (packages, namespaces, mounts, dropping caches)")
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "peers: "+format+"\n", args...) }
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if len(cfg.Systems) == 0 {
		cfg.Systems = Systems
	}
	Cleanup(dir, logf)
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	e := &env{dir: dir, self: cfg.Self, logf: logf, pkgs: newInstaller(logf), upFlags: cfg.UpFlags}
	if err := e.pkgs.ensure(ctx, basePackages...); err != nil {
		logf("%v (continuing: no fio limit, unmounting without fusermount3)", err)
	}
	all := map[string]system{
		"local":       &localFS{env: e},
		"passthrough": &passthroughFS{env: e},
		"glusterfs":   &glusterFS{env: e},
		"moosefs":     &mooseFS{env: e},
		"strata":      &strataFS{env: e},
		// strata-meta3 runs after strata (Systems' order, then Optional).
		"strata-meta3":     &strataFS{env: e, sys: "strata-meta3", flags: []string{"--meta-voters", "3"}},
		"strata-ha":        &strataFS{env: e, sys: "strata-ha", flags: []string{"--ha", "--mirror-root=false"}},
		"strata-mirror":    &strataFS{env: e, sys: "strata-mirror", flags: []string{"--ha"}},
		"strata-nfs":       newStrataNFS(e),
		"strata-nfs-async": newStrataNFSAsync(e),
		"ganesha":          &ganeshaNFS{env: e},
	}
	rep = &bench.Report{Machine: bench.CurrentMachine(dir)}
	var started []system
	defer func() {
		// Tear down in reverse order, whatever happened.
		for i := len(started) - 1; i >= 0; i-- {
			s := started[i]
			logf("tearing down %s", s.name())
			if terr := s.teardown(); terr != nil {
				logf("teardown %s: %v", s.name(), terr)
				rep.Notes = append(rep.Notes, fmt.Sprintf("teardown %s: %v", s.name(), terr))
			}
		}
		Cleanup(dir, logf)
	}()

	type peer struct {
		name   string
		runner *bench.Runner
		only   string // the one workload this series runs ("" = all)
	}
	var peers []peer
	var nfsPeers []nfsSystem
	for _, name := range cfg.Systems {
		s, ok := all[name]
		if !ok {
			return rep, fmt.Errorf("unknown system %q (want %s)", name, strings.Join(append(slices.Clone(Systems), Optional...), ", "))
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		logf("setting up %s", name)
		started = append(started, s)
		sctx, cancel := context.WithTimeout(ctx, 15*time.Minute) // includes apt-get
		path, err := s.setup(sctx)
		cancel()
		if err != nil {
			var skip errSkip
			if errors.As(err, &skip) {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s skipped: %v", name, err))
			} else {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s FAILED to set up: %v", name, err))
			}
			logf("%s not available: %v", name, err)
			if terr := s.teardown(); terr != nil {
				logf("teardown %s: %v", name, terr)
			}
			started = started[:len(started)-1]
			continue
		}
		if ns, ok := s.(nfsSystem); ok {
			nfsPeers = append(nfsPeers, ns)
			logf("%s ready at %s", name, path)
			continue
		}
		bc := cfg.Bench
		bc.Path, bc.System, bc.Fio = path, name, false
		// The repeats are turns of their own (below); the random files
		// are written once and serve every turn.
		bc.Repeat, bc.KeepRandomFiles = 1, true
		if c, ok := s.(configurer); ok {
			c.configure(&bc)
		}
		r, err := bench.NewRunner(bc)
		if err != nil {
			return rep, err
		}
		defer r.Close()
		peers = append(peers, peer{name: name, runner: r})
		logf("%s ready at %s (%s)", name, path, bench.FSType(path))
		if fc, ok := fsyncBaseline(name, bc); ok {
			fr, err := bench.NewRunner(fc)
			if err != nil {
				return rep, err
			}
			defer fr.Close()
			peers = append(peers, peer{name: fc.System, runner: fr, only: "smallfile"})
			logf("%s: smallfile also on %s with an fsync before each close", fc.System, path)
		}
	}
	if len(peers) == 0 && len(nfsPeers) == 0 {
		return rep, errors.New("no system could be set up")
	}

	// The physical limit of the disk under all of them.
	if cfg.Bench.Fio {
		lim, err := bench.MeasureLimit(ctx, filepath.Join(dir, "local"), cfg.Bench.FioBytes, cfg.Bench.FioRuntime, nil)
		if err != nil {
			rep.Notes = append(rep.Notes, "no fio limit: "+err.Error())
		} else {
			rep.Limit = lim
			logf("fio limit: seq write %.0f MiB/s, seq read %.0f MiB/s, rand write %.0f IOPS, rand read %.0f IOPS",
				lim.SeqWriteMiBps, lim.SeqReadMiBps, lim.RandWriteIOPS, lim.RandReadIOPS)
		}
	}

	// Interleaved: each workload on every system, one repeat at a time
	// (turns), before the next workload, so that drift of the machine over
	// time hits all systems alike; the samples of a system's turns are
	// merged into one result with their median.
	repeat := max(cfg.Bench.Repeat, 1)
	failed := map[string]bool{}
	var corrupt []string
	var results []bench.Result
	for _, w := range cfg.Bench.Workloads {
		for turn := 1; turn <= repeat; turn++ {
			for _, i := range turnOrder(len(peers), turn) {
				p := peers[i]
				if failed[p.name] || (p.only != "" && p.only != w) {
					continue
				}
				waited, quiet, serr := settle(ctx)
				switch {
				case serr != nil && ctx.Err() != nil:
					return rep, ctx.Err()
				case serr != nil:
					logf("cannot tell whether the machine is quiet: %v", serr)
				case !quiet:
					note := fmt.Sprintf("%s %s: the machine was still busy after %v of waiting for the previous system's background work", p.name, w, waited.Round(time.Second))
					rep.Notes = append(rep.Notes, note)
					logf("%s", note)
				case waited > time.Second:
					logf("%s %s: waited %v for the machine to be quiet", p.name, w, waited.Round(100*time.Millisecond))
				}
				if repeat > 1 {
					logf("%s %s: turn %d of %d", p.name, w, turn, repeat)
				}
				res, err := p.runner.Workload(ctx, w)
				results = append(results, res...)
				rep.Results = bench.MergeRepeats(results)
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				if err != nil {
					failed[p.name] = true
					if errors.Is(err, bench.ErrCorrupt) {
						corrupt = append(corrupt, p.name)
						rep.Notes = append(rep.Notes, fmt.Sprintf("%s: VERIFICATION FAILED: %v", p.name, err))
					} else {
						rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %s failed: %v", p.name, w, err))
					}
					logf("%s dropped from the run: %v", p.name, err)
				}
			}
		}
		if w == "random" {
			for _, p := range peers {
				p.runner.RemoveRandomFiles()
			}
		}
	}
	if err := runNFSRow(ctx, nfsPeers, repeat, logf, rep, &results); err != nil {
		return rep, err
	}
	for _, p := range peers {
		for _, n := range p.runner.Notes() {
			rep.Notes = append(rep.Notes, p.name+": "+n)
		}
		rep.Machine.CachesDropped = rep.Machine.CachesDropped || p.runner.CachesDropped()
	}
	rep.ApplyEfficiency()
	if len(corrupt) > 0 {
		return rep, fmt.Errorf("%w on %s", bench.ErrCorrupt, strings.Join(corrupt, ", "))
	}
	return rep, nil
}

// LocalFsync is the series of the local directory whose smallfile creates
// fsync each file before its close: the durable baseline of a small-file
// create (issue 19's bars compare the sync policy's creates with it).
const LocalFsync = "local-fsync"

// fsyncBaseline returns the suite of the local-fsync series when the
// system just set up is the local directory and the suite runs smallfile
// without an fsync per file (with one, local already is that baseline).
func fsyncBaseline(name string, bc bench.Config) (bench.Config, bool) {
	if name != "local" || bc.SmallFileFsync || !slices.Contains(bc.Workloads, "smallfile") {
		return bc, false
	}
	bc.System, bc.SmallFileFsync, bc.Workloads = LocalFsync, true, []string{"smallfile"}
	return bc, true
}

// turnOrder is the order in which turn (from 1) visits n systems: the rows
// of a Williams design, a Latin square whose rows are the first row
// 0, 1, n-1, 2, n-2, … shifted by one per turn (and, for odd n, the same
// rows reversed after the first n turns). Over its period — n turns for
// even n, 2n for odd — every system runs equally often in every position
// and right after every other system, so the leftover background work or
// state of one system (a page cache full of its files, a daemon's own
// timers) does not
// always land on the same next one, as it would in a fixed or merely
// rotated order.
func turnOrder(n, turn int) []int {
	if n == 0 {
		return nil // only NFS systems (their own row)
	}
	period := n
	if n%2 == 1 {
		period = 2 * n
	}
	r := (turn - 1) % period
	order := make([]int, n)
	lo, hi := 1, n-1
	for k := 1; k < n; k++ {
		if k%2 == 1 {
			order[k] = lo
			lo++
		} else {
			order[k] = hi
			hi--
		}
	}
	shift := r % n
	for k := range order {
		order[k] = (order[k] + shift) % n
	}
	if r >= n {
		slices.Reverse(order)
	}
	return order
}

// Cleanup removes what an earlier (crashed) run left behind, recognised by
// the names this package uses: host daemons whose command line names our
// paths (see leftovers.go), mounts under dir, our network namespaces and
// the processes in them, our GlusterFS volume definition.
func Cleanup(dir string, logf func(string, ...any)) {
	ctx := context.Background()
	stopLeftovers(dir, 30*time.Second, logf)
	if err := unmountUnder(dir); err != nil {
		logf("cleanup: %v", err)
	}
	for _, ns := range ourNamespaces() {
		logf("cleanup: removing namespace %s", ns)
		if err := killNamespace(ctx, ns); err != nil {
			logf("cleanup: %v", err)
		}
	}
	os.RemoveAll("/var/lib/glusterd/vols/" + glusterVolume)
	// Data of the systems (not the logs or reports).
	for _, sub := range []string{"local", "passthrough-src", "passthrough-mnt", "gluster", "moosefs", "strata-data", "strata-mnt", "strata-meta3-data", "strata-meta3-mnt",
		"strata-ha-data", "strata-ha-mnt", "strata-mirror-data", "strata-mirror-mnt",
		"strata-nfs-data", "strata-nfs-mnt", "strata-nfs-async-data", "strata-nfs-async-mnt", "ganesha"} {
		p := filepath.Join(dir, sub)
		if mountFSType(p) == "" {
			os.RemoveAll(p)
		}
	}
}

// DefaultBench is the peers suite: the full methodology sized so that five
// systems finish in about fifteen minutes on a small machine.
func DefaultBench() bench.Config {
	c := bench.DefaultConfig()
	c.Threads = []int{1, 2, 4}
	c.SeqBytes = 1 << 30
	c.RandomFileBytes = 256 << 20
	c.RandomRuntime = 5 * time.Second
	c.SharedBytes = 1 << 30
	c.FilesPerDir = 1000
	c.DirsPerThread = 5
	c.FioBytes = 512 << 20
	c.FioRuntime = 5 * time.Second
	c.PhaseTimeout = 10 * time.Minute
	return c
}
