package meta

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// mirrorCluster is a real metadata service on a fake clock with storage
// servers registered and heartbeating through the rpc (no store behind
// them: the service only hears them).
type mirrorCluster struct {
	t       *testing.T
	svc     *Service
	c       *client
	fc      *clock.Fake
	servers []mirrorServer
}

type mirrorServer struct {
	id      uint32
	addr    string
	targets []uint32
}

const testFailover = 3 * time.Second

func newMirrorCluster(t *testing.T) *mirrorCluster {
	t.Helper()
	return newMirrorClusterWith(t, nil)
}

func newMirrorClusterWith(t *testing.T, change func(*Config)) *mirrorCluster {
	t.Helper()
	cfg := testConfig(t, "")
	fc := fakeClock(t, &cfg)
	cfg.FailoverTimeout = testFailover
	if change != nil {
		change(&cfg)
	}
	svc := openService(t, cfg)
	m := &mirrorCluster{t: t, svc: svc, c: newClient(t, svc.Addr()), fc: fc}
	waitLeaderLoop(t, fc)
	return m
}

// waitFailoverTicker waits until the leader loop has made its failover
// ticker (at a session tick once groups exist), advancing the clock a
// session tick at a time with heartbeats of every server.
func (m *mirrorCluster) waitFailoverTicker() {
	m.t.Helper()
	var all []uint32
	for _, s := range m.servers {
		all = append(all, s.id)
	}
	for i := 0; m.fc.Pending() < 3; i++ {
		if i == 50 {
			m.t.Fatalf("no failover ticker after groups were made (%d timers pending)", m.fc.Pending())
		}
		m.advance(250*time.Millisecond, 250*time.Millisecond, all...)
		time.Sleep(5 * time.Millisecond)
	}
}

// addServer registers a server at addr (failure domain domain) with n
// targets of 1 TiB, half free.
func (m *mirrorCluster) addServer(addr, domain string, n int) mirrorServer {
	m.t.Helper()
	req := &rpc.RegisterServerReq{Addr: addr, Host: "h-" + addr, Domain: domain}
	for i := range n {
		u := fmt.Sprintf("%s-t%d", addr, i)
		req.Targets = append(req.Targets, rpc.TargetReg{UUID: u, Path: "/t/" + u, TotalBytes: 1 << 40, FreeBytes: 1 << 39})
	}
	var resp rpc.RegisterServerResp
	if err := m.c.call(rpc.MRegisterServer, req, &resp); err != nil {
		m.t.Fatalf("register %s: %v", addr, err)
	}
	s := mirrorServer{id: resp.ServerID, addr: addr, targets: resp.TargetIDs}
	m.servers = append(m.servers, s)
	m.beat(s)
	return s
}

// beat sends s's heartbeat and returns the answer.
func (m *mirrorCluster) beat(s mirrorServer) *rpc.ServerHeartbeatResp {
	m.t.Helper()
	req := &rpc.ServerHeartbeatReq{ServerID: s.id}
	for _, id := range s.targets {
		req.Targets = append(req.Targets, rpc.TargetUsage{ID: id, TotalBytes: 1 << 40, FreeBytes: 1 << 39})
	}
	var resp rpc.ServerHeartbeatResp
	if err := m.c.call(rpc.MServerHeartbeat, req, &resp); err != nil {
		m.t.Fatalf("heartbeat of server %d: %v", s.id, err)
	}
	return &resp
}

func (m *mirrorCluster) groups() []rpc.GroupInfo {
	m.t.Helper()
	var resp rpc.ListGroupsResp
	if err := m.c.call(rpc.MListGroups, &rpc.Empty{}, &resp); err != nil {
		m.t.Fatalf("list groups: %v", err)
	}
	return resp.Groups
}

func (m *mirrorCluster) group(id uint32) rpc.GroupInfo {
	m.t.Helper()
	for _, g := range m.groups() {
		if g.ID == id {
			return g
		}
	}
	m.t.Fatalf("no group %d", id)
	return rpc.GroupInfo{}
}

func (m *mirrorCluster) create(req *rpc.MirrorCreateReq) ([]rpc.GroupInfo, error) {
	var resp rpc.ListGroupsResp
	err := m.c.call(rpc.MMirrorCreate, req, &resp)
	return resp.Groups, err
}

func (m *mirrorCluster) report(r *rpc.MirrorReportReq) (rpc.GroupInfo, error) {
	var g rpc.GroupInfo
	err := m.c.call(rpc.MMirrorReport, r, &g)
	return g, err
}

// serverOf is the server holding target t.
func (m *mirrorCluster) serverOf(t uint32) mirrorServer {
	for _, s := range m.servers {
		for _, id := range s.targets {
			if id == t {
				return s
			}
		}
	}
	m.t.Fatalf("no server holds target %d", t)
	return mirrorServer{}
}

// advance moves the fake clock by total in steps of step, sending the
// heartbeats of the servers alive (by id) after each step.
func (m *mirrorCluster) advance(total, step time.Duration, alive ...uint32) {
	m.t.Helper()
	for moved := time.Duration(0); moved < total; moved += step {
		m.fc.Advance(step)
		for _, s := range m.servers {
			for _, id := range alive {
				if s.id == id {
					m.beat(s)
				}
			}
		}
	}
}

