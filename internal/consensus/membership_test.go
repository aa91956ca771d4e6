package consensus

import (
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// freeAddr returns a loopback address with a port that was free just now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// changeLog collects one node's leader changes.
type changeLog struct {
	mu sync.Mutex
	cs []LeaderEvent
}

func (l *changeLog) add(c LeaderEvent) { l.mu.Lock(); l.cs = append(l.cs, c); l.mu.Unlock() }

// waitFor waits until a change satisfying ok was seen.
func (l *changeLog) waitFor(t *testing.T, what string, ok func(LeaderEvent) bool) LeaderEvent {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, c := range l.cs {
			if ok(c) {
				l.mu.Unlock()
				return c
			}
		}
		l.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Fatalf("no leader change %s; saw %+v", what, l.cs)
	return LeaderEvent{}
}

func (l *changeLog) reset() { l.mu.Lock(); l.cs = nil; l.mu.Unlock() }

type member struct {
	n    *Node
	w    *LeaderWatch
	log  *changeLog
	stop chan struct{}
	done chan struct{}
}

func (m *member) close() {
	close(m.stop)
	<-m.done
	m.n.Close()
}

// startGroup starts n voters in one group (ids are their addresses).
func startGroup(t *testing.T, n int) []*member {
	t.Helper()
	var peers []Peer
	for i := 0; i < n; i++ {
		a := freeAddr(t)
		peers = append(peers, Peer{ID: a, Addr: a})
	}
	var ms []*member
	for _, p := range peers {
		dir := t.TempDir()
		// Timeouts of a second: on a loaded machine a shorter heartbeat may
		// lapse during a transfer and turn it into a loss.
		node, err := Open(Config{Dir: filepath.Join(dir, "raft"), NodeID: p.ID, BindAddr: p.Addr, FSM: openCounter(t, filepath.Join(dir, "fsm")),
			Bootstrap: true, Peers: peers, HeartbeatTimeout: time.Second, ElectionTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m := &member{n: node, log: &changeLog{}, stop: make(chan struct{}), done: make(chan struct{})}
		m.w = node.NewLeaderWatch(m.log.add)
		go func() { defer close(m.done); m.w.Run(m.stop) }()
		ms = append(ms, m)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			if m.n != nil {
				m.close()
			}
		}
	})
	return ms
}

// leaderOf waits until one of ms leads and all running ones agree.
func leaderOf(t *testing.T, ms []*member) *member {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range ms {
			if m.n != nil && m.n.IsLeader() {
				agree := true
				for _, o := range ms {
					if o.n != nil {
						if _, id := o.n.Leader(); id != m.n.ID() {
							agree = false
						}
					}
				}
				if agree {
					return m
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader that every voter knows")
	return nil
}

// TestMembershipTransferAndLoss: three real voters; the configuration
// lists them; a transfer moves leadership (to the most caught-up voter or
// a named one) and every voter records it as a transfer; a dead leader is
// recorded as lost for lack of contact, and its successor's change
// carries that cause.
func TestMembershipTransferAndLoss(t *testing.T) {
	ms := startGroup(t, 3)
	l := leaderOf(t, ms)
	for _, m := range ms {
		m.log.waitFor(t, "electing the first leader", func(c LeaderEvent) bool {
			return c.Leader == l.n.ID() && c.Reason == ReasonElected && c.Cause == "elected"
		})
	}
	conf, err := l.n.Configuration()
	if err != nil || len(conf) != 3 {
		t.Fatalf("configuration %+v %v, want 3 servers", conf, err)
	}
	for i, s := range conf {
		if !s.Voter || s.ID != ms[i].n.ID() || s.Addr != ms[i].n.Addr() {
			t.Errorf("server %d: %+v, want voter %s", i, s, ms[i].n.ID())
		}
	}
	if _, err := l.n.Apply(u64(1), 5*time.Second); err != nil {
		t.Fatal(err)
	}

	// To the most caught-up voter.
	for _, m := range ms {
		m.log.reset()
	}
	newID, newAddr, err := l.w.Transfer("", "", 10*time.Second)
	if err != nil || newID == l.n.ID() || newID != newAddr {
		t.Fatalf("transfer: %q %q %v", newID, newAddr, err)
	}
	nl := leaderOf(t, ms)
	if nl.n.ID() != newID {
		t.Fatalf("transfer named %s, leader is %s", newID, nl.n.ID())
	}
	for _, m := range ms {
		m.log.waitFor(t, "lost for the transfer", func(c LeaderEvent) bool { return c.Lost() && c.Reason == ReasonTransfer })
		m.log.waitFor(t, "to the new leader by transfer", func(c LeaderEvent) bool {
			return c.Leader == newID && c.Reason == ReasonTransfer
		})
	}
	if _, err := nl.n.Apply(u64(1), 5*time.Second); err != nil {
		t.Fatalf("apply on the new leader: %v", err)
	}
	if _, err := l.n.Apply(u64(1), time.Second); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("apply on the old leader: %v, want ErrNotLeader", err)
	}
	if _, _, err := l.w.Transfer("", "", time.Second); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("transfer from a follower: %v, want ErrNotLeader", err)
	}

	// To a named voter.
	var target *member
	for _, m := range ms {
		if m != nl {
			target = m
			break
		}
	}
	if id, _, err := nl.w.Transfer(target.n.ID(), target.n.Addr(), 10*time.Second); err != nil || id != target.n.ID() {
		t.Fatalf("transfer to %s: %q %v", target.n.ID(), id, err)
	}
	if got := leaderOf(t, ms); got != target {
		t.Fatalf("leader %s after transfer to %s", got.n.ID(), target.n.ID())
	}

	// The leader dies.
	for _, m := range ms {
		m.log.reset()
	}
	dead := target.n.ID()
	target.close()
	target.n = nil
	nl2 := leaderOf(t, ms)
	for _, m := range ms {
		if m.n == nil {
			continue
		}
		lost := m.log.waitFor(t, "lost for lack of contact", func(c LeaderEvent) bool { return c.Lost() && c.Reason == ReasonLeaderLost })
		if lost.Previous != dead {
			t.Errorf("lost leader %q, want %q", lost.Previous, dead)
		}
		m.log.waitFor(t, "to the successor after the loss", func(c LeaderEvent) bool {
			return c.Leader == nl2.n.ID() && c.Reason == ReasonLeaderLost
		})
		if last, ok := m.w.Last(); !ok || last.Leader != nl2.n.ID() {
			t.Errorf("last change %+v, want the successor", last)
		}
	}
}

// TestTransferAlone: a single voter has nobody to hand leadership to.
func TestTransferAlone(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, filepath.Join(dir, "raft"), openCounter(t, filepath.Join(dir, "fsm")))
	defer n.Close()
	if _, _, err := n.NewLeaderWatch(nil).Transfer("", "", time.Second); !errors.Is(err, ErrNoOtherVoter) {
		t.Fatalf("transfer alone: %v, want ErrNoOtherVoter", err)
	}
	if !n.IsLeader() {
		t.Fatal("no longer leader after a refused transfer")
	}
}
