package consensus

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
)

// HasState reports whether this node has raft state: a log entry or a
// snapshot (a bootstrapped or replicated configuration among them). A
// node opened without Bootstrap on an empty log has none until it
// bootstraps (BootstrapPeers) or a leader replicates to it.
func (n *Node) HasState() bool { return n.raft.LastIndex() > 0 }

// ErrHasState answers BootstrapPeers on a node that already has state
// (bootstrapped, or brought up to date by a leader meanwhile).
var ErrHasState = errors.New("consensus: node already has raft state")

// BootstrapPeers bootstraps the configuration of Config.Peers on a
// running node whose log is empty: what Open does with Bootstrap, decided
// later. The voters are sorted by id, so that every voter of a fresh group
// writes the same entry at index 1.
func (n *Node) BootstrapPeers() error {
	if len(n.cfg.Peers) == 0 {
		return errors.New("consensus: no peers to bootstrap")
	}
	peers := slices.Clone(n.cfg.Peers)
	slices.SortFunc(peers, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
	var conf raft.Configuration
	for _, p := range peers {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
	}
	err := n.raft.BootstrapCluster(conf).Error()
	switch {
	case err == nil:
		n.log.Info("bootstrapped raft group", "voters", len(conf.Servers), "addr", n.trans.LocalAddr())
		return nil
	case errors.Is(err, raft.ErrCantBootstrap):
		return fmt.Errorf("%w: %v", ErrHasState, err)
	}
	return fmt.Errorf("raft bootstrap: %w", err)
}
