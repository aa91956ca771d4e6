package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Joining a group. A voter of a group (Config.Peers) whose raft log is
// empty starts raft without bootstrapping and asks the other voters
// listed in --peers (MMetaInfo) whether they have raft state:
//
//   - one of them has (a log, a configuration): a group exists, and this
//     voter must not bootstrap one of its own — its entry at index 1 would
//     not be the group's, and with a list longer than the group's it could
//     elect a second leader. It waits, serving "not the leader", until the
//     group's leader replicates to it: at once when it is in the group's
//     configuration (a voter whose data dir was wiped), after `strata meta
//     add-voter ADDR` otherwise. It never bootstraps afterwards.
//   - a majority of the listed voters, this one included, answered with no
//     state and none had any: a fresh group; it bootstraps the whole list
//     (hashicorp/raft: every voter of a new group bootstraps the same full
//     configuration; a second bootstrap is refused harmlessly).
//   - otherwise (too many unreachable, or still starting) it asks again.
//
// docs/design/0012-metadata-quorum.md ("Joining") has the reasoning.

// joinProbeEvery is how often a voter without raft state asks again.
const joinProbeEvery = 250 * time.Millisecond

// joinProbeTimeout bounds one question to one voter.
const joinProbeTimeout = time.Second

// peerState is what one probe learned of another voter.
type peerState int

const (
	peerUnknown  peerState = iota // unreachable, or its raft not running yet
	peerFresh                     // running, no raft state
	peerHasGroup                  // has raft state
)

// probeAnswer is one voter's answer.
type probeAnswer struct {
	addr  string
	state peerState
	info  *rpc.MetaInfoResp
}

// startJoin bootstraps or waits to be added (see above) when this voter
// has no raft state; with state, it watches for having been removed
// (watchRemoved). Open calls it once the raft node runs.
func (s *Service) startJoin() {
	if s.node.HasState() {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.watchRemoved()
		}()
		return
	}
	if len(s.cfg.Peers) == 1 {
		if err := s.node.BootstrapPeers(); err != nil && !errors.Is(err, consensus.ErrHasState) {
			s.log.Error("bootstrap the metadata group", "err", err)
		}
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.joinLoop()
	}()
}

// joinLoop asks the other voters until this voter bootstraps a fresh
// group or has state (a leader replicated to it), or until Close.
func (s *Service) joinLoop() {
	others, clients := s.otherVoters()
	defer closeAll(clients)
	seenGroup, toldWait := false, false
	for {
		if s.node.HasState() {
			if seenGroup {
				s.log.Info("joined the metadata group: the leader brought this voter up to date", "applied", s.fsm.AppliedIndex())
			}
			return
		}
		if !seenGroup {
			var done bool
			if seenGroup, done = s.joinRound(others, clients, &toldWait); done {
				return
			}
		}
		select {
		case <-s.stop:
			return
		case <-time.After(joinProbeEvery):
		}
	}
}

// joinRound asks the other voters once and acts on their answers: it
// reports whether a group exists (this voter waits for its leader from
// now on), and done when this voter bootstrapped (or has state).
func (s *Service) joinRound(others []string, clients []*transport.Client, toldWait *bool) (group, done bool) {
	answers := s.probeVoters(others, clients)
	fresh := 1 // this voter
	for i, a := range answers {
		switch a.state {
		case peerFresh:
			fresh++
		case peerHasGroup:
			s.logWaitForGroup(&answers[i])
			return true, false
		}
	}
	if fresh > len(s.cfg.Peers)/2 {
		err := s.node.BootstrapPeers()
		switch {
		case err == nil:
			s.log.Info("bootstrapped a new metadata group: no other voter had raft state", "voters", s.cfg.Peers, "fresh", fresh)
			return false, true
		case errors.Is(err, consensus.ErrHasState):
			return false, true
		}
		s.log.Error("bootstrap the metadata group", "err", err)
		return false, false
	}
	if !*toldWait {
		*toldWait = true
		s.log.Info("waiting for a majority of the voters to answer before bootstrapping a new metadata group",
			"answered_fresh", fresh, "voters", len(s.cfg.Peers))
	}
	return false, false
}

