package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// KillLockClient: a client dies with locks held (issue 21's list). A
// second mount (ClusterConfig.LockClient: a `strata mount` process of its
// own, a client with its own session) serves a lock holder, `strata chaos
// hold-locks`, that takes the write locks of the load's lockers' ranges
// (LoadConfig.Lockers) and stamps them; once it holds them all (the
// lockers now wait), the second mount's process is killed with SIGKILL.
// The holder then has a dead mount: its reads must fail at once (the
// kernel aborts a FUSE connection whose daemon is gone), not leave it in
// D state; it is killed in turn. The metadata service releases the dead
// client's locks when its session lease runs out (meta: expireSessions,
// locks.releaseClient), so every locker must get its lock within the
// session lease and lockMargin of the kill: the trial's lock_wait_seconds
// (and its stall). The second mount is then started again on its stale
// mount point.
const KillLockClient Fault = "kill-lock-client"

// lockMargin: what a dead client's locks may take beyond the session
// lease to be granted to a waiter: the leader's expiry tick (at most
// 1 s), the raft command closing the session, the lockers' polling.
const lockMargin = 5 * time.Second

// startLockMount starts the second mount and waits until deadline for it.
func (c *Cluster) startLockMount(deadline time.Time) error {
	c.mu.Lock()
	p := c.mount2
	c.mu.Unlock()
	if p != nil && !p.exited() {
		return nil
	}
	// A killed mount leaves its point disconnected: detach it here (the
	// new mount's own check can be answered from cached attributes).
	if fuseMounted(c.LockMount) {
		if err := syscall.Unmount(c.LockMount, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("detach the dead mount at %s: %w", c.LockMount, err)
		}
	}
	argv := append([]string{"mount", "--meta", c.metaList(), "--key-file", c.keyFile}, c.cfg.MountFlags...)
	m, err := c.start("mount-2", c.clientHost(), append(argv, c.LockMount)...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.mount2 = m
	c.mu.Unlock()
	for !onStrata(c.LockMount) {
		if m.exited() || time.Now().After(deadline) {
			return fmt.Errorf("the lock client's mount at %s did not come up (see %s)", c.LockMount, filepath.Join(c.cfg.Dir, "logs", "mount-2.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// holder is a running `strata chaos hold-locks`.
type holder struct {
	cmd   *exec.Cmd
	lines chan string // its standard output, closed at its end
	done  chan struct{}
}

// startHolder runs the lock holder named name on files.
func (c *Cluster) startHolder(name string, files []string) (*holder, error) {
	lf, err := os.OpenFile(filepath.Join(c.cfg.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.cfg.Bin, append([]string{"chaos", "hold-locks", "--name", name, "--max", "10m"}, files...)...)
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start the lock holder: %w", err)
	}
	h := &holder{cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintln(lf, sc.Text())
			select {
			case h.lines <- sc.Text():
			default: // nobody reads any more
			}
		}
		close(h.lines)
		cmd.Wait()
		lf.Close()
		close(h.done)
	}()
	return h, nil
}

// next is the holder's next line starting with one of prefixes, bounded
// by d; violations seen meanwhile go to l. "" when none came.
func (h *holder) next(l *Load, d time.Duration, prefixes ...string) string {
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				return ""
			}
			if strings.HasPrefix(line, holderViolation) {
				l.lockViolation("lock holder: " + line)
			}
			for _, p := range prefixes {
				if strings.HasPrefix(line, p) {
					return line
				}
			}
		case <-timeout:
			return ""
		}
	}
}

// kill ends the holder (SIGKILL) and waits 10 s for it; false if it
// outlived that (stuck in the kernel).
func (h *holder) kill() bool {
	syscall.Kill(h.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-h.done:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}

// procState is the state letter of /proc/PID/stat (R, S, D, Z…), or "?".
func procState(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "gone"
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return "?"
}

// injectLockClient runs one kill-lock-client trial.
func (c *Cluster) injectLockClient(ctx context.Context, l *Load, n int, s Schedule) (*Trial, error) {
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return nil, err
	}
	t := &Trial{N: n, Fault: KillLockClient, Leader: leader, Victim: "mount-2 (the lock client)"}
	name := fmt.Sprintf("holder-%d", n)
	var files []string
	for _, f := range l.LockFiles() {
		rel, err := filepath.Rel(c.Mount, f)
		if err != nil {
			return nil, fmt.Errorf("lock file %s is not under the mount %s", f, c.Mount)
		}
		files = append(files, filepath.Join(c.LockMount, rel))
	}
	t.holderAt = l.Now()
	h, err := c.startHolder(name, files)
	if err != nil {
		return nil, err
	}
	if h.next(l, 90*time.Second, holderHeld) == "" {
		t.At = l.Now()
		t.AtSec = t.At.Seconds()
		t.Problems = append(t.Problems, fmt.Sprintf("the lock holder did not get its locks within 90 s (see logs/%s.log)", name))
		h.kill()
		t.end = l.Now()
		return t, nil
	}
	// The lockers now wait for the holder's locks.
	time.Sleep(time.Second)
	t.At = l.Now()
	t.AtSec = t.At.Seconds()
	c.mu.Lock()
	m := c.mount2
	c.mu.Unlock()
	if err := m.signal(syscall.SIGKILL); err != nil {
		h.kill()
		return nil, err
	}
	killed := time.Now()
	l.HolderDied(name)
	l.WatchGrants(l.Now())
	// What became of the holder on its dead mount.
	if line := h.next(l, 5*time.Second, holderIOError); line != "" {
		why := line
		if i := strings.LastIndex(line, ": "); i >= 0 {
			why = line[i+2:]
		}
		t.note(fmt.Sprintf("the holder's reads failed %.2fs after the kill (%s), state %s", time.Since(killed).Seconds(), why, procState(h.cmd.Process.Pid)))
	} else {
		t.Problems = append(t.Problems, fmt.Sprintf("the lock holder's reads on its killed mount neither failed nor returned within 5 s (state %s)", procState(h.cmd.Process.Pid)))
	}
	if !h.kill() {
		t.Problems = append(t.Problems, fmt.Sprintf("the lock holder (pid %d) outlived SIGKILL by 10 s (state %s: stuck in the kernel)", h.cmd.Process.Pid, procState(h.cmd.Process.Pid)))
	}
	// The lockers' wait for the dead client's locks.
	bound := s.SessionLease + lockMargin
	deadline := killed.Add(bound + 30*time.Second)
	for {
		if wait, ok := l.GrantWait(); ok {
			t.LockWaitSeconds = wait.Seconds()
			break
		}
		if time.Now().After(deadline) {
			t.LockWaitSeconds = time.Since(killed).Seconds()
			t.Problems = append(t.Problems, fmt.Sprintf("the lockers were not all granted the dead client's locks within %.0fs of its kill", t.LockWaitSeconds))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The client heartbeats every third of a lease, so its session
	// expires at least 2/3 of a lease after its kill: a grant sooner took
	// the dead client's locks away while its session still held them (as
	// it would from a live client that is merely slow to reclaim).
	early := 2*s.SessionLease/3 - time.Second
	switch {
	case t.LockWaitSeconds > bound.Seconds():
		t.Problems = append(t.Problems, fmt.Sprintf("the dead client's locks were granted %.2fs after its kill, beyond %v (session lease %v + %v)",
			t.LockWaitSeconds, bound, s.SessionLease, lockMargin))
	case t.LockWaitSeconds < early.Seconds():
		t.Problems = append(t.Problems, fmt.Sprintf("the dead client's locks were granted %.2fs after its kill, before its session could expire (%v: 2/3 of the lease %v, less 1 s)",
			t.LockWaitSeconds, early, s.SessionLease))
	}
	// The second mount again, on its stale mount point.
	if err := c.startLockMount(time.Now().Add(60 * time.Second)); err != nil {
		return t, err
	}
	if err := statWithin(files[0], 10*time.Second); err != nil {
		t.Problems = append(t.Problems, fmt.Sprintf("the restarted lock client's mount: %v", err))
	}
	t.end = l.Now()
	return t, nil
}

// statWithin stats path, failing if that takes longer than d.
func statWithin(path string, d time.Duration) error {
	done := make(chan error, 1)
	go func() {
		_, err := os.Stat(path)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("stat %s: no answer within %v", path, d)
	}
}
