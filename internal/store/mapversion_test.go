package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Group map versions (docs/design/0014 § Group map versions), against a
// real metadata service and real stores on loopback: answers of the
// service taken at chosen moments are delivered to the stores in the
// other order, through the functions their answers go through
// (installHeartbeat for a heartbeat answer, refreshGroups for
// MListGroups, installGroups for a report's answer).

// versionRig is a metadata service and three stores of one target each.
// The failover timeout is long, so the stores heartbeat once at start and
// then only every couple of minutes — a's every aEvery if that is shorter:
// the test delivers the answers.
type versionRig struct {
	t       *testing.T
	m       *meta.Service
	cl      *transport.Client
	a, b, c *env
}

func newVersionRig(t *testing.T, aEvery time.Duration) *versionRig {
	t.Helper()
	m, err := meta.Open(meta.Config{DataDir: filepath.Join(t.TempDir(), "meta"), ListenAddr: "127.0.0.1:0", ClusterKey: testKey,
		FailoverTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	r := &versionRig{t: t, m: m, cl: transport.NewClient(m.Addr(), transport.ClientConfig{Key: testKey})}
	t.Cleanup(func() { r.cl.Close() })
	mod := func(c *Config) {
		c.MetaAddr = m.Addr()
		c.HeartbeatInterval = time.Hour
	}
	r.a = newEnv(t, 1, func(c *Config) {
		mod(c)
		c.HeartbeatInterval = min(c.HeartbeatInterval, aEvery)
	})
	r.b, r.c = newEnv(t, 1, mod), newEnv(t, 1, mod)
	for _, e := range []*env{r.a, r.b, r.c} {
		waitFor(t, "the store's first heartbeat answer", func() bool { return e.s.groups.seen().installs > 0 })
	}
	return r
}

// call calls the metadata service.
func (r *versionRig) call(m rpc.Method, req, resp rpc.Message) {
	r.t.Helper()
	if err := r.cl.Call(context.Background(), m, req, resp); err != nil {
		r.t.Fatalf("method %d: %v", m, err)
	}
}

// heartbeat answers a heartbeat of e's server now (the answer its loop
// would get), to be delivered later.
func (r *versionRig) heartbeat(e *env) *rpc.ServerHeartbeatResp {
	r.t.Helper()
	var resp rpc.ServerHeartbeatResp
	r.call(rpc.MServerHeartbeat, &rpc.ServerHeartbeatReq{ServerID: e.s.serverID.Load()}, &resp)
	if resp.Version == 0 {
		r.t.Fatal("a heartbeat answer of this service carries no map version")
	}
	return &resp
}

// refresh makes e's server read the map now (MListGroups).
func (r *versionRig) refresh(e *env) {
	r.t.Helper()
	if err := e.s.refreshGroups(context.Background(), e.s.groups.seen()); err != nil {
		r.t.Fatal(err)
	}
}

// TestMirrorStaleMapAfterNewer: a heartbeat answer read before a group was
// created, delivered after an MListGroups answer read after, does not
// drop the group; one read before a group's secondary was replaced does
// not give the replaced store its copy back (nor does the answer of a
// report made before the replace), and does not drop the group from the
// new secondary's store.
func TestMirrorStaleMapAfterNewer(t *testing.T) {
	r := newVersionRig(t, time.Hour)
	ta, tb, tc := r.a.s.TargetIDs()[0], r.b.s.TargetIDs()[0], r.c.s.TargetIDs()[0]

	// A group is created between a heartbeat answer and a refresh.
	early := r.heartbeat(r.a)
	var made rpc.ListGroupsResp
	r.call(rpc.MMirrorCreate, &rpc.MirrorCreateReq{Pairs: []uint32{ta, tb}}, &made)
	if len(made.Groups) != 1 {
		t.Fatalf("mirror create answered %d groups", len(made.Groups))
	}
	g := made.Groups[0].ID
	r.refresh(r.a)
	if _, ok := r.a.s.groups.entry(g); !ok {
		t.Fatal("the refreshed map lacks the new group")
	}
	r.a.s.installHeartbeat(early, time.Now())
	if _, ok := r.a.s.groups.entry(g); !ok {
		t.Fatalf("a heartbeat answer of version %d, read before the group was created, dropped it from a map of version %d",
			early.Version, r.a.s.groups.gate.Version)
	}
	r.b.s.installHeartbeat(r.heartbeat(r.b), time.Now())

	// The secondary goes (the primary's report), and is replaced by c's
	// target; b and c hold answers read before the replace.
	var lost rpc.GroupResp
	r.call(rpc.MMirrorReport, &rpc.MirrorReportReq{Group: g, Epoch: 1, Target: ta, Event: rpc.MirrorSecondaryLost}, &lost)
	if lost.Version == 0 || lost.Group.Secondary != tb || lost.Group.State != rpc.GroupDegraded {
		t.Fatalf("report answer %+v", lost)
	}
	r.a.s.installGroups([]rpc.GroupInfo{lost.Group}, lost.Version, false)
	earlyB, earlyC := r.heartbeat(r.b), r.heartbeat(r.c)
	r.b.s.installHeartbeat(earlyB, time.Now())
	if e, ok := r.b.s.groups.entry(g); !ok || e.primary || e.info.Epoch != lost.Group.Epoch {
		t.Fatalf("b's entry of the degraded group: %+v %v", e, ok)
	}
	var replaced rpc.GroupResp
	r.call(rpc.MMirrorReplace, &rpc.MirrorReplaceReq{Group: g, Target: tc}, &replaced)
	if replaced.Group.Secondary != tc || replaced.Version <= lost.Version {
		t.Fatalf("replace answer %+v (the report's version %d)", replaced, lost.Version)
	}
	r.refresh(r.b)
	r.refresh(r.c)
	if _, ok := r.b.s.groups.entry(g); ok {
		t.Fatal("the replaced store kept the group after a refresh")
	}
	if e, ok := r.c.s.groups.entry(g); !ok || e.local != tc {
		t.Fatalf("the new secondary's store lacks the group after a refresh: %+v %v", e, ok)
	}

	r.b.s.installHeartbeat(earlyB, time.Now())
	if e, ok := r.b.s.groups.entry(g); ok {
		t.Fatalf("a heartbeat answer of version %d, read before the replace, gave the replaced store its copy back: %+v", earlyB.Version, e)
	}
	r.b.s.installGroups([]rpc.GroupInfo{lost.Group}, lost.Version, false)
	if e, ok := r.b.s.groups.entry(g); ok {
		t.Fatalf("a report's answer of version %d, read before the replace, gave the replaced store its copy back: %+v", lost.Version, e)
	}
	r.c.s.installHeartbeat(earlyC, time.Now())
	if _, ok := r.c.s.groups.entry(g); !ok {
		t.Fatalf("a heartbeat answer of version %d, read before the replace, dropped the group from its new secondary's store", earlyC.Version)
	}

	// Answers in order still move the map on: the next heartbeat answer
	// is installed, and an unversioned one (an older service) too.
	next := r.heartbeat(r.c)
	if next.Version < r.c.s.groups.gate.Version {
		t.Fatalf("a later heartbeat answer's version %d is older than the installed %d", next.Version, r.c.s.groups.gate.Version)
	}
	r.c.s.installHeartbeat(next, time.Now())
	if r.c.s.groups.gate.Version != next.Version {
		t.Fatalf("installed version %d, want the latest answer's %d", r.c.s.groups.gate.Version, next.Version)
	}
	r.c.s.installHeartbeat(&rpc.ServerHeartbeatResp{LeaseMs: 1000}, time.Now())
	if _, ok := r.c.s.groups.entry(g); ok || r.c.s.groups.gate.Version != 0 {
		t.Fatal("an unversioned empty map (an older service) was not installed as before versions existed")
	}
}

// TestMirrorLateHeartbeatAnswer is the race end to end: a's own heartbeat
// loop holds an answer read before a group was created (failpoint
// store/before-heartbeat-install) while a write for the group makes a read
// the newer map (MListGroups, admitGroup's refresh) and forward to b. When
// the held answer is installed, the group stays in a's map.
func TestMirrorLateHeartbeatAnswer(t *testing.T) {
	const (
		point = "store/before-heartbeat-install"
		hold  = 2 * time.Second
	)
	r := newVersionRig(t, 3*hold) // a's next heartbeat comes 3*hold after the held one's
	ta, tb := r.a.s.TargetIDs()[0], r.b.s.TargetIDs()[0]
	if err := failpoint.Arm(point, "1*sleep("+hold.String()+")"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { failpoint.Disarm(point) })
	waitFor(t, "a heartbeat answer held", func() bool { return failpoint.Armed()[point] >= 1 })
	held := time.Now()

	var made rpc.ListGroupsResp
	r.call(rpc.MMirrorCreate, &rpc.MirrorCreateReq{Pairs: []uint32{ta, tb}}, &made)
	g := made.Groups[0].ID
	id := rpc.ChunkID{Target: rpc.GroupBit | g, Ino: 7, Epoch: made.Groups[0].Epoch}
	if err := r.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: id, Data: []byte("late")}, &rpc.WriteResp{}); err != nil {
		t.Fatalf("write to the new group: %v", err)
	}
	if took := time.Since(held); took > hold/2 {
		t.Skipf("creating the group and writing took %v: the held answer may have been installed first", took)
	}
	if got := r.b.mustRead(tb, 7, 0, 4); string(got) != "late" {
		t.Fatalf("the secondary's copy reads %q", got)
	}
	// The held answer is installed hold after it was held; a's next
	// heartbeat comes 2*hold after that. Watch a's map in between.
	for time.Since(held) < hold+hold/2 {
		if _, ok := r.a.s.groups.entry(g); !ok {
			t.Fatalf("%v after a heartbeat answer read before the group was created was held, the group left the store's map", time.Since(held).Round(time.Millisecond))
		}
		time.Sleep(time.Millisecond)
	}
}
