package consensus

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// ErrNotLeader marks a proposal made on a node that is not (or no longer)
// the leader. The proposal was not applied — or, when leadership was lost
// after appending, its fate is unknown; deduplicated commands are safe to
// retry on the new leader.
var ErrNotLeader = errors.New("consensus: not the leader")

// StateMachine is the replicated state. Raft calls ApplyBatch, Snapshot and
// Restore from its single FSM goroutine, never concurrently with each other.
//
// Contract: ApplyBatch is deterministic — the same entries applied to the
// same state give the same state and answers on every node; it must record
// the index of the last entry it applied atomically with that entry's
// effects, and skip entries at or below that index (they are replayed after
// a restart because the node does not restore snapshots on start).
// AppliedIndex reports that recorded index. Snapshot must make the state it
// captures durable before returning (raft may then truncate the log).
type StateMachine interface {
	raft.BatchingFSM
	AppliedIndex() uint64
}

// Peer is a voter in the initial configuration.
type Peer struct {
	ID   string
	Addr string
}

// Config configures a Node.
type Config struct {
	// Dir holds the raft log (Dir/log) and snapshots (Dir/snapshots).
	Dir string
	// NodeID is this node's stable raft server id.
	NodeID string
	// BindAddr is the raft TCP listen address; port 0 picks a free port.
	BindAddr string
	// Advertise is the address peers dial; default: the bound address
	// (which must then not be unspecified, e.g. 0.0.0.0).
	Advertise string
	// Streams, when set, carries raft over another service's port
	// instead of a TCP transport of its own (BindAddr and Advertise are
	// then unused): its Addr is this node's raft address.
	Streams Streams
	// CheckPeers refuses to start (ErrPeersMismatch) when the node has
	// stored raft state whose latest configuration's voters are not
	// Peers' addresses.
	CheckPeers bool
	// FSM is the state machine.
	FSM StateMachine
	// Bootstrap creates the initial configuration when the log is empty:
	// Peers, or this node alone when Peers is empty. A node joining an
	// existing group starts with Bootstrap false and is added by the leader
	// (Node.AddVoter).
	Bootstrap bool
	Peers     []Peer
	// HeartbeatTimeout and ElectionTimeout; defaults 500 ms each. The
	// leader's read lease (lease.go) is half the HeartbeatTimeout.
	HeartbeatTimeout time.Duration
	ElectionTimeout  time.Duration
	// MaxAppendEntries bounds one group commit (entries per fsync and per
	// ApplyBatch); default 128. hashicorp/raft allocates a slice of this
	// many pointers at every commit (processLogs), on every voter: at 512
	// that was 4 KiB, a third of the bytes an unlink allocated. Batches
	// under load rarely pass a few dozen entries; 128 measured better
	// than 512 in three alternated rounds on one voter (creates closed one
	// by one 17.3-17.9 K/s against 9.4-16.5 K, unlinks 29.7-32.9 K against
	// 19.2-28.7 K, an async NFS REMOVE 47-55 us against 55-86 us) and no
	// worse with three voters.
	MaxAppendEntries int
	// SnapshotThreshold: entries since the last snapshot that trigger a new
	// one; default 16384. TrailingLogs kept after a snapshot; default 10240.
	SnapshotThreshold uint64
	TrailingLogs      uint64
	// DeferSync lets a leader's raft batch count as stored once it is written to
	// the log (page cache), without waiting for stable storage; a
	// background syncer makes it durable within SyncDelay (default 5 ms),
	// at once when somebody calls WaitDurable. Commands are then committed
	// and applied before they are durable: a crash of the process loses
	// nothing, a crash of the machine may lose the last few milliseconds.
	// The caller decides which answers wait (WaitDurable with the index
	// ApplyIndex returned), and must keep its persisted state from running
	// ahead of the log (SyncLog before persisting). A node that is not the
	// leader still syncs each batch before acknowledging it (wal.go,
	// syncAppends): a majority's acknowledgement means the entries are on
	// the stable storage of every follower in it.
	DeferSync bool
	SyncDelay time.Duration
	Logger    *slog.Logger

	// leaseDur, when set (tests), replaces the read lease's length.
	leaseDur time.Duration
}

