package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/mountinfo"
)

// Binary returns the strata binary for real-process tests: $STRATA_BIN, or a
// fresh build of ./cmd/strata into a temp dir (once per test binary).
func Binary(t testing.TB) string {
	t.Helper()
	if b := os.Getenv("STRATA_BIN"); b != "" {
		return b
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "strata-bin-")
		if err != nil {
			buildErr = err
			return
		}
		out := filepath.Join(dir, "strata")
		cmd := exec.Command("go", "build", "-o", out, "github.com/stratafs/strata/cmd/strata")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, b)
			return
		}
		builtBin = out
	})
	if buildErr != nil {
		t.Fatalf("build strata: %v", buildErr)
	}
	return builtBin
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// RequireFUSE skips the test when FUSE mounts cannot work here.
func RequireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for FUSE mounts with allow_other")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("/dev/fuse unusable: %v", err)
	}
	f.Close()
	if _, err := exec.LookPath("fusermount3"); err != nil {
		if _, err2 := exec.LookPath("fusermount"); err2 != nil {
			t.Skip("fusermount3 not installed (apt-get install fuse3)")
		}
	}
}

// FreePort returns a loopback address with a port that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Proc is one real strata process whose output goes to a log file.
type Proc struct {
	Name string
	Args []string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs bin with args (prefix: command to run it under, e.g. ip netns exec).
func StartProc(t testing.TB, dir, name string, prefix []string, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Args: args, Log: filepath.Join(dir, name+".log")}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	all := append(append(append([]string{}, prefix...), bin), args...)
	p.cmd = exec.Command(all[0], all[1:]...)
	p.cmd.Stdout = logf
	p.cmd.Stderr = logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p.done = make(chan struct{})
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p
}

// Pid of the process.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to d for the process to end and returns its exit error.
func (p *Proc) Wait(d time.Duration) (error, bool) {
	select {
	case <-p.done:
		return p.err, true
	case <-time.After(d):
		return nil, false
	}
}

