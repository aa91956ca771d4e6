package meta

import (
	"log/slog"
	"net"
	"path/filepath"
	"testing"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/transport"
)

// TestKey is the cluster key of the services the tests start.
var TestKey = testKey

// OpenVoter starts a metadata service that neither bootstraps a raft
// group nor waits to lead: a voter for a leader to add (MAddVoter). Its
// raft id is its rpc address, as in a group that shares the rpc port; its
// raft traffic has a port of its own. (It stands in for starting a voter
// of a multi-voter group, which Open does not do on this branch.)
func OpenVoter(t *testing.T, listen string) *Service {
	t.Helper()
	cfg := Config{DataDir: t.TempDir(), ListenAddr: listen, NodeID: listen, RaftAddr: "127.0.0.1:0", ClusterKey: testKey}.withDefaults()
	lg := slog.Default().With("svc", "meta", "node", cfg.NodeID)
	s := &Service{cfg: cfg, log: lg, locks: newLockTable(lg, cfg.Clock), sess: newSessions(), dg: newDelegMgr(), live: newLiveness(cfg.ServerTimeout),
		disk: newDiskSpace(cfg.DataDir, cfg.DiskReserve), stop: make(chan struct{}), m: newMetrics()}
	s.peers.m = map[string]*transport.Client{}
	var err error
	fail := func(err error) {
		s.Close()
		t.Fatalf("start voter %s: %v", listen, err)
	}
	if s.db, err = kv.Open(filepath.Join(cfg.DataDir, "fsm"), kv.Options{Logger: lg, NoWAL: true}); err != nil {
		fail(err)
	}
	if s.fsm, err = newFSM(s.db); err != nil {
		fail(err)
	}
	if s.ln, err = net.Listen("tcp", listen); err != nil {
		fail(err)
	}
	s.node, err = consensus.Open(consensus.Config{Dir: filepath.Join(cfg.DataDir, "raft"), NodeID: cfg.NodeID, BindAddr: cfg.RaftAddr,
		FSM: s.fsm, Logger: lg, DeferSync: true})
	if err != nil {
		fail(err)
	}
	s.startLeaderWatch()
	s.raftNode.Store(s.node)
	s.srv = transport.NewServer(cfg.ClusterKey)
	s.register()
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.srv.Serve(s.ln) }()
	go func() { defer s.wg.Done(); s.watchLeadership() }()
	t.Cleanup(func() { s.Close() })
	return s
}