// Node is one member of a raft group.
type Node struct {
	cfg    Config
	raft   *raft.Raft
	raftp  atomic.Pointer[raft.Raft] // raft, for the log store's calls during NewRaft
	logs   *logStore                 // stable store (term, vote); legacy log entries are migrated out
	wal    *wal                      // the raft log
	trans  *raft.NetworkTransport
	snaps  *raft.FileSnapshotStore
	notify chan bool
	log    *slog.Logger
	lease  *readLease
	change leaderChanges
	// stop ends the node's own goroutines (lease renewal, health watch,
	// leader observer); bg waits for them.
	stop chan struct{}
	bg   sync.WaitGroup

	// applyMu is held shared while a proposal (or barrier) is handed to
	// raft, and exclusively by Close to refuse new ones (closing): after
	// that, Close drains what raft holds before stopping it.
	applyMu sync.RWMutex
	closing bool

	closeOnce sync.Once
	closeErr  error
}

// Open starts a raft node: opens the log and snapshot stores, binds the
// transport, brings the FSM up to the latest snapshot if it is behind
// (normally it is not: its own store is persistent), and bootstraps when
// asked and the log is empty.
func Open(cfg Config) (n *Node, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = 500 * time.Millisecond
	}
	if cfg.ElectionTimeout <= 0 {
		cfg.ElectionTimeout = 500 * time.Millisecond
	}
	if cfg.MaxAppendEntries <= 0 {
		cfg.MaxAppendEntries = 128
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = 16384
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 10240
	}
	if cfg.FSM == nil || cfg.NodeID == "" || cfg.Dir == "" {
		return nil, errors.New("consensus: Config needs Dir, NodeID and FSM")
	}
	lg := cfg.Logger.With("pkg", "raft")
	n = &Node{cfg: cfg, log: lg, notify: make(chan bool, 16), lease: newReadLease(cfg.HeartbeatTimeout, raft.ServerID(cfg.NodeID)), stop: make(chan struct{})}
	if cfg.leaseDur > 0 {
		n.lease.dur = cfg.leaseDur
	}
	node := n // `return nil, err` clears n before this runs
	defer func() {
		if err != nil {
			node.Close()
		}
	}()
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("raft dir: %w", err)
	}
	if n.logs, err = openLogStore(filepath.Join(cfg.Dir, "log")); err != nil {
		return nil, err
	}
	if n.wal, err = openWAL(filepath.Join(cfg.Dir, "wal"), DefaultSegmentBytes, lg); err != nil {
		return nil, err
	}
	// Only the leader may count a batch stored before it is durable
	// (DeferSync); a follower acknowledges what is on stable storage.
	n.wal.syncAppends = func() bool {
		r := n.raftp.Load()
		return r == nil || r.State() != raft.Leader
	}
	if err := migrateLog(n.logs, n.wal); err != nil {
		return nil, err
	}
	if cfg.DeferSync {
		if cfg.SyncDelay <= 0 {
			cfg.SyncDelay = 5 * time.Millisecond
		}
		n.wal.setDeferSync(cfg.SyncDelay)
	}
	out := &logWriter{log: lg}
	if n.snaps, err = raft.NewFileSnapshotStore(cfg.Dir, 2, out); err != nil {
		return nil, fmt.Errorf("raft snapshot store: %w", err)
	}
	if cfg.Streams != nil {
		n.trans = raft.NewNetworkTransport(streamLayer{cfg.Streams}, 3, 10*time.Second, out)
	} else {
		var adv net.Addr
		if cfg.Advertise != "" {
			if adv, err = net.ResolveTCPAddr("tcp", cfg.Advertise); err != nil {
				return nil, fmt.Errorf("raft advertise address %q: %w", cfg.Advertise, err)
			}
		}
		if n.trans, err = raft.NewTCPTransport(cfg.BindAddr, adv, 3, 10*time.Second, out); err != nil {
			return nil, fmt.Errorf("raft transport on %s: %w", cfg.BindAddr, err)
		}
	}
	if cfg.CheckPeers {
		if err := n.checkPeers(); err != nil {
			return nil, err
		}
	}
	if err := n.catchUpFromSnapshot(); err != nil {
		return nil, err
	}
	if err := n.dropLogBehindSnapshot(); err != nil {
		return nil, err
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout / 2
	rc.CommitTimeout = 5 * time.Millisecond
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	rc.BatchApplyCh = true
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.NoSnapshotRestoreOnStart = true
	rc.NotifyCh = n.notify
	rc.LogOutput = out
	rc.LogLevel = "INFO"

	if cfg.Bootstrap {
		has, err := raft.HasExistingState(n.wal, n.logs, n.snaps)
		if err != nil {
			return nil, fmt.Errorf("raft state check: %w", err)
		}
		if !has {
			var conf raft.Configuration
			if len(cfg.Peers) == 0 {
				conf.Servers = []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: n.trans.LocalAddr()}}
			}
			for _, p := range cfg.Peers {
				conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
			}
			if err := raft.BootstrapCluster(rc, n.wal, n.logs, n.snaps, n.trans, conf); err != nil {
				return nil, fmt.Errorf("raft bootstrap: %w", err)
			}
			lg.Info("bootstrapped raft group", "voters", len(conf.Servers), "addr", n.trans.LocalAddr())
		}
	}
	trans := leaseTransport{NetworkTransport: n.trans, lease: n.lease, pipeline: !cfg.DeferSync}
	if n.raft, err = raft.NewRaft(rc, cfg.FSM, n.wal, n.logs, n.snaps, trans); err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n.raftp.Store(n.raft)
	obs := make(chan raft.Observation, 16)
	n.raft.RegisterObserver(raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	}))
	n.bg.Add(3)
	go func() { defer n.bg.Done(); n.whileLeader(max(n.lease.dur/3, time.Millisecond), n.renewLease) }()
	go func() { defer n.bg.Done(); n.whileLeader(healthInterval, n.stepDownWhenUnhealthy) }()
	go func() { defer n.bg.Done(); n.observeLeaders(obs, n.stop) }()
	return n, nil
}

