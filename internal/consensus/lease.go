package consensus

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The leader's read lease: how a leader answers reads from its own state
// without a network round trip per read, and never from stale state after
// it was deposed.
//
// Every AppendEntries the leader sends (heartbeats every tenth of the
// heartbeat timeout, and replication) goes through leaseTransport, which
// notes, per follower, the send time of the latest request the follower
// accepted in the leader's term. The follower processed that request, and
// reset its last-contact time, after it was sent. hashicorp/raft (v1.8.0,
// raft.go requestVote) refuses a vote to any candidate but its known leader
// while it has one ("rejecting vote request since we have a leader"),
// unless the candidate carries the leadership-transfer flag, and forgets
// its leader only when its heartbeat timer finds no contact for
// HeartbeatTimeout (runFollower). So with q the latest time such that a
// majority of the voters (the leader counting itself) accepted a request
// sent at or after q, no other leader can be elected — a new one needs the
// vote of one of them — and so nothing committed elsewhere, before
// q + HeartbeatTimeout. The lease runs until q + leaseFraction ×
// HeartbeatTimeout, the rest being the margin for clock rate differences
// and scheduling. Send times, not the arrival of answers, bound q: an
// answer may arrive late (raft's own VerifyLeader counts the answer to a
// heartbeat sent before it was called). Times are Go's monotonic clock,
// which keeps running while the process is stopped (SIGSTOP): a leader
// that was stopped finds its lease expired when it resumes.
//
// A read that finds the lease expired waits until q passes the moment it
// arrived (a majority accepted a request sent after it: raft's ReadIndex
// argument, whatever the lease's length, so reads pass on links slower
// than the lease), poking the heartbeats with VerifyLeader; a failed
// VerifyLeader (another leader exists) answers ErrNotLeader. A leadership
// transfer drops the lease and nothing sent before its end counts: the
// target may be elected at once.
//
// What the argument assumes: a follower that restarts forgets its leader
// and may vote at once; the lease holds only if such a restart takes
// longer than the lease (a process restart and a raft log open do).
type readLease struct {
	dur   time.Duration
	epoch time.Time // monotonic base of the times below
	self  raft.ServerID

	state atomic.Pointer[leaseState]
	// transfers counts leadership transfers under way.
	transfers atomic.Int32

	mu      sync.Mutex
	term    uint64                          // of acked
	acked   map[raft.ServerID]time.Duration // send time of the latest request each voter accepted in term
	voters  []raft.ServerID                 // of the latest configuration
	resetAt time.Duration                   // requests sent before do not count
	changed chan struct{}                   // closed and replaced when state changes
	round   *leaseRound                     // the VerifyLeader in flight, nil when none
}

// leaseState is what reads check: in term, a majority accepted requests
// sent at or after q, so the lease holds until until. single: this node is
// the only voter.
type leaseState struct {
	term     uint64
	q, until time.Duration // since epoch
	single   bool
}

type leaseRound struct {
	done chan struct{}
	err  error
}

// leaseFraction of HeartbeatTimeout is the lease.
const leaseFraction = 0.5

func newReadLease(heartbeat time.Duration, self raft.ServerID) *readLease {
	l := &readLease{dur: time.Duration(float64(heartbeat) * leaseFraction), epoch: time.Now(), self: self,
		acked: map[raft.ServerID]time.Duration{}, changed: make(chan struct{})}
	l.state.Store(&leaseState{})
	return l
}

func (l *readLease) now() time.Duration { return time.Since(l.epoch) }

// ack notes that id accepted, in term, a request sent at sent.
func (l *readLease) ack(id raft.ServerID, term uint64, sent time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term != l.term {
		if term < l.term {
			return
		}
		l.term = term
		clear(l.acked)
	}
	if sent < l.resetAt || sent <= l.acked[id] {
		return
	}
	l.acked[id] = sent
	l.recomputeLocked()
}

