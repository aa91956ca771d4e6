package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// ErrNotLeader is the errno-carrying error answered by a node that is not
// the leader: ENOTCONN, with the leader's raft address and id in the text —
// for a voter of a group (Config.Peers), the leader's rpc address as
// rpc.NotLeader's hint. Clients retry on the leader.
var ErrNotLeader = syscall.ENOTCONN

const (
	// openWait bounds how long Open waits for leadership.
	openWait = 10 * time.Second
	// applyTimeout bounds one proposal (enqueue + commit + apply).
	applyTimeout = 10 * time.Second
)

// Service is a running metadata service: one raft node, its state machine
// and the rpc server in front of them.
type Service struct {
	cfg  Config
	log  *slog.Logger
	db   kv.Store
	fsm  *fsm
	node *consensus.Node
	// members: the membership methods' state (membership.go).
	members *membership
	// raftNode is node for the store's flush hook, which can run before
	// node is set.
	raftNode atomic.Pointer[consensus.Node]
	srv      *transport.Server
	ln       net.Listener
	web      *http.Server
	webAddr  string // the metrics listener's address ("" without one)
	m        *metrics
	disk     *diskSpace // free space of DataDir's file system

	locks *lockTable
	sess  *sessions
	live  *liveness
	dirs  knownDirs
	mir   mirrorState
	// haLeases: the leader's memory of the named leases it granted (halease.go)
	haLeases haLeases
	// dg: the leader's memory of create delegations (delegation.go)
	dg *delegMgr
	// spills: the leader's spills of inline data under way (spill.go)
	spills spillLocks

	ready       atomic.Bool  // leader and caught up: serve requests
	leaderSince atomic.Int64 // ns since epoch when this node became leader
	rr          atomic.Uint64
	requests    atomic.Uint64 // rpc requests served (the reaper's measure of load)

	peers struct {
		sync.Mutex
		m map[string]*transport.Client
	}

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Open starts the metadata service on cfg.DataDir: it opens or creates the
// store, starts raft (bootstrapping a single voter on first start), waits
// until this node leads and has replayed its log, and serves rpc. A voter
// of a group (Config.Peers) serves from the start (redirecting to the
// leader), checks that the other voters accept it (quorum.go), bootstraps
// a fresh group or waits to be added to an existing one (join.go), and
// does not wait for leadership.
func Open(cfg Config) (s *Service, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("metadata config: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("metadata data dir: %w", err)
	}
	saved, err := loadState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	raftAddr := cfg.RaftAddr
	multi := len(cfg.Peers) > 0
	if multi {
		if err := adoptSingleNode(cfg, saved); err != nil {
			return nil, err
		}
		if err := checkVoterID(cfg, saved); err != nil {
			return nil, err
		}
		cfg.NodeID = cfg.ListenAddr
	} else if saved != nil && len(saved.Peers) > 0 {
		return nil, fmt.Errorf("data dir %s belongs to the voter %s of the metadata group %v: start it with --peers %s", cfg.DataDir, saved.NodeID, saved.Peers, strings.Join(saved.Peers, ","))
	}
	if saved != nil {
		if cfg.NodeID != "" && cfg.NodeID != saved.NodeID {
			return nil, fmt.Errorf("data dir %s belongs to node %q, not %q", cfg.DataDir, saved.NodeID, cfg.NodeID)
		}
		cfg.NodeID = saved.NodeID
		if _, port, _ := net.SplitHostPort(cfg.RaftAddr); port == "0" && saved.RaftAddr != "" {
			raftAddr = saved.RaftAddr // keep the address the raft configuration knows
		}
	}
	if cfg.NodeID == "" {
		cfg.NodeID = newNodeID()
	}
	s = &Service{
		cfg:   cfg,
		log:   slog.Default().With("svc", "meta", "node", cfg.NodeID),
		locks: newLockTable(slog.Default().With("svc", "meta", "node", cfg.NodeID), cfg.Clock),
		sess:  newSessions(),
		dg:    newDelegMgr(),
		live:  newLiveness(cfg.ServerTimeout),
		disk:  newDiskSpace(cfg.DataDir, cfg.DiskReserve),
		stop:  make(chan struct{}),
		m:     newMetrics(),
	}
	s.peers.m = map[string]*transport.Client{}
	s.locks.verify = func() error { return s.node.VerifyRead(readVerifyTimeout) }
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	// The state machine's store keeps no log of its own: the raft log is
	// its log (entries above the store's applied index are re-applied at
	// start). Before a memtable is persisted, the raft log is made durable
	// up to everything applied, so the store never runs ahead of the log.
	kvOpts := kv.Options{Logger: s.log, NoWAL: true, FS: cfg.FS, BeforeFlush: func() {
		if n := s.raftNode.Load(); n != nil {
			if err := n.SyncLog(applyTimeout); err != nil {
				panic(fmt.Sprintf("meta: raft log not durable before persisting state: %v", err))
			}
		}
	}}
	if s.db, err = kv.Open(filepath.Join(cfg.DataDir, "fsm"), kvOpts); err != nil {
		return s, err
	}
	if s.fsm, err = newFSM(s.db); err != nil {
		return s, err
	}
	s.fsm.onBatch = func(n int) { s.m.batch.Observe(float64(n)) }
	if s.ln, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return s, fmt.Errorf("metadata rpc listen on %s: %w (another voter, or another process, already uses this address)", cfg.ListenAddr, err)
		}
		return s, fmt.Errorf("metadata rpc listen on %s: %w", cfg.ListenAddr, err)
	}
	s.srv = transport.NewServer(cfg.ClusterKey)
	s.srv.TLS = cfg.TLS
	rc := consensus.Config{
		Dir: filepath.Join(cfg.DataDir, "raft"), NodeID: cfg.NodeID, BindAddr: raftAddr,
		FSM: s.fsm, Bootstrap: true, Logger: s.log,
		DeferSync: true, SyncDelay: cfg.SyncDelay,
		TrailingLogs: cfg.trailingLogs, SnapshotThreshold: cfg.trailingLogs,
	}
	if multi {
		// Serve before raft starts: the other voters' checks at start
		// (preflight) need an answer, and requests get "not the leader".
		s.quorumConfig(&rc)
		rc.Bootstrap = false // join.go: bootstrap a fresh group, or wait to be added
		s.serve()
		if err := s.preflight(); err != nil {
			return s, err
		}
		raftAddr = cfg.ListenAddr
	}
	if s.node, err = consensus.Open(rc); err != nil && raftAddr != cfg.RaftAddr && !multi {
		s.log.Warn("previous raft address unavailable; binding a new one", "addr", raftAddr, "err", err)
		rc.BindAddr = cfg.RaftAddr
		s.node, err = consensus.Open(rc)
	}
	if err != nil {
		return s, s.whyRefused(err)
	}
	s.startLeaderWatch()
	s.raftNode.Store(s.node)
	if multi {
		s.startJoin()
	}
	if err := saveState(cfg.DataDir, cfg, s.node.Addr(), s.fsm.clusterID()); err != nil {
		return s, err
	}

	if !multi {
		s.serve()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watchLeadership()
	}()
	if cfg.MetricsAddr != "" {
		if err := s.serveMetrics(cfg.MetricsAddr); err != nil {
			return s, err
		}
	}

	if multi {
		// A voter of a group serves once it follows a leader (it
		// redirects) or leads; it must not wait for leadership.
		s.log.Info("metadata voter started", "rpc", s.Addr(), "peers", cfg.Peers, "data", cfg.DataDir)
		return s, nil
	}
	deadline := time.Now().Add(openWait)
	for !s.ready.Load() {
		if time.Now().After(deadline) {
			return s, fmt.Errorf("metadata service did not become leader within %v (raft %s)", openWait, s.node.Stats().State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.log.Info("metadata service ready", "rpc", s.Addr(), "raft", s.node.Addr(), "data", cfg.DataDir)
	return s, nil
}

// serve registers the handlers and serves rpc on s.ln.
func (s *Service) serve() {
	s.srv.Observe = func(m rpc.Method, d time.Duration, err error) {
		s.requests.Add(1)
		s.m.observe(m, d, err)
	}
	s.register()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(s.ln); err != nil {
			s.log.Error("rpc server stopped", "err", err)
		}
	}()
}

// Addr is the rpc listen address actually bound.
func (s *Service) Addr() string { return s.ln.Addr().String() }

// RaftAddr is the raft transport address actually bound.
func (s *Service) RaftAddr() string { return s.node.Addr() }

// AddVoter adds another metadata node to the raft group (leader only): the
// join hook for the multi-voter group.
func (s *Service) AddVoter(nodeID, raftAddr string) error {
	return s.node.AddVoter(nodeID, raftAddr, applyTimeout)
}

// Close stops serving, shuts raft down and closes the store. Safe to call
// more than once and after a failed Open.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.ready.Store(false)
		close(s.stop)
		var errs []error
		if s.srv != nil {
			s.srv.Close()
		}
		if s.ln != nil {
			s.ln.Close() // the server may not have served it yet
		}
		if s.web != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s.web.Shutdown(ctx)
			cancel()
		}
		// Stop the leader loop (and the other service goroutines) while
		// raft still runs, so that their last proposals complete rather
		// than be refused (consensus.ErrClosed) by the node's Close, which
		// answers every proposal raft holds before stopping it.
		s.wg.Wait()
		if s.node != nil {
			s.snapshotBeforeClose()
			if err := s.node.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		s.peers.Lock()
		for _, c := range s.peers.m {
			c.Close()
		}
		s.peers.Unlock()
		if s.db != nil {
			if err := s.db.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		s.closeErr = errors.Join(errs...)
		s.log.Info("metadata service closed")
	})
	return s.closeErr
}

