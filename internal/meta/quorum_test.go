package meta

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// freeAddrs returns n loopback addresses whose ports were free a moment ago.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// group is a metadata group of voters in this process.
type group struct {
	t     testing.TB
	peers []string
	dirs  []string
	key   []byte
	svcs  []*Service // nil: stopped
	// configure, when set, gives voter i's config instead of config.
	configure func(i int) Config
}

func newGroup(t testing.TB, n int) *group {
	g := &group{t: t, peers: freeAddrs(t, n), key: testKey}
	base := t.TempDir()
	for i := range n {
		g.dirs = append(g.dirs, filepath.Join(base, "v"+string(rune('1'+i))))
	}
	g.svcs = make([]*Service, n)
	t.Cleanup(func() {
		for _, s := range g.svcs {
			if s != nil {
				s.Close()
			}
		}
	})
	return g
}

func (g *group) config(i int) Config {
	return Config{DataDir: g.dirs[i], ListenAddr: g.peers[i], Peers: g.peers, ClusterKey: g.key, SessionLease: 5 * time.Second}
}

// start opens voter i (in parallel for several).
func (g *group) start(is ...int) {
	g.t.Helper()
	errs := make(chan error, len(is))
	for _, i := range is {
		go func() {
			cfg := g.config(i)
			if g.configure != nil {
				cfg = g.configure(i)
			}
			s, err := Open(cfg)
			g.svcs[i] = s
			errs <- err
		}()
	}
	for range is {
		if err := <-errs; err != nil {
			g.t.Fatalf("open voter: %v", err)
		}
	}
}

func (g *group) stop(i int) {
	g.t.Helper()
	if err := g.svcs[i].Close(); err != nil {
		g.t.Logf("close voter %d: %v", i, err)
	}
	g.svcs[i] = nil
}

// leader waits for a voter that serves (ready) and returns its index.
func (g *group) leader() int {
	g.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for i, s := range g.svcs {
			if s != nil && s.ready.Load() {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.t.Fatal("no metadata leader within 15s")
	return -1
}

// TestQuorumFailover: three voters bootstrap a fresh group; followers
// redirect to the leader; the leader is closed and another takes over
// within seconds; a create retried on it with the same (client, seq)
// answers as the first time; the voter that was away catches up.
func TestQuorumFailover(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	h := c.hdr()
	var first rpc.ChangeResp
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: h, Parent: rootIno, Name: "a", Mode: dirMode}, &first); err != nil {
		t.Fatal(err)
	}
	for i := range g.svcs {
		if i == l {
			continue
		}
		fc := transport.NewClient(g.peers[i], transport.ClientConfig{Key: testKey})
		var resp rpc.AttrResp
		err := fc.Call(t.Context(), rpc.MLookup, &rpc.LookupReq{Parent: rootIno, Name: "a"}, &resp)
		fc.Close()
		if !errors.Is(err, syscall.ENOTCONN) || rpc.LeaderHint(err) != g.peers[l] {
			t.Fatalf("follower %s answered %v (hint %q), want a redirect to %s", g.peers[i], err, rpc.LeaderHint(err), g.peers[l])
		}
	}
	if id := g.svcs[l].ClusterID(); id == "" {
		t.Fatal("no cluster id after the first command")
	}

	start := time.Now()
	g.stop(l)
	nl := g.leader()
	t.Logf("new leader %s after %v", g.peers[nl], time.Since(start))
	if nl == l {
		t.Fatal("stopped voter still leads")
	}
	c2 := &client{t: t, c: transport.NewClient(g.peers[nl], transport.ClientConfig{Key: testKey}), id: c.id}
	t.Cleanup(func() { c2.c.Close() })
	var again rpc.ChangeResp
	if err := c2.call(rpc.MCreate, &rpc.CreateReq{Hdr: h, Parent: rootIno, Name: "a", Mode: dirMode}, &again); err != nil {
		t.Fatalf("create retried on the new leader: %v", err)
	}
	if again.Attr.Ino != first.Attr.Ino {
		t.Fatalf("retried create answered ino %d, first %d", again.Attr.Ino, first.Attr.Ino)
	}
	c2.seq.Store(h.Seq)
	c2.mustCreate(rootIno, "b", dirMode)
	ents, err := c2.readdirAll(rootIno, 100, false)
	if err != nil || len(ents) != 2 {
		t.Fatalf("readdir after failover: %v %v", ents, err)
	}

	// The voter that was away rejoins and catches up.
	g.start(l)
	want := g.svcs[nl].fsm.AppliedIndex()
	waitFor(t, "rejoined voter catches up", func() bool { return g.svcs[l].fsm.AppliedIndex() >= want })
	if g.svcs[l].ClusterID() != g.svcs[nl].ClusterID() {
		t.Fatalf("cluster ids differ: %q %q", g.svcs[l].ClusterID(), g.svcs[nl].ClusterID())
	}
}

