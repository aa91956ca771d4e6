package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/netns"
)

// ClusterConfig says what to start.
type ClusterConfig struct {
	// Bin is the strata binary every process runs.
	Bin string
	// Dir holds the cluster's data, logs, key file and mount point.
	Dir string
	// Voters is the number of metadata voters (3 or 5); Stores the number
	// of storage servers.
	Voters, Stores int
	// TargetsPerStore: targets of each storage server (default 1).
	TargetsPerStore int
	// MountFlags are extra flags of `strata mount` (e.g. --sync-policy);
	// MetaFlags of every voter, StoreFlags of every store.
	MountFlags, MetaFlags, StoreFlags []string
	// Mirror: once the stores registered, pair their targets into mirror
	// groups (`strata mirror create --auto`) and mark MirrorDirs
	// (directories made under the mount) mirrored (`strata stripe set
	// --mirror`), so that the files made there live on groups.
	Mirror     bool
	MirrorDirs []string
	// FaultDisks: every target is a `strata faultfs` mount whose mode the
	// disk faults switch (disks.go).
	FaultDisks bool
	// LockClient: a second mount (a client of its own, at LockMount) for
	// the kill-lock-client fault's lock holder (lockfault.go).
	LockClient bool
	// Hosts says where the processes run: Loopback (default) or Netns
	// (each voter on a host of its own; with Mirror each store too).
	Hosts string
	// Shaped: the Netns hosts' links are forwarded by this process, so
	// that the delay fault works on kernels without netem.
	Shaped bool
	Log    *slog.Logger
}

// Cluster is a running set of strata processes on loopback or on hosts
// that are network namespaces.
type Cluster struct {
	cfg       ClusterConfig
	keyFile   string
	MetaAddrs []string
	Mount     string
	// LockMount: the second mount's point (ClusterConfig.LockClient).
	LockMount string
	hosts     *hosts // nil on loopback

	// StoreAddrs are the stores' --listen addresses, by index.
	StoreAddrs []string
	disks      [][]*disk // by store, by target (FaultDisks)

	mu     sync.Mutex
	voters []*proc // by index; nil while stopped
	stores []*proc // by index
	mount  *proc
	mount2 *proc   // the lock client's mount
	faulty []*proc // the faultfs processes (the disks: never killed by a fault)
}

