package meta

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	sclient "github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// libClient is a session of the real client library on the metadata
// service at addrs (its voters).
func libClient(t testing.TB, addrs ...string) *sclient.Client {
	t.Helper()
	cfg := sclient.DefaultConfig()
	cfg.MetaAddrs = addrs
	cfg.ClusterKey = testKey
	cfg.IOTimeout = 20 * time.Second
	c, err := sclient.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type span struct{ start, end uint64 }

func reserve(t testing.TB, c *sclient.Client, n uint32) span {
	t.Helper()
	start, count, err := c.ReserveInos(t.Context(), n)
	if err != nil {
		t.Fatalf("reserve %d inode numbers: %v", n, err)
	}
	if count != uint64(n) || start == 0 {
		t.Fatalf("reserved [%d,+%d), asked for %d", start, count, n)
	}
	return span{start, start + count}
}

func checkDisjoint(t *testing.T, spans []span) {
	t.Helper()
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if a.start < b.end && b.start < a.end {
				t.Fatalf("inode ranges overlap: [%d,%d) and [%d,%d)", a.start, a.end, b.start, b.end)
			}
		}
	}
}

// sessionHeld counts the keys under a session's 'n' prefix.
func sessionHeld(t *testing.T, s *Service, id uint64) int {
	t.Helper()
	p := schema.SessionHeldPrefix(id)
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n
}

func files(parent uint64, names []string, inos ...uint64) []rpc.BatchCreate {
	out := make([]rpc.BatchCreate, len(names))
	for i, n := range names {
		out[i] = rpc.BatchCreate{Parent: parent, Name: n, Ino: inos[i], Mode: 0o644, Uid: 1, Gid: 2}
	}
	return out
}

