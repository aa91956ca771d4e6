package store

import (
	"bytes"
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// The mirror tests run real storage servers on loopback. The metadata
// service of this branch does not answer the mirror methods yet, so a
// small stand-in (standinMeta) does: it registers servers (target ids),
// keeps a table of groups, answers MListGroups and MServerHeartbeat from
// it, and applies MMirrorReport as the design says (secondary lost:
// degraded, new epoch; primary failed: swapped, degraded, FullResync, new
// epoch; resync done: in sync, new epoch). The tests push
// the table into the stores through Server.installHeartbeat, the code path
// of a heartbeat answer, so they do not wait for heartbeat ticks.

type standinMeta struct {
	t    *testing.T
	srv  *transport.Server
	addr string

	mu         sync.Mutex
	nextTarget uint32
	nextServer uint32
	ids        map[string]uint32   // target uuid → id
	servers    map[uint32][]uint32 // server id → its target ids
	addrOf     map[uint32]string   // target id → server address
	groups     map[uint32]*rpc.GroupInfo
	reports    []rpc.MirrorReportReq
	failReport bool   // answer MMirrorReport with EIO
	failBeats  bool   // answer MServerHeartbeat with EIO
	leaseMs    uint32 // the lease heartbeat answers grant (default 60 s)
	listDelay  time.Duration
	listFail   bool // answer MListGroups with EIO (after listDelay)
	lists      int  // MListGroups calls answered
}

func newStandinMeta(t *testing.T) *standinMeta {
	t.Helper()
	m := &standinMeta{t: t, ids: map[string]uint32{}, servers: map[uint32][]uint32{}, addrOf: map[uint32]string{},
		groups: map[uint32]*rpc.GroupInfo{}}
	m.srv = transport.NewServer(testKey)
	transport.Handle(m.srv, rpc.MRegisterServer, m.register)
	transport.Handle(m.srv, rpc.MServerHeartbeat, m.heartbeat)
	transport.Handle(m.srv, rpc.MListGroups, m.list)
	transport.Handle(m.srv, rpc.MMirrorReport, m.report)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.addr = ln.Addr().String()
	go m.srv.Serve(ln)
	t.Cleanup(func() { m.srv.Close() })
	return m
}

func (m *standinMeta) register(ctx context.Context, r *rpc.RegisterServerReq) (*rpc.RegisterServerResp, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextServer++
	resp := &rpc.RegisterServerResp{ServerID: m.nextServer}
	for _, tr := range r.Targets {
		id := m.ids[tr.UUID]
		if id == 0 {
			m.nextTarget++
			id = m.nextTarget
			m.ids[tr.UUID] = id
		}
		m.addrOf[id] = r.Addr
		resp.TargetIDs = append(resp.TargetIDs, id)
	}
	m.servers[resp.ServerID] = resp.TargetIDs
	return resp, nil
}

// info answers group g with its addresses filled in (mu held).
func (m *standinMeta) info(g *rpc.GroupInfo) rpc.GroupInfo {
	gi := *g
	gi.PrimaryAddr, gi.SecondaryAddr = m.addrOf[g.Primary], m.addrOf[g.Secondary]
	gi.PrimaryAlive, gi.SecondaryAlive = true, true
	return gi
}

func (m *standinMeta) heartbeat(ctx context.Context, r *rpc.ServerHeartbeatReq) (*rpc.ServerHeartbeatResp, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failBeats {
		return nil, rpc.Errorf(syscall.EIO, "stand-in refuses heartbeats")
	}
	resp := &rpc.ServerHeartbeatResp{LeaseMs: 60000, FailoverTimeoutMs: 90000}
	if m.leaseMs != 0 {
		resp.LeaseMs, resp.FailoverTimeoutMs = m.leaseMs, 3*m.leaseMs/2
	}
	mine := map[uint32]bool{}
	for _, id := range m.servers[r.ServerID] {
		mine[id] = true
	}
	for _, g := range m.groups {
		if mine[g.Primary] || mine[g.Secondary] {
			resp.Groups = append(resp.Groups, m.info(g))
		}
	}
	return resp, nil
}

func (m *standinMeta) list(ctx context.Context, _ *rpc.Empty) (*rpc.ListGroupsResp, error) {
	m.mu.Lock()
	d := m.listDelay
	m.mu.Unlock()
	time.Sleep(d)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lists++
	if m.listFail {
		return nil, rpc.Errorf(syscall.EIO, "stand-in refuses to list groups")
	}
	resp := &rpc.ListGroupsResp{}
	for _, g := range m.groups {
		resp.Groups = append(resp.Groups, m.info(g))
	}
	return resp, nil
}

func (m *standinMeta) report(ctx context.Context, r *rpc.MirrorReportReq) (*rpc.GroupInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reports = append(m.reports, *r)
	if m.failReport {
		return nil, rpc.Errorf(syscall.EIO, "stand-in refuses reports")
	}
	g := m.groups[r.Group]
	if g == nil {
		return nil, rpc.Errorf(syscall.ENOENT, "no group %d", r.Group)
	}
	if r.Epoch != g.Epoch {
		return nil, rpc.Errorf(syscall.ESTALE, "group %d is at epoch %d, report of %d", r.Group, g.Epoch, r.Epoch)
	}
	switch r.Event {
	case rpc.MirrorSecondaryLost:
		if g.State != rpc.GroupDegraded {
			g.State = rpc.GroupDegraded
			g.Epoch++
		}
	case rpc.MirrorPrimaryFailed:
		if g.State != rpc.GroupInSync {
			return nil, rpc.Errorf(syscall.EIO, "group %d is not in sync", r.Group)
		}
		g.Primary, g.Secondary = g.Secondary, g.Primary
		g.State, g.FullResync = rpc.GroupDegraded, true
		g.Epoch++
	case rpc.MirrorResyncProgress:
		g.ResyncDone, g.ResyncTotal = r.Done, r.Total
	case rpc.MirrorResyncDone:
		g.State, g.FullResync = rpc.GroupInSync, false
		g.ResyncDone, g.ResyncTotal = r.Done, r.Total
		g.Epoch++
	}
	gi := m.info(g)
	return &gi, nil
}

// setGroup puts a group in the table.
func (m *standinMeta) setGroup(g rpc.GroupInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.groups[g.ID] = &g
}

// group answers a group of the table.
func (m *standinMeta) group(id uint32) rpc.GroupInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.info(m.groups[id])
}