// snapshotBeforeClose takes a snapshot when many log entries have been
// applied since the last one, so that the next start does not read them
// all back (hashicorp/raft re-applies every entry after the last snapshot,
// which the FSM then skips, at a few tens of thousands per second).
func (s *Service) snapshotBeforeClose() {
	r := s.node.Raft()
	last, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64)
	if err != nil || r.AppliedIndex() < last+closeSnapshotEntries {
		return
	}
	start := time.Now()
	if err := s.node.Snapshot(); err != nil {
		s.log.Warn("snapshot at shutdown", "err", err)
		return
	}
	s.log.Info("snapshot at shutdown", "applied", r.AppliedIndex(), "took", time.Since(start))
}

// closeSnapshotEntries is how many entries since the last snapshot make a
// clean shutdown take one.
const closeSnapshotEntries = 4096

// watchLeadership reacts to raft leadership changes. It owns the leader
// loop's lifetime: started on gaining leadership, cancelled on losing it.
func (s *Service) watchLeadership() {
	var cancel context.CancelFunc
	var loop sync.WaitGroup
	stopLoop := func() {
		if cancel != nil {
			cancel()
			loop.Wait()
			cancel = nil
		}
	}
	defer stopLoop()
	startLoop := func() context.CancelFunc {
		ctx, c := context.WithCancel(context.Background())
		loop.Add(1)
		go func() {
			defer loop.Done()
			s.leaderLoop(ctx)
		}()
		return c
	}
	for {
		select {
		case <-s.stop:
			return
		case leader := <-s.node.LeaderChanges():
			if !leader {
				s.ready.Store(false)
				stopLoop()
				s.locks.reset()
				s.live.reset()
				s.dg.reset()
				s.log.Warn("lost metadata leadership")
				continue
			}
			if err := s.becomeLeader(); err != nil {
				s.log.Error("could not take up leadership", "err", err)
				continue
			}
			stopLoop()
			cancel = startLoop()
			s.ready.Store(true)
		}
	}
}

