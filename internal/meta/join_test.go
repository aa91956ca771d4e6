package meta

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// TestQuorumVoterJoinsWithoutBootstrap: a fourth voter started with
// --peers A,B,C,D while A,B,C already form a group does not bootstrap a
// configuration of its own: it stays without raft state, answers "not the
// leader", and joins when the leader adds it (MAddVoter), catching up with
// the namespace. (Before join.go it bootstrapped {A,B,C,D} at index 1, a
// configuration the group never had.)
func TestQuorumVoterJoinsWithoutBootstrap(t *testing.T) {
	g := newGroup(t, 4)
	first := g.peers[:3]
	cfg := g.config
	g.configure = func(i int) Config {
		c := cfg(i)
		if i < 3 {
			c.Peers = first
		}
		return c
	}
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	for i := range 10 {
		c.mustCreate(rootIno, fmt.Sprintf("d%d", i), dirMode)
	}

	g.start(3)
	d := g.svcs[3]
	// It asks the others every joinProbeEvery; give it several rounds.
	time.Sleep(6 * joinProbeEvery)
	if d.node.HasState() {
		conf, _ := d.node.Configuration()
		t.Fatalf("the new voter has raft state before it was added (configuration %v): it bootstrapped", conf)
	}
	dc := transport.NewClient(g.peers[3], transport.ClientConfig{Key: g.key, Conns: 1})
	t.Cleanup(func() { dc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	var r rpc.AttrResp
	err := dc.Call(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: rootIno}, &r)
	cancel()
	if !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("the voter waiting to be added answered %v, want not the leader", err)
	}

	var resp rpc.MembershipResp
	if err := c.call(rpc.MAddVoter, &rpc.MembershipReq{Addr: g.peers[3]}, &resp); err != nil {
		t.Fatalf("add voter: %v", err)
	}
	if countVoters(resp.Voters) != 4 {
		t.Fatalf("add voter answered %+v", resp)
	}
	want := g.svcs[l].fsm.AppliedIndex()
	waitFor(t, "the added voter catches up", func() bool { return d.fsm.AppliedIndex() >= want })
	if a, b := d.ClusterID(), g.svcs[l].ClusterID(); a != b || a == "" {
		t.Fatalf("cluster id of the added voter %q, leader %q", a, b)
	}
	// Restarted with the list of the group it is in now, it starts.
	g.stop(3)
	g.start(3)
	c.mustCreate(rootIno, "after", dirMode)
	want = g.svcs[l].fsm.AppliedIndex()
	waitFor(t, "the restarted voter follows", func() bool { return g.svcs[3].fsm.AppliedIndex() >= want })
}

// TestQuorumFreshGroupWaitsForMajority: the first voter of a fresh group
// of three, alone, does not bootstrap (the others might have a group it
// cannot see); once a second voter answers without state, the group
// bootstraps and elects a leader.
func TestQuorumFreshGroupWaitsForMajority(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0)
	time.Sleep(6 * joinProbeEvery)
	if g.svcs[0].node.HasState() {
		t.Fatal("a voter that reached no other voter bootstrapped")
	}
	g.start(1)
	l := g.leader()
	newClient(t, g.peers[l]).mustCreate(rootIno, "two-of-three", dirMode)
	g.start(2)
	want := g.svcs[l].fsm.AppliedIndex()
	waitFor(t, "the third voter catches up", func() bool { return g.svcs[2].fsm.AppliedIndex() >= want })
	for i, s := range g.svcs {
		conf, err := s.node.Configuration()
		if err != nil || len(conf) != 3 {
			t.Fatalf("voter %d (%s): configuration %v %v", i, filepath.Base(g.dirs[i]), conf, err)
		}
	}
}