// proc is one child process.
type proc struct {
	name string
	argv []string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

// start runs the binary with argv on host h (nil: in this process's
// network namespace).
func (c *Cluster) start(name string, h *netns.Host, argv ...string) (*proc, error) {
	return c.startEnv(name, h, nil, argv...)
}

// startEnv is start with env added to this process's environment.
func (c *Cluster) startEnv(name string, h *netns.Host, env []string, argv ...string) (*proc, error) {
	lf, err := os.OpenFile(filepath.Join(c.cfg.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	fmt.Fprintf(lf, "=== %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(c.cfg.Bin, argv...)
	if h != nil {
		cmd = h.Command(context.Background(), c.cfg.Bin, argv...)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, argv: argv, cmd: cmd, done: make(chan struct{}), log: lf}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig and, for SIGKILL, waits (bounded) for the process to go.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited() {
		return fmt.Errorf("%s (pid %d) already exited: %v", p.name, p.cmd.Process.Pid, p.err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, p.name, err)
	}
	if sig == syscall.SIGKILL {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s (pid %d) did not die within 10s of SIGKILL", p.name, p.cmd.Process.Pid)
		}
	}
	return nil
}

// stop ends the process with SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT) // a stopped process cannot handle SIGTERM
	syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// freePorts returns n distinct free loopback ports' addresses.
func freePorts(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		lns = append(lns, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// StartCluster starts the voters, waits for a leader, then the stores and
// the mount. On error everything started is stopped.
func StartCluster(ctx context.Context, cfg ClusterConfig) (c *Cluster, err error) {
	if cfg.Voters < 1 || cfg.Stores < 1 {
		return nil, fmt.Errorf("cluster needs at least one voter and one store (got %d, %d)", cfg.Voters, cfg.Stores)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Hosts == "" {
		cfg.Hosts = Loopback
	}
	if cfg.Hosts != Loopback && cfg.Hosts != Netns {
		return nil, fmt.Errorf("hosts %q: want %s or %s", cfg.Hosts, Loopback, Netns)
	}
	c = &Cluster{cfg: cfg, Mount: filepath.Join(cfg.Dir, "mnt")}
	if cfg.LockClient {
		c.LockMount = filepath.Join(cfg.Dir, "mnt2")
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs"), c.Mount, c.LockMount} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	key := make([]byte, 16)
	rand.Read(key)
	c.keyFile = filepath.Join(cfg.Dir, "key")
	if err := os.WriteFile(c.keyFile, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	var storeAddrs []string
	if cfg.Hosts == Netns {
		if err := RemoveLeftovers(cfg.Log); err != nil {
			return nil, err
		}
		storeHosts := 0
		if cfg.Mirror {
			storeHosts = cfg.Stores
		}
		if c.hosts, err = newHosts(cfg.Voters, storeHosts, cfg.Shaped); err != nil {
			return nil, err
		}
		for _, h := range c.hosts.voters {
			c.MetaAddrs = append(c.MetaAddrs, h.Addr+":7400")
		}
		for i := range cfg.Stores {
			storeAddrs = append(storeAddrs, fmt.Sprintf("%s:%d", c.storeHost(i).Addr, 7500+i))
		}
	} else {
		if c.MetaAddrs, err = freePorts(cfg.Voters); err != nil {
			return nil, err
		}
		if storeAddrs, err = freePorts(cfg.Stores); err != nil {
			return nil, err
		}
	}
	c.voters = make([]*proc, cfg.Voters)
	for i := range cfg.Voters {
		if err := c.StartVoter(i); err != nil {
			return nil, err
		}
	}
	if _, err := c.WaitLeader(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	c.StoreAddrs = storeAddrs
	if cfg.FaultDisks {
		if err := c.startDisks(); err != nil {
			return nil, err
		}
	}
	c.stores = make([]*proc, cfg.Stores)
	if err := c.startServing(ctx); err != nil {
		return nil, err
	}
	if cfg.Mirror {
		if err := c.setUpMirror(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// startServing starts every store that is not running and the mount, and
// waits (60 s) for the mount and for every target to be alive.
func (c *Cluster) startServing(ctx context.Context) error {
	for i := range c.StoreAddrs {
		if err := c.StartStore(i); err != nil {
			return err
		}
	}
	argv := append([]string{"mount", "--meta", c.metaList(), "--key-file", c.keyFile}, c.cfg.MountFlags...)
	m, err := c.start("mount", c.clientHost(), append(argv, c.Mount)...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.mount = m
	c.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for !onStrata(c.Mount) {
		if m.exited() || time.Now().After(deadline) {
			return fmt.Errorf("mount at %s did not come up (see %s)", c.Mount, filepath.Join(c.cfg.Dir, "logs", "mount.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c.cfg.LockClient {
		if err := c.startLockMount(deadline); err != nil {
			return err
		}
	}
	// Wait until files can be placed: every store registered.
	return c.waitTargets(ctx, deadline)
}

// waitTargets waits until every target is alive, until deadline.
func (c *Cluster) waitTargets(ctx context.Context, deadline time.Time) error {
	want := c.cfg.Stores * c.targetsPerStore()
	for {
		st, err := c.Status(ctx)
		if err == nil && liveTargets(st) >= want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%d of %d targets alive", liveTargets(st), want)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("stores did not register: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Cluster) targetsPerStore() int { return max(1, c.cfg.TargetsPerStore) }

// targetDir is target j of store i (a faultfs mount with FaultDisks).
func (c *Cluster) targetDir(i, j int) string {
	return filepath.Join(c.cfg.Dir, fmt.Sprintf("store-%d", i+1), fmt.Sprintf("t%d", j))
}

// StoreArgs is store i's command line (after the binary).
func (c *Cluster) StoreArgs(i int) []string {
	argv := []string{"store", "--meta", c.metaList(), "--listen", c.StoreAddrs[i], "--key-file", c.keyFile}
	for j := range c.targetsPerStore() {
		argv = append(argv, "--target", c.targetDir(i, j))
	}
	return append(argv, c.cfg.StoreFlags...)
}

// StartStore (re)starts store i on its targets.
func (c *Cluster) StartStore(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.stores[i]; p != nil && !p.exited() {
		return fmt.Errorf("store %s is running", c.StoreAddrs[i])
	}
	for j := range c.targetsPerStore() {
		if err := os.MkdirAll(c.targetDir(i, j), 0o755); err != nil {
			return err
		}
	}
	// Its failpoints file (heartbeat-loss-primary), empty until a fault.
	env := []string{failpoint.FileEnvVar + "=" + c.failpointsFile(i)}
	p, err := c.startEnv(fmt.Sprintf("store-%d", i+1), c.storeHost(i), env, c.StoreArgs(i)...)
	if err != nil {
		return err
	}
	c.stores[i] = p
	return nil
}

// failpointsFile is store i's STRATA_FAILPOINTS_FILE.
func (c *Cluster) failpointsFile(i int) string {
	return filepath.Join(c.cfg.Dir, "logs", fmt.Sprintf("store-%d.failpoints", i+1))
}

// setStoreFailpoints arms store i's failpoints as spec says ("": none);
// the store reads the file within failpoint.FilePoll.
func (c *Cluster) setStoreFailpoints(i int, spec string) error {
	tmp := c.failpointsFile(i) + ".new"
	if err := os.WriteFile(tmp, []byte(spec+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, c.failpointsFile(i))
}

// SignalStore sends sig to store i (SIGKILL waits for it to die).
func (c *Cluster) SignalStore(i int, sig syscall.Signal) error {
	c.mu.Lock()
	p := c.stores[i]
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("store %s was never started", c.StoreAddrs[i])
	}
	return p.signal(sig)
}

// StoreIndex maps a store's --listen address to its index, or -1.
func (c *Cluster) StoreIndex(addr string) int {
	for i, a := range c.StoreAddrs {
		if a == addr {
			return i
		}
	}
	return -1
}

func (c *Cluster) metaList() string { return strings.Join(c.MetaAddrs, ",") }

// clientHost is where the stores, the mount and `strata status` run (nil:
// this process's namespace).
func (c *Cluster) clientHost() *netns.Host {
	if c.hosts == nil {
		return nil
	}
	return c.hosts.client
}

// storeHost is store i's host: its own with Mirror on Netns, else the
// client's (nil: this process's namespace).
func (c *Cluster) storeHost(i int) *netns.Host {
	if c.hosts == nil {
		return nil
	}
	if i < len(c.hosts.stores) {
		return c.hosts.stores[i]
	}
	return c.hosts.client
}

// voterHost is voter i's host (nil: this process's namespace).
func (c *Cluster) voterHost(i int) *netns.Host {
	if c.hosts == nil {
		return nil
	}
	return c.hosts.voters[i]
}

// VoterArgs is voter i's command line (after the binary).
func (c *Cluster) VoterArgs(i int) []string {
	return append([]string{"meta", "--listen", c.MetaAddrs[i], "--data", filepath.Join(c.cfg.Dir, fmt.Sprintf("meta-%d", i+1)),
		"--peers", c.metaList(), "--key-file", c.keyFile}, c.cfg.MetaFlags...)
}

// StartVoter (re)starts voter i with its data directory.
func (c *Cluster) StartVoter(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.voters[i]; p != nil && !p.exited() {
		return fmt.Errorf("voter %s is running", c.MetaAddrs[i])
	}
	p, err := c.start(fmt.Sprintf("meta-%d", i+1), c.voterHost(i), c.VoterArgs(i)...)
	if err != nil {
		return err
	}
	c.voters[i] = p
	return nil
}

// Signal sends sig to voter i (SIGKILL waits for it to die).
func (c *Cluster) Signal(i int, sig syscall.Signal) error {
	c.mu.Lock()
	p := c.voters[i]
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("voter %s is not running", c.MetaAddrs[i])
	}
	return p.signal(sig)
}

// VoterIndex maps an address to its voter index, or -1.
func (c *Cluster) VoterIndex(addr string) int {
	for i, a := range c.MetaAddrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// liveTargets counts the targets st says are alive.
func liveTargets(st *admin.Status) int {
	n := 0
	for _, t := range st.Targets {
		if t.Alive {
			n++
		}
	}
	return n
}

// Status runs `strata status --json` against the voters' list.
func (c *Cluster) Status(ctx context.Context) (*admin.Status, error) {
	out, err := c.admin(ctx, "status", "--json")
	if err != nil {
		return nil, err
	}
	var s admin.Status
	if err := json.Unmarshal(out, &s); err != nil {
		return nil, fmt.Errorf("strata status --json: %w", err)
	}
	return &s, nil
}

// admin runs `strata ARGS --meta VOTERS --key-file K` on the client host
// (10 s at most) and returns its standard output.
func (c *Cluster) admin(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	args = append(args, "--meta", c.metaList(), "--key-file", c.keyFile)
	cmd := c.clientCommand(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("strata %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// clientCommand is `strata ARGS` on the client host.
func (c *Cluster) clientCommand(ctx context.Context, args ...string) *exec.Cmd {
	if h := c.clientHost(); h != nil {
		return h.Command(ctx, c.cfg.Bin, args...)
	}
	return exec.CommandContext(ctx, c.cfg.Bin, args...)
}

// WaitLeader waits until the status names a leader, bounded by d.
func (c *Cluster) WaitLeader(ctx context.Context, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	var last error
	for {
		st, err := c.Status(ctx)
		if err == nil && st.Meta.Leader != "" {
			return st.Meta.Leader, nil
		}
		if err != nil {
			last = err
		} else {
			last = errors.New("no leader named")
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("no metadata leader within %v: %v", d, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitCaughtUp waits until voter addr reports itself a follower or leader
// with an applied index within lag of the leader's, bounded by d.
func (c *Cluster) WaitCaughtUp(ctx context.Context, addr string, lag uint64, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for {
		if st, err := c.Status(ctx); err == nil {
			var leaderIdx, idx uint64
			state := ""
			for _, v := range st.Meta.Voters {
				if v.Address == st.Meta.Leader {
					leaderIdx = v.AppliedIndex
				}
				if v.Address == addr {
					idx, state = v.AppliedIndex, v.State
				}
			}
			if (state == "follower" || state == "leader") && idx+lag >= leaderIdx {
				return nil
			}
			last = fmt.Sprintf("state %q applied %d, leader %d", state, idx, leaderIdx)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("voter %s did not catch up within %v: %s", addr, d, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Stop ends the mount, the stores and the voters (SIGTERM, then SIGKILL),
// detaches the mount point if the mount left it behind, and deletes the
// hosts' namespaces (with their packet-fault rules).
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mount.stop(30 * time.Second)
	c.mount2.stop(30 * time.Second)
	for _, m := range []string{c.Mount, c.LockMount} {
		if m != "" && onStrata(m) {
			syscall.Unmount(m, syscall.MNT_DETACH)
		}
	}
	for _, p := range c.stores {
		p.stop(30 * time.Second)
	}
	for _, p := range c.voters {
		p.stop(30 * time.Second)
	}
	c.stopDisks()
	if c.hosts != nil {
		if err := c.hosts.net.Close(); err != nil {
			c.cfg.Log.Warn("chaos: delete the hosts' namespaces", "err", err)
		}
		c.hosts = nil
	}
}

func onStrata(dir string) bool {
	_, ok, err := mountinfo.OnStrata(dir)
	return ok && err == nil
}