// becomeLeader catches the state machine up with everything committed,
// creates the root on the very first start, and loads the session table.
func (s *Service) becomeLeader() error {
	if err := s.node.Barrier(applyTimeout); err != nil {
		return err
	}
	if !s.fsm.initialized() {
		r, err := s.propose(&command{Op: opInit, Now: s.now()})
		if err != nil {
			return fmt.Errorf("create root: %w", err)
		}
		if err := r.err(); err != nil {
			return fmt.Errorf("create root: %w", err)
		}
		s.log.Info("created new namespace")
	}
	if err := s.sess.load(s.db, s.cfg.Clock.Now()); err != nil {
		return fmt.Errorf("load sessions: %w", err)
	}
	// Locks start empty under a new epoch; the sessions' clients reclaim
	// theirs within a lease (they heartbeat every third of one).
	s.locks.startGrace(s.sess.ids(), s.cfg.SessionLease)
	s.dg.recallAll(s)
	s.leaderSince.Store(s.now())
	s.log.Info("metadata leader", "sessions", s.sess.count(), "applied", s.fsm.AppliedIndex())
	return nil
}

// initialized reports whether the root exists.
func (f *fsm) initialized() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctr.NextIno != 0
}

// nextIno is the inode number the next create gets.
func (f *fsm) nextIno() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctr.NextIno
}

