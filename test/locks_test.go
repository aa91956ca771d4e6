package test

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/testutil"
)

var (
	lockLong   = flag.Bool("long", false, "run TestLockCounter with the full 500 rounds per process")
	lockRounds = flag.Int("lock-rounds", 0, "rounds per process in TestLockCounter (0: 200, or 500 with -long)")
)

// lockKinds are the three lock flavours of Linux: POSIX record locks
// (owned by the process), OFD locks (owned by the open file description)
// and flock (whole file, owned by the open file description).
var lockKinds = []string{"fcntl", "ofd", "flock"}

// setLock takes (wait: blocking) or drops an exclusive whole-file lock of
// kind on fd, retrying when a signal interrupts the wait.
func setLock(fd int, kind string, lock, wait bool) error {
	for {
		var err error
		switch kind {
		case "flock":
			how := unix.LOCK_UN
			if lock {
				how = unix.LOCK_EX
				if !wait {
					how |= unix.LOCK_NB
				}
			}
			err = unix.Flock(fd, how)
		default:
			lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart}
			if lock {
				lk.Type = unix.F_WRLCK
			}
			cmd := unix.F_SETLK
			switch {
			case kind == "ofd" && wait:
				cmd = unix.F_OFD_SETLKW
			case kind == "ofd":
				cmd = unix.F_OFD_SETLK
			case wait:
				cmd = unix.F_SETLKW
			}
			err = unix.FcntlFlock(uintptr(fd), cmd, &lk)
		}
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// lockReproWorker is the reproduction of issue 18's first item, as one
// process: it takes and drops a lock through fd1, lets a child keep fd1's
// open file description alive for 2 s, closes fd1, opens the file again as
// fd2 and locks it ("locked"). When the child has exited, the kernel sends
// the release of fd1's handle ("released"); the lock through fd2 must
// outlive it. The worker holds the lock until its stdin closes.
func lockReproWorker() int {
	path, kind := os.Getenv("LOCK_FILE"), os.Getenv("LOCK_KIND")
	fail := func(what string, err error) int {
		fmt.Printf("error: %s: %v\n", what, err)
		return 1
	}
	fd1, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open fd1", err)
	}
	f1 := os.NewFile(uintptr(fd1), "fd1")
	if err := setLock(fd1, kind, true, false); err != nil {
		return fail("lock fd1", err)
	}
	if err := setLock(fd1, kind, false, false); err != nil {
		return fail("unlock fd1", err)
	}
	child := exec.Command("sleep", "2")
	child.ExtraFiles = []*os.File{f1} // the child's fd 3: fd1's open file description
	if err := child.Start(); err != nil {
		return fail("start child", err)
	}
	if err := f1.Close(); err != nil {
		return fail("close fd1", err)
	}
	fd2, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open fd2", err)
	}
	if err := setLock(fd2, kind, true, false); err != nil {
		return fail("lock fd2", err)
	}
	fmt.Println("locked")
	if err := child.Wait(); err != nil {
		return fail("child", err)
	}
	fmt.Println("released")
	_, _ = io.Copy(io.Discard, os.Stdin) // hold the lock until the test lets go
	return 0
}

// tryLock runs lockWorker on path (a separate process taking, without
// waiting, a write lock that conflicts with kind's: a flock for a flock, an
// fcntl lock for an fcntl or OFD lock): "locked" or "busy".
func tryLock(path, kind string) string {
	if kind != "flock" {
		kind = "fcntl"
	}
	try := exec.Command(os.Args[0])
	try.Env = append(os.Environ(), "STRATA_TEST_WORKER=lock", "LOCK_KIND="+kind, "LOCK_FILE="+path, "LOCK_HOLD=0")
	out, err := try.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s (%v)", out, err)
	}
	return string(out)
}

