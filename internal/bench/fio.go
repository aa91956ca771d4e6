package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FioJobs is the job count of every fio measurement: the bars compare the
// harness at 4 threads with fio at 4 jobs.
const FioJobs = 4

// fioResult is the part of fio's JSON output used here.
type fioResult struct {
	Jobs []struct {
		Read  fioStats `json:"read"`
		Write fioStats `json:"write"`
	} `json:"jobs"`
}

type fioStats struct {
	IOBytes int64   `json:"io_bytes"`
	BWBytes float64 `json:"bw_bytes"`
	IOPS    float64 `json:"iops"`
	Runtime int64   `json:"runtime"` // ms

	// cpuSeconds is user+system of the fio process and its jobs (from
	// wait4), set by runFio.
	cpuSeconds float64
}

// runFio runs one fio job group in dir and returns its aggregate stats.
func runFio(ctx context.Context, dir string, args ...string) (fioStats, error) {
	base := []string{"--directory=" + dir, "--numjobs=" + strconv.Itoa(FioJobs), "--group_reporting",
		"--output-format=json", "--ioengine=psync",
		// The harness writes into fresh files without preallocating them,
		// as IOzone does; fio's default (fallocate=native) would not.
		"--fallocate=none",
		// Each job drops its file's cached pages before starting (the
		// default, stated because the harness does the same).
		"--invalidate=1"}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fio", append(base, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fioStats{}, fmt.Errorf("fio %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	// fio may print warnings before the JSON document.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var res fioResult
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		return fioStats{}, fmt.Errorf("fio: unreadable output: %v", err)
	}
	j := res.Jobs[0]
	st := j.Read
	if j.Write.IOBytes > 0 {
		st = j.Write
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		st.cpuSeconds = rusageSeconds(ru)
	}
	return st, nil
}

func fioVersion() string {
	out, err := exec.Command("fio", "--version").Output()
	if err != nil {
		return "fio"
	}
	return strings.TrimSpace(string(out))
}

// MeasureLimit measures the raw limit of dir with fio: sequential 1 MiB
// write (end_fsync) and read (after dropping the page cache), and random
// 4 KiB O_DIRECT write and read, FioJobs jobs each. bytesPerJob sizes the
// sequential files; runtime bounds the random runs.
func MeasureLimit(ctx context.Context, dir string, bytesPerJob int64, runtime time.Duration, prog *progress) (*Limit, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed")
	}
	if prog == nil {
		prog = newProgress(nil)
	}
	tmp, err := os.MkdirTemp(dir, "strata-fio.")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	lim := &Limit{Tool: fioVersion(), Directory: dir,
		Pattern: fmt.Sprintf("%d jobs, psync; seq: %s per job, bs=1M, end_fsync, page cache dropped before read; random: bs=4k, direct=1, %s per job, %s",
			FioJobs, FormatSize(bytesPerJob), FormatSize(bytesPerJob), runtime)}
	size := "--size=" + strconv.FormatInt(bytesPerJob, 10)
	rt := "--runtime=" + strconv.FormatFloat(runtime.Seconds(), 'f', 3, 64) + "s"
	steps := []struct {
		label string
		args  []string
		dst   *float64
		iops  bool
	}{
		{"fio seq write", []string{"--name=seq", "--rw=write", "--bs=1M", size, "--end_fsync=1"}, &lim.SeqWriteMiBps, false},
		{"fio seq read", []string{"--name=seq", "--rw=read", "--bs=1M", size}, &lim.SeqReadMiBps, false},
		{"fio random write", []string{"--name=rand", "--rw=randwrite", "--bs=4k", size, "--direct=1", "--time_based", rt}, &lim.RandWriteIOPS, true},
		{"fio random read", []string{"--name=rand", "--rw=randread", "--bs=4k", size, "--direct=1", "--time_based", rt}, &lim.RandReadIOPS, true},
	}
	for _, s := range steps {
		dropPageCache()
		prog.begin(s.label+" "+dir, 0, false)
		st, err := runFio(ctx, tmp, s.args...)
		if err != nil {
			prog.end("FAILED")
			return nil, err
		}
		if s.iops {
			*s.dst = st.IOPS
			prog.end(fmt.Sprintf("%.0f IOPS", st.IOPS))
		} else {
			*s.dst = st.BWBytes / (1 << 20)
			prog.end(fmt.Sprintf("%.1f MiB/s", *s.dst))
		}
	}
	if os.Geteuid() != 0 {
		lim.Notes = append(lim.Notes, "not root: page cache not dropped before the read")
	}
	return lim, nil
}

