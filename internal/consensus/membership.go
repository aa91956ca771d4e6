package consensus

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// ID is this node's raft server id.
func (n *Node) ID() string { return n.cfg.NodeID }

// LastContact is when a leader last contacted this node (zero: never; on
// the leader itself, raft does not update it).
func (n *Node) LastContact() time.Time { return n.raft.LastContact() }

// ErrNoOtherVoter answers a leadership transfer in a group of one voter.
var ErrNoOtherVoter = errors.New("no other voter to hand leadership to")

// Causes of leader changes: the label of LeaderEvent.Reason (a metric
// label, so a short fixed set).
const (
	ReasonElected     = "elected"      // the first leader this node saw
	ReasonTransfer    = "transfer"     // a leadership transfer
	ReasonLeaderLost  = "leader_lost"  // the leader went silent
	ReasonSteppedDown = "stepped_down" // this node stopped leading, not for a transfer
)

// LeaderEvent is a change of the leader a node sees: a leader lost (Leader
// empty) or a leader taking office.
type LeaderEvent struct {
	Time time.Time
	// Leader and LeaderAddr: the new leader's raft id and address; empty
	// when the leader was lost. Previous: the leader before ("" if none).
	Leader, LeaderAddr string
	Previous           string
	Term               uint64
	// Reason is one of the Reason constants; Cause says it in words:
	// "elected", "transfer", "leader lost: no contact for 1.2s",
	// "stepped down". A leader taking office carries the cause of the loss
	// before it.
	Reason, Cause string
}

// Lost reports whether the change is the loss of a leader.
func (c LeaderEvent) Lost() bool { return c.Leader == "" }

// LeaderWatch follows raft's leadership observations and tells each
// leader change, with its cause. Create it with NewLeaderWatch, run it with
// Run, and hand leadership over with its Transfer (so that the change
// is known as a transfer on this node).
type LeaderWatch struct {
	n  *Node
	fn func(LeaderEvent)

	mu         sync.Mutex
	leader     string    // raft id of the leader last seen ("" none)
	seen       bool      // some leader was seen since start
	transferAt time.Time // a transfer was started here or seen in a vote request
	voteAt     time.Time // a peer's (non-transfer) vote request was seen
	voteFrom   string
	pending    LeaderEvent // the loss a new leader's change carries
	last       LeaderEvent
	hasLast    bool
}

// transferWindow: a leadership loss this soon after a transfer started or
// was seen is counted as the transfer's.
const transferWindow = 10 * time.Second

// NewLeaderWatch returns a watch of n that calls fn (from Run's goroutine)
// at each leader change.
func (n *Node) NewLeaderWatch(fn func(LeaderEvent)) *LeaderWatch {
	return &LeaderWatch{n: n, fn: fn}
}

// Run observes raft until stop is closed.
func (w *LeaderWatch) Run(stop <-chan struct{}) {
	ch := make(chan raft.Observation, 64)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RequestVoteRequest:
			return true
		}
		return false
	})
	w.n.raft.RegisterObserver(obs)
	defer w.n.raft.DeregisterObserver(obs)
	// The leader raft knows before the observer was registered.
	if addr, id := w.n.raft.LeaderWithID(); id != "" {
		w.observe(raft.LeaderObservation{LeaderAddr: addr, LeaderID: id}, time.Now())
	}
	for {
		select {
		case <-stop:
			return
		case o := <-ch:
			w.observe(o.Data, time.Now())
		}
	}
}

// observe turns one observation into a leader change, if it is one.
func (w *LeaderWatch) observe(data any, now time.Time) {
	w.mu.Lock()
	var change *LeaderEvent
	switch d := data.(type) {
	case raft.RequestVoteRequest:
		if d.LeadershipTransfer {
			w.transferAt = now
		} else {
			w.voteAt, w.voteFrom = now, string(d.ID)
		}
	case raft.LeaderObservation:
		id := string(d.LeaderID)
		if id == w.leader {
			break
		}
		c := LeaderEvent{Time: now, Leader: id, LeaderAddr: string(d.LeaderAddr), Previous: w.leader, Term: w.n.raft.CurrentTerm()}
		if w.leader != "" {
			// The leader is lost (or, without an observed gap, replaced).
			c.Reason, c.Cause = w.lossCause(now)
			w.pending = c
		}
		w.leader = id
		if id != "" {
			if w.seen && w.pending.Reason != "" {
				c.Reason, c.Cause = w.pending.Reason, w.pending.Cause
			} else if c.Reason == "" {
				c.Reason, c.Cause = ReasonElected, "elected"
			}
			w.seen = true
			w.pending = LeaderEvent{}
			// What came before this leader took office explains no
			// later loss.
			w.transferAt, w.voteAt = time.Time{}, time.Time{}
		}
		w.last, w.hasLast = c, true
		change = &c
	}
	w.mu.Unlock()
	if change != nil && w.fn != nil {
		w.fn(*change)
	}
}

