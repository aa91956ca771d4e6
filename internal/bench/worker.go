package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The worker protocol. The runner starts one worker process per client and
// talks to it over its stdin and stdout, one line per message:
//
//	runner -> worker   {task JSON}        what to do
//	worker -> runner   ready              files opened, directories made
//	runner -> worker   go                 start the clock
//	worker -> runner   progress B O       bytes and ops so far (every 250 ms)
//	worker -> runner   result {JSON}      per-thread times and counts, or the error
//
// The ready/go barrier keeps process start-up and file opening out of the
// timing and starts all clients together.

// task is one phase for one client process.
type task struct {
	Workload      string        `json:"workload"`
	Phase         string        `json:"phase"` // write, read, layout, create, stat, remove
	Dir           string        `json:"dir"`
	Threads       []int         `json:"threads"` // global thread indices run by this client
	TotalThreads  int           `json:"total_threads"`
	RecordBytes   int64         `json:"record_bytes"`
	FileBytes     int64         `json:"file_bytes"` // per thread: seq file, random file, shared block
	Runtime       time.Duration `json:"runtime"`
	ODirect       bool          `json:"odirect"`
	FilesPerDir   int           `json:"files_per_dir"`
	DirsPerThread int           `json:"dirs_per_thread"`
	MetaSync      bool          `json:"meta_sync"`
	// FilesPerThread, SharedDir and Fsync shape smallfile (whose
	// FileBytes is each file's size).
	FilesPerThread int    `json:"files_per_thread,omitempty"`
	SharedDir      bool   `json:"shared_dir,omitempty"`
	Fsync          bool   `json:"fsync,omitempty"`
	Seed           uint64 `json:"seed"`
	// Nonce is the data pattern's run nonce: the writer's, passed on to
	// the readers of the same data (see pattern.go).
	Nonce uint64 `json:"nonce"`
}

type threadResult struct {
	Thread  int   `json:"thread"`
	StartNs int64 `json:"start_ns"`
	EndNs   int64 `json:"end_ns"`
	Bytes   int64 `json:"bytes"`
	Ops     int64 `json:"ops"`
}

type workerResult struct {
	Threads []threadResult `json:"threads"`
	ODirect bool           `json:"odirect"`
	Notes   []string       `json:"notes,omitempty"`
	Err     string         `json:"err,omitempty"`
	Corrupt bool           `json:"corrupt,omitempty"`
}

// File ids of the pattern, one range per workload.
const (
	seqFileBase    = 1 << 32
	randomFileBase = 2 << 32
	sharedFileID   = 3 << 32
	smallFileBase  = 4 << 32 // + thread; file k of a thread sits at offset k*smallSlot(size)
)

func seqName(dir string, i int) string    { return filepath.Join(dir, fmt.Sprintf("seq.%d", i)) }
func randomName(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("random.%d", i)) }
func sharedName(dir string) string        { return filepath.Join(dir, "shared.dat") }
func metaDir(dir string, thread, d int) string {
	return filepath.Join(dir, fmt.Sprintf("meta.t%d", thread), fmt.Sprintf("d%d", d))
}

// smallName is file k of thread th of smallfile: in the shared directory
// "smallfile" or in the thread's own "smallfile.tTH".
func smallName(dir string, shared bool, th, k int) string {
	if shared {
		return filepath.Join(dir, "smallfile", fmt.Sprintf("t%d.f%d", th, k))
	}
	return filepath.Join(dir, fmt.Sprintf("smallfile.t%d", th), fmt.Sprintf("f%d", k))
}

// WorkerMain runs one worker: it reads a task from in, executes it and
// writes the result to out. The strata binary calls it from its hidden
// `bench worker` subcommand; tests call it from TestMain.
func WorkerMain(in io.Reader, out io.Writer) error {
	r := bufio.NewReader(in)
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("read task: %w", err)
	}
	var t task
	if err := json.Unmarshal([]byte(line), &t); err != nil {
		return fmt.Errorf("parse task: %w", err)
	}
	// One P per benchmark thread (plus one for the protocol): a thread
	// that returns from a blocking pwrite must get its P back at once, as
	// a fio job process would. With GOMAXPROCS = cores (2 here) and 4
	// threads, half the returning threads parked until sysmon retook a P
	// from a thread still in its system call (see doc.go, Pitfalls).
	if n := len(t.Threads) + 1; n > runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
	if dir := os.Getenv(ProfileEnv); dir != "" {
		stop, err := startProfile(dir, &t)
		if err != nil {
			return err
		}
		defer stop()
	}
	var outMu sync.Mutex
	send := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(out, format+"\n", args...)
		outMu.Unlock()
	}
	res := runTask(&t, r, send)
	b, _ := json.Marshal(res)
	send("result %s", b)
	if res.Err != "" {
		return errors.New(res.Err)
	}
	return nil
}

