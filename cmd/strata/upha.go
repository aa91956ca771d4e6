package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// `strata up --ha`: the embedded cluster with every metadata voter and
// every storage server in a process of its own (this binary run as
// `strata meta` and `strata store`), so that killing one of them — kill -9
// of a primary's server, of the metadata leader — is what losing a machine
// is to the others, while the mount stays in this process. A child that
// dies is started again after --ha-restart-delay (its targets then resync),
// as an operator would bring a machine back; 0 leaves it dead.
//
// The children's addresses are chosen at the first start and kept in
// DATA/ha.json, so that a restart (of one child, or of the whole cluster)
// serves on the addresses the metadata service and the mirror groups know.

// haLayout is DATA/ha.json.
type haLayout struct {
	Voters []string `json:"voters"` // the voters' --listen addresses
	Stores []string `json:"stores"` // the storage servers' --listen addresses
	// StoreMetrics are the storage servers' --metrics-addr (/metrics, for
	// scripts such as scripts/mirror-bars.sh); a layout saved without them
	// gets them at the next start.
	StoreMetrics []string `json:"store_metrics,omitempty"`
}

// haChild is one supervised child process.
type haChild struct {
	name string
	argv []string
	log  string // its log file

	mu struct {
		sync.Mutex
		cmd     *exec.Cmd
		done    chan struct{}
		stopped bool // the cluster is stopping: no restart
	}
}

// haCluster supervises the children of `strata up --ha`.
type haCluster struct {
	bin          string
	restartDelay time.Duration
	children     []*haChild
	wg           sync.WaitGroup
}

// haLayoutFor returns the saved layout of dataDir, or a new one with free
// loopback ports (voters on consecutive ports, as --meta-voters places
// them), saved before anything starts.
func haLayoutFor(dataDir, metaListen string, voters, stores int) (haLayout, error) {
	p := filepath.Join(dataDir, "ha.json")
	if b, err := os.ReadFile(p); err == nil {
		var l haLayout
		if err := json.Unmarshal(b, &l); err != nil {
			return haLayout{}, fmt.Errorf("read %s: %w", p, err)
		}
		if len(l.Voters) != voters || len(l.Stores) != stores {
			return haLayout{}, fmt.Errorf("%s holds %d voters and %d storage servers, not %d and %d: start it with --meta-voters %d --stores %d, or use a new --data",
				p, len(l.Voters), len(l.Stores), voters, stores, len(l.Voters), len(l.Stores))
		}
		if len(l.StoreMetrics) != len(l.Stores) {
			if l.StoreMetrics, err = freeLoopbackAddrs(len(l.Stores), append(slices.Clone(l.Voters), l.Stores...)); err != nil {
				return haLayout{}, err
			}
			if err := saveHALayout(p, l); err != nil {
				return haLayout{}, err
			}
		}
		return l, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return haLayout{}, fmt.Errorf("read %s: %w", p, err)
	}
	if _, err := os.Stat(filepath.Join(voterDir(dataDir, 0), "meta.json")); err == nil {
		return haLayout{}, fmt.Errorf("%s holds a cluster started without --ha: start it without --ha, or use a new --data", dataDir)
	}
	vs, err := voterAddrs(dataDir, metaListen, voters)
	if err != nil {
		return haLayout{}, err
	}
	l := haLayout{Voters: vs}
	// One round of listeners for both lists, so that no address repeats.
	addrs, err := freeLoopbackAddrs(2*stores, vs)
	if err != nil {
		return haLayout{}, err
	}
	l.Stores, l.StoreMetrics = addrs[:stores], addrs[stores:]
	if err := saveHALayout(p, l); err != nil {
		return haLayout{}, err
	}
	return l, nil
}

// freeLoopbackAddrs answers n distinct free loopback addresses (free when
// asked: they are closed again before the answer), none of them in
// taken — the voters' ports, chosen and released before, which the kernel
// may hand out again.
func freeLoopbackAddrs(n int, taken []string) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var addrs []string
	for try := 0; len(addrs) < n; try++ {
		if try >= n+100 {
			return nil, fmt.Errorf("no %d free loopback ports apart from %v", n, taken)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port for a storage server: %w", err)
		}
		lns = append(lns, ln) // held until the end: never answered twice
		if a := ln.Addr().String(); !slices.Contains(taken, a) {
			addrs = append(addrs, a)
		}
	}
	return addrs, nil
}

// saveHALayout writes l to p (DATA/ha.json).
func saveHALayout(p string, l haLayout) error {
	b, _ := json.MarshalIndent(l, "", "  ")
	if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// startHA starts the voters and the storage servers of o as child
// processes and returns the voters' addresses once they are started (the
// caller waits for the targets). stop ends them all.
func startHA(o upOptions, dataDir, keyFile string) (metaAddrs []string, h *haCluster, err error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find the strata binary: %w", err)
	}
	l, err := haLayoutFor(dataDir, o.metaListen, o.metaVoters, o.stores)
	if err != nil {
		return nil, nil, err
	}
	logs := filepath.Join(dataDir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create %s: %w", logs, err)
	}
	h = &haCluster{bin: bin, restartDelay: o.haRestartDelay}
	metaList := strings.Join(l.Voters, ",")
	common := []string{"--key-file", keyFile}
	if o.tlsFiles.cert != "" {
		common = append(common, "--tls-cert", o.tlsFiles.cert, "--tls-key", o.tlsFiles.key, "--tls-ca", o.tlsFiles.ca)
	}
	for i, addr := range l.Voters {
		argv := append([]string{"meta", "--listen", addr, "--data", voterDir(dataDir, i), "--peers", metaList,
			"--disk-reserve", fmt.Sprint(o.metaDiskReserve)}, common...)
		if o.strictMetaSync {
			argv = append(argv, "--strict-sync")
		}
		if o.failoverTimeout > 0 {
			argv = append(argv, "--failover-timeout", o.failoverTimeout.String())
		}
		h.children = append(h.children, &haChild{name: fmt.Sprintf("meta-%d", i+1), argv: argv})
	}
	for i, addr := range l.Stores {
		argv := append([]string{"store", "--listen", addr, "--meta", metaList, "--sync-interval", o.syncInterval.String(),
			"--metrics-addr", l.StoreMetrics[i]}, common...)
		for t := 0; t < o.targetsPerStore; t++ {
			dir := filepath.Join(dataDir, fmt.Sprintf("store%d", i), fmt.Sprintf("target%d", t))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, nil, fmt.Errorf("create target dir: %w", err)
			}
			argv = append(argv, "--target", dir)
		}
		h.children = append(h.children, &haChild{name: fmt.Sprintf("store-%d", i+1), argv: argv})
	}
	for _, c := range h.children {
		c.log = filepath.Join(logs, c.name+".log")
		if err := h.start(c); err != nil {
			h.stop()
			return nil, nil, err
		}
	}
	slog.Info("ha cluster started", "voters", l.Voters, "stores", l.Stores, "logs", logs)
	return l.Voters, h, nil
}

