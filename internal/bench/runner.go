package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Runner runs workloads against one path. Peers runs several Runners
// interleaved, one workload at a time.
type Runner struct {
	cfg     Config
	work    string // per-run directory under cfg.Path
	prog    *progress
	dropped bool // page cache dropped at least once
	notes   []string
	striped bool
	// nonce seeds the data pattern of this run (see pattern.go), so data
	// left by an earlier run never passes verification; passes counts the
	// write passes that got a nonce of their own.
	nonce  uint64
	passes uint64
	// calls counts Workload calls per workload, so that every repeat of
	// a caller that calls it again gets seeds of its own.
	calls map[string]int
}

// NewRunner validates cfg and creates the run's work directory.
func NewRunner(cfg Config) (*Runner, error) {
	if cfg.Striper == nil {
		cfg.Striper = DefaultStriper{}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.System == "" {
		cfg.System = filepath.Base(cfg.Path)
	}
	work := filepath.Join(cfg.Path, fmt.Sprintf("strata-bench.%d.%d", os.Getpid(), time.Now().UnixNano()%1e6))
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, fmt.Errorf("make work directory: %w", err)
	}
	r := &Runner{cfg: cfg, work: work, prog: newProgress(cfg.Progress), nonce: rand.Uint64(), calls: map[string]int{}}
	if os.Geteuid() != 0 {
		r.note("not root: page cache not dropped between phases; reads may be served from memory")
	}
	return r, nil
}

// Notes returns the run-wide remarks collected so far.
func (r *Runner) Notes() []string { return r.notes }

// CachesDropped reports whether the page cache was dropped between phases.
func (r *Runner) CachesDropped() bool { return r.dropped }

// RemoveRandomFiles removes the random workload's files, which
// Config.KeepRandomFiles left in place.
func (r *Runner) RemoveRandomFiles() { r.removeGlob("random.*") }

// Close removes the work directory.
func (r *Runner) Close() error {
	return os.RemoveAll(r.work)
}

func (r *Runner) note(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	for _, n := range r.notes {
		if n == s {
			return
		}
	}
	r.notes = append(r.notes, s)
	r.prog.note("%s: %s", r.cfg.System, s)
}

// Run is the whole suite on one path: fio limit, every workload, report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	r, err := NewRunner(cfg)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	rep := &Report{Machine: CurrentMachine(r.cfg.Path)}
	if r.cfg.Fio {
		dir, what := LimitDir(r.cfg.Path, r.cfg.LimitDir)
		r.prog.note("raw limit: fio measures %s (%s)", dir, what)
		lim, err := MeasureLimit(ctx, dir, r.cfg.FioBytes, r.cfg.FioRuntime, r.prog)
		if err != nil {
			r.note("no fio limit: %v", err)
		} else {
			lim.Measured = what
			rep.Limit = lim
		}
	}
	for _, w := range r.cfg.Workloads {
		res, err := r.Workload(ctx, w)
		rep.Results = append(rep.Results, res...)
		if err != nil {
			rep.Notes = r.notes
			rep.Machine.CachesDropped = r.dropped
			rep.ApplyEfficiency()
			return rep, err
		}
	}
	rep.Notes = r.notes
	rep.Machine.CachesDropped = r.dropped
	rep.ApplyEfficiency()
	return rep, nil
}

// points lists the sweep points (threads, clients) in order.
func (r *Runner) points() [][2]int {
	var pts [][2]int
	for _, c := range r.cfg.Clients {
		for _, t := range r.cfg.Threads {
			if c > t {
				continue
			}
			pts = append(pts, [2]int{t, c})
		}
	}
	return pts
}