// waitGroup polls group id until ok accepts it (the leader loop handles
// its ticks on its own goroutine), for at most 10 s.
func (m *mirrorCluster) waitGroup(id uint32, what string, ok func(rpc.GroupInfo) bool) rpc.GroupInfo {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := m.group(id)
		if ok(g) {
			return g
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("group %d never became %s: %+v", id, what, g)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func fourByTwo(m *mirrorCluster, domains ...string) {
	for i := range 4 {
		d := ""
		if len(domains) > 0 {
			d = domains[i]
		}
		m.addServer(fmt.Sprintf("10.0.0.%d:7401", i+1), d, 2)
	}
}

// TestMirrorCreateAuto pairs every target with one on another server,
// spreading primaries and partners over the servers; a second run finds
// nothing left to pair.
func TestMirrorCreateAuto(t *testing.T) {
	m := newMirrorCluster(t)
	fourByTwo(m)
	gs, err := m.create(&rpc.MirrorCreateReq{Auto: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 4 {
		t.Fatalf("%d groups from 8 targets on 4 servers, want 4: %+v", len(gs), gs)
	}
	used := map[uint32]bool{}
	primaries := map[string]int{}
	partners := map[[2]string]bool{}
	for i, g := range gs {
		if g.ID != uint32(i+1) || g.Epoch != 1 || g.State != rpc.GroupInSync {
			t.Errorf("new group %+v: want id %d, epoch 1, in sync", g, i+1)
		}
		if g.PrimaryAddr == g.SecondaryAddr || g.PrimaryAddr == "" {
			t.Errorf("group %d: copies on servers %q and %q", g.ID, g.PrimaryAddr, g.SecondaryAddr)
		}
		if !g.PrimaryAlive || !g.SecondaryAlive {
			t.Errorf("group %d: servers not alive: %+v", g.ID, g)
		}
		for _, id := range []uint32{g.Primary, g.Secondary} {
			if used[id] {
				t.Errorf("target %d in two groups", id)
			}
			used[id] = true
		}
		primaries[g.PrimaryAddr]++
		partners[[2]string{min(g.PrimaryAddr, g.SecondaryAddr), max(g.PrimaryAddr, g.SecondaryAddr)}] = true
	}
	for addr, n := range primaries {
		if n != 1 {
			t.Errorf("server %s holds %d primaries, want 1 each: %v", addr, n, primaries)
		}
	}
	if len(partners) != 4 {
		t.Errorf("groups pair %d distinct server pairs, want 4 (a dead server's load spread): %v", len(partners), partners)
	}
	again, err := m.create(&rpc.MirrorCreateReq{Auto: true})
	if err != nil || len(again) != 0 {
		t.Fatalf("second auto pairing: %v %+v, want nothing", err, again)
	}
	if n := len(m.groups()); n != 4 {
		t.Fatalf("%d groups listed", n)
	}
}

// TestMirrorCreateByDomain pairs only across failure domains, and refuses
// when no server has a domain.
func TestMirrorCreateByDomain(t *testing.T) {
	m := newMirrorCluster(t)
	fourByTwo(m, "rackA", "rackA", "rackB", "rackB")
	gs, err := m.create(&rpc.MirrorCreateReq{Auto: true, ByDomain: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 4 {
		t.Fatalf("%d groups, want 4", len(gs))
	}
	rack := func(addr string) string {
		if addr <= "10.0.0.2:7401" {
			return "A"
		}
		return "B"
	}
	for _, g := range gs {
		if rack(g.PrimaryAddr) == rack(g.SecondaryAddr) {
			t.Errorf("group %d pairs %s and %s, both in rack %s", g.ID, g.PrimaryAddr, g.SecondaryAddr, rack(g.PrimaryAddr))
		}
	}

	// Labelled servers are not paired within a domain without --domain
	// either.
	m3 := newMirrorCluster(t)
	fourByTwo(m3, "rackA", "rackA", "rackB", "rackB")
	gs, err = m3.create(&rpc.MirrorCreateReq{Auto: true})
	if err != nil || len(gs) != 4 {
		t.Fatalf("auto pairing of labelled servers: %v %+v", err, gs)
	}
	for _, g := range gs {
		if rack(g.PrimaryAddr) == rack(g.SecondaryAddr) {
			t.Errorf("group %d pairs %s and %s, both in rack %s", g.ID, g.PrimaryAddr, g.SecondaryAddr, rack(g.PrimaryAddr))
		}
	}

	m2 := newMirrorCluster(t)
	fourByTwo(m2)
	_, err = m2.create(&rpc.MirrorCreateReq{Auto: true, ByDomain: true})
	wantErrno(t, err, syscall.EINVAL, "pairing by domain without domains")
	if !strings.Contains(err.Error(), "--domain") {
		t.Errorf("refusal does not say how to label: %v", err)
	}
}

// TestMirrorCreatePairsRefused: explicit pairs are checked, the first bad
// one named, and nothing is made when one is bad.
func TestMirrorCreatePairsRefused(t *testing.T) {
	m := newMirrorCluster(t)
	a := m.addServer("10.0.0.1:7401", "", 2)
	b := m.addServer("10.0.0.2:7401", "", 2)
	for _, tc := range []struct {
		pairs []uint32
		says  string
	}{
		{[]uint32{a.targets[0], 99}, "target 99 is not registered"},
		{[]uint32{a.targets[0], a.targets[1]}, "both on storage server"},
		{[]uint32{a.targets[0], b.targets[0], a.targets[1], a.targets[1]}, "cannot mirror itself"},
		{[]uint32{a.targets[0]}, "pairs"},
	} {
		_, err := m.create(&rpc.MirrorCreateReq{Pairs: tc.pairs})
		wantErrno(t, err, syscall.EINVAL, fmt.Sprintf("pairs %v", tc.pairs))
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("pairs %v: %v, want it to say %q", tc.pairs, err, tc.says)
		}
	}
	if n := len(m.groups()); n != 0 {
		t.Fatalf("%d groups made by refused requests", n)
	}
	gs, err := m.create(&rpc.MirrorCreateReq{Pairs: []uint32{a.targets[0], b.targets[1]}})
	if err != nil || len(gs) != 1 || gs[0].Primary != a.targets[0] || gs[0].Secondary != b.targets[1] {
		t.Fatalf("good pair: %v %+v", err, gs)
	}
	_, err = m.create(&rpc.MirrorCreateReq{Pairs: []uint32{b.targets[1], a.targets[1]}})
	wantErrno(t, err, syscall.EINVAL, "a target in a group already")
	if !strings.Contains(err.Error(), "in mirror group 1 already") {
		t.Errorf("refusal: %v", err)
	}
}

// twoGroups makes two servers with one target each paired as group 1.
func twoGroups(t *testing.T) (*mirrorCluster, rpc.GroupInfo) {
	m := newMirrorCluster(t)
	m.addServer("10.0.0.1:7401", "", 1)
	m.addServer("10.0.0.2:7401", "", 1)
	m.addServer("10.0.0.3:7401", "", 1) // a spare
	gs, err := m.create(&rpc.MirrorCreateReq{Pairs: []uint32{m.servers[0].targets[0], m.servers[1].targets[0]}})
	if err != nil || len(gs) != 1 {
		t.Fatalf("create: %v %+v", err, gs)
	}
	m.waitFailoverTicker()
	return m, m.group(gs[0].ID)
}

// TestMirrorFailOverPlanned swaps the copies under a new epoch and stays
// in sync; a request of an older epoch is refused, and so is a switch of
// a group that is not in sync.
func TestMirrorFailOverPlanned(t *testing.T) {
	m, g := twoGroups(t)
	var got rpc.GroupInfo
	if err := m.c.call(rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Group: g.ID, Epoch: g.Epoch}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Primary != g.Secondary || got.Secondary != g.Primary || got.Epoch != g.Epoch+1 || got.State != rpc.GroupInSync {
		t.Fatalf("after fail-over %+v (was %+v)", got, g)
	}
	if got.PrimaryAddr != g.SecondaryAddr {
		t.Fatalf("primary address %q, want the old secondary's %q", got.PrimaryAddr, g.SecondaryAddr)
	}
	// The same request again (a retry): refused, not switched back.
	err := m.c.call(rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Group: g.ID, Epoch: g.Epoch}, &got)
	wantErrno(t, err, syscall.ESTALE, "fail-over of an older epoch")
	if now := m.group(g.ID); now.Primary != g.Secondary {
		t.Fatalf("a refused retry switched back: %+v", now)
	}
	err = m.c.call(rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Group: 42}, &got)
	wantErrno(t, err, syscall.ENOENT, "fail-over of no group")
	// Degraded: the secondary lacks writes.
	cur := m.group(g.ID)
	if _, err := m.report(&rpc.MirrorReportReq{Group: g.ID, Epoch: cur.Epoch, Target: cur.Primary, Event: rpc.MirrorSecondaryLost}); err != nil {
		t.Fatal(err)
	}
	err = m.c.call(rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Group: g.ID}, &got)
	wantErrno(t, err, syscall.EBUSY, "fail-over of a degraded group")
}

// TestMirrorFailOverOnce: fail-overs sent together from one epoch switch
// once; the others are refused (ESTALE), none switches back.
func TestMirrorFailOverOnce(t *testing.T) {
	m, g := twoGroups(t)
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			var got rpc.GroupInfo
			errs <- m.c.call(rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Group: g.ID, Epoch: g.Epoch}, &got)
		}()
	}
	ok := 0
	for range n {
		switch err := <-errs; {
		case err == nil:
			ok++
		case !errors.Is(err, syscall.ESTALE):
			t.Errorf("a concurrent fail-over: %v, want success or ESTALE", err)
		}
	}
	now := m.group(g.ID)
	if ok != 1 || now.Epoch != g.Epoch+1 || now.Primary != g.Secondary {
		t.Fatalf("%d of %d fail-overs succeeded; group %+v", ok, n, now)
	}
}

