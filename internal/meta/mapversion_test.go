package meta

import (
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// Group map versions (docs/design/0014 § Group map versions): every answer
// that carries groups carries the raft index of the state it was read
// from, so that a store or client can tell an older answer that arrives
// late from a newer one.

// registerPair registers two servers of one target each through c and
// pairs them into a group; it answers the servers and the group.
func registerPair(t *testing.T, c *client) ([2]rpc.RegisterServerResp, rpc.GroupInfo) {
	t.Helper()
	var srv [2]rpc.RegisterServerResp
	for i, addr := range []string{"a:1", "b:1"} {
		req := &rpc.RegisterServerReq{Addr: addr, Host: "h-" + addr,
			Targets: []rpc.TargetReg{{UUID: addr, Path: "/t/" + addr, TotalBytes: 1 << 40, FreeBytes: 1 << 39}}}
		if err := c.call(rpc.MRegisterServer, req, &srv[i]); err != nil {
			t.Fatal(err)
		}
	}
	var made rpc.ListGroupsResp
	if err := c.call(rpc.MMirrorCreate, &rpc.MirrorCreateReq{Pairs: []uint32{srv[0].TargetIDs[0], srv[1].TargetIDs[0]}}, &made); err != nil || len(made.Groups) != 1 {
		t.Fatalf("mirror create: %v, %d groups", err, len(made.Groups))
	}
	if made.Version != 0 {
		t.Fatalf("a create's answer (the new groups alone, no map) has version %d", made.Version)
	}
	return srv, made.Groups[0]
}

func listVersion(t *testing.T, c *client) (rpc.ListGroupsResp, uint64) {
	t.Helper()
	var resp rpc.ListGroupsResp
	if err := c.call(rpc.MListGroups, &rpc.Empty{}, &resp); err != nil {
		t.Fatal(err)
	}
	return resp, resp.Version
}

func beatVersion(t *testing.T, c *client, server uint32) *rpc.ServerHeartbeatResp {
	t.Helper()
	var resp rpc.ServerHeartbeatResp
	if err := c.call(rpc.MServerHeartbeat, &rpc.ServerHeartbeatReq{ServerID: server}, &resp); err != nil {
		t.Fatal(err)
	}
	return &resp
}

// TestMirrorMapVersions: the versions of MListGroups, heartbeat and group
// change answers order them as the changes happened; a create's answer
// (no map) has none.
func TestMirrorMapVersions(t *testing.T) {
	m := newMirrorCluster(t)
	_, before := listVersion(t, m.c)
	if before == 0 {
		t.Fatal("MListGroups answered version 0 (unknown) from a service that knows it")
	}
	srv, g := registerPair(t, m.c)
	list, v1 := listVersion(t, m.c)
	if v1 <= before || len(list.Groups) != 1 {
		t.Fatalf("after a create: version %d (before %d), %d groups", v1, before, len(list.Groups))
	}
	hb := beatVersion(t, m.c, srv[0].ServerID)
	if hb.Version < v1 || len(hb.Groups) != 1 {
		t.Fatalf("heartbeat answer: version %d (the list's %d), %d groups", hb.Version, v1, len(hb.Groups))
	}
	var lost rpc.GroupResp
	if err := m.c.call(rpc.MMirrorReport, &rpc.MirrorReportReq{Group: g.ID, Epoch: g.Epoch, Target: g.Primary, Event: rpc.MirrorSecondaryLost}, &lost); err != nil {
		t.Fatal(err)
	}
	if lost.Version <= hb.Version || lost.Group.Epoch != g.Epoch+1 {
		t.Fatalf("report answer: version %d (the heartbeat's %d), epoch %d", lost.Version, hb.Version, lost.Group.Epoch)
	}
	if _, v2 := listVersion(t, m.c); v2 < lost.Version {
		t.Fatalf("a list after the report: version %d, older than the report's %d", v2, lost.Version)
	}
	var bad rpc.GroupResp
	if err := m.c.call(rpc.MMirrorReport, &rpc.MirrorReportReq{Group: g.ID, Epoch: lost.Group.Epoch, Target: g.Primary, Event: rpc.MirrorCopyBad}, &bad); err != nil {
		t.Fatal(err)
	}
	if bad.Version < lost.Version || bad.Group.Epoch != lost.Group.Epoch {
		t.Fatalf("a bad-copy report's answer: version %d (the degrade's %d), epoch %d", bad.Version, lost.Version, bad.Group.Epoch)
	}
}

// TestMirrorMapVersionAcrossLeaderChange: the version comes from the
// replicated state, so a new leader's answers are not older than the old
// leader's.
func TestMirrorMapVersionAcrossLeaderChange(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	srv, _ := registerPair(t, c)
	_, v1 := listVersion(t, c)
	hb1 := beatVersion(t, c, srv[1].ServerID)
	g.stop(l)
	nl := g.leader()
	c2 := newClient(t, g.peers[nl])
	list, v2 := listVersion(t, c2)
	if v2 < v1 || v2 < hb1.Version || len(list.Groups) != 1 {
		t.Fatalf("the new leader's map: version %d, %d groups; the old leader's list %d, heartbeat %d", v2, len(list.Groups), v1, hb1.Version)
	}
	if hb2 := beatVersion(t, c2, srv[1].ServerID); hb2.Version < v2 || len(hb2.Groups) != 1 {
		t.Fatalf("the new leader's heartbeat answer: version %d (its list's %d), %d groups", hb2.Version, v2, len(hb2.Groups))
	}
}