// Workload runs one workload over the whole sweep.
func (r *Runner) Workload(ctx context.Context, name string) ([]Result, error) {
	var out []Result
	r.calls[name]++
	switch name {
	case "random":
		if !r.cfg.KeepRandomFiles {
			defer r.removeGlob("random.*")
		}
	case "shared":
		if !r.striped {
			r.striped = true
			dir := filepath.Join(r.work, "shared")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			note, err := r.cfg.Striper.StripeAll(sctx, dir, r.cfg.TransferBytes)
			cancel()
			if err != nil {
				r.note("striping the shared file's directory failed: %v", err)
			} else if note != "" {
				r.note("%s", note)
			}
		}
	}
	for _, pt := range r.points() {
		res, err := r.point(ctx, name, pt[0], pt[1])
		out = append(out, res...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// sample is one measured phase.
type sample struct {
	bytes, ops int64
	seconds    float64
	cpuSeconds float64 // user+system of the worker processes
	odirect    bool
	notes      []string
}

func (s sample) value(unit string) float64 {
	switch unit {
	case UnitMiBps:
		return MiBps(s.bytes, s.seconds)
	default:
		return OpsPerSecond(s.ops, s.seconds)
	}
}

// point runs every phase of one workload at one sweep point, Repeat times.
func (r *Runner) point(ctx context.Context, name string, threads, clients int) ([]Result, error) {
	c := &r.cfg
	// Random's files are written once and reused by every point, so
	// they keep the run's nonce; the other workloads write afresh every
	// repeat and get a nonce per write pass.
	base := task{Workload: name, Dir: r.work, TotalThreads: threads, Seed: c.Seed, Nonce: r.nonce}
	var phases []string
	unit := UnitMiBps
	var rec int64
	switch name {
	case "seq":
		phases = []string{"write", "read"}
		rec = c.RecordBytes
		per := c.SeqBytes / int64(threads) / rec * rec
		if per < rec {
			per = rec
		}
		base.FileBytes, base.RecordBytes = per, rec
	case "random":
		phases = []string{"write", "read"}
		unit = UnitIOPS
		rec = c.RandomRecordBytes
		base.FileBytes, base.RecordBytes, base.Runtime, base.ODirect = c.RandomFileBytes/rec*rec, rec, c.RandomRuntime, c.ODirect
		if err := r.layout(ctx, base, threads); err != nil {
			return nil, err
		}
	case "shared":
		phases = []string{"write", "read"}
		rec = c.TransferBytes
		per := c.SharedBytes / int64(threads) / rec * rec
		if per < rec {
			per = rec
		}
		base.Dir = filepath.Join(r.work, "shared")
		base.FileBytes, base.RecordBytes = per, rec
	case "meta":
		phases = []string{"create", "stat", "remove"}
		unit = UnitOpsps
		base.FilesPerDir, base.DirsPerThread, base.MetaSync = c.FilesPerDir, c.DirsPerThread, c.MetaSync
	case "smallfile":
		phases = []string{"create", "read", "remove"}
		unit = UnitOpsps
		rec = c.SmallFileBytes
		base.FileBytes, base.FilesPerThread, base.SharedDir, base.Fsync = c.SmallFileBytes, c.SmallFilesPerThread, c.SmallFileShared, c.SmallFileFsync
	default:
		return nil, fmt.Errorf("unknown workload %q", name)
	}

	samples := make([][]sample, len(phases))
	first := (r.calls[name] - 1) * c.Repeat // repeats run by earlier calls
	for rep := 0; rep < c.Repeat; rep++ {
		nonce := base.Nonce
		if name != "random" {
			r.passes++
			nonce = mix64(r.nonce + r.passes)
		}
		if name == "shared" {
			// A fresh file per repeat, created before the clock starts.
			f, err := os.OpenFile(sharedName(base.Dir), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
			if err != nil {
				return nil, fmt.Errorf("create shared file: %w", err)
			}
			f.Close()
		}
		for i, ph := range phases {
			t := base
			t.Phase = ph
			t.Seed = c.Seed + uint64(first+rep)*7919
			t.Nonce = nonce
			s, err := r.phase(ctx, t, threads, clients, unit)
			if err != nil {
				return r.results(name, phases[:i], samples, threads, clients, unit, rec), err
			}
			samples[i] = append(samples[i], s)
			if err := r.dropCaches(ctx); err != nil {
				r.note("dropping caches failed: %v", err)
			}
		}
		switch name {
		case "seq":
			r.removeGlob("seq.*")
		case "shared":
			os.Remove(sharedName(base.Dir))
		case "meta":
			r.removeGlob("meta.t*")
		case "smallfile":
			r.removeGlob("smallfile*")
		}
	}
	return r.results(name, phases, samples, threads, clients, unit, rec), nil
}

// results turns the samples of each phase into one Result per phase.
func (r *Runner) results(name string, phases []string, samples [][]sample, threads, clients int, unit string, rec int64) []Result {
	var out []Result
	for i, ph := range phases {
		ss := samples[i]
		if len(ss) == 0 {
			continue
		}
		vals := make([]float64, len(ss))
		for k, s := range ss {
			vals[k] = s.value(unit)
		}
		med := Median(vals)
		// The sample closest to the median gives bytes, ops and seconds.
		best := ss[0]
		for _, s := range ss {
			if math.Abs(s.value(unit)-med) < math.Abs(best.value(unit)-med) {
				best = s
			}
		}
		res := Result{
			System: r.cfg.System, Path: r.cfg.Path, FSType: FSType(r.cfg.Path),
			Workload: name, Phase: ph, Threads: threads, Clients: clients,
			Value: med, Unit: unit,
			// Every phase's data is read back and checked by the
			// following phase (a failed check aborts the run before
			// any result is returned for the point).
			Verified: true,
			Bytes:    best.bytes, Ops: best.ops, Seconds: best.seconds, CPUSeconds: best.cpuSeconds,
			Samples: vals, RecordBytes: rec, Notes: best.notes,
		}
		if name == "random" {
			od := best.odirect
			res.ODirect = &od
		}
		if name == "meta" && ph == "create" && r.cfg.MetaSync {
			res.Notes = appendOnce(res.Notes, "fsync after create (mdtest -y)")
		}
		if name == "smallfile" {
			res.Notes = appendOnce(res.Notes, r.smallFileNote())
			if ph == "create" && r.cfg.SmallFileFsync {
				res.Notes = appendOnce(res.Notes, "fsync before each close")
			}
		}
		out = append(out, res)
	}
	return out
}

// smallFileNote says how smallfile was shaped.
func (r *Runner) smallFileNote() string {
	where := "one shared directory"
	if !r.cfg.SmallFileShared {
		where = "a directory per thread"
	}
	return fmt.Sprintf("%d files of %d bytes per thread, %s", r.cfg.SmallFilesPerThread, r.cfg.SmallFileBytes, where)
}

// layout writes the random workload's files that do not exist yet
// (untimed); files are reused across sweep points.
func (r *Runner) layout(ctx context.Context, base task, threads int) error {
	var need []int
	for i := 0; i < threads; i++ {
		st, err := os.Stat(randomName(r.work, i))
		if err == nil && st.Size() == base.FileBytes {
			continue
		}
		need = append(need, i)
	}
	if len(need) == 0 {
		return nil
	}
	t := base
	t.Phase = "layout"
	t.Threads = need
	t.TotalThreads = threads
	if _, err := r.phaseThreads(ctx, t, [][]int{need}, UnitMiBps, fmt.Sprintf("%s random layout %d files", r.cfg.System, len(need)), float64(int64(len(need))*base.FileBytes), false); err != nil {
		return err
	}
	return r.dropCaches(ctx)
}

// phase deals threads to clients round-robin and runs one phase.
func (r *Runner) phase(ctx context.Context, t task, threads, clients int, unit string) (sample, error) {
	split := make([][]int, clients)
	for i := 0; i < threads; i++ {
		split[i%clients] = append(split[i%clients], i)
	}
	label := fmt.Sprintf("%s %s %s t=%d c=%d", r.cfg.System, t.Workload, t.Phase, threads, clients)
	var total float64
	byTime := false
	switch {
	case t.Workload == "random":
		total, byTime = t.Runtime.Seconds(), true
	case t.Workload == "meta":
		total = float64(threads * t.FilesPerDir * t.DirsPerThread)
	case t.Workload == "smallfile":
		total = float64(threads * t.FilesPerThread)
	default:
		total = float64(int64(threads) * t.FileBytes)
	}
	s, err := r.phaseThreads(ctx, t, split, unit, label, total, byTime)
	if err == nil {
		r.prog.end(fmt.Sprintf("%.1f %s", s.value(unit), unit))
	} else {
		r.prog.end("FAILED")
	}
	return s, err
}

// startLead is how far ahead of the go lines the common start instant is.
const startLead = 30 * time.Millisecond

// phaseThreads starts one worker per element of split, runs the
// ready/go barrier and aggregates the per-thread times.
func (r *Runner) phaseThreads(ctx context.Context, t task, split [][]int, unit, label string, total float64, byTime bool) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout+t.Runtime)
	defer cancel()
	r.prog.begin(label, total, byTime)

	type worker struct {
		cmd    *exec.Cmd
		stdin  *os.File
		lines  chan string
		stderr lockedBuffer
		done   int64 // last progress, bytes or ops
	}
	ws := make([]*worker, len(split))
	var wg sync.WaitGroup
	defer func() {
		for _, w := range ws {
			if w == nil {
				continue
			}
			w.stdin.Close()
			if w.cmd.Process != nil {
				w.cmd.Process.Kill()
			}
		}
		wg.Wait()
		for _, w := range ws {
			if w != nil && w.cmd.Process != nil && w.cmd.ProcessState == nil {
				w.cmd.Wait()
			}
		}
	}()
	for i, threads := range split {
		tt := t
		tt.Threads = threads
		cmd := exec.Command(r.cfg.WorkerCommand[0], r.cfg.WorkerCommand[1:]...)
		cmd.Env = append(os.Environ(), r.cfg.WorkerEnv...)
		w := &worker{cmd: cmd, lines: make(chan string, 64)}
		cmd.Stderr = &w.stderr
		pr, pw, err := os.Pipe()
		if err != nil {
			return sample{}, err
		}
		cmd.Stdin = pr
		w.stdin = pw
		out, err := cmd.StdoutPipe()
		if err != nil {
			pr.Close()
			pw.Close()
			return sample{}, err
		}
		if err := cmd.Start(); err != nil {
			pr.Close()
			pw.Close()
			return sample{}, fmt.Errorf("start worker %v: %w", r.cfg.WorkerCommand, err)
		}
		pr.Close()
		ws[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(w.lines)
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				w.lines <- sc.Text()
			}
		}()
		b, _ := json.Marshal(tt)
		if _, err := pw.Write(append(b, '\n')); err != nil {
			return sample{}, fmt.Errorf("send task: %w", err)
		}
	}
	workerErr := func(i int, msg string) error {
		w := ws[i]
		se := strings.TrimSpace(w.stderr.String())
		if se != "" {
			msg += " (stderr: " + se + ")"
		}
		return fmt.Errorf("%s: client %d: %s", label, i, msg)
	}
	// next reads one protocol line of worker i, updating progress.
	results := make([]*workerResult, len(ws))
	next := func(i int) (string, error) {
		w := ws[i]
		for {
			select {
			case <-ctx.Done():
				return "", workerErr(i, fmt.Sprintf("timed out or cancelled: %v", ctx.Err()))
			case line, ok := <-w.lines:
				if !ok {
					return "", workerErr(i, "worker exited without a result")
				}
				if rest, ok := strings.CutPrefix(line, "progress "); ok {
					f := strings.Fields(rest)
					if len(f) == 2 {
						b, _ := strconv.ParseInt(f[0], 10, 64)
						o, _ := strconv.ParseInt(f[1], 10, 64)
						if t.Workload == "meta" || t.Workload == "smallfile" {
							w.done = o
						} else {
							w.done = b
						}
						var sum int64
						for _, x := range ws {
							sum += x.done
						}
						r.prog.update(float64(sum))
					}
					continue
				}
				if rest, ok := strings.CutPrefix(line, "result "); ok {
					var res workerResult
					if err := json.Unmarshal([]byte(rest), &res); err != nil {
						return "", workerErr(i, "bad result: "+err.Error())
					}
					results[i] = &res
					return "result", nil
				}
				return line, nil
			}
		}
	}
	// Barrier: every worker ready, then go to all.
	for i := range ws {
		line, err := next(i)
		if err != nil {
			return sample{}, err
		}
		if line == "result" {
			return sample{}, r.failure(workerErr(i, results[i].Err), results[i])
		}
		if line != "ready" {
			return sample{}, workerErr(i, fmt.Sprintf("unexpected %q", line))
		}
	}
	// One start instant for every thread of every worker (see the start
	// barrier in worker.go): far enough ahead that every worker has read
	// its go line on a busy machine.
	goLine := []byte(fmt.Sprintf("go %d\n", monotonicNow()+int64(startLead)))
	for i, w := range ws {
		if _, err := w.stdin.Write(goLine); err != nil {
			return sample{}, workerErr(i, "send go: "+err.Error())
		}
	}
	// Collect progress while waiting; the slowest worker bounds the wait.
	for i := range ws {
		for results[i] == nil {
			line, err := next(i)
			if err != nil {
				return sample{}, err
			}
			if line != "result" {
				return sample{}, workerErr(i, fmt.Sprintf("unexpected %q", line))
			}
		}
		if results[i].Err != "" {
			return sample{}, r.failure(workerErr(i, results[i].Err), results[i])
		}
	}
	var s sample
	// The workers exit after their result; their rusage is the phase's
	// client-side CPU cost. Bounded: on a timeout the deferred kill and
	// wait run instead.
	for _, w := range ws {
		w.stdin.Close()
	}
	readersDone := make(chan struct{})
	go func() { wg.Wait(); close(readersDone) }()
	select {
	case <-readersDone: // every worker closed its stdout: exiting or gone
		for _, w := range ws {
			w.cmd.Wait()
			if ru, ok := w.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				s.cpuSeconds += rusageSeconds(ru)
			}
		}
	case <-time.After(10 * time.Second):
	}
	s.odirect = true
	var start, end int64 = math.MaxInt64, 0
	for _, res := range results {
		if !res.ODirect {
			s.odirect = false
		}
		for _, n := range res.Notes {
			s.notes = appendOnce(s.notes, n)
		}
		for _, th := range res.Threads {
			start = min(start, th.StartNs)
			end = max(end, th.EndNs)
			s.bytes += th.Bytes
			s.ops += th.Ops
		}
	}
	if end > start {
		s.seconds = float64(end-start) / 1e9
	}
	return s, nil
}

