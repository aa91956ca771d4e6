package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Locks under faults (issue 21: "a client dying with locks held"). The
// load's lockers (LoadConfig.Lockers, one goroutine per lock file, each
// with one descriptor of its file: POSIX locks belong to the process, so
// one locker per file keeps them exclusive among the lockers too) take a
// write lock on a byte range of their file in a loop, polling F_SETLK (a
// bounded wait that an F_SETLKW could not give), and record the wait as a
// "lock" operation. Mutual exclusion is checked as a lock checker does:
// whoever gets the lock reads the range, which must say FREE (the last
// holder wrote that before unlocking) — a range that says HELD names a
// holder that has not let go, a violation unless that holder is known
// dead (its client killed: the kill-lock-client fault) —, writes HELD and
// its name, fsyncs (so another mount's wrongful holder would read it),
// waits a little, reads it back, writes FREE and unlocks. Strata promises
// what makes this sound: an unlock first sends the file's buffered writes
// to the stores, and a grant drops the mount's cached pages of the file,
// so the next holder on any mount reads what the last one wrote.

// Stamps are stampLen bytes at lockOff of a lock file: "HELD name seq" or
// "FREE name seq", space-padded, a newline last. A range never written
// reads as zeros: free.
const (
	lockOff  = 4096
	stampLen = 64
)

// lockPoll is how often a waiting locker tries F_SETLK again; lockGiveUp
// bounds one wait (the kill-lock-client trial checks its own, shorter,
// bound).
const (
	lockPoll   = 20 * time.Millisecond
	lockGiveUp = 120 * time.Second
)

// stamp formats a range's content.
func stamp(held bool, name string, seq int) []byte {
	state := "FREE"
	if held {
		state = "HELD"
	}
	s := fmt.Sprintf("%s %s %d", state, name, seq)
	b := bytes.Repeat([]byte{' '}, stampLen)
	copy(b, s)
	b[stampLen-1] = '\n'
	return b
}

// parseStamp reads a range: free, or held by name; an error for bytes
// that are neither zeros nor a stamp (a torn or foreign write).
func parseStamp(b []byte) (held bool, name string, seq int, err error) {
	if len(b) != stampLen {
		return false, "", 0, fmt.Errorf("stamp of %d bytes, want %d", len(b), stampLen)
	}
	if bytes.Count(b, []byte{0}) == stampLen {
		return false, "", 0, nil
	}
	f := strings.Fields(string(b))
	if len(f) != 3 || (f[0] != "HELD" && f[0] != "FREE") || b[stampLen-1] != '\n' {
		return false, "", 0, fmt.Errorf("range holds %q, not a stamp", strings.TrimRight(string(b), "\x00"))
	}
	seq, err = strconv.Atoi(f[2])
	if err != nil {
		return false, "", 0, fmt.Errorf("range holds %q, not a stamp", strings.TrimSpace(string(b)))
	}
	return f[0] == "HELD", f[1], seq, nil
}

// locker is one lock file's worker, owned by its goroutine until Stop
// returns (except the atomics).
type locker struct {
	id   int
	path string
	f    *os.File
	gen  int64
	seq  int
	// watch, first: the first grant (the load's time, nanoseconds) at or
	// after watch (WatchGrants; never before it is called), read by the
	// kill-lock-client trial.
	watch, first atomic.Int64
	// violations: ranges found HELD by a live holder, or not as written.
	violations []string
	grants     int
}

func (k *locker) name() string { return fmt.Sprintf("locker-%d", k.id) }

// lockPath is lock file i.
func (l *Load) lockPath(i int) string {
	return filepath.Join(l.cfg.Dir, "locks", fmt.Sprintf("lock-%d", i))
}

// LockFiles lists the lockers' files (on the load's mount).
func (l *Load) LockFiles() []string {
	var out []string
	for i := range l.lockers {
		out = append(out, l.lockPath(i))
	}
	return out
}

// makeLockFiles creates the lock files (a hole where the ranges are).
func (l *Load) makeLockFiles() error {
	if err := os.MkdirAll(filepath.Join(l.cfg.Dir, "locks"), 0o755); err != nil {
		return fmt.Errorf("load directory: %w", err)
	}
	for i := range l.cfg.Lockers {
		f, err := os.OpenFile(l.lockPath(i), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return fmt.Errorf("lock file: %w", err)
		}
		err = f.Truncate(2 * lockOff)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("lock file %s: %w", l.lockPath(i), err)
		}
		k := &locker{id: i, path: l.lockPath(i)}
		k.watch.Store(math.MaxInt64)
		l.lockers = append(l.lockers, k)
	}
	return nil
}

