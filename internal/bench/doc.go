// Package bench is Strata's benchmark harness: the HPC storage studies'
// methodology (IOzone N-to-N, IOzone random, IOR N-to-1, mdtest) and
// IO500's small-file phases run against any mounted path, with results as a
// table, JSON, plots and an HTML report.
//
// # Concepts
//
// A run is a sweep: for every workload (seq, random, shared, meta,
// smallfile), for every point (threads, clients) of the sweep, a sequence of
// phases (write then read; create, stat, remove; or, for smallfile, create
// = create+write+close of a 3,901-byte file, read = stat+open+read+check+
// close, remove). Every phase is executed by fresh worker
// processes (the strata binary re-executed with the hidden `bench worker`
// subcommand, or the test binary in tests), so that the process that reads a
// file is never the process that wrote it, and the page cache is dropped
// between phases when the harness runs as root. Threads inside a worker are
// goroutines locked to OS threads, each issuing blocking system calls, with
// one P (GOMAXPROCS) per thread; all threads of all workers start at one
// instant of the monotonic clock (see worker.go, the start barrier).
//
// A phase's aggregate rate is the phase's bytes (or operations) divided by
// the span from the earliest thread start to the latest thread end, as IOR
// computes it; with --repeat N the reported value is the median of N samples.
// The workers' user+system CPU time is recorded beside it (cpu_seconds).
//
// The streaming phases issue fio's psync system calls call for call: open,
// posix_fadvise DONTNEED and SEQUENTIAL, one pwrite/pread of a whole record
// into one reused page-aligned buffer, fsync; `strata bench calibrate`
// compares the two on the same directory (the overhead bar: within 10%).
//
// # Verification
//
// Every byte written is a function of (file id, run nonce, offset) — see
// pattern.go — and every byte read is checked against it. A mismatch is an error naming
// the file and the offset; it fails the run. A broken file system cannot post
// a fast number.
//
// # Output contract
//
// The JSON file is read by other tools: a top-level object with "machine"
// and "results"; each result has workload, phase, threads, clients, value,
// unit and verified (see Result). Fields may be added, never renamed.
//
// # Pitfalls
//
//   - Rates from a run that was not root were measured with a warm page cache
//     for reads; the machine record says so (caches_dropped=false).
//   - O_DIRECT is refused with EINVAL by some FUSE file systems; the random
//     workload then runs buffered and records odirect=false with a note.
//   - A worker must have a P for every benchmark thread. With GOMAXPROCS at
//     the core count (2) and 4 threads, a thread returning from a blocking
//     pwrite finds no P and parks until the scheduler's sysmon retakes one
//     from a thread still inside its system call; the worker sets
//     GOMAXPROCS to threads+1.
//   - Short phases on fast file systems (tmpfs: 2 GiB in 0.15 s) are
//     dominated by start skew unless every thread starts at one instant.
package bench