// TestMirrorReports walks a group through degrade, resync and back: each
// state change bumps the epoch, a report of an older epoch or from the
// secondary is refused, and the secondary's heartbeat starts the resync
// once the group has been degraded for the failover timeout.
func TestMirrorReports(t *testing.T) {
	m, g := twoGroups(t)
	p, s := m.serverOf(g.Primary), m.serverOf(g.Secondary)
	lost := &rpc.MirrorReportReq{ServerID: p.id, Group: g.ID, Epoch: g.Epoch, Target: g.Primary, Event: rpc.MirrorSecondaryLost, Detail: "forward: connection refused"}
	_, err := m.report(&rpc.MirrorReportReq{ServerID: s.id, Group: g.ID, Epoch: g.Epoch, Target: g.Secondary, Event: rpc.MirrorSecondaryLost})
	wantErrno(t, err, syscall.EINVAL, "a report from the secondary")
	got, err := m.report(lost)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != rpc.GroupDegraded || got.Epoch != g.Epoch+1 || got.Primary != g.Primary {
		t.Fatalf("after secondary lost: %+v", got)
	}
	_, err = m.report(lost) // sent again: of the old epoch
	wantErrno(t, err, syscall.ESTALE, "a report of an older epoch")

	// The secondary's server heartbeats at once: too soon to resync.
	if hb := m.beat(s); len(hb.Groups) != 1 || hb.Groups[0].State != rpc.GroupDegraded {
		t.Fatalf("heartbeat answer right after the degrade: %+v", hb.Groups)
	}
	m.advance(testFailover, 500*time.Millisecond, p.id)
	hb := m.beat(s)
	if len(hb.Groups) != 1 || hb.Groups[0].State != rpc.GroupResyncing || hb.Groups[0].Epoch != g.Epoch+2 {
		t.Fatalf("heartbeat answer after the timeout: %+v, want resyncing at epoch %d", hb.Groups, g.Epoch+2)
	}
	ep := hb.Groups[0].Epoch
	got, err = m.report(&rpc.MirrorReportReq{ServerID: p.id, Group: g.ID, Epoch: ep, Target: g.Primary, Event: rpc.MirrorResyncProgress, Done: 43, Total: 100})
	if err != nil || got.ResyncDone != 43 || got.ResyncTotal != 100 || got.Epoch != ep {
		t.Fatalf("progress: %v %+v", err, got)
	}
	got, err = m.report(&rpc.MirrorReportReq{ServerID: p.id, Group: g.ID, Epoch: ep, Target: g.Primary, Event: rpc.MirrorResyncDone})
	if err != nil || got.State != rpc.GroupInSync || got.Epoch != ep+1 {
		t.Fatalf("resync done: %v %+v", err, got)
	}
	// A bad copy is counted, not a state change.
	got, err = m.report(&rpc.MirrorReportReq{ServerID: s.id, Group: g.ID, Epoch: ep + 1, Target: g.Secondary, Event: rpc.MirrorCopyBad, Detail: "chunk 7 block 3"})
	if err != nil || got.Epoch != ep+1 || got.State != rpc.GroupInSync {
		t.Fatalf("copy bad: %v %+v", err, got)
	}
}

