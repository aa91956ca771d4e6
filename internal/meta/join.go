package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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
// has no raft state. Open calls it once the raft node runs.
func (s *Service) startJoin() {
	if s.node.HasState() {
		return
	}
	var others []string
	for _, p := range s.cfg.Peers {
		if p != s.cfg.ListenAddr {
			others = append(others, p)
		}
	}
	if len(others) == 0 {
		if err := s.node.BootstrapPeers(); err != nil && !errors.Is(err, consensus.ErrHasState) {
			s.log.Error("bootstrap the metadata group", "err", err)
		}
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.joinLoop(others)
	}()
}

// joinLoop asks the other voters until this voter bootstraps a fresh
// group or has state (a leader replicated to it), or until Close.
func (s *Service) joinLoop(others []string) {
	clients := make([]*transport.Client, len(others))
	m := s.membershipState()
	for i, a := range others {
		clients[i] = m.infoClient(a)
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	seenGroup, toldWait := false, false
	for {
		if s.node.HasState() {
			if seenGroup {
				s.log.Info("joined the metadata group: the leader brought this voter up to date", "applied", s.fsm.AppliedIndex())
			}
			return
		}
		answers := s.probeVoters(others, clients)
		fresh := 1 // this voter
		var group *probeAnswer
		for i, a := range answers {
			switch a.state {
			case peerFresh:
				fresh++
			case peerHasGroup:
				if group == nil {
					group = &answers[i]
				}
			}
		}
		switch {
		case group != nil && !seenGroup:
			seenGroup = true
			s.logWaitForGroup(group)
		case group == nil && !seenGroup && fresh > len(s.cfg.Peers)/2:
			err := s.node.BootstrapPeers()
			if err != nil && !errors.Is(err, consensus.ErrHasState) {
				s.log.Error("bootstrap the metadata group", "err", err)
				break
			}
			if err == nil {
				s.log.Info("bootstrapped a new metadata group: no other voter had raft state", "voters", s.cfg.Peers, "fresh", fresh)
			}
			return
		case group == nil && !seenGroup && !toldWait:
			toldWait = true
			s.log.Info("waiting for a majority of the voters to answer before bootstrapping a new metadata group",
				"answered_fresh", fresh, "voters", len(s.cfg.Peers))
		}
		select {
		case <-s.stop:
			return
		case <-time.After(joinProbeEvery):
		}
	}
}

// logWaitForGroup says, once, that this voter waits for the group g
// answered for, and what the administrator does about it.
func (s *Service) logWaitForGroup(g *probeAnswer) {
	self := s.cfg.ListenAddr
	member := slices.ContainsFunc(g.info.Voters, func(v rpc.VoterInfo) bool {
		return v.Addr == self || v.ID == self || v.RaftAddr == self
	})
	if member {
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