// Kill sends SIGKILL to the process (kill -9) and waits for it.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to d, then kills.
func (p *Proc) Stop(d time.Duration) error {
	if p.Exited() {
		return p.err
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err, ok := p.Wait(d); ok {
		return err
	}
	p.Kill()
	return fmt.Errorf("%s did not stop within %v after SIGTERM; killed", p.Name, d)
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitFor polls cond every 50 ms until it returns nil or d passes.
func WaitFor(d time.Duration, cond func() error) error {
	deadline := time.Now().Add(d)
	var err error
	for {
		if err = cond(); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// IsMounted reports whether dir is a FUSE mount point (mountinfo).
func IsMounted(dir string) bool {
	abs, _ := filepath.Abs(dir)
	ms, err := mountinfo.Read()
	if err != nil {
		return false
	}
	for _, m := range ms {
		if m.Point == abs && strings.HasPrefix(m.FSType, "fuse") {
			return true
		}
	}
	return false
}

// ForceUnmount detaches a leftover mount (after a kill -9 of its daemon).
func ForceUnmount(dir string) {
	if !IsMounted(dir) {
		return
	}
	_ = exec.Command("fusermount3", "-u", "-z", dir).Run()
	if IsMounted(dir) {
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	}
}

// ProcCluster is a Strata cluster of real processes on loopback: one
// metadata service, storage servers and FUSE mounts, each its own process.
type ProcCluster struct {
	t         testing.TB
	Bin       string
	Dir       string
	MetaAddr  string
	KeyFile   string
	Meta      *Proc
	Stores    []*Proc
	Mounts    []*Proc
	MountDirs []string
	storeArgs [][]string
	mountArgs [][]string
	metaArgs  []string
	authArgs  []string
}

// ProcOptions shapes a ProcCluster.
type ProcOptions struct {
	Stores          int        // default 2
	TargetsPerStore int        // default 2
	Mounts          int        // default 1
	MountArgs       []string   // extra flags for strata mount, e.g. --io-timeout 3s
	MetaArgs        []string   // extra flags for strata meta, e.g. --orphan-grace 1s
	TargetDirs      [][]string // optional: explicit target dirs per store
	AuthArgs        []string   // extra flags for every command, e.g. --tls-cert …
}

// StartProcCluster starts the processes and waits until every target is
// registered and every mount is up. Everything is stopped at test cleanup
// (and logs are printed if the test failed).
func StartProcCluster(t testing.TB, o ProcOptions) *ProcCluster {
	t.Helper()
	RequireFUSE(t)
	if o.Stores == 0 {
		o.Stores = 2
	}
	if o.TargetsPerStore == 0 {
		o.TargetsPerStore = 2
	}
	if o.Mounts == 0 {
		o.Mounts = 1
	}
	c := &ProcCluster{t: t, Bin: Binary(t), Dir: t.TempDir(), authArgs: o.AuthArgs}
	// t.TempDir makes 0700 directories; other users must reach the mounts
	// (permission tests run as nobody).
	_ = os.Chmod(c.Dir, 0o755)
	_ = os.Chmod(filepath.Dir(c.Dir), 0o755)
	c.KeyFile = filepath.Join(c.Dir, "cluster.key")
	if err := os.WriteFile(c.KeyFile, []byte("test-cluster-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.MetaAddr = FreePort(t)
	c.metaArgs = append([]string{"meta", "--listen", c.MetaAddr, "--data", filepath.Join(c.Dir, "meta"), "--key-file", c.KeyFile}, slices.Concat(o.MetaArgs, o.AuthArgs)...)
	t.Cleanup(c.stopAll)
	c.StartMeta()
	for i := 0; i < o.Stores; i++ {
		args := append([]string{"store", "--meta", c.MetaAddr, "--listen", "127.0.0.1:0", "--key-file", c.KeyFile}, o.AuthArgs...)
		for j := 0; j < o.TargetsPerStore; j++ {
			dir := filepath.Join(c.Dir, fmt.Sprintf("store%d", i), fmt.Sprintf("t%d", j))
			if o.TargetDirs != nil {
				dir = o.TargetDirs[i][j]
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--target", dir)
		}
		c.storeArgs = append(c.storeArgs, args)
		c.Stores = append(c.Stores, nil)
		c.StartStore(i)
	}
	c.WaitTargets(o.Stores*o.TargetsPerStore, 20*time.Second)
	for i := 0; i < o.Mounts; i++ {
		dir := filepath.Join(c.Dir, fmt.Sprintf("mnt%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"mount", "--meta", c.MetaAddr, "--key-file", c.KeyFile}, slices.Concat(o.MountArgs, o.AuthArgs)...)
		args = append(args, dir)
		c.mountArgs = append(c.mountArgs, args)
		c.MountDirs = append(c.MountDirs, dir)
		c.Mounts = append(c.Mounts, nil)
		c.StartMount(i)
	}
	return c
}

// StartMeta (re)starts the metadata service and waits until it answers.
func (c *ProcCluster) StartMeta() {
	c.t.Helper()
	c.Meta = StartProc(c.t, c.Dir, "meta", nil, c.Bin, c.metaArgs...)
	if err := WaitFor(20*time.Second, func() error {
		if c.Meta.Exited() {
			return errors.New("meta exited:\n" + c.Meta.Tail(20))
		}
		_, err := c.Status()
		return err
	}); err != nil {
		c.t.Fatalf("metadata service did not come up: %v", err)
	}
}

// StartStore (re)starts storage server i.
func (c *ProcCluster) StartStore(i int) {
	c.t.Helper()
	c.Stores[i] = StartProc(c.t, c.Dir, fmt.Sprintf("store%d", i), nil, c.Bin, c.storeArgs[i]...)
}

// StartMount (re)starts mount i and waits until it is mounted.
func (c *ProcCluster) StartMount(i int) {
	c.t.Helper()
	ForceUnmount(c.MountDirs[i])
	p := StartProc(c.t, c.Dir, fmt.Sprintf("mount%d", i), nil, c.Bin, c.mountArgs[i]...)
	c.Mounts[i] = p
	if err := WaitFor(20*time.Second, func() error {
		if p.Exited() {
			return errors.New("mount exited:\n" + p.Tail(20))
		}
		if !IsMounted(c.MountDirs[i]) {
			return errors.New("not mounted yet")
		}
		return nil
	}); err != nil {
		c.t.Fatalf("mount %d did not come up: %v", i, err)
	}
}

// Mount returns the path of mount i.
func (c *ProcCluster) Mount(i int) string { return c.MountDirs[i] }

// ClusterStatus is the subset of `strata status --json` tests look at.
type ClusterStatus struct {
	Servers []struct {
		ID    uint32 `json:"id"`
		Addr  string `json:"address"`
		Alive bool   `json:"alive"`
	} `json:"servers"`
	Targets []struct {
		ID         uint32 `json:"id"`
		ServerID   uint32 `json:"server_id"`
		Path       string `json:"path"`
		TotalBytes uint64 `json:"size_bytes"`
		FreeBytes  uint64 `json:"avail_bytes"` // what writes may use: free less the reserve
		Alive      bool   `json:"alive"`
	} `json:"targets"`
}

// Status runs `strata status --json`.
func (c *ProcCluster) Status() (*ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := append([]string{"status", "--json", "--meta", c.MetaAddr, "--key-file", c.KeyFile}, c.authArgs...)
	out, err := exec.CommandContext(ctx, c.Bin, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("strata status: %v: %s", err, out)
	}
	var st ClusterStatus
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("status json: %v: %s", err, out)
	}
	return &st, nil
}

// WaitTargets waits until n targets are registered and alive.
func (c *ProcCluster) WaitTargets(n int, d time.Duration) {
	c.t.Helper()
	if err := WaitFor(d, func() error {
		st, err := c.Status()
		if err != nil {
			return err
		}
		alive := 0
		for _, t := range st.Targets {
			if t.Alive {
				alive++
			}
		}
		if alive < n {
			return fmt.Errorf("%d of %d targets alive", alive, n)
		}
		return nil
	}); err != nil {
		for _, s := range c.Stores {
			if s != nil {
				c.t.Logf("%s log:\n%s", s.Name, s.Tail(30))
			}
		}
		c.t.Fatalf("targets: %v", err)
	}
}

// KillAll kill -9s every process (mounts first), then detaches dead mounts.
func (c *ProcCluster) KillAll() {
	for _, p := range c.Mounts {
		if p != nil {
			p.Kill()
		}
	}
	for _, p := range c.Stores {
		if p != nil {
			p.Kill()
		}
	}
	if c.Meta != nil {
		c.Meta.Kill()
	}
	for _, d := range c.MountDirs {
		ForceUnmount(d)
	}
}

func (c *ProcCluster) stopAll() {
	for i, p := range c.Mounts {
		if p != nil && !p.Exited() {
			if err := p.Stop(15 * time.Second); err != nil {
				c.t.Logf("stop mount: %v", err)
			}
		}
		ForceUnmount(c.MountDirs[i])
	}
	for _, p := range c.Stores {
		if p != nil {
			_ = p.Stop(10 * time.Second)
		}
	}
	if c.Meta != nil {
		_ = c.Meta.Stop(10 * time.Second)
	}
	if c.t.Failed() {
		all := append([]*Proc{c.Meta}, append(c.Stores, c.Mounts...)...)
		for _, p := range all {
			if p != nil {
				c.t.Logf("---- %s log (tail) ----\n%s", p.Name, p.Tail(40))
			}
		}
	}
}