// TestMirrorPrimaryDiskFailed: the primary's report that its own copy
// failed (MirrorPrimaryFailed) promotes the in-sync secondary under a new
// epoch, degraded, with the failed copy as the secondary marked for a full
// resync (in the heartbeat answers and the list, and it survives the
// resync's start); a report of the old epoch, or from the secondary, is
// refused; resync done clears the mark; a group not in sync answers EIO.
func TestMirrorPrimaryDiskFailed(t *testing.T) {
	m, g := twoGroups(t)
	p, s := m.serverOf(g.Primary), m.serverOf(g.Secondary)
	failed := &rpc.MirrorReportReq{ServerID: p.id, Group: g.ID, Epoch: g.Epoch, Target: g.Primary, Event: rpc.MirrorPrimaryFailed,
		Detail: "sync data at offset 0: input/output error"}
	_, err := m.report(&rpc.MirrorReportReq{ServerID: s.id, Group: g.ID, Epoch: g.Epoch, Target: g.Secondary, Event: rpc.MirrorPrimaryFailed})
	wantErrno(t, err, syscall.EINVAL, "a primary-failed report from the secondary")
	got, err := m.report(failed)
	if err != nil {
		t.Fatal(err)
	}
	if got.Primary != g.Secondary || got.Secondary != g.Primary || got.State != rpc.GroupDegraded || got.Epoch != g.Epoch+1 {
		t.Fatalf("after the primary's disk failed: %+v", got)
	}
	if n := metricValue(t, m.svc, "strata_mirror_failovers_total", "disk"); n != 1 {
		t.Fatalf("disk failovers counted: %v, want 1", n)
	}
	_, err = m.report(failed) // sent again: of the old epoch
	wantErrno(t, err, syscall.ESTALE, "a primary-failed report of an older epoch")
	if l := m.group(g.ID); !l.FullResync || l.Primary != g.Secondary {
		t.Fatalf("listed after the switch: %+v, want FullResync with primary %d", l, g.Secondary)
	}
	// The failed copy's server heartbeats after the timeout: resync, and
	// the mark stays.
	m.advance(testFailover, 500*time.Millisecond, s.id)
	hb := m.beat(p)
	if len(hb.Groups) != 1 || hb.Groups[0].State != rpc.GroupResyncing || !hb.Groups[0].FullResync || hb.Groups[0].Epoch != g.Epoch+2 {
		t.Fatalf("the failed copy's heartbeat answer after the timeout: %+v", hb.Groups)
	}
	// Resyncing: the new primary's own disk failing has no copy to go to.
	ep := hb.Groups[0].Epoch
	_, err = m.report(&rpc.MirrorReportReq{ServerID: s.id, Group: g.ID, Epoch: ep, Target: g.Secondary, Event: rpc.MirrorPrimaryFailed})
	wantErrno(t, err, syscall.EIO, "a primary-failed report of a resyncing group")
	got, err = m.report(&rpc.MirrorReportReq{ServerID: s.id, Group: g.ID, Epoch: ep, Target: g.Secondary, Event: rpc.MirrorResyncDone})
	if err != nil || got.State != rpc.GroupInSync || got.Epoch != ep+1 {
		t.Fatalf("resync done: %v %+v", err, got)
	}
	if l := m.group(g.ID); l.FullResync || l.State != rpc.GroupInSync {
		t.Fatalf("listed after the resync: %+v, want in sync without FullResync", l)
	}
}