// logWaitForGroup says, once, that this voter waits for the group g
// answered for, and what the administrator does about it.
func (s *Service) logWaitForGroup(g *probeAnswer) {
	self := s.cfg.ListenAddr
	if s.inVoters(g.info.Voters) {
		s.log.Info("this voter is in the metadata group's configuration but has no raft state (a new or wiped data dir): waiting for the leader to bring it up to date",
			"peer", g.addr, "leader", g.info.Leader, "voters", names(g.info.Voters))
		return
	}
	s.log.Warn(fmt.Sprintf("waiting to be added: run `strata meta add-voter %s` on the group", self),
		"peer", g.addr, "leader", g.info.Leader, "voters", names(g.info.Voters))
}

// probeVoters asks every voter in others for its MMetaInfo, in parallel.
func (s *Service) probeVoters(others []string, clients []*transport.Client) []probeAnswer {
	out := make([]probeAnswer, len(others))
	var wg sync.WaitGroup
	for i := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = probeAnswer{addr: others[i]}
			ctx, cancel := context.WithTimeout(context.Background(), joinProbeTimeout)
			defer cancel()
			info, err := askInfo(ctx, clients[i])
			switch {
			case err != nil:
			case info.LastIndex > 0 || len(info.Voters) > 0:
				out[i].state, out[i].info = peerHasGroup, info
			default:
				out[i].state, out[i].info = peerFresh, info
			}
		}()
	}
	wg.Wait()
	return out
}

// A removed voter. `strata meta remove-voter` takes a voter out of the
// configuration; the voter may not have received that configuration (it
// was away, or the leader stopped replicating to it first). Restarted, it
// refuses when its --peers differ from its stored configuration, or it
// starts and stays passive: the voters reject its vote requests (and
// raft's pre-vote keeps its term from rising), because it is not in their
// configuration. Either way the other voters' answers say why, and the
// voter says it.

// removedFrom asks the other voters whether one of them follows a leader
// in a configuration without this voter, and returns that answer (nil:
// none says so).
func (s *Service) removedFrom(clients []*transport.Client, others []string) *probeAnswer {
	for _, a := range s.probeVoters(others, clients) {
		if a.state == peerHasGroup && a.info.Leader != "" && len(a.info.Voters) > 0 && !s.inVoters(a.info.Voters) {
			return &a
		}
	}
	return nil
}

// inVoters reports whether this voter is in vs.
func (s *Service) inVoters(vs []rpc.VoterInfo) bool {
	self := s.cfg.ListenAddr
	return slices.ContainsFunc(vs, func(v rpc.VoterInfo) bool {
		return v.Addr == self || v.ID == self || v.RaftAddr == self
	})
}

// otherVoters is s.cfg.Peers without this voter, and an info client for
// each (the caller closes them).
func (s *Service) otherVoters() ([]string, []*transport.Client) {
	var others []string
	var clients []*transport.Client
	m := s.membershipState()
	for _, p := range s.cfg.Peers {
		if p != s.cfg.ListenAddr {
			others = append(others, p)
			clients = append(clients, m.infoClient(p))
		}
	}
	return others, clients
}

// whyRefused adds to a refusal to start because --peers differ from the
// stored configuration what the other voters say: that this voter was
// removed from the group, when it was.
func (s *Service) whyRefused(err error) error {
	if len(s.cfg.Peers) == 0 || !errors.Is(err, consensus.ErrPeersMismatch) || errors.Is(err, consensus.ErrRemoved) {
		return err
	}
	others, clients := s.otherVoters()
	defer closeAll(clients)
	if a := s.removedFrom(clients, others); a != nil {
		return fmt.Errorf("metadata voter %s was removed from the metadata group (%s, following the leader %s, lists the voters %s): to make it a voter again, start it on an empty data directory and run strata meta add-voter %s on the group; %w",
			s.cfg.ListenAddr, a.addr, a.info.Leader, names(a.info.Voters), s.cfg.ListenAddr, err)
	}
	return err
}

// watchRemoved logs, once, that this voter was removed from the group:
// while it knows no leader (a voter of the configuration soon does) it
// asks the others every second.
func (s *Service) watchRemoved() {
	others, clients := s.otherVoters()
	defer closeAll(clients)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(4 * joinProbeEvery):
		}
		if addr, _ := s.node.Leader(); addr != "" {
			continue // a voter of the configuration, or the leader's last word to a removed one
		}
		if a := s.removedFrom(clients, others); a != nil {
			s.log.Error(fmt.Sprintf("this voter was removed from the metadata group: it stays passive (the voters ignore it); to make it a voter again, stop it, empty its data directory, start it and run `strata meta add-voter %s` on the group", s.cfg.ListenAddr),
				"peer", a.addr, "leader", a.info.Leader, "voters", names(a.info.Voters))
			return
		}
	}
}