// The start barrier. Sending "go" to the workers one after another and
// letting each wake up, spawn its threads and start would spread the start
// of a phase over milliseconds on a busy machine, and the rate's span (from
// the earliest start) would count that spread: with 4 worker processes on
// tmpfs it cost up to half of a 120 ms read phase. Instead every thread
// waits, on its own OS thread, for one start instant on the machine-wide
// monotonic clock that the runner puts in the go line ("go T", T in
// CLOCK_MONOTONIC nanoseconds, a few tens of milliseconds ahead), with an
// absolute clock_nanosleep; the kernel wakes them all at T. A plain "go"
// (or a T already past) starts at once.

// parseGo reads "go" or "go T" and returns T (0 = now).
func parseGo(line string) (int64, error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "go" || len(f) > 2 {
		return 0, fmt.Errorf("not a go line")
	}
	if len(f) == 1 {
		return 0, nil
	}
	return strconv.ParseInt(f[1], 10, 64)
}

// monotonicNow is CLOCK_MONOTONIC in nanoseconds, the same in every process.
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// sleepUntil blocks the calling OS thread until CLOCK_MONOTONIC reaches at.
func sleepUntil(at int64) {
	if at <= 0 {
		return
	}
	ts := unix.NsecToTimespec(at)
	for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil) == unix.EINTR {
	}
}

// threadFunc runs one thread's timed part and returns its byte and op counts.
type threadFunc func(tr *threadResult, c *counters) error

type counters struct{ bytes, ops atomic.Int64 }

func runTask(t *task, in *bufio.Reader, send func(string, ...any)) (res workerResult) {
	res.ODirect = t.ODirect
	fail := func(err error) workerResult {
		res.Err = err.Error()
		res.Corrupt = errors.Is(err, ErrCorrupt)
		return res
	}
	// Prepare every thread (open files, make directories), untimed.
	fns := make([]threadFunc, len(t.Threads))
	var cleanups []func()
	defer func() {
		for _, c := range cleanups {
			c()
		}
	}()
	for k, th := range t.Threads {
		fn, cleanup, err := prepareThread(t, th, &res)
		if cleanup != nil {
			cleanups = append(cleanups, cleanup)
		}
		if err != nil {
			return fail(err)
		}
		fns[k] = fn
	}
	// Every benchmark thread gets its OS thread now, before the barrier,
	// and waits there for the start time.
	res.Threads = make([]threadResult, len(t.Threads))
	errs := make([]error, len(t.Threads))
	var c counters
	var startAt atomic.Int64 // CLOCK_MONOTONIC ns; < 0: abort
	release := make(chan struct{})
	var wg sync.WaitGroup
	for k := range t.Threads {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			// One OS thread per benchmark thread: the blocking system
			// calls of different threads must not share a kernel thread.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			<-release
			at := startAt.Load()
			if at < 0 {
				return
			}
			sleepUntil(at)
			tr := &res.Threads[k]
			tr.Thread = t.Threads[k]
			tr.StartNs = time.Now().UnixNano()
			errs[k] = fns[k](tr, &c)
			tr.EndNs = time.Now().UnixNano()
		}(k)
	}
	send("ready")
	line, err := in.ReadString('\n')
	at, perr := parseGo(line)
	if err != nil || perr != nil {
		startAt.Store(-1)
		close(release)
		wg.Wait()
		return fail(fmt.Errorf("waiting for go: %q %v %v", line, err, perr))
	}
	startAt.Store(at)

	stop := make(chan struct{})
	var tick sync.WaitGroup
	tick.Add(1)
	go func() {
		defer tick.Done()
		tk := time.NewTicker(250 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				send("progress %d %d", c.bytes.Load(), c.ops.Load())
			}
		}
	}()
	close(release)
	wg.Wait()
	close(stop)
	tick.Wait()
	send("progress %d %d", c.bytes.Load(), c.ops.Load())
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	return res
}