// catchUpFromSnapshot restores the newest snapshot into the FSM when the
// FSM's recorded index is below it — the FSM store was lost or is older than
// the log that remains (raft's NoSnapshotRestoreOnStart skips this).
func (n *Node) catchUpFromSnapshot() error {
	list, err := n.snaps.List()
	if err != nil {
		return fmt.Errorf("list raft snapshots: %w", err)
	}
	if len(list) == 0 || list[0].Index <= n.cfg.FSM.AppliedIndex() {
		return nil
	}
	meta, rc, err := n.snaps.Open(list[0].ID)
	if err != nil {
		return fmt.Errorf("open raft snapshot %s: %w", list[0].ID, err)
	}
	defer rc.Close()
	n.log.Warn("state machine behind snapshot: restoring", "snapshot", meta.ID, "snapshot_index", meta.Index, "applied", n.cfg.FSM.AppliedIndex())
	if err := n.cfg.FSM.Restore(rc); err != nil {
		return fmt.Errorf("restore raft snapshot %s: %w", meta.ID, err)
	}
	return nil
}

// Addr is the raft transport's address.
func (n *Node) Addr() string { return string(n.trans.LocalAddr()) }

// Raft exposes the underlying raft instance (stats, configuration).
func (n *Node) Raft() *raft.Raft { return n.raft }

// LeaderChanges delivers true when this node becomes leader and false when
// it stops being leader. Buffered; read it promptly.
func (n *Node) LeaderChanges() <-chan bool { return n.notify }

// IsLeader reports whether this node is the leader now.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the current leader's raft address and id ("" if unknown).
func (n *Node) Leader() (addr, id string) {
	a, i := n.raft.LeaderWithID()
	return string(a), string(i)
}

// WaitLeader waits until some node is leader (bounded by ctx).
func (n *Node) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if a, _ := n.Leader(); a != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no raft leader elected: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Apply proposes cmd and waits until it is committed and applied, returning
// the FSM's answer. Concurrent Apply calls are group-committed by raft.
// With DeferSync the entry may not be durable yet: see ApplyIndex.
func (n *Node) Apply(cmd []byte, timeout time.Duration) (any, error) {
	resp, _, err := n.ApplyIndex(cmd, timeout)
	return resp, err
}

// ApplyIndex is Apply that also returns the entry's log index, for
// WaitDurable.
func (n *Node) ApplyIndex(cmd []byte, timeout time.Duration) (any, uint64, error) {
	n.applyMu.RLock()
	if n.closing {
		n.applyMu.RUnlock()
		return nil, 0, ErrClosed
	}
	f := n.raft.Apply(cmd, timeout)
	n.applyMu.RUnlock()
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			return nil, 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		if errors.Is(err, raft.ErrRaftShutdown) {
			return nil, 0, ErrClosed
		}
		return nil, 0, fmt.Errorf("raft apply: %w", err)
	}
	return f.Response(), f.Index(), nil
}

