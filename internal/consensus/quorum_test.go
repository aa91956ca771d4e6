package consensus

import (
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// trio is a raft group of three nodes on loopback in this process.
type trio struct {
	t     *testing.T
	addrs []string
	nodes []*Node
}

func startTrio(t *testing.T, cfg func(*Config)) *trio {
	t.Helper()
	tr := &trio{t: t}
	var lns []net.Listener
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		tr.addrs = append(tr.addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	var peers []Peer
	for _, a := range tr.addrs {
		peers = append(peers, Peer{ID: a, Addr: a})
	}
	tr.nodes = make([]*Node, 3)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, a := range tr.addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := Config{Dir: t.TempDir(), NodeID: a, BindAddr: a, FSM: openCounter(t, t.TempDir()),
				Bootstrap: true, Peers: peers, CheckPeers: true, SnapshotThreshold: 1 << 30}
			if cfg != nil {
				cfg(&c)
			}
			tr.nodes[i], errs[i] = Open(c)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range tr.nodes {
			n.Close()
		}
	})
	return tr
}

// leader waits (bounded) for a leader other than not and returns it.
func (tr *trio) leader(not *Node) *Node {
	tr.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range tr.nodes {
			if n != not && n.IsLeader() {
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tr.t.Fatal("no leader within 15s")
	return nil
}

// TestFollowersAckDurable: with DeferSync, a follower's stored entries
// are on stable storage when it acknowledges them (its durable index never
// trails its last index), while the leader still defers; and a follower
// syncs groups of entries, not each one.
func TestFollowersAckDurable(t *testing.T) {
	tr := startTrio(t, func(c *Config) { c.DeferSync, c.SyncDelay = true, time.Hour })
	l := tr.leader(nil)
	var syncs atomic.Int64
	for _, n := range tr.nodes {
		if n != l {
			n.SetLogFault(func(op, _ string) error {
				if op == "sync" {
					syncs.Add(1)
				}
				return nil
			})
		}
	}
	const entries = 400
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range entries / 16 {
				if _, err := l.Apply(u64(uint64(w)), 5*time.Second); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	last := l.Stats().LastIndex
	for _, n := range tr.nodes {
		if n == l {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for n.Stats().LastIndex < last && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		st := n.Stats()
		if st.LastIndex < last {
			t.Fatalf("follower %s at %d, leader at %d", n.Addr(), st.LastIndex, last)
		}
		if st.DurableIndex < st.LastIndex {
			t.Errorf("follower %s acknowledged up to %d but is durable only up to %d", n.Addr(), st.LastIndex, st.DurableIndex)
		}
	}
	if ls := l.Stats(); ls.DurableIndex >= ls.LastIndex {
		t.Errorf("leader durable at %d of %d: it should still defer (SyncDelay 1h, nobody waited)", ls.DurableIndex, ls.LastIndex)
	}
	if n := syncs.Load(); n == 0 || n >= 2*entries {
		t.Errorf("followers ran %d syncs for %d entries each: want group commit", n, entries)
	}
}

// TestUnhealthyLeaderStepsDown: a leader whose log can no longer be
// synced hands leadership to another voter even when nothing is appended
// (raft alone would keep an idle leader whose disk failed).
func TestUnhealthyLeaderStepsDown(t *testing.T) {
	tr := startTrio(t, func(c *Config) { c.DeferSync, c.SyncDelay = true, time.Hour })
	l := tr.leader(nil)
	_, idx, err := l.ApplyIndex(u64(1), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.SetLogFault(func(op, _ string) error {
		if op == "sync" {
			return syscall.EIO
		}
		return nil
	})
	if _, idx, err = l.ApplyIndex(u64(2), 5*time.Second); err != nil {
		t.Fatal(err) // the write works; its sync will not
	}
	if err := l.WaitDurable(idx, 5*time.Second); err == nil {
		t.Fatal("sync of a failing log succeeded")
	}
	nl := tr.leader(l)
	if _, err := nl.Apply(u64(3), 5*time.Second); err != nil {
		t.Fatalf("apply on the new leader: %v", err)
	}
	if got := nl.LastLeaderChange(); got.Leader != nl.Addr() {
		t.Errorf("last leader change %+v, want leader %s", got, nl.Addr())
	}
}

// TestReadLease: the leader verifies reads from its lease; followers and a
// leader that handed leadership away refuse them.
func TestReadLease(t *testing.T) {
	tr := startTrio(t, nil)
	l := tr.leader(nil)
	if err := l.VerifyRead(5 * time.Second); err != nil {
		t.Fatalf("leader: %v", err)
	}
	if !l.lease.held(l.Term()) {
		t.Fatal("lease not held right after a verified read")
	}
	for _, n := range tr.nodes {
		if n != l {
			if err := n.VerifyRead(time.Second); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("follower %s: %v", n.Addr(), err)
			}
		}
	}
	if err := l.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	if err := l.VerifyRead(time.Second); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("former leader after a transfer: %v", err)
	}
	nl := tr.leader(l)
	if err := nl.VerifyRead(5 * time.Second); err != nil {
		t.Fatalf("new leader: %v", err)
	}
	if c := l.LastLeaderChange(); c.Cause != "leadership transferred" {
		t.Errorf("old leader's last change: %+v", c)
	}
}

// TestLogBehindSnapshotDropped: a log that ends before the newest snapshot
// (a crash between installing a leader's snapshot and raft emptying the
// log) is emptied at open, so that appends after the snapshot work.
func TestLogBehindSnapshotDropped(t *testing.T) {
	raftDir, fsmDir := t.TempDir(), t.TempDir()
	fsm := openCounter(t, fsmDir)
	n := startNode(t, raftDir, fsm)
	for i := range 50 {
		if _, err := n.Apply(u64(uint64(i)), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	// Cut the log's tail below the snapshot, as if the snapshot had come
	// from a leader to a node whose log was short.
	w, err := openWAL(filepath.Join(raftDir, "wal"), DefaultSegmentBytes, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	last, _ := w.LastIndex()
	if err := w.DeleteRange(10, last); err != nil {
		t.Fatal(err)
	}
	w.Close()
	n = startNode(t, raftDir, fsm)
	done := make(chan error, 1)
	go func() { _, err := n.Apply(u64(1), 5*time.Second); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("apply after the snapshot: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("apply after the snapshot: no answer within 10s") // the node is left: its Close would wait for that apply
	}
	n.Close()
}

// TestReadWithoutLease: where a verification round takes longer than the
// lease (here a lease of a nanosecond), a read still passes on the leader
// once a round that started after it succeeded.
func TestReadWithoutLease(t *testing.T) {
	tr := startTrio(t, func(c *Config) { c.leaseDur = time.Nanosecond })
	l := tr.leader(nil)
	for range 5 {
		if err := l.VerifyRead(5 * time.Second); err != nil {
			t.Fatalf("leader: %v", err)
		}
	}
	for _, n := range tr.nodes {
		if n != l {
			if err := n.VerifyRead(time.Second); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("follower %s: %v", n.Addr(), err)
			}
		}
	}
}