// prepareThread does the untimed set-up of one thread and returns its timed
// part and a cleanup that runs when the worker ends (closing files a failed
// run left open).
func prepareThread(t *task, th int, res *workerResult) (threadFunc, func(), error) {
	const create = unix.O_RDWR | unix.O_CREAT | unix.O_TRUNC
	switch t.Workload + "/" + t.Phase {
	case "seq/write":
		return prepareStream(seqName(t.Dir, th), newPattern(seqFileBase+uint64(th), t.Nonce), 0, t.FileBytes, t.RecordBytes, true, create)
	case "seq/read":
		return prepareStream(seqName(t.Dir, th), newPattern(seqFileBase+uint64(th), t.Nonce), 0, t.FileBytes, t.RecordBytes, false, unix.O_RDONLY)
	case "shared/write":
		return prepareStream(sharedName(t.Dir), newPattern(sharedFileID, t.Nonce), int64(th)*t.FileBytes, t.FileBytes, t.RecordBytes, true, unix.O_WRONLY)
	case "shared/read":
		// Read a block another thread wrote (IOR's task reordering).
		b := th
		if t.TotalThreads > 1 {
			b = (th + 1) % t.TotalThreads
		}
		return prepareStream(sharedName(t.Dir), newPattern(sharedFileID, t.Nonce), int64(b)*t.FileBytes, t.FileBytes, t.RecordBytes, false, unix.O_RDONLY)
	case "random/layout":
		return prepareStream(randomName(t.Dir, th), newPattern(randomFileBase+uint64(th), t.Nonce), 0, t.FileBytes, 1<<20, true, create)
	case "random/write", "random/read":
		return prepareRandom(t, th, res)
	case "meta/create", "meta/stat", "meta/remove":
		return prepareMeta(t, th)
	case "smallfile/create", "smallfile/read", "smallfile/remove":
		return prepareSmall(t, th)
	}
	return nil, nil, fmt.Errorf("unknown workload/phase %s/%s", t.Workload, t.Phase)
}