// dropPageCache writes back and drops the page cache when root.
func dropPageCache() bool {
	unix.Sync()
	if os.Geteuid() != 0 {
		return false
	}
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200) == nil
}

// Calibration compares the harness's seq workload with fio's identical
// pattern on the same directory, in the same run: FioJobs threads, 1 MiB
// records, psync, fsync at the end, page cache dropped before every phase.
type Calibration struct {
	Directory   string `json:"directory"`
	Jobs        int    `json:"jobs"`
	Clients     int    `json:"clients"` // harness worker processes (fio: one per job)
	BytesPerJob int64  `json:"bytes_per_job"`
	Rounds      int    `json:"rounds"`
	// Medians and the ratios of the medians (harness ÷ fio).
	FioWriteMiBps   float64 `json:"fio_write_mib_s"`
	FioReadMiBps    float64 `json:"fio_read_mib_s"`
	BenchWriteMiBps float64 `json:"bench_write_mib_s"`
	BenchReadMiBps  float64 `json:"bench_read_mib_s"`
	WriteRatio      float64 `json:"write_ratio"`
	ReadRatio       float64 `json:"read_ratio"`
	// Medians of the per-round ratios: each round's harness and fio ran
	// back to back, so these cancel drift of a shared machine better.
	WriteRatioPaired float64 `json:"write_ratio_paired"`
	ReadRatioPaired  float64 `json:"read_ratio_paired"`
	// CPU seconds (user+system, whole processes) per GiB moved, medians:
	// the harness's own cost beside fio's, which a busy machine disturbs
	// far less than it disturbs throughput.
	FioWriteCPUPerGiB   float64 `json:"fio_write_cpu_s_per_gib"`
	FioReadCPUPerGiB    float64 `json:"fio_read_cpu_s_per_gib"`
	BenchWriteCPUPerGiB float64 `json:"bench_write_cpu_s_per_gib"`
	BenchReadCPUPerGiB  float64 `json:"bench_read_cpu_s_per_gib"`
	// Samples in round order; FioFirst[i] says which tool ran first.
	FioWrite   []float64 `json:"fio_write_samples"`
	FioRead    []float64 `json:"fio_read_samples"`
	BenchWrite []float64 `json:"bench_write_samples"`
	BenchRead  []float64 `json:"bench_read_samples"`
	FioFirst   []bool    `json:"fio_first"`

	fioWriteCPU, fioReadCPU, benchWriteCPU, benchReadCPU []float64
}