// TestQuorumConfigChecks: each misconfiguration refuses to start with a
// message naming the problem.
func TestQuorumConfigChecks(t *testing.T) {
	g := newGroup(t, 3)
	bad := g.config(0)
	bad.Peers = []string{g.peers[1], g.peers[2]}
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), "do not include this voter's listen address") {
		t.Fatalf("peers without self: %v", err)
	}
	bad.Peers = []string{g.peers[0], g.peers[1], g.peers[1]}
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("duplicate peer: %v", err)
	}

	g.start(0, 1, 2)
	g.leader()
	// A second process on an address in use.
	dup := g.config(0)
	dup.DataDir = t.TempDir()
	if _, err := Open(dup); err == nil || !strings.Contains(err.Error(), "already uses this address") {
		t.Fatalf("address in use: %v", err)
	}
	// A restart with other peers names both lists.
	g.stop(2)
	other := g.config(2)
	other.Peers = append([]string{}, g.peers...)
	other.Peers[0] = freeAddrs(t, 1)[0]
	_, err := Open(other)
	if err == nil || !strings.Contains(err.Error(), strings.Join(sorted(g.peers), ",")) || !strings.Contains(err.Error(), strings.Join(sorted(other.Peers), ",")) {
		t.Fatalf("mismatched peers: %v", err)
	}
	// A wrong key: both running voters refuse it.
	wrong := g.config(2)
	wrong.ClusterKey = []byte("another key")
	if _, err := Open(wrong); err == nil || !strings.Contains(err.Error(), "wrong cluster key") {
		t.Fatalf("wrong key: %v", err)
	}
	g.start(2) // nothing was lost: the voter starts with its right config
	l := g.leader()
	c := newClient(t, g.peers[l])
	c.mustCreate(rootIno, "x", dirMode)

	// Another cluster's data dir on the same addresses: a new group
	// bootstraps on them, and voter 3 is started with the old group's dir.
	oldDir := g.dirs[2]
	for i := range g.svcs {
		g.stop(i)
	}
	g2 := &group{t: t, peers: g.peers, key: testKey, svcs: make([]*Service, 3)}
	for range 3 {
		g2.dirs = append(g2.dirs, filepath.Join(t.TempDir(), "w"))
	}
	t.Cleanup(func() {
		for _, s := range g2.svcs {
			if s != nil {
				s.Close()
			}
		}
	})
	g2.start(0, 1, 2)
	l2 := g2.leader()
	newClient(t, g2.peers[l2]).mustCreate(rootIno, "y", dirMode)
	waitFor(t, "cluster id everywhere", func() bool {
		for _, s := range g2.svcs {
			if s.ClusterID() == "" {
				return false
			}
		}
		return true
	})
	g2.stop(2)
	g2.dirs[2] = oldDir
	_, err = Open(g2.config(2))
	if err == nil || !strings.Contains(err.Error(), "belongs to cluster") {
		t.Fatalf("other cluster's data dir: %v", err)
	}
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestQuorumFailingDiskStepsDown: a leader whose raft log can no longer be
// synced (EIO) hands leadership to another voter, where changes go on.
func TestQuorumFailingDiskStepsDown(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	c.mustCreate(rootIno, "before", dirMode)
	g.svcs[l].Node().SetLogFault(func(op, _ string) error {
		if op == "sync" {
			return syscall.EIO
		}
		return nil
	})
	// A session open waits for durability: it fails on the failing log.
	var resp rpc.SessionOpenResp
	if err := c.call(rpc.MSessionOpen, &rpc.SessionOpenReq{Host: "t", MountPoint: "/t", Pid: 2}, &resp); err == nil {
		t.Fatal("a durable change succeeded on a log that cannot sync")
	}
	start := time.Now()
	var nl int
	waitFor(t, "another voter leads", func() bool {
		for i, s := range g.svcs {
			if i != l && s.Serving() {
				nl = i
				return true
			}
		}
		return false
	})
	t.Logf("leadership left the failing voter after %v", time.Since(start))
	c2 := newClient(t, g.peers[nl])
	c2.mustCreate(rootIno, "after", dirMode)
	// The failing voter goes as a crash would: closing its store would
	// flush state its log cannot cover (BeforeFlush refuses, by panic).
	bad := g.svcs[l]
	g.svcs[l] = nil
	bad.ready.Store(false)
	close(bad.stop)
	bad.srv.Close()
	bad.wg.Wait()
	bad.node.Close()
}

