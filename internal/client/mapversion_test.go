package client

import (
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// TestGroupMapStaleAfterNewer: the client's group map, against a real
// metadata service and stores (docs/design/0014 § Group map versions). An
// MListGroups answer read before a group was created, installed after one
// read after it (as by a later refresh), does not drop the group; one read
// before a group's secondary was replaced does not bring the replaced copy
// back. Answers in order still move the map on.
func TestGroupMapStaleAfterNewer(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 3, targets: 1})
	c := tc.client(nil)
	list := func() rpc.ListGroupsResp {
		t.Helper()
		var resp rpc.ListGroupsResp
		if err := c.metaCall(bg, rpc.MListGroups, &rpc.Empty{}, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Version == 0 {
			t.Fatal("MListGroups answered no map version")
		}
		return resp
	}
	// deliver installs an answer as a refresh begun after every other
	// would: only its version can tell that it is older.
	deliver := func(r rpc.ListGroupsResp) { c.groups.install(r.Groups, r.Version, c.groups.started.Add(1)) }
	call := func(m rpc.Method, req, resp rpc.Message) {
		t.Helper()
		if err := c.metaCall(bg, m, req, resp); err != nil {
			t.Fatalf("method %d: %v", m, err)
		}
	}
	t0, t1, t2 := tc.stores[0].TargetIDs()[0], tc.stores[1].TargetIDs()[0], tc.stores[2].TargetIDs()[0]

	early := list()
	var made rpc.ListGroupsResp
	call(rpc.MMirrorCreate, &rpc.MirrorCreateReq{Hdr: c.hdr(), Pairs: []uint32{t0, t1}}, &made)
	if len(made.Groups) != 1 {
		t.Fatalf("mirror create answered %d groups", len(made.Groups))
	}
	g := made.Groups[0].ID
	if err := c.groups.refresh(bg); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.groups.epoch(g); !ok {
		t.Fatal("the refreshed map lacks the new group")
	}
	deliver(early)
	if _, ok := c.groups.epoch(g); !ok {
		t.Fatalf("a map of version %d, read before the group was created, dropped it", early.Version)
	}

	var gr rpc.GroupResp
	call(rpc.MMirrorReport, &rpc.MirrorReportReq{Group: g, Epoch: 1, Target: t0, Event: rpc.MirrorSecondaryLost}, &gr)
	beforeReplace := list()
	call(rpc.MMirrorReplace, &rpc.MirrorReplaceReq{Hdr: c.hdr(), Group: g, Target: t2}, &gr)
	if err := c.groups.refresh(bg); err != nil {
		t.Fatal(err)
	}
	if got := c.Groups()[g]; got.Secondary != t2 {
		t.Fatalf("after the replace and a refresh the group's secondary is target %d, want %d", got.Secondary, t2)
	}
	deliver(beforeReplace)
	if got := c.Groups()[g]; got.Secondary != t2 || got.Epoch != gr.Group.Epoch {
		t.Fatalf("a map of version %d, read before the replace, was installed: secondary %d epoch %d, want %d epoch %d",
			beforeReplace.Version, got.Secondary, got.Epoch, t2, gr.Group.Epoch)
	}

	later := list()
	deliver(later)
	c.groups.mu.RLock()
	installed := c.groups.mu.gate.Version
	c.groups.mu.RUnlock()
	if installed != later.Version {
		t.Fatalf("installed map version %d, want the latest answer's %d", installed, later.Version)
	}
}
