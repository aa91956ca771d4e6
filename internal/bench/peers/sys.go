package peers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// run executes a command with a bounded wait and returns its combined output.
func run(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(lastLines(string(out), 6)))
	}
	return string(out), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// daemon is a child process we started; stop signals it by PID.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start launches a long-running child with its output in logPath.
func start(name, logPath string, argv ...string) (*daemon, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group: a Ctrl-C at the terminal reaches us, and we stop
	// the daemons in order (unmount before the servers go).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(d.done) }()
	return d, nil
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILL.
func (d *daemon) stop(grace time.Duration) {
	if d == nil || d.exited() {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return
	case <-time.After(grace):
	}
	d.cmd.Process.Kill()
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
	}
}

// logTail returns the end of the daemon's log for error messages.
func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.log)
	return lastLines(string(b), 8)
}

// mountFSType returns the fstype of the mount exactly at dir, "" if none.
func mountFSType(dir string) string {
	for _, m := range mounts() {
		if m.point == dir {
			return m.fstype
		}
	}
	return ""
}

type mountEntry struct{ point, fstype string }

func mounts() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		for i, x := range fl {
			if x == "-" && len(fl) > 4 && i+1 < len(fl) {
				out = append(out, mountEntry{point: strings.ReplaceAll(fl[4], `\040`, " "), fstype: fl[i+1]})
				break
			}
		}
	}
	return out
}

// waitMount waits until dir is a mount whose type has prefix want, or the
// daemon (if any) dies, or timeout.
func waitMount(ctx context.Context, dir, want string, d *daemon, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if t := mountFSType(dir); t != "" && strings.HasPrefix(t, want) {
			return nil
		}
		if d != nil && d.exited() {
			return fmt.Errorf("%s exited before %s was mounted: %s", d.name, dir, d.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not mounted after %v", dir, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// unmount detaches dir if it is a mount point (lazily when busy).
func unmount(dir string) error {
	if mountFSType(dir) == "" {
		return nil
	}
	var errs []error
	for _, argv := range [][]string{{"fusermount3", "-u", dir}, {"umount", dir}, {"umount", "-l", dir}} {
		if _, err := run(context.Background(), 30*time.Second, argv[0], argv[1:]...); err != nil {
			errs = append(errs, err)
			continue
		}
		if mountFSType(dir) == "" {
			return nil
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount below root, deepest first.
func unmountUnder(root string) error {
	var pts []string
	for _, m := range mounts() {
		if strings.HasPrefix(m.point, root+"/") {
			pts = append(pts, m.point)
		}
	}
	var errs []error
	for i := len(pts) - 1; i >= 0; i-- {
		errs = append(errs, unmount(pts[i]))
	}
	return errors.Join(errs...)
}

// installed reports whether a Debian package is installed.
func installed(pkg string) bool {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", pkg).Output()
	return err == nil && bytes.Contains(out, []byte("install ok installed"))
}

// ensurePackages installs the missing packages with apt-get (bounded).
func ensurePackages(ctx context.Context, logf func(string, ...any), pkgs ...string) error {
	var missing []string
	for _, p := range pkgs {
		if !installed(p) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("packages %v missing and not root to install them", missing)
	}
	logf("installing %s with apt-get", strings.Join(missing, " "))
	os.Setenv("DEBIAN_FRONTEND", "noninteractive")
	if _, err := run(ctx, 10*time.Minute, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, missing...)...); err != nil {
		if _, uerr := run(ctx, 5*time.Minute, "apt-get", "update"); uerr != nil {
			return err
		}
		if _, err := run(ctx, 10*time.Minute, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, missing...)...); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes a config file, creating its directory.
func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// waitLog waits until d's log holds want at least n times (bounded).
func waitLog(ctx context.Context, d *daemon, want string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(d.log)
		if bytes.Count(b, []byte(want)) >= n {
			return nil
		}
		if d.exited() {
			return fmt.Errorf("%s exited: %s", d.name, d.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %q not seen %d times in %v: %s", d.name, want, n, timeout, d.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