// start runs c and supervises it: when it ends while the cluster runs, it
// is logged and started again after the restart delay.
func (h *haCluster) start(c *haChild) error {
	lf, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log of %s: %w", c.name, err)
	}
	fmt.Fprintf(lf, "=== %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), h.bin, strings.Join(c.argv, " "))
	cmd := exec.Command(h.bin, c.argv...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group (a Ctrl-C at the terminal reaches only this
	// process, which stops the children in order), and SIGTERM should
	// this process die without stopping them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.stopped {
		lf.Close()
		return nil
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.mu.cmd, c.mu.done = cmd, done
	slog.Info("child started", "name", c.name, "pid", cmd.Process.Pid, "log", c.log)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		werr := cmd.Wait()
		lf.Close()
		close(done)
		c.mu.Lock()
		stopped := c.mu.stopped
		c.mu.Unlock()
		if stopped {
			return
		}
		if h.restartDelay <= 0 {
			slog.Error("child died; not restarted (--ha-restart-delay 0)", "name", c.name, "pid", cmd.Process.Pid, "err", werr, "log", c.log)
			return
		}
		slog.Error("child died; restarting it", "name", c.name, "pid", cmd.Process.Pid, "err", werr, "in", h.restartDelay, "log", c.log)
		t := time.NewTimer(h.restartDelay)
		defer t.Stop()
		<-t.C
		if err := h.start(c); err != nil {
			slog.Error("restart failed", "name", c.name, "err", err)
		}
	}()
	return nil
}

// stop ends every child: storage servers first, then the voters, each
// with SIGTERM and, after 15 s, SIGKILL. It returns the children that did
// not exit cleanly.
func (h *haCluster) stop() error {
	var errs []error
	for i := len(h.children) - 1; i >= 0; i-- {
		c := h.children[i]
		c.mu.Lock()
		c.mu.stopped = true
		cmd, done := c.mu.cmd, c.mu.done
		c.mu.Unlock()
		if cmd == nil {
			continue
		}
		select {
		case <-done:
			continue
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped child cannot handle SIGTERM
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			if st := cmd.ProcessState; st != nil && !st.Success() {
				errs = append(errs, fmt.Errorf("%s: %v (log %s)", c.name, st, c.log))
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			errs = append(errs, fmt.Errorf("%s did not stop within 15 s of SIGTERM: killed (log %s)", c.name, c.log))
		}
	}
	h.wg.Wait()
	return errors.Join(errs...)
}

// haPairAll pairs every unpaired target into mirror groups across servers
// (what `strata mirror create --auto` does) and, with mirrorRoot, marks the
// root directory mirrored so that every new file is (a directory whose
// mark an operator changed keeps it: the root's mark is set only on the
// first start, when there are no groups yet). It waits a bounded time for
// the metadata service to answer.
func haPairAll(ctx context.Context, metaAddrs []string, key []byte, mirrorRoot bool) ([]rpc.GroupInfo, error) {
	c := transport.NewMulti(metaAddrs, transport.MultiConfig{ClientConfig: transport.ClientConfig{Key: key, TLS: adminTLS, Conns: 1}})
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var before rpc.ListGroupsResp
	if err := c.Call(cctx, rpc.MListGroups, &rpc.Empty{}, &before); err != nil {
		return nil, fmt.Errorf("list the mirror groups: %w", err)
	}
	var made rpc.ListGroupsResp
	req := &rpc.MirrorCreateReq{Hdr: rpc.ReqHeader{ClientID: uint64(os.Getpid()), Seq: uint64(time.Now().UnixNano())}, Auto: true}
	if err := c.Call(cctx, rpc.MMirrorCreate, req, &made); err != nil {
		return nil, fmt.Errorf("pair the targets into mirror groups: %w", err)
	}
	if mirrorRoot && len(before.Groups) == 0 && len(made.Groups) > 0 {
		const rootIno = 1
		set := &rpc.SetDirLayoutReq{Hdr: rpc.ReqHeader{ClientID: uint64(os.Getpid()), Seq: uint64(time.Now().UnixNano())},
			Dir: rootIno, Mirror: rpc.DirMirrorOn}
		if err := c.Call(cctx, rpc.MSetDirLayout, set, &rpc.AttrResp{}); err != nil {
			return nil, fmt.Errorf("mark the root directory mirrored: %w", err)
		}
	}
	return append(before.Groups, made.Groups...), nil
}