// TestLockOutlivesOldHandleRelease: the release of an old handle, arriving
// after its owner locked the file again through a newer one, must not
// drop the newer lock. Other processes, on the same mount and on another,
// must keep getting EAGAIN until the holder lets go.
func TestLockOutlivesOldHandleRelease(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 2, Mounts: 2})
	for _, kind := range lockKinds {
		t.Run(kind, func(t *testing.T) {
			name := "repro-" + kind
			if err := os.WriteFile(filepath.Join(c.Mount(0), name), []byte("data\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			paths := []string{filepath.Join(c.Mount(0), name), filepath.Join(c.Mount(1), name)}
			w := exec.Command(os.Args[0])
			w.Env = append(os.Environ(), "STRATA_TEST_WORKER=lockrepro", "LOCK_KIND="+kind, "LOCK_FILE="+paths[0])
			w.Stderr = os.Stderr
			stdin, err := w.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := w.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- w.Wait() }()
			t.Cleanup(func() {
				stdin.Close()
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					w.Process.Kill()
					<-done
				}
			})
			lines := make(chan string, 4)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			expect := func(want string) {
				t.Helper()
				select {
				case got := <-lines:
					if got != want {
						t.Fatalf("worker said %q, want %q", got, want)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("worker did not say %q within 30 s", want)
				}
			}
			expect("locked")
			for m, p := range paths {
				if got := tryLock(p, kind); got != "busy" {
					t.Fatalf("mount %d, while fd2 holds the lock and fd1's handle is still open: got %q, want busy", m, got)
				}
			}
			expect("released")
			// The release of fd1's handle is on its way now (the kernel
			// sends it when the child's exit drops the last reference):
			// for 3 s, conflicting locks must keep failing on both mounts.
			end := time.Now().Add(3 * time.Second)
			for time.Now().Before(end) {
				for m, p := range paths {
					if got := tryLock(p, kind); got != "busy" {
						t.Fatalf("mount %d, after the release of fd1's handle, while fd2 holds the lock: got %q, want busy", m, got)
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			stdin.Close() // the holder exits: its lock goes with it
			if err := testutil.WaitFor(10*time.Second, func() error {
				if got := tryLock(paths[1], kind); got != "locked" {
					return fmt.Errorf("got %q", got)
				}
				return nil
			}); err != nil {
				t.Fatalf("lock of the exited holder not released: %v", err)
			}
		})
	}
}

// counterWidth is the size of the counter file: a zero-padded decimal and
// a newline, written in place so that the size never changes.
const counterWidth = 16

// lockCountWorker runs LOCK_ROUNDS rounds of open (O_DIRECT with
// LOCK_DIRECT=true), lock (LOCK_KIND, waiting), read the counter, write it
// plus one, unlock, close.
func lockCountWorker() int {
	path, kind := os.Getenv("LOCK_FILE"), os.Getenv("LOCK_KIND")
	rounds, err := strconv.Atoi(os.Getenv("LOCK_ROUNDS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "LOCK_ROUNDS:", err)
		return 1
	}
	for r := range rounds {
		if err := lockCountRound(path, kind); err != nil {
			fmt.Fprintf(os.Stderr, "pid %d round %d: %v\n", os.Getpid(), r, err)
			return 1
		}
	}
	return 0
}

func lockCountRound(path, kind string) error {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if os.Getenv("LOCK_DIRECT") == "true" {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return err
	}
	err = func() error {
		if err := setLock(fd, kind, true, true); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		buf := make([]byte, counterWidth)
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(buf[:n])), 10, 64)
		if err != nil {
			return fmt.Errorf("counter %q: %w", buf[:n], err)
		}
		if _, err := unix.Pwrite(fd, fmt.Appendf(nil, "%0*d\n", counterWidth-1, v+1), 0); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return setLock(fd, kind, false, false)
	}()
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	return err
}

// TestLockCounter: 8 processes on 2 mounts each increment a shared counter
// under an exclusive lock, opening and closing the file every round, for
// each lock kind; every increment must count. With O_DIRECT this tests
// exclusion; buffered, also that what a holder wrote reaches the next
// holder on either mount, past both mounts' caches. -long runs the 500
// rounds of issue 18, -lock-rounds any number.
func TestLockCounter(t *testing.T) {
	const procs = 8
	rounds := 200
	if *lockLong {
		rounds = 500
	}
	if *lockRounds > 0 {
		rounds = *lockRounds
	}
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 2, Mounts: 2})
	for _, mode := range []string{"direct", "buffered"} {
		for _, kind := range lockKinds {
			t.Run(mode+"/"+kind, func(t *testing.T) { runLockCounter(t, c, mode, kind, procs, rounds) })
		}
	}
}

// runLockCounter is one TestLockCounter run: procs processes, rounds
// rounds each, alternating between the cluster's two mounts.
func runLockCounter(t *testing.T, c *testutil.ProcCluster, mode, kind string, procs, rounds int) {
	name := "counter-" + mode + "-" + kind
	if err := os.WriteFile(filepath.Join(c.Mount(0), name), fmt.Appendf(nil, "%0*d\n", counterWidth-1, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var cmds []*exec.Cmd
	var errs []chan error
	for p := range procs {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "STRATA_TEST_WORKER=lockcount", "LOCK_KIND="+kind,
			"LOCK_FILE="+filepath.Join(c.Mount(p%2), name), "LOCK_ROUNDS="+strconv.Itoa(rounds), "LOCK_DIRECT="+strconv.FormatBool(mode == "direct"))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		cmds, errs = append(cmds, cmd), append(errs, done)
	}
	deadline := time.After(10 * time.Minute)
	for i, done := range errs {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
		case <-deadline:
			for _, c := range cmds {
				c.Process.Kill()
			}
			t.Fatal("workers did not finish within 10 minutes")
		}
	}
	want := uint64(procs * rounds)
	for m := range 2 {
		data, err := os.ReadFile(filepath.Join(c.Mount(m), name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil || got != want {
			t.Errorf("mount %d: counter %q after %d×%d rounds, want %d", m, data, procs, rounds, want)
		}
	}
	t.Logf("%s %s: %d×%d rounds in %v", mode, kind, procs, rounds, time.Since(start).Round(time.Millisecond))
}