// lossCause says why the leader w.leader was lost, at now. Called with
// w.mu held.
func (w *LeaderWatch) lossCause(now time.Time) (reason, cause string) {
	transfer := !w.transferAt.IsZero() && now.Sub(w.transferAt) < transferWindow
	if w.leader == w.n.cfg.NodeID {
		if transfer {
			return ReasonTransfer, "transfer"
		}
		return ReasonSteppedDown, "stepped down"
	}
	if transfer {
		return ReasonTransfer, "transfer"
	}
	silent := time.Duration(0)
	if lc := w.n.raft.LastContact(); !lc.IsZero() {
		silent = now.Sub(lc)
	}
	if silent >= w.n.cfg.HeartbeatTimeout {
		return ReasonLeaderLost, fmt.Sprintf("leader lost: no contact for %v", silent.Round(time.Millisecond))
	}
	if !w.voteAt.IsZero() && now.Sub(w.voteAt) < w.n.cfg.ElectionTimeout {
		return ReasonLeaderLost, fmt.Sprintf("leader lost: %s started an election (no contact with the leader for %v)", w.voteFrom, silent.Round(time.Millisecond))
	}
	// The leader was heard from just now, and no peer asked for votes:
	// it told this node to take over (raft's TimeoutNow of a transfer).
	w.transferAt = now
	return ReasonTransfer, "transfer"
}

// Last is the last leader change seen (ok false: none since Run started).
func (w *LeaderWatch) Last() (LeaderEvent, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.hasLast
}

// Transfer hands leadership to the voter id at addr, or, with id "", to
// the most caught-up voter, and waits (within timeout) until another
// voter leads. It returns the new leader's raft id and address. Leader
// only.
func (w *LeaderWatch) Transfer(id, addr string, timeout time.Duration) (string, string, error) {
	n := w.n
	if !n.IsLeader() {
		return "", "", ErrNotLeader
	}
	if id == "" {
		conf, err := n.Configuration()
		if err != nil {
			return "", "", err
		}
		others := 0
		for _, s := range conf {
			if s.Voter && s.ID != n.cfg.NodeID {
				others++
			}
		}
		if others == 0 {
			return "", "", ErrNoOtherVoter
		}
	}
	w.mu.Lock()
	w.transferAt = time.Now()
	w.mu.Unlock()
	// TransferLeadership drops the read lease for the transfer (the
	// target may win at once): every transfer must go through it.
	if err := leaderErr(n.TransferLeadership(addr), "leadership transfer"); err != nil {
		return "", "", err
	}
	deadline := time.Now().Add(timeout)
	for {
		a, lid := n.raft.LeaderWithID()
		if lid != "" && string(lid) != n.cfg.NodeID {
			return string(lid), string(a), nil
		}
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("leadership transfer: no new leader within %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// AddMember adds the voter id at addr and returns once the configuration
// holding it is committed (leader only: ErrNotLeader, wrapped, elsewhere).
func (n *Node) AddMember(id, addr string, timeout time.Duration) error {
	return leaderErr(n.AddVoter(id, addr, timeout), "add voter")
}

// RemoveMember removes the server id and returns once the configuration
// without it is committed (leader only).
func (n *Node) RemoveMember(id string, timeout time.Duration) error {
	return leaderErr(n.RemoveServer(id, timeout), "remove server")
}

// leaderErr wraps raft's not-the-leader answers as ErrNotLeader.
func leaderErr(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %s: %v", ErrNotLeader, what, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	}
	return fmt.Errorf("raft %s: %w", what, err)
}