// TestInoRangesNeverOverlap: ranges reserved by two sessions, and the
// numbers ordinary creates take, never meet; a session's end drops its
// ranges and their numbers are not handed out again; the ranges survive
// a restart (snapshot and log replay).
func TestInoRangesNeverOverlap(t *testing.T) {
	dir := t.TempDir()
	s := openService(t, testConfig(t, dir))
	a, b := libClient(t, s.Addr()), libClient(t, s.Addr())
	var spans []span
	for range 3 {
		spans = append(spans, reserve(t, a, 100), reserve(t, b, 7))
		f, err := a.Mkdir(t.Context(), rootIno, "d"+time.Now().Format("150405.000000000"), 0o755, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		spans = append(spans, span{f.Ino, f.Ino + 1})
	}
	checkDisjoint(t, spans)
	if _, _, err := a.ReserveInos(t.Context(), rpc.MaxReserveInos+1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("reserving too many: %v, want EINVAL", err)
	}
	for range rpc.MaxSessionRanges - 3 {
		reserve(t, a, 1)
	}
	if _, _, err := a.ReserveInos(t.Context(), 1); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("a range beyond the session's bound: %v, want EAGAIN", err)
	}

	// The session's end drops its ranges; their numbers stay unused.
	aID := a.ClientID()
	if n := sessionHeld(t, s, aID); n != rpc.MaxSessionRanges {
		t.Fatalf("session holds %d ranges, want %d", n, rpc.MaxSessionRanges)
	}
	a.Close()
	waitFor(t, "closed session's ranges dropped", func() bool { return sessionHeld(t, s, aID) == 0 })
	after := reserve(t, b, 5)
	for _, sp := range spans {
		if after.start < sp.end {
			t.Fatalf("range [%d,%d) after a session's end is below an earlier one [%d,%d)", after.start, after.end, sp.start, sp.end)
		}
	}

	// Restart: b's ranges are still b's (the batch below uses one).
	bID := b.ClientID()
	held := sessionHeld(t, s, bID)
	if err := s.node.Snapshot(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	s.Close()
	s2 := openService(t, testConfig(t, dir))
	if n := sessionHeld(t, s2, bID); n != held {
		t.Fatalf("after a restart session %d holds %d range keys, had %d", bID, n, held)
	}
	if next := s2.fsm.nextIno(); next < after.end {
		t.Fatalf("next inode %d after a restart is inside a reserved range ending at %d", next, after.end)
	}
}

// TestCreateBatch: a batch applies its creates in order, each with its own
// result; a name that exists fails alone; numbers outside the session's
// ranges, used already, or of another session are refused with EINVAL;
// the batch's files read back as MCreate's do.
func TestCreateBatch(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	raw := newClient(t, s.Addr())
	reg := raw.registerTargets("127.0.0.1:1", "u1", "u2")
	a, other := libClient(t, s.Addr()), libClient(t, s.Addr())
	d, err := a.Mkdir(t.Context(), rootIno, "d", 0o2775, 0, 77)
	if err != nil {
		t.Fatal(err)
	}
	r := reserve(t, a, 16)
	res, err := a.CreateBatch(t.Context(), files(d.Ino, []string{"f0", "f1", "f2", "f3"}, r.start, r.start+1, r.start+2, r.start+3))
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range res {
		if err := x.Err(); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if x.Attr.Ino != r.start+uint64(i) || x.Attr.Gid != 77 || x.Attr.Mode != modeReg|0o644 || len(x.Attr.Layout.Targets) == 0 {
			t.Fatalf("create %d answered %+v", i, x.Attr)
		}
	}
	if res[3].Dir.Mtime < res[0].Dir.Mtime {
		t.Fatal("directory times of a batch go backwards")
	}
	for i, name := range []string{"f0", "f1", "f2", "f3"} {
		got, err := other.Lookup(t.Context(), d.Ino, name)
		if err != nil || got.Ino != r.start+uint64(i) {
			t.Fatalf("lookup %s: %+v %v", name, got, err)
		}
	}

	// One name exists: that create fails, the others stand, and its
	// number stays the session's.
	res, err = a.CreateBatch(t.Context(), files(d.Ino, []string{"g0", "f1", "g2"}, r.start+4, r.start+5, r.start+6))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err() != nil || !errors.Is(res[1].Err(), syscall.EEXIST) || res[2].Err() != nil {
		t.Fatalf("batch with an existing name answered %v / %v / %v", res[0].Err(), res[1].Err(), res[2].Err())
	}
	res, err = a.CreateBatch(t.Context(), files(d.Ino, []string{"g1"}, r.start+5))
	if err != nil || res[0].Err() != nil {
		t.Fatalf("reusing the number of a failed create: %v %v", err, res[0].Err())
	}

	// Numbers that are not the session's are refused, alone.
	otherR := reserve(t, other, 2)
	for k, bad := range []struct {
		what string
		ino  uint64
	}{{"used", r.start}, {"beyond", r.end}, {"others", otherR.start}, {"below", 2}} {
		res, err := a.CreateBatch(t.Context(), files(d.Ino, []string{"x-" + bad.what, "ok-" + bad.what}, bad.ino, r.start+7+uint64(k)))
		if err != nil {
			t.Fatal(err)
		}
		if e := res[0].Err(); !errors.Is(e, syscall.EINVAL) || !strings.Contains(e.Error(), "not in a range reserved") {
			t.Fatalf("%s number %d: %v, want EINVAL naming the ranges", bad.what, bad.ino, e)
		}
		if res[1].Err() != nil {
			t.Fatalf("create after a refused one: %v", res[1].Err())
		}
	}
	// A layout the client chose: checked against the registered targets.
	one := files(d.Ino, []string{"placed"}, r.start+11)
	one[0].Layout = layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{reg.TargetIDs[1]}}
	res, err = a.CreateBatch(t.Context(), one)
	if err != nil || res[0].Err() != nil || res[0].Attr.Layout.Targets[0] != reg.TargetIDs[1] {
		t.Fatalf("create with the client's layout: %v %v %+v", err, res[0].Err(), res[0].Attr.Layout)
	}
	one = files(d.Ino, []string{"misplaced"}, r.start+12)
	one[0].Layout = layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{999}}
	if res, err = a.CreateBatch(t.Context(), one); err != nil || !errors.Is(res[0].Err(), syscall.EINVAL) {
		t.Fatalf("create on an unknown target: %v %v", err, res[0].Err())
	}
	dirs := files(d.Ino, []string{"sub"}, r.start+13)
	dirs[0].Mode = modeDir | 0o755
	if res, err = a.CreateBatch(t.Context(), dirs); err != nil || !errors.Is(res[0].Err(), syscall.EINVAL) {
		t.Fatalf("a directory in a batch: %v %v", err, res[0].Err())
	}
	// Creates in two directories are one batch each.
	two := files(d.Ino, []string{"p", "q"}, r.start+14, r.start+15)
	two[1].Parent = rootIno
	if _, err := a.CreateBatch(t.Context(), two); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("a batch over two directories: %v, want EINVAL", err)
	}
}

