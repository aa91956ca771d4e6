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
	"sync"
	"syscall"
	"time"
)

// run executes a command with a bounded wait and returns its combined output.
func run(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	if name == "apt-get" {
		cmd.Env = append(os.Environ(), aptEnv...)
	}
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

// stop sends SIGTERM, waits up to grace, then SIGKILL; it reports whether
// the kill was needed.
func (d *daemon) stop(grace time.Duration) (killed bool) {
	if d == nil || d.exited() {
		return false
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return false
	case <-time.After(grace):
	}
	d.cmd.Process.Kill()
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
	}
	return true
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

// waitFile waits until path exists, or the daemon dies, or timeout.
func waitFile(ctx context.Context, path string, d *daemon, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if d != nil && d.exited() {
			return fmt.Errorf("%s exited before writing %s: %s", d.name, path, d.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not written after %v", path, timeout)
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
	for _, argv := range unmountArgvs(dir) {
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

// unmountArgvs are the ways to detach dir, gentlest first: a FUSE unmount,
// a plain one, then lazy ones (a daemon that died leaves a mount that only
// a lazy unmount removes: "Transport endpoint is not connected").
func unmountArgvs(dir string) [][]string {
	return [][]string{{"fusermount3", "-u", dir}, {"umount", dir}, {"fusermount3", "-u", "-z", dir}, {"umount", "-l", dir}}
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
	return err == nil && dpkgInstalled(out)
}

// dpkgInstalled reads dpkg-query's ${Status}: "install ok installed" only
// (not "deinstall ok config-files", "install ok half-configured", …).
func dpkgInstalled(status []byte) bool {
	return strings.TrimSpace(string(status)) == "install ok installed"
}

// installer installs Debian packages: the missing ones among those asked
// for, with `apt-get update` run at most once per peers run (a fresh
// machine or container has no package lists; a stale one has lists whose
// versions are gone from the mirror).
type installer struct {
	mu        sync.Mutex
	updated   bool
	installed func(pkg string) bool                          // dpkg check
	run       func(ctx context.Context, argv []string) error // runs one command
	logf      func(string, ...any)
}

func newInstaller(logf func(string, ...any)) *installer {
	return &installer{
		installed: installed,
		run: func(ctx context.Context, argv []string) error {
			_, err := run(ctx, 10*time.Minute, argv[0], argv[1:]...)
			return err
		},
		logf: logf,
	}
}

// aptEnv keeps apt-get and dpkg from asking questions.
var aptEnv = []string{"DEBIAN_FRONTEND=noninteractive", "NEEDRESTART_MODE=a"}

// installArgv is the install command for exactly these package names.
func installArgv(pkgs []string) []string {
	return append([]string{"apt-get", "install", "-y", "--no-install-recommends",
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}, pkgs...)
}

// ensure installs the packages that dpkg does not report installed.
func (in *installer) ensure(ctx context.Context, pkgs ...string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	var missing []string
	for _, p := range pkgs {
		if !in.installed(p) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("packages %v missing and not root to install them", missing)
	}
	if !in.updated {
		in.updated = true
		in.logf("apt-get update (once per run)")
		if err := in.run(ctx, []string{"apt-get", "update"}); err != nil {
			// Cached lists may still do; the install says if not.
			in.logf("apt-get update failed: %v", err)
		}
	}
	in.logf("installing %s with apt-get", strings.Join(missing, " "))
	if err := in.run(ctx, installArgv(missing)); err != nil {
		return fmt.Errorf("install %s: %w", strings.Join(missing, " "), err)
	}
	var still []string
	for _, p := range missing {
		if !in.installed(p) {
			still = append(still, p)
		}
	}
	if len(still) > 0 {
		return fmt.Errorf("apt-get succeeded but %s not installed", strings.Join(still, " "))
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