// TestMirrorHeartbeatAnswer: a server's heartbeat answer carries the
// groups with a copy on its targets, its lease (2/3 of the failover
// timeout) and the timeout.
func TestMirrorHeartbeatAnswer(t *testing.T) {
	m, g := twoGroups(t)
	for i, s := range m.servers {
		hb := m.beat(s)
		if hb.LeaseMs != 2000 || hb.FailoverTimeoutMs != 3000 {
			t.Errorf("server %d: lease %d ms, timeout %d ms; want 2000, 3000", s.id, hb.LeaseMs, hb.FailoverTimeoutMs)
		}
		want := 1
		if i == 2 {
			want = 0 // the spare
		}
		if len(hb.Groups) != want {
			t.Fatalf("server %d: %d groups in its heartbeat answer, want %d", s.id, len(hb.Groups), want)
		}
		if want == 1 && (hb.Groups[0].ID != g.ID || hb.Groups[0].PrimaryAddr != g.PrimaryAddr || hb.Groups[0].SecondaryAddr != g.SecondaryAddr) {
			t.Errorf("server %d: group %+v, want %+v", s.id, hb.Groups[0], g)
		}
	}
}

// TestMirrorAutomaticFailover, on a fake clock: the primary of an in-sync
// group whose server goes silent is replaced by its secondary once the
// failover timeout has passed since its last heartbeat (not before); the
// group is then degraded, and when the new primary's server goes silent
// too nothing is promoted.
func TestMirrorAutomaticFailover(t *testing.T) {
	m, g := twoGroups(t)
	p, s, spare := m.serverOf(g.Primary), m.serverOf(g.Secondary), m.servers[2]
	m.advance(2500*time.Millisecond, 250*time.Millisecond, s.id, spare.id)
	time.Sleep(50 * time.Millisecond) // the loop's last check
	if now := m.group(g.ID); now.Primary != g.Primary || now.Epoch != g.Epoch {
		t.Fatalf("switched before the failover timeout: %+v", now)
	}
	m.advance(750*time.Millisecond, 250*time.Millisecond, s.id, spare.id)
	got := m.waitGroup(g.ID, "failed over", func(x rpc.GroupInfo) bool { return x.Primary == g.Secondary })
	if got.Secondary != g.Primary || got.State != rpc.GroupDegraded || got.Epoch != g.Epoch+1 {
		t.Fatalf("after the automatic switch: %+v", got)
	}
	if got.PrimaryAlive != true || got.SecondaryAlive != false {
		t.Fatalf("liveness after the switch: %+v", got)
	}
	if n := metricValue(t, m.svc, "strata_mirror_failovers_total", "automatic"); n != 1 {
		t.Fatalf("failovers counted: %v, want 1", n)
	}
	// Now the new primary dies too: a degraded group is never switched.
	m.advance(2*testFailover, 250*time.Millisecond, spare.id)
	time.Sleep(50 * time.Millisecond)
	if now := m.group(g.ID); now.Primary != got.Primary || now.Epoch != got.Epoch || now.State != rpc.GroupDegraded {
		t.Fatalf("a degraded group with a dead primary changed: %+v (was %+v)", now, got)
	}
	// The old primary returns: it resyncs once its group has been
	// degraded for the timeout and the new primary is alive.
	m.beat(s)
	hb := m.beat(p)
	if len(hb.Groups) != 1 || hb.Groups[0].State != rpc.GroupResyncing || hb.Groups[0].Secondary != g.Primary {
		t.Fatalf("the returning old primary's heartbeat answer: %+v", hb.Groups)
	}
}