// prepareStream opens a file for a sequential pass over [off, off+n) in
// records of rec bytes; writes end with fsync and close inside the timing.
//
// The system calls are fio's psync engine's, call for call (checked with
// strace against fio 3.33): open (O_RDWR|O_CREAT for writes, O_RDONLY for
// reads), posix_fadvise DONTNEED (fio's invalidate=1: the file starts cold
// even when the harness cannot drop the whole page cache) and SEQUENTIAL
// (fio's fadvise_hint=1, which doubles the readahead window), then one
// pwrite or pread of a full record per step into one reused, page-aligned
// buffer, then fsync for writes. Nothing is allocated in the timed loop.
func prepareStream(name string, pat *pattern, off, n, rec int64, write bool, flags int) (threadFunc, func(), error) {
	fd, err := unix.Open(name, flags|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	closed := false
	cleanup := func() {
		if !closed {
			unix.Close(fd)
		}
	}
	advise(fd, off, n, unix.FADV_DONTNEED)
	advise(fd, off, n, unix.FADV_SEQUENTIAL)
	buf := alignedBuf(int(rec))
	// Whole-block records from a block-aligned start: prime once, then
	// patch headers only (the last, shorter record may fill in full).
	fast := aligned(int(rec), off)
	if write && fast {
		pat.prime(buf)
	}
	fn := func(tr *threadResult, c *counters) error {
		for pos := off; pos < off+n; {
			l := rec
			if rem := off + n - pos; rem < l {
				l = rem
			}
			if err := recordIO(fd, buf[:l], pos, write, fast, pat, name); err != nil {
				return err
			}
			pos += l
			tr.Bytes += l
			tr.Ops++
			c.bytes.Add(l)
			c.ops.Add(1)
		}
		closed = true
		return finishFile(fd, write, name)
	}
	return fn, cleanup, nil
}

// advise is posix_fadvise, ignoring file systems that do not support it.
func advise(fd int, off, n int64, how int) { _ = unix.Fadvise(fd, off, n, how) }

// prepareRandom opens a laid-out file for random 4 KiB records with
// O_DIRECT when the file system accepts it.
func prepareRandom(t *task, th int, res *workerResult) (threadFunc, func(), error) {
	name := randomName(t.Dir, th)
	write := t.Phase == "write"
	flags := os.O_RDONLY
	if write {
		flags = os.O_RDWR
	}
	var fd int
	var err error
	if t.ODirect {
		fd, err = unix.Open(name, flags|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EINVAL) {
			res.ODirect = false
			res.Notes = appendOnce(res.Notes, "O_DIRECT refused (EINVAL) by the file system; random I/O ran buffered")
			fd, err = unix.Open(name, flags|unix.O_CLOEXEC, 0)
		}
	} else {
		fd, err = unix.Open(name, flags|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	closed := false
	cleanup := func() {
		if !closed {
			unix.Close(fd)
		}
	}
	rec := t.RecordBytes
	blocks := t.FileBytes / rec
	if blocks < 1 {
		return nil, cleanup, fmt.Errorf("random file %s smaller than one record", name)
	}
	advise(fd, 0, 0, unix.FADV_DONTNEED)
	advise(fd, 0, 0, unix.FADV_RANDOM)
	buf := alignedBuf(int(rec))
	rng := rand.New(rand.NewPCG(t.Seed, uint64(th)+1))
	pat := newPattern(randomFileBase+uint64(th), t.Nonce)
	fast := aligned(int(rec), 0) // then every offset (a multiple of rec) is aligned
	if write && fast {
		pat.prime(buf)
	}
	fn := func(tr *threadResult, c *counters) error {
		deadline := time.Now().Add(t.Runtime)
		for i := 0; ; i++ {
			if i&15 == 0 && !time.Now().Before(deadline) {
				break
			}
			pos := rng.Int64N(blocks) * rec
			if err := recordIO(fd, buf, pos, write, fast, pat, name); err != nil {
				return err
			}
			tr.Bytes += rec
			tr.Ops++
			c.bytes.Add(rec)
			c.ops.Add(1)
		}
		closed = true
		return finishFile(fd, write, name)
	}
	return fn, cleanup, nil
}

// prepareMeta makes the thread's directories (create phase) and lists the
// names it works on, in random order for stat (mdtest -R).
func prepareMeta(t *task, th int) (threadFunc, func(), error) {
	var names []string
	for d := 0; d < t.DirsPerThread; d++ {
		dir := metaDir(t.Dir, th, d)
		if t.Phase == "create" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, nil, err
			}
		}
		for k := 0; k < t.FilesPerDir; k++ {
			names = append(names, filepath.Join(dir, fmt.Sprintf("f%d", k)))
		}
	}
	if t.Phase == "stat" {
		rng := rand.New(rand.NewPCG(t.Seed, uint64(th)+1))
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	}
	fn := func(tr *threadResult, c *counters) error {
		var st unix.Stat_t
		for _, n := range names {
			switch t.Phase {
			case "create":
				fd, err := unix.Open(n, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				if err != nil {
					return fmt.Errorf("create %s: %w", n, err)
				}
				if t.MetaSync {
					if err := unix.Fsync(fd); err != nil {
						unix.Close(fd)
						return fmt.Errorf("fsync %s: %w", n, err)
					}
				}
				if err := unix.Close(fd); err != nil {
					return fmt.Errorf("close %s: %w", n, err)
				}
			case "stat":
				if err := unix.Stat(n, &st); err != nil {
					return fmt.Errorf("stat %s: %w", n, err)
				}
				if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
					return fmt.Errorf("%w: file %s offset 0: stat says mode %o size %d, want an empty regular file", ErrCorrupt, n, st.Mode, st.Size)
				}
			case "remove":
				if err := unix.Unlink(n); err != nil {
					return fmt.Errorf("remove %s: %w", n, err)
				}
			}
			tr.Ops++
			c.ops.Add(1)
		}
		return nil
	}
	return fn, nil, nil
}

func pwriteFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return syscall.EIO
		}
		b = b[n:]
		off += int64(n)
	}
	return nil
}

func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: short file: end of file at offset %d", ErrCorrupt, off)
		}
		b = b[n:]
		off += int64(n)
	}
	return nil
}

// alignedBuf returns a page-aligned buffer, as O_DIRECT requires.
func alignedBuf(n int) []byte {
	const align = 4096
	b := make([]byte, n+align)
	a := int(uintptrOf(b) & (align - 1))
	if a != 0 {
		a = align - a
	}
	return b[a : a+n : a+n]
}

func appendOnce(xs []string, s string) []string {
	for _, x := range xs {
		if x == s {
			return xs
		}
	}
	return append(xs, s)
}