// WaitDurable returns once the log is on stable storage up to index (at
// once without DeferSync, where every stored entry is durable).
func (n *Node) WaitDurable(index uint64, timeout time.Duration) error {
	return n.wal.WaitDurable(index, timeout)
}

// WaitDurableCtx is WaitDurable that also returns, with an error, when ctx
// ends first.
func (n *Node) WaitDurableCtx(ctx context.Context, index uint64, timeout time.Duration) error {
	return n.wal.waitDurable(ctx.Done(), index, timeout)
}

// DurableIndex is the last log index on stable storage.
func (n *Node) DurableIndex() uint64 { return n.wal.durableIndex() }

// Term is the node's current raft term.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// ErrClosed answers a proposal made while or after the node closes.
var ErrClosed = errors.New("raft node closed")

// ErrCompacted: the log no longer holds an index because a snapshot covers
// it. ErrNoEntry: the log does not reach the index.
var (
	ErrCompacted = errors.New("raft log entry compacted into a snapshot")
	ErrNoEntry   = errors.New("raft log has no entry at this index")
)

// EntryTerm returns the term of the log entry at index: with the index an
// answer carried, a caller can tell whether the entry it was answered from
// is still the one in the log (a machine crash before the entry was
// durable drops it, and later entries may reuse its index with a newer
// term).
func (n *Node) EntryTerm(index uint64) (uint64, error) {
	if t, ok := n.wal.termOf(index); ok {
		return t, nil
	}
	if last, _ := n.wal.LastIndex(); index > last {
		return 0, fmt.Errorf("%w: %d (last is %d)", ErrNoEntry, index, last)
	}
	return 0, fmt.Errorf("%w: %d", ErrCompacted, index)
}

// SyncLog makes every entry written to the log so far durable. A state
// machine calls it before persisting applied state (with DeferSync the
// log could otherwise be behind the state after a machine crash). After
// Close it returns nil: closing synced the log.
func (n *Node) SyncLog(timeout time.Duration) error {
	return n.wal.WaitDurable(math.MaxUint64, timeout)
}

// Barrier waits until every entry committed before it is applied to the FSM.
func (n *Node) Barrier(timeout time.Duration) error {
	n.applyMu.RLock()
	if n.closing {
		n.applyMu.RUnlock()
		return ErrClosed
	}
	f := n.raft.Barrier(timeout)
	n.applyMu.RUnlock()
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		if errors.Is(err, raft.ErrRaftShutdown) {
			return ErrClosed
		}
		return fmt.Errorf("raft barrier: %w", err)
	}
	return nil
}

// Snapshot takes a snapshot now (and lets raft truncate the log).
func (n *Node) Snapshot() error { return n.raft.Snapshot().Error() }

// AddVoter adds a node to the group (leader only): the join hook for the
// multi-voter group.
func (n *Node) AddVoter(id, addr string, timeout time.Duration) error {
	return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout).Error()
}

// RemoveServer removes a node from the group (leader only).
func (n *Node) RemoveServer(id string, timeout time.Duration) error {
	return n.raft.RemoveServer(raft.ServerID(id), 0, timeout).Error()
}

// Stats is a snapshot of raft's state for status pages.
type Stats struct {
	State        string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64
	// DurableIndex: the log is on stable storage up to here (with
	// DeferSync it may trail LastIndex by the entries of the last few ms).
	DurableIndex uint64
}

func (n *Node) Stats() Stats {
	return Stats{
		State:        n.raft.State().String(),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
		LastIndex:    n.raft.LastIndex(),
		DurableIndex: n.wal.durableIndex(),
	}
}

