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
}

// runFio runs one fio job group in dir and returns its aggregate stats.
func runFio(ctx context.Context, dir string, args ...string) (fioStats, error) {
	base := []string{"--directory=" + dir, "--numjobs=" + strconv.Itoa(FioJobs), "--group_reporting",
		"--output-format=json", "--ioengine=psync",
		// The harness writes into fresh files without preallocating them,
		// as IOzone does; fio's default (fallocate=native) would not.
		"--fallocate=none"}
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
	if j.Write.IOBytes > 0 {
		return j.Write, nil
	}
	return j.Read, nil
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
// records, psync, fsync at the end, page cache dropped before reading.
type Calibration struct {
	Directory       string    `json:"directory"`
	Jobs            int       `json:"jobs"`
	BytesPerJob     int64     `json:"bytes_per_job"`
	Rounds          int       `json:"rounds"`
	FioWriteMiBps   float64   `json:"fio_write_mib_s"`
	FioReadMiBps    float64   `json:"fio_read_mib_s"`
	BenchWriteMiBps float64   `json:"bench_write_mib_s"`
	BenchReadMiBps  float64   `json:"bench_read_mib_s"`
	WriteRatio      float64   `json:"write_ratio"` // bench ÷ fio
	ReadRatio       float64   `json:"read_ratio"`
	FioWrite        []float64 `json:"fio_write_samples"`
	FioRead         []float64 `json:"fio_read_samples"`
	BenchWrite      []float64 `json:"bench_write_samples"`
	BenchRead       []float64 `json:"bench_read_samples"`
}

// Calibrate alternates fio and the harness's seq workload rounds times on
// cfg.Path and reports the medians. cfg supplies the worker command.
func Calibrate(ctx context.Context, cfg Config, bytesPerJob int64, rounds int) (*Calibration, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed")
	}
	cfg.Workloads = []string{"seq"}
	cfg.Threads = []int{FioJobs}
	cfg.Clients = []int{1}
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
	c := &Calibration{Directory: cfg.Path, Jobs: FioJobs, BytesPerJob: bytesPerJob, Rounds: rounds}
	tmp := filepath.Join(r.work, "fio")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	size := "--size=" + strconv.FormatInt(bytesPerJob, 10)
	for i := 0; i < rounds; i++ {
		dropPageCache()
		r.prog.begin("calibrate: fio seq write", 0, false)
		w, err := runFio(ctx, tmp, "--name=seq", "--rw=write", "--bs=1M", size, "--end_fsync=1")
		if err != nil {
			return nil, err
		}
		r.prog.end(fmt.Sprintf("%.1f MiB/s", w.BWBytes/(1<<20)))
		dropPageCache()
		r.prog.begin("calibrate: fio seq read", 0, false)
		rd, err := runFio(ctx, tmp, "--name=seq", "--rw=read", "--bs=1M", size)
		if err != nil {
			return nil, err
		}
		r.prog.end(fmt.Sprintf("%.1f MiB/s", rd.BWBytes/(1<<20)))
		os.RemoveAll(tmp)
		os.MkdirAll(tmp, 0o755)
		c.FioWrite = append(c.FioWrite, w.BWBytes/(1<<20))
		c.FioRead = append(c.FioRead, rd.BWBytes/(1<<20))

		dropPageCache()
		res, err := r.Workload(ctx, "seq")
		if err != nil {
			return nil, err
		}
		for _, x := range res {
			if x.Phase == "write" {
				c.BenchWrite = append(c.BenchWrite, x.Value)
			} else {
				c.BenchRead = append(c.BenchRead, x.Value)
			}
		}
	}
	c.FioWriteMiBps, c.FioReadMiBps = Median(c.FioWrite), Median(c.FioRead)
	c.BenchWriteMiBps, c.BenchReadMiBps = Median(c.BenchWrite), Median(c.BenchRead)
	c.WriteRatio = Efficiency(c.BenchWriteMiBps, c.FioWriteMiBps)
	c.ReadRatio = Efficiency(c.BenchReadMiBps, c.FioReadMiBps)
	return c, nil
}
