package consensus

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The leader's read lease: how a leader answers reads from its own state
// without a network round trip per read, and never from stale state after
// it was deposed.
//
// A lease is earned by a round of raft's VerifyLeader that succeeds: the
// leader sent a heartbeat to every follower after the round started, and
// a majority answered that they follow it in its term. Each of those
// followers reset its last-contact time then, at or after the round's
// start, and hashicorp/raft (v1.8.0, raft.go requestVote) refuses its vote
// to any candidate but its known leader while it has one ("rejecting vote
// request since we have a leader"), unless the candidate carries the
// leadership-transfer flag; it forgets its leader only when its heartbeat
// timer finds no contact for HeartbeatTimeout (runFollower). A new leader
// needs the votes of a majority, which includes one of those followers: no
// other leader can be elected, and so no change committed elsewhere,
// before round start + HeartbeatTimeout. The lease runs until round start
// + leaseFraction × HeartbeatTimeout, the rest being the margin for clock
// rate differences and scheduling. Times are Go's monotonic clock, which
// keeps running while the process is stopped (SIGSTOP): a leader that was
// stopped finds its lease expired when it resumes.
//
// Rounds run in the background while this node leads (every lease/3), so
// reads normally find the lease held. A read that finds it expired waits
// for the next round (one round serves every reader waiting for it) and
// then checks again; a round that started after the read arrived is
// enough by itself (raft's ReadIndex argument: it verified the leadership
// after the read began), so that reads still pass where a round takes
// longer than the lease (a slow link); a failed round (another leader
// exists, no quorum) answers ErrNotLeader. A leadership transfer drops the lease and no round
// renews it until the transfer ends: the target may be elected at once.
//
// What the argument assumes: a follower that restarts forgets its leader
// and may vote at once; the lease holds only if such a restart takes
// longer than the lease (a process restart and a raft log open do).
type readLease struct {
	dur   time.Duration
	epoch time.Time // monotonic base of the times below

	state atomic.Pointer[leaseState]
	// transfers counts leadership transfers under way; gen changes at
	// the start and end of each, so that a round that overlapped one
	// earns nothing (the target may have been elected meanwhile).
	transfers atomic.Int32
	gen       atomic.Uint64

	mu    sync.Mutex
	round *leaseRound // the round in flight, nil when none
}

type leaseState struct {
	term, gen uint64
	until     time.Duration // since epoch
}

type leaseRound struct {
	done  chan struct{}
	err   error
	start time.Duration // since epoch; set before done closes
	ok    bool          // verified the leadership in one term, no transfer overlapping
}

// leaseFraction of HeartbeatTimeout is the lease.
const leaseFraction = 0.5

func newReadLease(heartbeat time.Duration) *readLease {
	l := &readLease{dur: time.Duration(float64(heartbeat) * leaseFraction), epoch: time.Now()}
	l.state.Store(&leaseState{})
	return l
}

func (l *readLease) now() time.Duration { return time.Since(l.epoch) }

func (l *readLease) beginTransfer() {
	l.transfers.Add(1)
	l.gen.Add(1)
	l.state.Store(&leaseState{})
}

func (l *readLease) endTransfer() {
	l.gen.Add(1)
	l.transfers.Add(-1)
}

// held reports whether the lease covers now in term.
func (l *readLease) held(term uint64) bool {
	s := l.state.Load()
	return s.term == term && term != 0 && s.gen == l.gen.Load() && l.transfers.Load() == 0 && l.now() < s.until
}

// ErrLeaseTimeout: no verification round ended within the read's timeout.
var ErrLeaseTimeout = errors.New("consensus: leadership not verified in time")

// VerifyRead returns nil when this node may answer a read from its state
// now: it is the leader and holds the read lease, or has just renewed it.
// It answers ErrNotLeader (wrapped) when the node is not, or may no longer
// be, the leader.
func (n *Node) VerifyRead(timeout time.Duration) error {
	if n.raft.State() == raft.Leader && n.lease.held(n.raft.CurrentTerm()) {
		return nil
	}
	deadline := time.Now().Add(timeout)
	arrived := n.lease.now()
	for {
		if n.raft.State() != raft.Leader {
			return fmt.Errorf("%w: %s", ErrNotLeader, n.raft.State())
		}
		if n.lease.transfers.Load() > 0 {
			// Wait for the transfer's outcome: this node either is
			// no longer the leader, or keeps leading and renews.
			if time.Now().After(deadline) {
				return ErrLeaseTimeout
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		r := n.leaseRound()
		select {
		case <-r.done:
		case <-time.After(time.Until(deadline)):
			return ErrLeaseTimeout
		}
		if r.err != nil {
			return r.err
		}
		// A round that started after the read arrived verified the
		// leadership at a moment after it (ReadIndex), whatever the lease.
		if (r.ok && r.start >= arrived) || n.lease.held(n.raft.CurrentTerm()) {
			return nil
		}
		if time.Now().After(deadline) {
			return ErrLeaseTimeout
		}
	}
}

// leaseRound returns the verification round in flight, starting one when
// none is.
func (n *Node) leaseRound() *leaseRound {
	l := n.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.round != nil {
		return l.round
	}
	r := &leaseRound{done: make(chan struct{})}
	l.round = r
	go func() {
		gen := l.gen.Load()
		transferring := l.transfers.Load() > 0
		start := l.now()
		term := n.raft.CurrentTerm()
		err := n.raft.VerifyLeader().Error()
		r.start = start
		if err == nil && !transferring && n.raft.CurrentTerm() == term && l.gen.Load() == gen {
			r.ok = true
			l.mu.Lock()
			if s := l.state.Load(); s.term != term || s.gen != gen || s.until < start+l.dur {
				l.state.Store(&leaseState{term: term, gen: gen, until: start + l.dur})
			}
			l.mu.Unlock()
		}
		if err != nil {
			l.state.Store(&leaseState{})
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
				err = fmt.Errorf("%w: %v", ErrNotLeader, err)
			} else if errors.Is(err, raft.ErrRaftShutdown) {
				err = ErrClosed
			}
		}
		r.err = err
		l.mu.Lock()
		l.round = nil
		l.mu.Unlock()
		close(r.done)
	}()
	return r
}

// renewLease runs a verification round every third of the lease while
// this node leads.
func (n *Node) renewLease() {
	if n.lease.transfers.Load() == 0 {
		<-n.leaseRound().done
	}
}