// deadHolders are the names of lock holders whose client was killed: a
// range they left HELD is no violation.
type deadHolders struct {
	mu sync.Mutex
	m  map[string]bool
	// seen: violations the holders reported.
	seen []string
}

// HolderDied records that holder name (of another process) died holding
// its locks: its HELD stamps are left over, not held.
func (l *Load) HolderDied(name string) {
	l.dead.mu.Lock()
	defer l.dead.mu.Unlock()
	if l.dead.m == nil {
		l.dead.m = map[string]bool{}
	}
	l.dead.m[name] = true
}

// lockViolation records a violation another process (the holder) saw.
func (l *Load) lockViolation(s string) {
	l.dead.mu.Lock()
	defer l.dead.mu.Unlock()
	if len(l.dead.seen) < maxViolations {
		l.dead.seen = append(l.dead.seen, s)
	}
}

func (l *Load) holderDead(name string) bool {
	l.dead.mu.Lock()
	defer l.dead.mu.Unlock()
	return l.dead.m[name]
}

// WatchGrants starts timing the lockers' next grants: GrantWait then
// answers how long after at (the load's time) the last of them was
// granted its lock again.
func (l *Load) WatchGrants(at time.Duration) {
	for _, k := range l.lockers {
		k.first.Store(0)
		k.watch.Store(int64(at))
	}
}

// GrantWait is, once every locker has been granted its lock at or after
// the time WatchGrants was given, the longest of those waits; ok false
// until then (and when there are no lockers).
func (l *Load) GrantWait() (wait time.Duration, ok bool) {
	for _, k := range l.lockers {
		first := k.first.Load()
		if first == 0 {
			return 0, false
		}
		wait = max(wait, time.Duration(first-k.watch.Load()))
	}
	return wait, len(l.lockers) > 0
}

func (l *Load) runLocker(k *locker) {
	// On a thread of its own, known to the hung-thread check (dstate.go),
	// which leaves it out: a lock request waits in the mount for as long
	// as the service holds new locks back (a grace period of up to the
	// session lease after a restart), and lockers' waits have their own
	// bound (Trial.LockWaitSeconds).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	l.lockerThreads.Store(tid, true)
	defer l.lockerThreads.Delete(tid)
	rng := rand.New(rand.NewPCG(uint64(k.id), uint64(time.Now().UnixNano())))
	defer func() {
		if k.f != nil {
			k.f.Close()
		}
	}()
	for !l.stopped() {
		l.gate.RLock()
		l.lockStep(k, rng)
		l.gate.RUnlock()
		sleepOrStop(l.stop, time.Duration(50+rng.IntN(100))*time.Millisecond)
	}
}

// sleepOrStop sleeps d or until stop is closed.
func sleepOrStop(stop <-chan struct{}, d time.Duration) {
	select {
	case <-stop:
	case <-time.After(d):
	}
}

// errStopped ends a wait when the load stops (not an operation's error).
var errStopped = errors.New("load stopped")

// lockStep is one critical section: wait for the lock, check the range,
// stamp it HELD, wait, check it, stamp it FREE, unlock.
func (l *Load) lockStep(k *locker, rng *rand.Rand) {
	if g := l.gen.Load(); k.f == nil || g != k.gen { // (re)open after a restart of everything
		if k.f != nil {
			k.f.Close()
			k.f = nil
		}
		f, err := os.OpenFile(k.path, os.O_RDWR, 0)
		if err != nil {
			l.record(Op{Kind: "lock", Worker: -200 - k.id, Start: l.Now(), End: l.Now(), Err: fmt.Errorf("open %s: %w", k.path, err)})
			return
		}
		k.f, k.gen = f, g
	}
	start := l.Now()
	err := waitLock(k.f, unix.F_WRLCK, l.stop, lockGiveUp)
	if errors.Is(err, errStopped) {
		return
	}
	l.record(Op{Kind: "lock", Worker: -200 - k.id, Start: start, End: l.Now(), Err: err})
	if err != nil {
		k.reopen()
		return
	}
	if now := int64(l.Now()); now >= k.watch.Load() {
		k.first.CompareAndSwap(0, now)
	}
	k.grants++
	k.seq++
	err = l.timed("locked-io", -200-k.id, func() error {
		err := l.critical(k, rng)
		if uerr := setLock(k.f, unix.F_UNLCK); uerr != nil && err == nil {
			err = fmt.Errorf("unlock %s: %w", k.path, uerr)
		}
		return err
	})
	if err != nil {
		k.reopen()
	}
}

// reopen drops the locker's descriptor after an error (a handle whose lock
// was lost keeps failing): the next step opens the file again.
func (k *locker) reopen() {
	k.f.Close()
	k.f = nil
}