func closeAll(clients []*transport.Client) {
	for _, c := range clients {
		c.Close()
	}
}

// A single node's data dir becomes a group's first voter. A node started
// without --peers has a random raft id and a raft port of its own; a
// voter of a group is named by its --listen address and carries raft on
// that port. Started with --peers, the single node's data dir is adopted:
// its raft configuration (itself alone) is rebound to the listen address
// (consensus.RebindSingleVoter), and the other voters, started with the
// same --peers, wait to be added (`strata meta add-voter`). A data dir
// whose configuration has other servers (grown without --peers) is
// refused: its servers' raft ports cannot be mapped to voters' addresses.

// adoptSingleNode rebinds the data dir of a single node (saved: started
// without --peers) to this voter, and updates saved to match. Its
// configuration is then itself alone, which consensus accepts with any
// --peers that include it (the others wait to be added).
func adoptSingleNode(cfg Config, saved *savedState) error {
	if saved == nil || len(saved.Peers) > 0 || saved.NodeID == cfg.ListenAddr || cfg.NodeID != "" && cfg.NodeID != cfg.ListenAddr {
		return nil
	}
	lg := slog.Default().With("svc", "meta", "node", cfg.ListenAddr)
	old, err := consensus.RebindSingleVoter(filepath.Join(cfg.DataDir, "raft"), cfg.ListenAddr, cfg.ListenAddr, lg)
	if errors.Is(err, consensus.ErrNotSingleVoter) {
		return fmt.Errorf("data dir %s belongs to the metadata node %q, started without --peers, whose raft group has other servers (%w): their raft ports cannot be mapped to voters' --listen addresses; keep starting it without --peers (strata meta --listen %s --data %s)",
			cfg.DataDir, saved.NodeID, err, saved.ListenAddr, cfg.DataDir)
	}
	if err != nil {
		return fmt.Errorf("data dir %s of the single metadata node %q: make it the voter %s: %w", cfg.DataDir, saved.NodeID, cfg.ListenAddr, err)
	}
	lg.Info("the data dir of a metadata node started without --peers becomes the first voter of the group: add the other voters with strata meta add-voter ADDR once they run",
		"old_id", old, "old_raft_addr", saved.RaftAddr, "voter", cfg.ListenAddr, "peers", cfg.Peers)
	// The data dir says at once that it is a voter's now: started again
	// without --peers it is refused with what to do (its configuration
	// no longer names its old id), not left without a leader.
	voter := cfg
	voter.NodeID = cfg.ListenAddr
	if err := saveState(cfg.DataDir, voter, cfg.ListenAddr, saved.ClusterID); err != nil {
		return err
	}
	saved.NodeID, saved.Peers = cfg.ListenAddr, cfg.Peers
	return nil
}

// reachable refuses to add the metadata service at addr (its MMetaInfo
// answer info) when its raft traffic and this leader's cannot meet: a
// voter of a group (started with --peers: its raft id is its raft address,
// its rpc address) carries raft on its rpc port, a node started without
// --peers on a raft port of its own. Added anyway, the configuration
// would need a voter the leader cannot reach, and the group would stall
// for good.
func (m *membership) reachable(addr string, info *rpc.MetaInfoResp) error {
	group, theirs := len(m.s.cfg.Peers) > 0, info.ID == info.RaftAddr
	switch {
	case theirs && !group:
		return rpc.Errorf(syscall.EINVAL, "add voter %s: it is a voter of a group (started with --peers: raft on its rpc port), and this metadata node %s runs without --peers (raft on its own port %s), so they cannot reach each other; restart this node with --peers %s,%s (its data dir becomes the group's first voter), then add %s; the configuration is unchanged",
			addr, m.s.Addr(), m.s.node.Addr(), m.s.cfg.ListenAddr, addr, addr)
	case group && !theirs:
		return rpc.Errorf(syscall.EINVAL, "add voter %s: it runs without --peers (raft on its own port %s), and the voters of this group carry raft on their rpc ports; start it with --peers (this group's voters and itself) on an empty data directory, then add it; the configuration is unchanged",
			addr, info.RaftAddr)
	}
	return nil
}
