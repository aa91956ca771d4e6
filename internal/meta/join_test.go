package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
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

// TestQuorumRemovedVoterStaysOut: a voter removed while it was stopped
// (so its stored configuration still names it) and restarted with its
// --peers starts passive: it logs that it was removed, and the group's
// leader and term stay. Restarted with another list, it refuses to start
// and says it was removed (the other voters' configuration lacks it).
func TestQuorumRemovedVoterStaysOut(t *testing.T) {
	var logs testutil.SyncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	c.mustCreate(rootIno, "before", dirMode)
	f := (l + 1) % 3
	g.stop(f)
	var resp rpc.MembershipResp
	if err := c.call(rpc.MRemoveVoter, &rpc.MembershipReq{Addr: g.peers[f]}, &resp); err != nil || countVoters(resp.Voters) != 2 {
		t.Fatalf("remove voter: %+v %v", resp, err)
	}
	term := g.svcs[l].node.Term()

	g.start(f)
	waitFor(t, "the removed voter says it was removed", func() bool {
		return strings.Contains(logs.String(), "this voter was removed from the metadata group: it stays passive")
	})
	time.Sleep(2 * time.Second) // several election timeouts
	if nl := g.leader(); nl != l || g.svcs[l].node.Term() != term {
		t.Fatalf("the removed voter disturbed the group: leader %d term %d, before %d term %d", nl, g.svcs[nl].node.Term(), l, term)
	}
	c.mustCreate(rootIno, "after", dirMode)
	g.stop(f)

	cfg := g.config(f)
	cfg.Peers = []string{g.peers[f], g.peers[l]}
	s, err := Open(cfg)
	if err == nil {
		s.Close()
		t.Fatal("the removed voter started with another list")
	}
	// It says so from its stored configuration (the leader's last
	// replication to it may have delivered the removal) or from the
	// other voters'.
	if !strings.Contains(err.Error(), "was removed from the") || !errors.Is(err, consensus.ErrPeersMismatch) {
		t.Fatalf("the removed voter's refusal: %v", err)
	}
}

// TestSingleNodeBecomesFirstVoter: the data dir of a node started without
// --peers (random raft id, raft on a port of its own), restarted with
// --peers A,B,C, becomes voter A of the group with its namespace; B and
// C, started with the same --peers, wait to be added and catch up once
// added; A then restarts with --peers A,B,C like any voter.
func TestSingleNodeBecomesFirstVoter(t *testing.T) {
	g := newGroup(t, 3)
	single := Config{DataDir: g.dirs[0], ListenAddr: g.peers[0], ClusterKey: g.key}
	s, err := Open(single)
	if err != nil {
		t.Fatal(err)
	}
	oldID := s.node.ID()
	c := newClient(t, g.peers[0])
	for i := range 5 {
		c.mustCreate(rootIno, fmt.Sprintf("d%d", i), dirMode)
	}
	cluster := s.ClusterID()
	s.Close()

	// Adopted, then refused by its (only) other voters' check at start:
	// the data dir is a voter's from then on, and says so without
	// --peers.
	wrong := g.config(0)
	wrong.ClusterKey = []byte("another key")
	other, err := Open(Config{DataDir: g.dirs[2], ListenAddr: g.peers[2], Peers: []string{g.peers[0], g.peers[2]}, ClusterKey: g.key})
	if err != nil {
		t.Fatal(err)
	}
	wrong.Peers = []string{g.peers[0], g.peers[2]}
	if _, err := Open(wrong); err == nil || !strings.Contains(err.Error(), "wrong cluster key") {
		t.Fatalf("adopted with a wrong key: %v", err)
	}
	other.Close()
	if err := os.RemoveAll(g.dirs[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(single); err == nil || !strings.Contains(err.Error(), "start it with --peers") {
		t.Fatalf("the adopted data dir started without --peers: %v", err)
	}

	g.start(0)
	if l := g.leader(); l != 0 || g.svcs[0].node.ID() != g.peers[0] {
		t.Fatalf("leader %d, id %q (was %q)", l, g.svcs[0].node.ID(), oldID)
	}
	g.start(1, 2)
	c = newClient(t, g.peers[0])
	for _, i := range []int{1, 2} {
		var resp rpc.MembershipResp
		if err := c.call(rpc.MAddVoter, &rpc.MembershipReq{Addr: g.peers[i]}, &resp); err != nil {
			t.Fatalf("add voter %s: %v", g.peers[i], err)
		}
	}
	c.mustCreate(rootIno, "grown", dirMode)
	want := g.svcs[0].fsm.AppliedIndex()
	for _, i := range []int{1, 2} {
		waitFor(t, "the added voters catch up", func() bool { return g.svcs[i].fsm.AppliedIndex() >= want })
		if g.svcs[i].ClusterID() != cluster {
			t.Fatalf("voter %d: cluster %q, want %q", i, g.svcs[i].ClusterID(), cluster)
		}
	}
	g.stop(0)
	g.start(0)
	l := g.leader()
	ents, err := newClient(t, g.peers[l]).readdirAll(rootIno, 100, false)
	if err != nil || len(ents) != 6 {
		t.Fatalf("namespace of the grown group: %d entries, %v", len(ents), err)
	}
}

// TestSingleNodeGrownWithoutPeersRefused: a node started without --peers
// whose raft group has another server (added without --peers) is refused
// as a voter of a group, with what to do; and such a node refuses to add
// a voter started with --peers (their raft traffic cannot meet), leaving
// the configuration as it was.
func TestSingleNodeGrownWithoutPeersRefused(t *testing.T) {
	addrs := freeAddrs(t, 3)
	dir := t.TempDir()
	s, err := Open(Config{DataDir: dir, ListenAddr: addrs[0], ClusterKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	// A voter of a group waiting to be added: refused. (Its --peers name
	// a third address, where nothing runs yet: with the node alone, the
	// voter would not start, refused by its only other voter.)
	v, err := Open(Config{DataDir: t.TempDir(), ListenAddr: addrs[2], Peers: addrs, ClusterKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	c := newClient(t, addrs[0])
	var resp rpc.MembershipResp
	err = c.call(rpc.MAddVoter, &rpc.MembershipReq{Addr: addrs[2]}, &resp)
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "cannot reach each other") {
		t.Fatalf("adding a --peers voter to a node without --peers: %v", err)
	}
	if conf, _ := s.node.Configuration(); len(conf) != 1 {
		t.Fatalf("configuration after the refusal: %v", conf)
	}
	// Grown with a node without --peers (raft on its own port).
	b := OpenVoter(t, addrs[1])
	if err := c.call(rpc.MAddVoter, &rpc.MembershipReq{Addr: b.Addr()}, &resp); err != nil {
		t.Fatalf("add voter: %v", err)
	}
	s.Close()
	_, err = Open(Config{DataDir: dir, ListenAddr: addrs[0], Peers: []string{addrs[0], addrs[1]}, ClusterKey: testKey})
	if !errors.Is(err, consensus.ErrNotSingleVoter) || !strings.Contains(err.Error(), "keep starting it without --peers") {
		t.Fatalf("a grown single node's data dir started with --peers: %v", err)
	}
}