// setVoters records the voters of the latest configuration.
func (l *readLease) setVoters(conf []Server) {
	var v []raft.ServerID
	for _, s := range conf {
		if s.Voter {
			v = append(v, raft.ServerID(s.ID))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Equal(v, l.voters) {
		return
	}
	l.voters = v
	l.recomputeLocked()
}

// recomputeLocked publishes the state from the acknowledgements.
func (l *readLease) recomputeLocked() {
	st := &leaseState{term: l.term}
	if len(l.voters) == 1 && l.voters[0] == l.self {
		st.single = true
	} else if len(l.voters) > 0 {
		times := make([]time.Duration, 0, len(l.voters))
		for _, v := range l.voters {
			if v == l.self {
				times = append(times, 1<<62) // the leader accepts its own
			} else {
				times = append(times, l.acked[v]) // 0: none
			}
		}
		slices.Sort(times)
		slices.Reverse(times)
		st.q = times[len(times)/2] // the majority-th latest
		if st.q > 0 {
			st.until = st.q + l.dur
		}
	}
	l.state.Store(st)
	close(l.changed)
	l.changed = make(chan struct{})
}

// reset forgets every acknowledgement: requests sent before now no longer
// count.
func (l *readLease) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resetAt = l.now()
	clear(l.acked)
	l.recomputeLocked()
}

func (l *readLease) beginTransfer() {
	l.transfers.Add(1)
	l.reset()
}

func (l *readLease) endTransfer() {
	l.reset()
	l.transfers.Add(-1)
}

// held reports whether the lease covers now in term (a single voter's
// always does: no other leader can exist).
func (l *readLease) held(term uint64) bool {
	s := l.state.Load()
	return l.transfers.Load() == 0 && (s.single || s.term == term && term != 0 && l.now() < s.until)
}

// snapshot is the state and the channel closed at its next change.
func (l *readLease) snapshot() (*leaseState, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state.Load(), l.changed
}

// ErrLeaseTimeout: leadership was not confirmed within the read's timeout.
var ErrLeaseTimeout = errors.New("consensus: leadership not verified in time")

// VerifyRead returns nil when this node may answer a read from its state
// now: it is the leader and holds the read lease, or a majority has
// accepted a request it sent after the read arrived. It answers
// ErrNotLeader (wrapped) when the node is not, or may no longer be, the
// leader.
func (n *Node) VerifyRead(timeout time.Duration) error {
	if n.raft.State() == raft.Leader && n.lease.held(n.raft.CurrentTerm()) {
		return nil
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	arrived := n.lease.now()
	for {
		if n.raft.State() != raft.Leader {
			return fmt.Errorf("%w: %s", ErrNotLeader, n.raft.State())
		}
		if conf, err := n.Configuration(); err == nil {
			n.lease.setVoters(conf)
		}
		s, changed := n.lease.snapshot()
		if n.lease.transfers.Load() == 0 && (s.single || s.term == n.raft.CurrentTerm() && s.term != 0 && s.q >= arrived) {
			return nil
		}
		var round <-chan struct{}
		r := n.leaseRound() // makes every follower answer a heartbeat now
		if n.lease.transfers.Load() == 0 {
			round = r.done
		}
		select {
		case <-changed:
		case <-round:
			if r.err != nil {
				return r.err
			}
			// Its answers are in; a later heartbeat may be needed
			// (an answer may be to a request sent before the read).
			select {
			case <-changed:
			case <-time.After(n.lease.dur / 4):
			case <-deadline.C:
				return ErrLeaseTimeout
			}
		case <-time.After(5 * time.Millisecond): // a transfer's end
		case <-deadline.C:
			return ErrLeaseTimeout
		}
	}
}

// leaseRound returns the VerifyLeader in flight, starting one when none
// is: it makes every follower answer a heartbeat at once.
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
		err := n.raft.VerifyLeader().Error()
		if err != nil {
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

// renewLease keeps the voters current and, when the lease runs short,
// makes the followers answer at once rather than at their next heartbeat.
func (n *Node) renewLease() {
	if conf, err := n.Configuration(); err == nil {
		n.lease.setVoters(conf)
	}
	s := n.lease.state.Load()
	if n.lease.transfers.Load() == 0 && !s.single && s.until-n.lease.now() < n.lease.dur/2 {
		<-n.leaseRound().done
	}
}

// leaseTransport is raft's network transport as the lease sees it: it
// notes the send time of every AppendEntries a follower accepts. Without
// pipeline it also replicates without raft's pipelining: a follower syncs
// each AppendEntries before answering (its acknowledgement must mean "on
// stable storage"); pipelined, the leader sends every new batch at once
// and the follower syncs them one after the other, while unpipelined the
// next request leaves when the answer to the last is in, with everything
// gathered meanwhile, so one follower sync covers what arrived during the
// previous one.
type leaseTransport struct {
	*raft.NetworkTransport
	lease    *readLease
	pipeline bool
}

func (t leaseTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	sent := t.lease.now()
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	if err == nil && resp.Success && resp.Term == args.Term {
		t.lease.ack(id, args.Term, sent)
	}
	return err
}

func (t leaseTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if !t.pipeline {
		return nil, raft.ErrPipelineReplicationNotSupported
	}
	return t.NetworkTransport.AppendEntriesPipeline(id, target)
}