// Health lists what keeps this node's stores from working: a raft log
// that could not be synced (after which nothing new becomes durable) and
// a stable store whose engine keeps failing. Empty when healthy.
func (n *Node) Health() []error {
	var errs []error
	if n.wal != nil {
		if err := n.wal.health(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.logs != nil {
		if err := n.logs.kv.Health(); err != nil {
			errs = append(errs, fmt.Errorf("raft stable store: %w", err))
		}
	}
	return errs
}

// Close shuts raft down and closes the transport and log store. Safe to
// call more than once and on a partly opened node.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		n.applyMu.Lock()
		n.closing = true
		n.applyMu.Unlock()
		close(n.stop)
		n.bg.Wait()
		if n.raft != nil {
			n.drainProposals()
			if err := n.raft.Shutdown().Error(); err != nil {
				errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
			}
		}
		if n.trans != nil {
			if err := n.trans.Close(); err != nil {
				errs = append(errs, fmt.Errorf("raft transport close: %w", err))
			}
		}
		if n.wal != nil {
			if err := n.wal.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if n.logs != nil {
			if err := n.logs.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// closeDrainTimeout bounds how long Close waits for the proposals raft
// already holds (a leader without a quorum cannot commit them).
const closeDrainTimeout = 3 * time.Second

// drainProposals waits until raft has answered every proposal handed to it
// before Close refused new ones. hashicorp/raft answers nothing still
// queued in its apply channel, or committed but not yet applied, when it
// shuts down: those callers would wait forever. A barrier queues behind
// them all and completes once they are applied (a follower or candidate
// refuses them, and the barrier, at once); past the bound, shutdown answers
// the ones the leader has taken in with ErrLeadershipLost.
func (n *Node) drainProposals() {
	f := n.raft.Barrier(closeDrainTimeout)
	done := make(chan struct{})
	go func() {
		_ = f.Error() // any answer will do: it comes after the earlier ones
		close(done)
	}()
	t := time.NewTimer(closeDrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		n.log.Warn("raft: proposals still unanswered at close", "waited", closeDrainTimeout)
	}
}

// logWriter turns raft's hclog lines into slog records.
type logWriter struct {
	log *slog.Logger
	mu  sync.Mutex
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		line := sc.Text()
		lvl := slog.LevelInfo
		switch {
		case strings.Contains(line, "[ERROR]"):
			lvl = slog.LevelError
		case strings.Contains(line, "[WARN]"):
			lvl = slog.LevelWarn
		case strings.Contains(line, "[DEBUG]"), strings.Contains(line, "[TRACE]"):
			lvl = slog.LevelDebug
		}
		// Drop hclog's own timestamp and level prefix.
		if i := strings.Index(line, "]"); i >= 0 && i+1 < len(line) {
			line = strings.TrimSpace(line[i+1:])
		}
		if lvl == slog.LevelWarn && firstElection(line) || lvl == slog.LevelError && closedStream(line) {
			lvl = slog.LevelInfo
		}
		w.log.Log(context.Background(), lvl, line)
	}
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)

// firstElection reports raft's "heartbeat timeout reached, starting
// election" when no leader was known before: every start of a node logs
// it (raft's Warn), which is routine, unlike losing a known leader.
func firstElection(line string) bool {
	return strings.Contains(line, "heartbeat timeout reached, starting election") &&
		strings.Contains(line, "last-leader-addr= ") && strings.HasSuffix(line, "last-leader-id=")
}

// closedStream reports raft's transport complaining that a connection
// closed under it (a voter stopping, or restarting): routine.
func closedStream(line string) bool {
	return strings.Contains(line, "failed to decode incoming command") &&
		(strings.Contains(line, "transport shutdown") || strings.Contains(line, "connection reset by peer") ||
			strings.Contains(line, "EOF") || strings.Contains(line, "use of closed network connection"))
}

// migrateLog moves log entries kept by an older build in the pebble store
// (before the WAL existed) into the WAL, then deletes them there.
func migrateLog(old *logStore, w *wal) error {
	first, _ := old.FirstIndex()
	last, _ := old.LastIndex()
	if first == 0 {
		return nil
	}
	if wl, _ := w.LastIndex(); wl != 0 {
		return fmt.Errorf("raft log in both the pebble store (%d..%d) and the wal (..%d)", first, last, wl)
	}
	for i := first; i <= last; i += 512 {
		var batch []*raft.Log
		for j := i; j <= last && j < i+512; j++ {
			l := new(raft.Log)
			if err := old.GetLog(j, l); err != nil {
				return fmt.Errorf("migrate raft log entry %d: %w", j, err)
			}
			batch = append(batch, l)
		}
		if err := w.StoreLogs(batch); err != nil {
			return fmt.Errorf("migrate raft log: %w", err)
		}
	}
	return old.DeleteRange(first, last)
}
