package consensus

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Streams is what a node needs to carry raft over another service's port
// (transport.StreamListener): the streams it accepts, and dials of streams
// to the other voters. Addr is this voter's raft address (its id too).
type Streams interface {
	net.Listener
	DialStream(addr string, timeout time.Duration) (net.Conn, error)
}

// streamLayer adapts Streams to raft.StreamLayer.
type streamLayer struct{ Streams }

func (s streamLayer) Dial(a raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.DialStream(string(a), timeout)
}

// ErrPeersMismatch: the voters a restarted node was given are not those of
// the raft configuration it has stored.
var ErrPeersMismatch = errors.New("consensus: peers differ from the stored raft configuration")

// ErrRemoved: the stored raft configuration no longer holds this voter (it
// comes with ErrPeersMismatch).
var ErrRemoved = errors.New("this voter was removed from the group")

// storedVoters returns the voter addresses of the newest configuration in
// the log (or else in the newest snapshot): what the node will start with.
func (n *Node) storedVoters() ([]string, error) {
	conf, ok, err := latestConfiguration(n.wal, n.snaps)
	if err != nil || !ok {
		return nil, err
	}
	return votersOf(conf), nil
}

func votersOf(c raft.Configuration) []string {
	var out []string
	for _, s := range c.Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.Address))
		}
	}
	slices.Sort(out)
	return out
}

// checkPeers compares the configured peers with the stored configuration.
// A voter alone in its stored configuration may be given more peers.
func (n *Node) checkPeers() error {
	stored, err := n.storedVoters()
	if err != nil || stored == nil {
		return err
	}
	var want []string
	for _, p := range n.cfg.Peers {
		want = append(want, p.Addr)
	}
	slices.Sort(want)
	self := string(n.trans.LocalAddr())
	if len(stored) == 1 && stored[0] == self && slices.Contains(want, self) {
		// Alone in its configuration (a group's first voter, e.g. a
		// single node's data dir adopted): the other voters listed wait
		// to be added, there is no other stored list to contradict.
		return nil
	}
	if len(stored) > 0 && !slices.Contains(stored, self) && !slices.Equal(stored, want) {
		return fmt.Errorf("%w: %w (%s): its raft configuration (in %s) lists the voters %s without it, and it was started with %s; it stays out: to make it a voter again, start it on an empty data directory and run strata meta add-voter %s on the group",
			ErrPeersMismatch, ErrRemoved, self, n.cfg.Dir, strings.Join(stored, ","), strings.Join(want, ","), self)
	}
	if !slices.Equal(stored, want) {
		return fmt.Errorf("%w: this voter's raft configuration (in %s) lists the voters %s, but it was started with %s: start it with the stored list, or change the membership online (strata meta add-voter/remove-voter)",
			ErrPeersMismatch, n.cfg.Dir, strings.Join(stored, ","), strings.Join(want, ","))
	}
	return nil
}

// Server is one member of the current configuration.
type Server struct {
	ID, Addr string
	Voter    bool
}