// notLeader is the answer of a node that cannot serve: see ErrNotLeader.
func (s *Service) notLeader() error {
	n := s.raftNode.Load() // nil while a voter starts (it serves before raft runs)
	if n == nil {
		return rpc.NotLeader("", "metadata node %s is starting", s.cfg.ListenAddr)
	}
	addr, id := n.Leader()
	if len(s.cfg.Peers) > 0 {
		// A voter's raft address is its rpc address: the hint a client
		// follows (rpc.LeaderHint).
		if addr == s.cfg.ListenAddr {
			addr = "" // this node, no longer (or not yet) able to serve
		}
		if addr == "" {
			return rpc.NotLeader("", "metadata voter %s is not the leader (no leader known)", s.cfg.ListenAddr)
		}
		return rpc.NotLeader(addr, "metadata voter %s is not the leader", s.cfg.ListenAddr)
	}
	if addr == "" {
		return rpc.Errorf(ErrNotLeader, "metadata node %s is not the leader (no leader elected yet)", s.cfg.NodeID)
	}
	return rpc.Errorf(ErrNotLeader, "metadata node %s is not the leader (leader: id=%s raft=%s)", s.cfg.NodeID, id, addr)
}

// propose replicates a command and returns the state machine's answer,
// once the entry is on stable storage unless c.answerBeforeDurable.
func (s *Service) propose(c *command) (*result, error) {
	if err := s.checkDisk(c); err != nil {
		return nil, err
	}
	resp, index, err := s.node.ApplyIndex(c.encode(make([]byte, 0, 128)), applyTimeout)
	if err != nil {
		if errors.Is(err, consensus.ErrNotLeader) {
			return nil, s.notLeader()
		}
		if errors.Is(err, consensus.ErrClosed) {
			// Refused, never proposed: the client retries it on the
			// restarted (or next) leader.
			return nil, rpc.Errorf(ErrNotLeader, "metadata node %s is shutting down", s.cfg.NodeID)
		}
		return nil, rpc.Errorf(syscall.EIO, "metadata commit failed: %v", err)
	}
	r, ok := resp.(*result)
	if !ok {
		return nil, rpc.Errorf(syscall.EIO, "metadata commit: unexpected answer %T", resp)
	}
	if s.cfg.StrictSync || !c.answerBeforeDurable() {
		if err := s.node.WaitDurable(index, applyTimeout); err != nil {
			return nil, rpc.Errorf(syscall.EIO, "metadata log not durable: %v", err)
		}
	}
	return r, failpoint.EvalSub("meta/before-reply", c.Op)
}

// checkEntry fails with EIO when the log no longer holds the entry (index,
// term) that a change was answered from (ChangeResp): the metadata machine
// went down before the entry was durable, so the change is lost although
// it was answered. An entry already compacted into a snapshot was durable
// (snapshots are built from applied, synced state) and passes; so does
// index or term 0 (nothing to check).
func (s *Service) checkEntry(index, term uint64) error {
	if index == 0 || term == 0 {
		return nil
	}
	got, err := s.node.EntryTerm(index)
	switch {
	case errors.Is(err, consensus.ErrCompacted):
		return nil
	case errors.Is(err, consensus.ErrNoEntry):
		return rpc.Errorf(syscall.EIO, "metadata change at log index %d (term %d) was lost: the metadata service restarted without it (a crash before it was on stable storage)", index, term)
	case err != nil:
		return rpc.Errorf(syscall.EIO, "check metadata log entry %d: %v", index, err)
	case got != term:
		return rpc.Errorf(syscall.EIO, "metadata change at log index %d (term %d) was lost: the metadata service restarted without it and index %d now holds an entry of term %d", index, term, index, got)
	}
	return nil
}

// syncLog waits until everything applied so far is on stable storage: the
// barrier behind a client's fsync and close (MSync) and before the reaper
// deletes data.
func (s *Service) syncLog() error { return s.syncLogTo(context.Background(), 0) }

// syncLogTo waits until the log is durable up to index (0 or beyond what
// was applied: up to everything applied), or until ctx ends.
func (s *Service) syncLogTo(ctx context.Context, index uint64) error {
	if a := s.fsm.AppliedIndex(); index == 0 || index > a {
		index = a
	}
	if err := s.node.WaitDurableCtx(ctx, index, applyTimeout); err != nil {
		return rpc.Errorf(syscall.EIO, "metadata log not durable: %v", err)
	}
	return nil
}