// TestMirrorNewLeaderStartsClocksAfresh: a restarted service (a new
// leader) has heard no server; it counts each server's silence from when
// it took office, so a primary is not switched at once but after the
// failover timeout, if it stays silent.
func TestMirrorNewLeaderStartsClocksAfresh(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	fc := fakeClock(t, &cfg)
	cfg.FailoverTimeout = testFailover
	svc, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &mirrorCluster{t: t, svc: svc, c: newClient(t, svc.Addr()), fc: fc}
	m.addServer("10.0.0.1:7401", "", 1)
	m.addServer("10.0.0.2:7401", "", 1)
	gs, err := m.create(&rpc.MirrorCreateReq{Auto: true})
	if err != nil || len(gs) != 1 {
		t.Fatalf("create: %v %+v", err, gs)
	}
	g := gs[0]
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Hour) // long after the servers' last heartbeats
	svc = openService(t, cfg)
	m.svc, m.c = svc, newClient(t, svc.Addr())
	if !fc.WaitPending(3, 10*time.Second) { // sessions, reaper, failover (groups exist)
		t.Fatalf("the leader loop's tickers never appeared (%d pending)", fc.Pending())
	}
	s := m.serverOf(g.Secondary)
	m.advance(2500*time.Millisecond, 250*time.Millisecond, s.id)
	time.Sleep(50 * time.Millisecond)
	if now := m.group(g.ID); now.Primary != g.Primary || now.Epoch != g.Epoch {
		t.Fatalf("a new leader switched a primary it had not waited for: %+v", now)
	}
	m.advance(750*time.Millisecond, 250*time.Millisecond, s.id)
	m.waitGroup(g.ID, "failed over", func(x rpc.GroupInfo) bool { return x.Primary == g.Secondary })
}

// TestMirrorSecondarySilent: an in-sync group whose secondary's server
// goes silent for the timeout is degraded (so that it can be replaced);
// replacing its secondary with a target in no group works, with one on
// the primary's server refused.
func TestMirrorSecondarySilent(t *testing.T) {
	m, g := twoGroups(t)
	p, spare := m.serverOf(g.Primary), m.servers[2]
	m.advance(testFailover+500*time.Millisecond, 250*time.Millisecond, p.id, spare.id)
	got := m.waitGroup(g.ID, "degraded", func(x rpc.GroupInfo) bool { return x.State == rpc.GroupDegraded })
	if got.Primary != g.Primary || got.Epoch != g.Epoch+1 {
		t.Fatalf("degraded: %+v", got)
	}
	var rep rpc.GroupInfo
	err := m.c.call(rpc.MMirrorReplace, &rpc.MirrorReplaceReq{Group: g.ID, Target: g.Primary}, &rep)
	wantErrno(t, err, syscall.EINVAL, "replace with the primary itself")
	if err := m.c.call(rpc.MMirrorReplace, &rpc.MirrorReplaceReq{Group: g.ID, Target: spare.targets[0]}, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Secondary != spare.targets[0] || rep.State != rpc.GroupDegraded || rep.Epoch != got.Epoch+1 || rep.SecondaryAddr != spare.addr {
		t.Fatalf("after replace: %+v", rep)
	}
	// The new target's server heartbeats after the hold-off: resync.
	m.advance(testFailover, 250*time.Millisecond, p.id, spare.id)
	if hb := m.beat(spare); len(hb.Groups) != 1 || hb.Groups[0].State != rpc.GroupResyncing {
		t.Fatalf("the new target's server's heartbeat answer: %+v", hb.Groups)
	}
}

// TestMirrorPlacement: new files in a directory marked mirrored get
// layouts of groups (all slots), its new subdirectories inherit the mark,
// other directories keep targets; without groups a mirrored create fails
// with ENOSPC naming the cause.
func TestMirrorPlacement(t *testing.T) {
	m := newMirrorCluster(t)
	fourByTwo(m)
	d := m.c.mustCreate(1, "mirrored", dirMode)
	setMirror := func(ino uint64, on uint8) error {
		return m.c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: m.c.hdr(), Dir: ino, Mirror: on}, nil)
	}
	if err := setMirror(d.Ino, rpc.DirMirrorOn); err != nil {
		t.Fatal(err)
	}
	_, err := m.c.create(d.Ino, "early", fileMode)
	wantErrno(t, err, syscall.ENOSPC, "a mirrored create without groups")
	if !strings.Contains(err.Error(), "no mirror group exists") {
		t.Fatalf("refusal: %v", err)
	}
	if _, err := m.create(&rpc.MirrorCreateReq{Auto: true}); err != nil {
		t.Fatal(err)
	}
	f := m.c.mustCreate(d.Ino, "f", fileMode)
	if len(f.Layout.Targets) != 4 {
		t.Fatalf("mirrored file over %d groups, want min(groups, 8) = 4: %+v", len(f.Layout.Targets), f.Layout)
	}
	for _, id := range f.Layout.Targets {
		if !layout.IsGroup(id) || id&^layout.GroupBit < 1 || id&^layout.GroupBit > 4 {
			t.Fatalf("mirrored file's layout %v names a non-group", f.Layout.Targets)
		}
	}
	sub := m.c.mustCreate(d.Ino, "sub", dirMode)
	if sf := m.c.mustCreate(sub.Ino, "g", fileMode); !layout.IsGroup(sf.Layout.Targets[0]) {
		t.Fatalf("a file in a subdirectory of a mirrored one: %v", sf.Layout.Targets)
	}
	if pf := m.c.mustCreate(1, "plain", fileMode); layout.IsGroup(pf.Layout.Targets[0]) {
		t.Fatalf("a file outside mirrored directories got groups: %v", pf.Layout.Targets)
	}
	// A layout change through an older client (no mirror byte) keeps
	// the mark; turning it off gives targets again.
	if err := m.c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: m.c.hdr(), Dir: d.Ino, StripeCount: 2}, nil); err != nil {
		t.Fatal(err)
	}
	if f2 := m.c.mustCreate(d.Ino, "f2", fileMode); len(f2.Layout.Targets) != 2 || !layout.IsGroup(f2.Layout.Targets[0]) {
		t.Fatalf("after a count change: %v", f2.Layout.Targets)
	}
	if err := setMirror(d.Ino, rpc.DirMirrorOff); err != nil {
		t.Fatal(err)
	}
	if f3 := m.c.mustCreate(d.Ino, "f3", fileMode); layout.IsGroup(f3.Layout.Targets[0]) {
		t.Fatalf("mark removed, still groups: %v", f3.Layout.Targets)
	}
	// The mark is replicated state, kept across a restart (schema v2).
	v, err := m.svc.db.Get(schema.InodeKey(sub.Ino))
	if err != nil {
		t.Fatal(err)
	}
	var in schema.Inode
	if err := schema.DecodeInode(v, &in); err != nil || !in.Mirror {
		t.Fatalf("stored subdirectory: mirror %v, %v", in.Mirror, err)
	}
}

