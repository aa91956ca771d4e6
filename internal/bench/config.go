package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Workloads in the order a suite runs them.
var Workloads = []string{"seq", "random", "shared", "meta", "smallfile"}

// Config is one benchmark run. Sizes are bytes.
type Config struct {
	// Path is the directory benchmarked; the harness works in a
	// subdirectory of it and removes it afterwards.
	Path string
	// System labels the results ("local", "glusterfs", a run name).
	System string
	// Workloads to run, a subset of Workloads.
	Workloads []string
	// Threads is the sweep of total thread counts; Clients the sweep of
	// client process counts (threads are dealt round-robin to clients; a
	// point with more clients than threads is skipped).
	Threads []int
	Clients []int
	// Repeat runs every phase this many times; the value is the median.
	Repeat int
	// KeepRandomFiles leaves the random workload's files in place when
	// Workload returns, for a caller that runs it again (peers' repeats,
	// interleaved over the systems); Close removes them.
	KeepRandomFiles bool

	// SeqBytes is the total data of seq, split evenly across threads
	// (IOzone N-to-N, 1 MiB records).
	SeqBytes    int64
	RecordBytes int64
	// RandomFileBytes is each thread's file for random; RandomRuntime the
	// duration of each random phase; RandomRecordBytes the I/O size.
	RandomFileBytes   int64
	RandomRuntime     time.Duration
	RandomRecordBytes int64
	// ODirect asks for O_DIRECT in random (falls back when refused).
	ODirect bool
	// SharedBytes is the size of the N-to-1 file; TransferBytes the size
	// of each write and read (IOR -t).
	SharedBytes   int64
	TransferBytes int64
	// FilesPerDir and DirsPerThread shape meta (mdtest -I and -u);
	// MetaSync fsyncs every created file (mdtest -y).
	FilesPerDir   int
	DirsPerThread int
	MetaSync      bool
	// SmallFileBytes and SmallFilesPerThread shape smallfile (IO500's
	// mdtest-hard: 3,901-byte files); SmallFileShared puts every thread's
	// files in one directory (else a directory per thread);
	// SmallFileFsync fsyncs each file before its close (the durable
	// baseline of a local directory).
	SmallFileBytes      int64
	SmallFilesPerThread int
	SmallFileShared     bool
	SmallFileFsync      bool

	// Seed drives the random offsets and the stat order.
	Seed uint64
	// PhaseTimeout bounds every phase (worker start to last result).
	PhaseTimeout time.Duration

	// Fio measures the raw limit of LimitDir (default: see LimitDir: the
	// disk under Path, also when Path is a Strata mount) with fio
	// before the suite when fio is installed.
	Fio        bool
	LimitDir   string
	FioBytes   int64         // per fio job, sequential
	FioRuntime time.Duration // random fio jobs

	// WorkerCommand starts a worker process (the strata binary with the
	// hidden `bench worker` subcommand); WorkerEnv is added to its
	// environment.
	WorkerCommand []string
	WorkerEnv     []string

	// Progress receives progress lines (normally os.Stderr); nil = quiet.
	Progress io.Writer
	// Caches drops the caches of the file system under test between phases
	// beyond the kernel page cache (e.g. Strata's server caches). Nil = none.
	Caches CacheDropper
	// Striper prepares the shared file's directory (Strata: stripe over all
	// targets). Nil = DefaultStriper.
	Striper Striper
}

// CacheDropper empties a file system's own caches between phases.
// DropCaches is called by the runner only, between phases, never
// concurrently; it must return within ctx's deadline.
type CacheDropper interface {
	DropCaches(ctx context.Context) error
}

// Striper sets the layout of the directory that will hold the N-to-1 file.
// It returns a note for the report (empty when nothing was done).
type Striper interface {
	StripeAll(ctx context.Context, dir string, stripeBytes int64) (note string, err error)
}

// DefaultConfig is the full suite: the seeds' methodology sized for one
// machine.
func DefaultConfig() Config {
	return Config{
		System:            "",
		Workloads:         append([]string(nil), Workloads...),
		Threads:           []int{1, 2, 4},
		Clients:           []int{1},
		Repeat:            1,
		SeqBytes:          2 << 30,
		RecordBytes:       1 << 20,
		RandomFileBytes:   1 << 30,
		RandomRuntime:     15 * time.Second,
		RandomRecordBytes: 4 << 10,
		ODirect:           true,
		SharedBytes:       2 << 30,
		TransferBytes:     4 << 20,
		FilesPerDir:       1000,
		DirsPerThread:     5,
		MetaSync:          true,
		SmallFileBytes:    3901,
		// 2,000 files per thread: about 20 s per phase at Strata's
		// slowest (sync policy, 4 threads), well under a second locally.
		SmallFilesPerThread: 2000,
		SmallFileShared:     true,
		Seed:                1,
		PhaseTimeout:        15 * time.Minute,
		Fio:                 true,
		FioBytes:            512 << 20,
		FioRuntime:          10 * time.Second,
	}
}

// QuickConfig is the smoke-test suite: under a minute on a laptop.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Threads = []int{1, 2}
	c.SeqBytes = 128 << 20
	c.RandomFileBytes = 16 << 20
	c.RandomRuntime = time.Second
	c.SharedBytes = 64 << 20
	c.FilesPerDir = 250
	c.DirsPerThread = 2
	c.SmallFilesPerThread = 250
	c.FioBytes = 64 << 20
	c.FioRuntime = time.Second
	c.PhaseTimeout = 2 * time.Minute
	return c
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Path == "" {
		bad("no path to benchmark")
	}
	known := map[string]bool{}
	for _, w := range Workloads {
		known[w] = true
	}
	if len(c.Workloads) == 0 {
		bad("no workloads")
	}
	for _, w := range c.Workloads {
		if !known[w] {
			bad("unknown workload %q (want %s)", w, strings.Join(Workloads, ", "))
		}
	}
	if len(c.Threads) == 0 {
		bad("empty thread sweep")
	}
	if len(c.Clients) == 0 {
		bad("empty client sweep")
	}
	for _, n := range append(append([]int(nil), c.Threads...), c.Clients...) {
		if n < 1 {
			bad("thread and client counts must be >= 1, got %d", n)
		}
	}
	if c.Repeat < 1 {
		bad("repeat must be >= 1")
	}
	if c.RecordBytes < 1 || c.RandomRecordBytes < 1 || c.TransferBytes < 1 {
		bad("record and transfer sizes must be positive")
	}
	if c.RandomRecordBytes%512 != 0 {
		bad("random record size %d is not a multiple of 512 (O_DIRECT)", c.RandomRecordBytes)
	}
	if c.SeqBytes < c.RecordBytes {
		bad("seq size %d below one record", c.SeqBytes)
	}
	if c.RandomFileBytes < c.RandomRecordBytes {
		bad("random file size %d below one record", c.RandomFileBytes)
	}
	if c.SharedBytes < c.TransferBytes {
		bad("shared size %d below one transfer", c.SharedBytes)
	}
	if c.RandomRuntime <= 0 {
		bad("random runtime must be positive")
	}
	if c.FilesPerDir < 1 || c.DirsPerThread < 1 {
		bad("files per dir and dirs per thread must be >= 1")
	}
	if c.SmallFilesPerThread < 1 || c.SmallFileBytes < 0 {
		bad("smallfile: files per thread must be >= 1 and the file size >= 0")
	}
	if c.PhaseTimeout <= 0 {
		bad("phase timeout must be positive")
	}
	if len(c.WorkerCommand) == 0 {
		bad("no worker command")
	}
	return errors.Join(errs...)
}