// recordIO writes one record — stamping the block headers into the prebuilt
// buffer when records are block-aligned (fast), else filling the whole
// pattern — or reads one and checks it.
func recordIO(fd int, b []byte, pos int64, write, fast bool, pat *pattern, name string) error {
	if !write {
		if err := preadFull(fd, b, pos); err != nil {
			return fmt.Errorf("read %s at %d: %w", name, pos, err)
		}
		return pat.check(b, pos, name)
	}
	if fast {
		pat.stamp(b, pos)
	} else {
		pat.fill(b, pos)
	}
	if err := pwriteFull(fd, b, pos); err != nil {
		return fmt.Errorf("write %s at %d: %w", name, pos, err)
	}
	return nil
}

// finishFile ends a file inside the timing: fsync when it was written and
// wants it (fio's end_fsync, smallfile's --smallfile-fsync), then close.
func finishFile(fd int, write bool, name string) error {
	if write {
		if err := unix.Fsync(fd); err != nil {
			unix.Close(fd)
			return fmt.Errorf("fsync %s: %w", name, err)
		}
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	return nil
}

// smallSlot is the distance in the pattern between the files of one
// smallfile thread: file k holds the thread's pattern at offset
// k*smallSlot(size), so a file's data in another file's place fails the
// check as surely as another thread's or an earlier pass's.
func smallSlot(size int64) int64 {
	return max(blockBytes, (size+blockBytes-1)/blockBytes*blockBytes)
}

// prepareSmall lists the names of a smallfile phase and returns its timed
// loop (IO500's mdtest-hard, one operation per file):
//
//	create  open(O_CREAT|O_EXCL) + pwrite of the whole file [+ fsync] + close
//	read    stat (a regular file of the size written) + open + pread + check + close
//	remove  unlink
//
// Create works on the thread's own files; read and remove on the next
// thread's (IO500's mdtest -N 1), so that with several clients a file is
// read back by another process than its writer. The directories are made
// here, untimed; the runner removes them after the pass.
func prepareSmall(t *task, th int) (threadFunc, func(), error) {
	owner := th
	if t.Phase != "create" && t.TotalThreads > 1 {
		owner = (th + 1) % t.TotalThreads
	}
	names := make([]string, t.FilesPerThread)
	for k := range names {
		names[k] = smallName(t.Dir, t.SharedDir, owner, k)
	}
	if t.Phase == "create" && len(names) > 0 {
		if err := os.MkdirAll(filepath.Dir(names[0]), 0o755); err != nil {
			return nil, nil, fmt.Errorf("make smallfile directory: %w", err)
		}
	}
	size, slot := t.FileBytes, smallSlot(t.FileBytes)
	pat := newPattern(smallFileBase+uint64(owner), t.Nonce)
	buf := alignedBuf(int(slot))[:size]
	if t.Phase == "create" {
		pat.prime(buf)
	}
	fn := func(tr *threadResult, c *counters) error {
		var st unix.Stat_t
		for k, n := range names {
			off := int64(k) * slot
			switch t.Phase {
			case "create":
				pat.stamp(buf, off)
				if err := writeSmall(n, buf, t.Fsync); err != nil {
					return err
				}
			case "read":
				if err := unix.Stat(n, &st); err != nil {
					return fmt.Errorf("stat %s: %w", n, err)
				}
				if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
					return fmt.Errorf("%w: file %s offset 0: stat says mode %o size %d, want a regular file of %d bytes", ErrCorrupt, n, st.Mode, st.Size, size)
				}
				if err := readSmall(n, buf, pat, off); err != nil {
					return err
				}
			case "remove":
				if err := unix.Unlink(n); err != nil {
					return fmt.Errorf("remove %s: %w", n, err)
				}
			}
			tr.Ops++
			c.ops.Add(1)
			if t.Phase != "remove" {
				tr.Bytes += size
				c.bytes.Add(size)
			}
		}
		return nil
	}
	return fn, nil, nil
}

// writeSmall creates name (it must not exist) with the content b, fsyncs
// it when asked, and closes it.
func writeSmall(name string, b []byte, fsync bool) error {
	fd, err := unix.Open(name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	if len(b) > 0 {
		if err := pwriteFull(fd, b, 0); err != nil {
			unix.Close(fd)
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return finishFile(fd, fsync, name)
}

// readSmall reads name whole into b and checks it against the pattern at
// offset off (where the writer took the file's data from); an error names
// the offset in the file.
func readSmall(name string, b []byte, pat *pattern, off int64) error {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	if err := preadFull(fd, b, 0); err != nil {
		unix.Close(fd)
		return fmt.Errorf("read %s: %w", name, err)
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	return pat.checkFrom(b, off, 0, name)
}