// TestCreateBatchExactlyOnceAcrossLeaderChange: three voters; a batch is
// applied, the leader stops, and the same request (same seqs) sent to the
// new leader answers the same files without making any twice; a range
// reserved on the new leader does not meet the old one.
func TestCreateBatchExactlyOnceAcrossLeaderChange(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	c := newClient(t, g.peers[l])
	reg := c.registerTargets("127.0.0.1:1", "u1")
	var rr rpc.ReserveInosResp
	if err := c.call(rpc.MReserveInos, &rpc.ReserveInosReq{Hdr: c.hdr(), Count: 64}, &rr); err != nil {
		t.Fatal(err)
	}
	lay := layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{reg.TargetIDs[0]}}
	req := &rpc.CreateBatchReq{Hdr: rpc.ReqHeader{ClientID: c.id}}
	for i := range 64 {
		req.Creates = append(req.Creates, rpc.BatchCreate{Seq: c.seq.Add(1), Parent: rootIno, Name: "f" + string(rune('A'+i%26)) + string(rune('a'+i/26)),
			Ino: rr.Start + uint64(i), Mode: 0o644, Layout: lay})
	}
	var first rpc.CreateBatchResp
	if err := c.call(rpc.MCreateBatch, req, &first); err != nil {
		t.Fatal(err)
	}
	inodes := g.svcs[l].fsm.inodes.Load()
	g.stop(l)
	nl := g.leader()
	c2 := &client{t: t, c: newClient(t, g.peers[nl]).c, id: c.id}
	var again rpc.CreateBatchResp
	if err := c2.call(rpc.MCreateBatch, req, &again); err != nil {
		t.Fatalf("batch sent again to the new leader: %v", err)
	}
	for i := range first.Results {
		if e := again.Results[i].Err(); e != nil || again.Results[i].Attr.Ino != first.Results[i].Attr.Ino {
			t.Fatalf("create %d answered %v ino %d again, first ino %d", i, e, again.Results[i].Attr.Ino, first.Results[i].Attr.Ino)
		}
	}
	if got := g.svcs[nl].fsm.inodes.Load(); got != inodes {
		t.Fatalf("inode count %d after the batch was sent again, %d before", got, inodes)
	}
	ents, err := c2.readdirAll(rootIno, 1000, false)
	if err != nil || len(ents) != 64 {
		t.Fatalf("readdir: %d entries, %v", len(ents), err)
	}
	c2.seq.Store(c.seq.Load())
	var rr2 rpc.ReserveInosResp
	if err := c2.call(rpc.MReserveInos, &rpc.ReserveInosReq{Hdr: c2.hdr(), Count: 64}, &rr2); err != nil {
		t.Fatal(err)
	}
	if rr2.Start < rr.Start+rr.Count {
		t.Fatalf("range %d after a leader change meets the range [%d,+%d)", rr2.Start, rr.Start, rr.Count)
	}
	// The numbers used on the old leader are not the session's any more.
	var dup rpc.CreateBatchResp
	req2 := &rpc.CreateBatchReq{Hdr: rpc.ReqHeader{ClientID: c.id}, Creates: []rpc.BatchCreate{{Seq: c2.seq.Add(1), Parent: rootIno, Name: "dup", Ino: rr.Start, Layout: lay}}}
	if err := c2.call(rpc.MCreateBatch, req2, &dup); err != nil || !errors.Is(dup.Results[0].Err(), syscall.EINVAL) {
		t.Fatalf("a used number on the new leader: %v %v", err, dup.Results[0].Err())
	}
}