// Configuration is the latest raft configuration this node knows (possibly
// not committed yet).
func (n *Node) Configuration() ([]Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		out = append(out, Server{ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// TransferLeadership hands leadership to the voter at addr ("" lets raft
// pick the most up-to-date follower) and waits for the outcome. The read
// lease is dropped first and not renewed while the transfer runs: the
// target may win its election at once (voters grant a transferring
// candidate their vote even while they follow this leader).
func (n *Node) TransferLeadership(addr string) error {
	return n.transfer(addr, "leadership transferred")
}

// transfer is TransferLeadership with the cause noted for the change.
func (n *Node) transfer(addr, cause string) error {
	n.noteLeaderChange(cause)
	n.lease.beginTransfer()
	defer n.lease.endTransfer()
	var f raft.Future
	if addr == "" {
		f = n.raft.LeadershipTransfer()
	} else {
		id := addr
		if conf, err := n.Configuration(); err == nil {
			for _, s := range conf {
				if s.Addr == addr {
					id = s.ID
				}
			}
		}
		f = n.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr))
	}
	if err := f.Error(); err != nil {
		n.noteLeaderChange("")
		return fmt.Errorf("raft leadership transfer: %w", err)
	}
	return nil
}

// LeaderChange is the last change of leadership this node saw.
type LeaderChange struct {
	At     time.Time
	Leader string // the new leader's address ("" while none is known)
	Cause  string
}

// LastLeaderChange is the last change of leader this node observed, with
// its cause as far as this node knows it.
func (n *Node) LastLeaderChange() LeaderChange {
	n.change.Lock()
	defer n.change.Unlock()
	return n.change.last
}

func (n *Node) noteLeaderChange(cause string) {
	n.change.Lock()
	n.change.cause = cause
	n.change.Unlock()
}

// observeLeaders records leader changes (raft's observer) until stop.
func (n *Node) observeLeaders(ch chan raft.Observation, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case o := <-ch:
			lo, ok := o.Data.(raft.LeaderObservation)
			if !ok {
				continue
			}
			n.change.Lock()
			cause := n.change.cause
			if cause == "" {
				cause = "election"
				if lo.LeaderAddr == "" {
					cause = "leader lost (no contact within the heartbeat timeout)"
				}
			}
			if lo.LeaderAddr != "" {
				n.change.cause = "" // the change it named is complete
			}
			n.change.last = LeaderChange{At: time.Now(), Leader: string(lo.LeaderAddr), Cause: cause}
			n.change.Unlock()
			n.log.Info("raft leader changed", "leader", lo.LeaderAddr, "cause", cause)
		}
	}
}

// leaderChanges is Node's record of leader changes.
type leaderChanges struct {
	sync.Mutex
	last  LeaderChange
	cause string // of the next change, when this node causes it
}

// healthInterval is how often a leader checks that its log still works.
var healthInterval = 250 * time.Millisecond

// stepDownWhenUnhealthy hands leadership away while this node is the
// leader of a group with other voters and its log cannot be appended to
// or synced (a full or failing disk): the group keeps going on a healthy
// voter instead of stalling on this one. Raft itself steps down only
// when an append fails, not while a sync failure goes unnoticed by an
// idle leader, and could be re-elected once the failure is behind it.
func (n *Node) stepDownWhenUnhealthy() {
	herrs := n.wal.health()
	if herrs == nil {
		return
	}
	conf, err := n.Configuration()
	if err != nil || len(votersOfServers(conf)) < 2 {
		return
	}
	n.log.Error("raft log failing on the leader: handing leadership to another voter", "err", herrs)
	if err := n.transfer("", fmt.Sprintf("the previous leader's log failed: %v", herrs)); err != nil {
		n.log.Error("leadership transfer away from a failing log", "err", err)
	}
}

// whileLeader runs fn every interval while this node leads, until n.stop.
func (n *Node) whileLeader(interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		if n.IsLeader() {
			fn()
		}
	}
}

func votersOfServers(conf []Server) []string {
	var out []string
	for _, s := range conf {
		if s.Voter {
			out = append(out, s.Addr)
		}
	}
	return out
}

// IsMonotonic tells raft (raft.MonotonicLogStore) that the log takes no
// gaps: after installing a snapshot sent by the leader, raft empties the
// log instead of appending after a gap (a follower far behind).
func (w *wal) IsMonotonic() bool { return true }

// dropLogBehindSnapshot empties the log when the newest snapshot is past
// its last entry: a crash came between installing a snapshot sent by the
// leader and raft emptying the log (IsMonotonic), and the next append
// would follow the snapshot, not the log. Every entry is covered by the
// snapshot.
func (n *Node) dropLogBehindSnapshot() error {
	list, err := n.snaps.List()
	if err != nil {
		return fmt.Errorf("list raft snapshots: %w", err)
	}
	first, _ := n.wal.FirstIndex()
	last, _ := n.wal.LastIndex()
	if len(list) == 0 || first == 0 || last >= list[0].Index {
		return nil
	}
	n.log.Warn("raft log ends before the newest snapshot: dropping it", "log_first", first, "log_last", last, "snapshot_index", list[0].Index)
	return n.wal.DeleteRange(first, last)
}