// reported answers the reports of an event.
func (m *standinMeta) reported(event uint8) []rpc.MirrorReportReq {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []rpc.MirrorReportReq
	for _, r := range m.reports {
		if r.Event == event {
			out = append(out, r)
		}
	}
	return out
}

// push sends the table to the stores as a heartbeat answer, with a lease
// of leaseMs.
func (m *standinMeta) push(leaseMs uint32, stores ...*Server) {
	for _, s := range stores {
		if s == nil {
			continue
		}
		resp, _ := m.heartbeat(context.Background(), &rpc.ServerHeartbeatReq{ServerID: s.serverID.Load()})
		resp.LeaseMs = leaseMs
		s.installHeartbeat(resp, time.Now())
	}
}

// testDegradeWait caps degradeWait in the mirror tests.
const testDegradeWait = 200 * time.Millisecond

// mirrorPair is two storage servers, each with one target, registered with
// a stand-in, and group 1 over their targets (primary on a).
type mirrorPair struct {
	t    *testing.T
	meta *standinMeta
	a, b *env
	ta   uint32 // a's target id
	tb   uint32
}

func newMirrorPair(t *testing.T, mod func(*Config)) *mirrorPair {
	t.Helper()
	return newMirrorPairNet(t, mod, false)
}

// newMirrorPairNet is newMirrorPair; with network, the client's calls and
// the stores' forwards go over loopback TCP, as between processes.
func newMirrorPairNet(t *testing.T, mod func(*Config), network bool) *mirrorPair {
	t.Helper()
	if network {
		peersOverNetwork.Store(true)
		t.Cleanup(func() { peersOverNetwork.Store(false) })
	}
	p := &mirrorPair{t: t, meta: newStandinMeta(t)}
	// The degraded primary's wait for the secondary's lease: the pushed
	// lease is a minute, the wait a fraction of a second.
	old := degradeWaitCap.Swap(int64(testDegradeWait))
	t.Cleanup(func() { degradeWaitCap.Store(old) })
	cfg := func(c *Config) {
		c.MetaAddr = p.meta.addr
		c.HeartbeatInterval = time.Hour // the tests push the map themselves
		if mod != nil {
			mod(c)
		}
	}
	p.a = newEnv(t, 1, cfg)
	p.b = newEnv(t, 1, cfg)
	if network {
		for _, e := range []*env{p.a, p.b} {
			e.cl.Close()
			e.cl = transport.NewClient(e.s.Addr(), transport.ClientConfig{Key: testKey, NoLocal: true})
		}
	}
	p.ta, p.tb = p.a.s.TargetIDs()[0], p.b.s.TargetIDs()[0]
	// Each server sends its first heartbeat at once; an answer made
	// before the group exists but installed after the push below would
	// remove the group from its map (a full install). Wait for both.
	for _, e := range []*env{p.a, p.b} {
		deadline := time.Now().Add(10 * time.Second)
		for e.s.groups.seen().installs == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no first heartbeat answer installed within 10s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	p.meta.setGroup(rpc.GroupInfo{ID: 1, Epoch: 1, Primary: p.ta, Secondary: p.tb, State: rpc.GroupInSync})
	p.push()
	return p
}

// push sends the stand-in's table to both stores, with a long lease.
func (p *mirrorPair) push() { p.meta.push(60000, p.a.s, p.b.s) }

// gid is the ChunkID of ino in group 1 at epoch.
func gid(ino, epoch uint64) rpc.ChunkID {
	return rpc.ChunkID{Target: rpc.GroupBit | 1, Ino: ino, Epoch: epoch}
}

func (p *mirrorPair) epoch() uint64 { return p.meta.group(1).Epoch }

// gwrite writes through e's server to group 1 at the current epoch.
func (p *mirrorPair) gwrite(e *env, ino, off uint64, data []byte, sync bool) error {
	return e.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: gid(ino, p.epoch()), Off: off, Sync: sync, Data: data}, &rpc.WriteResp{})
}

// whole reads a chunk of target tgt on e whole (its length from stat).
func whole(t *testing.T, e *env, tgt uint32, ino uint64) ([]byte, bool) {
	t.Helper()
	st := e.stat(tgt, ino)
	var out []byte
	for off := uint64(0); off < st.Size; off += 8 << 20 {
		out = append(out, e.mustRead(tgt, ino, off, uint32(min(8<<20, st.Size-off)))...)
	}
	return out, st.Exists
}

// sameCopies fails unless both copies of ino are byte-equal (and exist
// alike).
func (p *mirrorPair) sameCopies(ino uint64) []byte {
	p.t.Helper()
	ad, aok := whole(p.t, p.a, p.ta, ino)
	bd, bok := whole(p.t, p.b, p.tb, ino)
	if aok != bok || !bytes.Equal(ad, bd) {
		p.t.Fatalf("chunk %x: copies differ: primary exists=%v len %d, secondary exists=%v len %d (first difference at %d)",
			ino, aok, len(ad), bok, len(bd), firstDiff(ad, bd))
	}
	return ad
}