// rusageSeconds is user+system time.
func rusageSeconds(ru *syscall.Rusage) float64 {
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// failure wraps a worker's error, marking verification failures loudly.
func (r *Runner) failure(err error, res *workerResult) error {
	if res != nil && res.Corrupt {
		r.prog.note("VERIFICATION FAILED on %s: %v", r.cfg.System, err)
		return corruptError{err}
	}
	return err
}

// corruptError is a worker's verification failure (its text already says
// so), recognised by errors.Is(err, ErrCorrupt).
type corruptError struct{ error }

func (corruptError) Is(target error) bool { return target == ErrCorrupt }

// lockedBuffer collects a worker's stderr while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 {
		return len(p), nil // keep the beginning; bounded memory
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// dropCaches writes back dirty data and drops the page cache (root only),
// then the file system's own caches.
func (r *Runner) dropCaches(ctx context.Context) error {
	var errs []error
	unix.Sync()
	if os.Geteuid() == 0 {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
			errs = append(errs, err)
		} else {
			r.dropped = true
		}
	}
	if r.cfg.Caches != nil {
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		errs = append(errs, r.cfg.Caches.DropCaches(dctx))
		cancel()
	}
	return errors.Join(errs...)
}

func (r *Runner) removeGlob(pattern string) {
	names, _ := filepath.Glob(filepath.Join(r.work, pattern))
	for _, n := range names {
		os.RemoveAll(n)
	}
}