// TestMirrorStatusAndReaper: cluster status lists the groups; a removed
// mirrored file's chunks are removed through its groups' primaries, with
// the group's epoch.
func TestMirrorStatus(t *testing.T) {
	m, g := twoGroups(t)
	var st rpc.ClusterStatusResp
	if err := m.c.call(rpc.MClusterStatus, &rpc.Empty{}, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Groups) != 1 || st.Groups[0].ID != g.ID || st.Groups[0].PrimaryAddr != g.PrimaryAddr {
		t.Fatalf("status groups: %+v", st.Groups)
	}
}

// TestMirrorReaperThroughPrimary: a removed mirrored file's chunks are
// removed through its group's primary (the store forwards the removal to
// the secondary), named by the group id and epoch; while the primary's
// server is silent the file stays an orphan, and goes once it is back.
func TestMirrorReaperThroughPrimary(t *testing.T) {
	m := newMirrorClusterWith(t, func(c *Config) { c.OrphanGrace = time.Second })
	ps, ss := newFakeStore(t), newFakeStore(t)
	p, s := m.addServer(ps.addr, "", 1), m.addServer(ss.addr, "", 1)
	gs, err := m.create(&rpc.MirrorCreateReq{Pairs: []uint32{p.targets[0], s.targets[0]}})
	if err != nil {
		t.Fatal(err)
	}
	m.waitFailoverTicker()
	d := m.c.mustCreate(1, "d", dirMode)
	if err := m.c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: m.c.hdr(), Dir: d.Ino, Mirror: rpc.DirMirrorOn}, nil); err != nil {
		t.Fatal(err)
	}
	f := m.c.mustCreate(d.Ino, "f", fileMode)
	if f.Layout.Targets[0] != layout.GroupBit|gs[0].ID {
		t.Fatalf("layout %v", f.Layout.Targets)
	}
	// Degraded, then its primary's server goes silent: nothing to promote.
	if _, err := m.report(&rpc.MirrorReportReq{Group: gs[0].ID, Epoch: 1, Target: p.targets[0], Event: rpc.MirrorSecondaryLost}); err != nil {
		t.Fatal(err)
	}
	m.advance(testFailover+500*time.Millisecond, 250*time.Millisecond, s.id)
	if _, err := m.c.unlink(d.Ino, "f"); err != nil {
		t.Fatal(err)
	}
	beats := func(n int, alive ...uint32) {
		for range n {
			m.advance(250*time.Millisecond, 250*time.Millisecond, alive...)
			if err := m.c.heartbeat(); err != nil {
				t.Fatal(err)
			}
		}
	}
	beats(12, s.id) // 3 s: past the orphan grace, reports after the unlink
	time.Sleep(100 * time.Millisecond)
	if n := len(ps.removed()) + len(ss.removed()); n != 0 {
		t.Fatalf("%d chunks removed while the group's primary is down", n)
	}
	if _, err := m.c.getattr(f.Ino); err != nil {
		t.Fatalf("the orphan went while its chunks could not be removed: %v", err)
	}
	beats(8, p.id, s.id)
	deadline := time.Now().Add(10 * time.Second)
	for len(ps.removed()) == 0 && time.Now().Before(deadline) {
		beats(1, p.id, s.id)
		time.Sleep(20 * time.Millisecond)
	}
	rm := ps.removed()
	if len(rm) != 1 || rm[0].Target != layout.GroupBit|gs[0].ID || rm[0].Ino != f.Ino || rm[0].Epoch < 2 {
		t.Fatalf("removed at the primary: %+v, want group %d's chunk of inode %d at epoch ≥ 2", rm, gs[0].ID, f.Ino)
	}
	if n := len(ss.removed()); n != 0 {
		t.Fatalf("%d removals sent to the secondary (the primary forwards them)", n)
	}
}