// critical is what a locker does while it holds the lock.
func (l *Load) critical(k *locker, rng *rand.Rand) error {
	got := make([]byte, stampLen)
	if _, err := k.f.ReadAt(got, lockOff); err != nil {
		return fmt.Errorf("read %s under the lock: %w", k.path, err)
	}
	held, who, seq, err := parseStamp(got)
	switch {
	case err != nil:
		k.violate(fmt.Sprintf("%.1fs %s: granted, %v", l.Now().Seconds(), k.path, err))
	case held && !l.holderDead(who):
		k.violate(fmt.Sprintf("%.1fs %s: granted while %s (#%d) holds the range", l.Now().Seconds(), k.path, who, seq))
	}
	mine := stamp(true, k.name(), k.seq)
	if _, err := k.f.WriteAt(mine, lockOff); err != nil {
		return fmt.Errorf("write %s under the lock: %w", k.path, err)
	}
	if err := k.f.Sync(); err != nil {
		return fmt.Errorf("fsync %s under the lock: %w", k.path, err)
	}
	time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
	if _, err := k.f.ReadAt(got, lockOff); err != nil {
		return fmt.Errorf("read %s under the lock: %w", k.path, err)
	}
	if !bytes.Equal(got, mine) {
		k.violate(fmt.Sprintf("%.1fs %s: while held, the range changed to %q", l.Now().Seconds(), k.path, strings.TrimSpace(string(got))))
	}
	if _, err := k.f.WriteAt(stamp(false, k.name(), k.seq), lockOff); err != nil {
		return fmt.Errorf("write %s under the lock: %w", k.path, err)
	}
	return nil
}

// maxViolations bounds the violations each locker describes.
const maxViolations = 20

func (k *locker) violate(s string) {
	if len(k.violations) < maxViolations {
		k.violations = append(k.violations, s)
	}
}

// setLock is one F_SETLK of the stamp's range.
func setLock(f *os.File, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: lockOff, Len: stampLen}
	return unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk)
}

// waitLock polls F_SETLK every lockPoll until granted, stop is closed
// (errStopped) or bound has passed.
func waitLock(f *os.File, typ int16, stop <-chan struct{}, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		err := setLock(f, typ)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lock %s: not granted within %v", f.Name(), bound)
		}
		select {
		case <-stop:
			return errStopped
		case <-time.After(lockPoll):
		}
	}
}

// HolderConfig is what `strata chaos hold-locks` does.
type HolderConfig struct {
	// Name is written in the HELD stamps.
	Name  string
	Files []string
	// Max bounds how long it runs (it is meant to be killed before).
	Max time.Duration
}

// Holder's lines on its standard output, read by the trial.
const (
	holderHeld      = "held"
	holderViolation = "VIOLATION"
	holderIOError   = "io-error"
)

// HoldLocks takes a write lock on the stamp's range of every file (a
// process of its own on a second mount: the kill-lock-client fault),
// checks and stamps each range as a locker does, fsyncs, says "held" on
// out, and then reads its ranges every 200 ms until killed or cfg.Max has
// passed, saying "io-error …" the first time a read fails (its mount was
// killed: the read must fail, not hang). A range found HELD by another
// when granted is said as "VIOLATION …".
func HoldLocks(cfg HolderConfig, out io.Writer) error {
	if cfg.Max <= 0 {
		cfg.Max = 10 * time.Minute
	}
	var fs []*os.File
	defer func() {
		for _, f := range fs {
			f.Close()
		}
	}()
	never := make(chan struct{})
	for _, p := range cfg.Files {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		fs = append(fs, f)
		if err := waitLock(f, unix.F_WRLCK, never, 60*time.Second); err != nil {
			return err
		}
		got := make([]byte, stampLen)
		if _, err := f.ReadAt(got, lockOff); err != nil {
			return fmt.Errorf("read %s under the lock: %w", p, err)
		}
		if held, who, seq, err := parseStamp(got); err != nil {
			fmt.Fprintf(out, "%s %s: granted, %v\n", holderViolation, p, err)
		} else if held {
			fmt.Fprintf(out, "%s %s: granted while %s (#%d) holds the range\n", holderViolation, p, who, seq)
		}
		if _, err := f.WriteAt(stamp(true, cfg.Name, 1), lockOff); err != nil {
			return fmt.Errorf("write %s under the lock: %w", p, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("fsync %s under the lock: %w", p, err)
		}
	}
	fmt.Fprintln(out, holderHeld)
	deadline := time.Now().Add(cfg.Max)
	failed := false
	buf := make([]byte, stampLen)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		for _, f := range fs {
			if _, err := f.ReadAt(buf, lockOff); err != nil && !failed {
				failed = true
				fmt.Fprintf(out, "%s %s: %v\n", holderIOError, f.Name(), err)
			}
		}
	}
	return nil
}