// benchLeader returns the address of a serving leader of n voters (1: a
// single node without peers).
func benchLeader(b *testing.B, n int) string {
	quietLogs(b)
	if n == 1 {
		return openService(b, testConfig(b, "")).Addr()
	}
	g := newGroup(b, n)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	g.start(idx...)
	return g.peers[g.leader()]
}

// BenchmarkQuorum compares lookups and creates from 8 callers on one voter
// and on the leader of three (the read lease keeps lookups local; creates
// wait for a follower's synced acknowledgement).
func BenchmarkQuorum(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("lookup/voters=%d", n), func(b *testing.B) {
			c := newClient(b, benchLeader(b, n))
			for i := range 100 {
				c.mustCreate(1, fmt.Sprintf("d%d", i), dirMode)
			}
			b.ResetTimer()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					var r rpc.AttrResp
					if err := c.call(rpc.MLookup, &rpc.LookupReq{Parent: 1, Name: fmt.Sprintf("d%d", i%100)}, &r); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
		})
		b.Run(fmt.Sprintf("mkdir/voters=%d", n), func(b *testing.B) {
			c := newClient(b, benchLeader(b, n))
			var next atomic.Int64
			b.ResetTimer()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.create(1, fmt.Sprintf("m%d", next.Add(1)), dirMode); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mkdirs/s")
		})
	}
}

// TestQuorumWipedVoterRejoins: a voter whose data directory was wiped
// starts again with the same --peers and catches up as a new member.
func TestQuorumWipedVoterRejoins(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	for i := range 20 {
		c.mustCreate(rootIno, fmt.Sprintf("d%d", i), dirMode)
	}
	f := (l + 1) % 3
	g.stop(f)
	if err := os.RemoveAll(g.dirs[f]); err != nil {
		t.Fatal(err)
	}
	c.mustCreate(rootIno, "while-away", dirMode)
	g.start(f)
	want := g.svcs[l].fsm.AppliedIndex()
	waitFor(t, "wiped voter catches up", func() bool { return g.svcs[f].fsm.AppliedIndex() >= want })
	if a, b := g.svcs[f].ClusterID(), g.svcs[l].ClusterID(); a != b || a == "" {
		t.Fatalf("cluster id of the rejoined voter %q, leader %q", a, b)
	}
	// It can lead: the others go, it and one more keep the namespace.
	g.stop(l)
	nl := g.leader()
	ents, err := newClient(t, g.peers[nl]).readdirAll(rootIno, 100, false)
	if err != nil || len(ents) != 21 {
		t.Fatalf("namespace after the rejoin and a failover: %d entries, %v", len(ents), err)
	}
}

// TestQuorumRejoinFromSnapshot: a voter that was away while the others
// truncated their logs behind a snapshot rejoins from the snapshot,
// streamed over the raft stream, and has the namespace.
func TestQuorumRejoinFromSnapshot(t *testing.T) {
	g := newGroup(t, 3)
	cfg := g.config
	g.configure = func(i int) Config { c := cfg(i); c.trailingLogs = 8; return c }
	g.start(0, 1, 2)
	l := g.leader()
	f := (l + 1) % 3
	g.stop(f)
	c := newClient(t, g.peers[l])
	for i := range 200 {
		c.mustCreate(rootIno, fmt.Sprintf("d%d", i), dirMode)
	}
	if err := g.svcs[l].node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	g.start(f)
	want := g.svcs[l].fsm.AppliedIndex()
	waitFor(t, "voter restored from a snapshot", func() bool { return g.svcs[f].fsm.AppliedIndex() >= want })
	// Entries after the snapshot reach it too (its log takes them).
	c.mustCreate(rootIno, "after", dirMode)
	want = g.svcs[l].fsm.AppliedIndex()
	waitFor(t, "voter appends after the snapshot", func() bool { return g.svcs[f].fsm.AppliedIndex() >= want })
	g.stop(l)
	nl := g.leader()
	ents, err := newClient(t, g.peers[nl]).readdirAll(rootIno, 1000, false)
	if err != nil || len(ents) != 201 {
		t.Fatalf("namespace after rejoin from a snapshot and a failover: %d entries, %v", len(ents), err)
	}
}