// TestMirrorSwitchWhileReaperHangs: the reaper's call to a hung primary
// (a stopped process: the connection open, no answer for the call's
// 30 s) does not hold the automatic switch, which comes once the primary
// has been silent for the failover timeout. Both ran on one loop before:
// a stopped primary was switched 15–30 s late under a load that removed
// files.
func TestMirrorSwitchWhileReaperHangs(t *testing.T) {
	m := newMirrorClusterWith(t, func(c *Config) { c.OrphanGrace = time.Second })
	ps, ss := newFakeStore(t), newFakeStore(t)
	ps.hang(t)
	p, s := m.addServer(ps.addr, "", 1), m.addServer(ss.addr, "", 1)
	gs, err := m.create(&rpc.MirrorCreateReq{Pairs: []uint32{p.targets[0], s.targets[0]}})
	if err != nil {
		t.Fatal(err)
	}
	g := gs[0]
	m.waitFailoverTicker()
	d := m.c.mustCreate(1, "d", dirMode)
	if err := m.c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: m.c.hdr(), Dir: d.Ino, Mirror: rpc.DirMirrorOn}, nil); err != nil {
		t.Fatal(err)
	}
	f := m.c.mustCreate(d.Ino, "f", fileMode)
	if _, err := m.c.unlink(d.Ino, "f"); err != nil {
		t.Fatal(err)
	}
	// Both servers heartbeat until the reaper's call is held at the primary.
	deadline := time.Now().Add(10 * time.Second)
	for held := false; !held; {
		if time.Now().After(deadline) {
			t.Fatal("the reaper never called the group's primary")
		}
		m.advance(250*time.Millisecond, 250*time.Millisecond, p.id, s.id)
		if err := m.c.heartbeat(); err != nil {
			t.Fatal(err)
		}
		select {
		case chunks := <-ps.held:
			if len(chunks) != 1 || chunks[0].Ino != f.Ino {
				t.Fatalf("the reaper asked the primary to remove %+v", chunks)
			}
			held = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The primary goes silent: switched after the timeout, not after the
	// reaper's call gives up (measured on the real clock: 30 s before; a
	// held loop's ticks are dropped after 50 ms, as a real ticker's).
	m.fc.SetPatience(50 * time.Millisecond)
	start := time.Now()
	m.advance(testFailover+250*time.Millisecond, 250*time.Millisecond, s.id)
	got := m.waitGroup(g.ID, "failed over", func(x rpc.GroupInfo) bool { return x.Primary == g.Secondary })
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("switched %v after the primary went silent, held by the reaper's call to it", el.Round(time.Second))
	}
	if got.Epoch != g.Epoch+1 || got.State != rpc.GroupDegraded {
		t.Fatalf("after the switch: %+v", got)
	}
}

// TestGroupStateValues: the stored states are the wire's.
func TestGroupStateValues(t *testing.T) {
	if schema.GroupInSync != rpc.GroupInSync || schema.GroupDegraded != rpc.GroupDegraded || schema.GroupResyncing != rpc.GroupResyncing {
		t.Fatal("stored group states differ from the wire's")
	}
}

// metricValue is the value of the counter or gauge name whose one label
// has value label, as the service's /metrics registry gathers it.
func metricValue(t *testing.T, s *Service, name, label string) float64 {
	t.Helper()
	fams, err := s.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, x := range f.GetMetric() {
			if ls := x.GetLabel(); len(ls) == 1 && ls[0].GetValue() == label {
				if c := x.GetCounter(); c != nil {
					return c.GetValue()
				}
				return x.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// TestDirLayoutAnswer: MDirLayout answers a directory's default layout
// and mirror mark as set, ENOTDIR for a file and ENOENT for no inode.
func TestDirLayoutAnswer(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", dirMode)
	f := c.mustCreate(d.Ino, "f", fileMode)
	get := func(ino uint64) (rpc.DirLayoutResp, error) {
		var r rpc.DirLayoutResp
		err := c.call(rpc.MDirLayout, &rpc.GetAttrReq{Ino: ino}, &r)
		return r, err
	}
	if r, err := get(d.Ino); err != nil || r != (rpc.DirLayoutResp{}) {
		t.Fatalf("new directory: %+v %v", r, err)
	}
	if err := c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: c.hdr(), Dir: d.Ino, StripeCount: 1, StripeSize: 2 << 20, Mirror: rpc.DirMirrorOn}, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := get(d.Ino); err != nil || r != (rpc.DirLayoutResp{StripeSize: 2 << 20, StripeCount: 1, Mirror: true}) {
		t.Fatalf("after set: %+v %v", r, err)
	}
	if err := c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: c.hdr(), Dir: d.Ino, StripeCount: 1, StripeSize: 2 << 20, Mirror: rpc.DirMirrorOff}, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := get(d.Ino); err != nil || r.Mirror {
		t.Fatalf("after clearing the mark: %+v %v", r, err)
	}
	_, err := get(f.Ino)
	wantErrno(t, err, syscall.ENOTDIR, "MDirLayout of a file")
	_, err = get(1 << 40)
	wantErrno(t, err, syscall.ENOENT, "MDirLayout of no inode")
}