// Calibrate runs fio and the harness's seq workload rounds times on
// cfg.Path, alternating which goes first, and reports medians. Both see the
// same state: fresh files for every write phase, no preallocation, the page
// cache dropped (when root) before every phase and the file's pages
// invalidated at open (fio's invalidate=1, posix_fadvise DONTNEED in the
// harness), the same file size per job, 1 MiB pwrite/pread, fsync at the
// end inside the timing. The harness runs its FioJobs threads in clients
// worker processes (FioJobs = one process per thread, as fio's jobs are).
// cfg supplies the worker command.
func Calibrate(ctx context.Context, cfg Config, bytesPerJob int64, rounds, clients int) (*Calibration, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed")
	}
	if clients < 1 || clients > FioJobs {
		return nil, fmt.Errorf("calibrate: clients %d, want 1..%d", clients, FioJobs)
	}
	cfg.Workloads = []string{"seq"}
	cfg.Threads = []int{FioJobs}
	cfg.Clients = []int{clients}
	cfg.Repeat = 1
	cfg.SeqBytes = bytesPerJob * FioJobs
	cfg.Fio = false
	if cfg.System == "" {
		cfg.System = "harness"
	}
	r, err := NewRunner(cfg)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	c := &Calibration{Directory: cfg.Path, Jobs: FioJobs, Clients: clients, BytesPerJob: bytesPerJob, Rounds: rounds}
	tmp := filepath.Join(r.work, "fio")
	size := "--size=" + strconv.FormatInt(bytesPerJob, 10)
	runFioRound := func() error {
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		for _, ph := range []struct {
			label    string
			args     []string
			dst, cpu *[]float64
		}{
			{"calibrate: fio seq write", []string{"--name=seq", "--rw=write", "--bs=1M", size, "--end_fsync=1"}, &c.FioWrite, &c.fioWriteCPU},
			{"calibrate: fio seq read", []string{"--name=seq", "--rw=read", "--bs=1M", size}, &c.FioRead, &c.fioReadCPU},
		} {
			dropPageCache()
			r.prog.begin(ph.label, 0, false)
			st, err := runFio(ctx, tmp, ph.args...)
			if err != nil {
				r.prog.end("FAILED")
				return err
			}
			v := st.BWBytes / (1 << 20)
			r.prog.end(fmt.Sprintf("%.1f MiB/s", v))
			*ph.dst = append(*ph.dst, v)
			*ph.cpu = append(*ph.cpu, st.cpuSeconds/(float64(st.IOBytes)/(1<<30)))
		}
		return nil
	}
	runHarnessRound := func() error {
		dropPageCache() // the runner drops again between write and read
		res, err := r.Workload(ctx, "seq")
		if err != nil {
			return err
		}
		for _, x := range res {
			cpu := x.CPUSeconds / (float64(x.Bytes) / (1 << 30))
			if x.Phase == "write" {
				c.BenchWrite = append(c.BenchWrite, x.Value)
				c.benchWriteCPU = append(c.benchWriteCPU, cpu)
			} else {
				c.BenchRead = append(c.BenchRead, x.Value)
				c.benchReadCPU = append(c.benchReadCPU, cpu)
			}
		}
		return nil
	}
	for i := 0; i < rounds; i++ {
		// Alternate the order so that neither tool always follows the
		// other's file deletion (ext4 discards) or write-back.
		fioFirst := i%2 == 0
		c.FioFirst = append(c.FioFirst, fioFirst)
		first, second := runFioRound, runHarnessRound
		if !fioFirst {
			first, second = second, first
		}
		if err := first(); err != nil {
			return nil, err
		}
		if err := second(); err != nil {
			return nil, err
		}
	}
	c.FioWriteMiBps, c.FioReadMiBps = Median(c.FioWrite), Median(c.FioRead)
	c.BenchWriteMiBps, c.BenchReadMiBps = Median(c.BenchWrite), Median(c.BenchRead)
	c.WriteRatio = Efficiency(c.BenchWriteMiBps, c.FioWriteMiBps)
	c.ReadRatio = Efficiency(c.BenchReadMiBps, c.FioReadMiBps)
	c.FioWriteCPUPerGiB, c.FioReadCPUPerGiB = Median(c.fioWriteCPU), Median(c.fioReadCPU)
	c.BenchWriteCPUPerGiB, c.BenchReadCPUPerGiB = Median(c.benchWriteCPU), Median(c.benchReadCPU)
	c.WriteRatioPaired = pairedRatio(c.BenchWrite, c.FioWrite)
	c.ReadRatioPaired = pairedRatio(c.BenchRead, c.FioRead)
	return c, nil
}

// pairedRatio is the median of a[i] ÷ b[i].
func pairedRatio(a, b []float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return Median(rs)
}
