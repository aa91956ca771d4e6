package meta

import (
	"bytes"
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
	// A file written and closed before its create was sent: made with
	// its size, mtime and space; a size its layout cannot hold, or a
	// written file without a layout, is refused.
	r2 := reserve(t, a, 4)
	w := files(d.Ino, []string{"written", "toolarge"}, r2.start, r2.start+1)
	for i := range w {
		w[i].Layout = layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{reg.TargetIDs[0]}}
		w[i].Written, w[i].Mtime = true, 12345
	}
	w[0].Size, w[0].Alloc = 3901, []rpc.SlotAlloc{{Slot: 0, Bytes: 4096}}
	w[1].Size = 1 << 62
	if res, err = a.CreateBatch(t.Context(), w); err != nil || res[0].Err() != nil || !errors.Is(res[1].Err(), syscall.EFBIG) {
		t.Fatalf("written creates: %v / %v", err, res)
	}
	got, err := other.GetAttr(t.Context(), r2.start)
	if err != nil || got.Size != 3901 || got.Mtime != 12345 || !got.BlocksKnown || got.Blocks != 8 {
		t.Fatalf("a written file as made: %+v %v", got, err)
	}
	w = files(d.Ino, []string{"nolayout"}, r2.start+2)
	w[0].Written, w[0].Size = true, 1
	if _, err := a.CreateBatch(t.Context(), w); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("a written file without a layout: %v, want EINVAL", err)
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

// delegTestConfig is a single voter whose sessions expire after lease.
func delegTestConfig(t testing.TB, lease time.Duration) Config {
	cfg := testConfig(t, "")
	cfg.SessionLease = lease
	return cfg
}

// lookupAsync looks name up in dir from c on a goroutine.
func lookupAsync(c *sclient.Client, dir uint64, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Lookup(context.Background(), dir, name)
		done <- err
	}()
	return done
}

func statusDelegations(t *testing.T, c *sclient.Client) []rpc.DelegationInfo {
	t.Helper()
	st, err := c.ClusterStatus(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.Delegations
}

// TestDelegationGrantAndRecall: a session gets a directory's delegation
// with its listing; another is refused while it holds it; the holder's
// own operations recall nothing; another session's lookup recalls it,
// WaitRecall tells the holder, the lookup waits while the holder makes
// its last changes and proceeds once the delegation is returned, seeing
// them.
func TestDelegationGrantAndRecall(t *testing.T) {
	s := openService(t, delegTestConfig(t, 5*time.Second))
	a, b := libClient(t, s.Addr()), libClient(t, s.Addr())
	ctx := t.Context()
	d, err := a.Mkdir(ctx, rootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Mkdir(ctx, d.Ino, "sub", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	g, err := a.Delegate(ctx, d.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if g.Epoch == 0 || g.Dir.Ino != d.Ino || len(g.Entries) != 1 || g.Entries[0].Name != "sub" || g.Entries[0].Mode != modeDir {
		t.Fatalf("grant answered epoch %d dir %d entries %+v", g.Epoch, g.Dir.Ino, g.Entries)
	}
	if again, err := a.Delegate(ctx, d.Ino); err != nil || again.Epoch != g.Epoch {
		t.Fatalf("asking again: %v epoch %d, want %d", err, again.Epoch, g.Epoch)
	}
	if _, err := b.Delegate(ctx, d.Ino); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("second session's delegation: %v, want EBUSY", err)
	}
	// The holder's own reads and changes recall nothing.
	if _, err := a.Lookup(ctx, d.Ino, "x"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("holder's lookup: %v", err)
	}
	if _, _, err := a.ReadDir(ctx, d.Ino, "", 100, true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Mkdir(ctx, d.Ino, "mine", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if dirs, err := a.WaitRecall(ctx, 100*time.Millisecond); err != nil || len(dirs) != 0 {
		t.Fatalf("recalls after the holder's own operations: %v %v", dirs, err)
	}
	if ds := statusDelegations(t, b); len(ds) != 1 || ds[0].Client != a.ClientID() || ds[0].Dir != d.Ino || ds[0].Recalled {
		t.Fatalf("status delegations %+v", ds)
	}

	done := lookupAsync(b, d.Ino, "late")
	dirs, err := a.WaitRecall(ctx, 2*time.Second)
	if err != nil || len(dirs) != 1 || dirs[0] != d.Ino {
		t.Fatalf("holder's recalls: %v %v, want [%d]", dirs, err, d.Ino)
	}
	select {
	case err := <-done:
		t.Fatalf("another session's lookup answered (%v) while the delegation is held", err)
	default:
	}
	if ds := statusDelegations(t, a); len(ds) != 1 || !ds[0].Recalled {
		t.Fatalf("status after the recall: %+v", ds)
	}
	// The holder flushes (its own changes still pass), then returns.
	if _, err := a.Mkdir(ctx, d.Ino, "late", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.ReturnDelegation(ctx, d.Ino, g.Epoch); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("lookup after the return: %v (the holder's last create must be seen)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lookup still waits after the delegation was returned")
	}
	if ds := statusDelegations(t, a); len(ds) != 0 {
		t.Fatalf("delegations after the return: %+v", ds)
	}
	// Now the other session may have it.
	if _, err := b.Delegate(ctx, d.Ino); err != nil {
		t.Fatalf("delegation after the return: %v", err)
	}
}

// TestDelegationHolderExpires: the holder stops (no heartbeats); another
// session's operation waits for its session's expiry, then proceeds —
// within the lease — and the holder's delegation and ranges are gone.
func TestDelegationHolderExpires(t *testing.T) {
	const lease = 1500 * time.Millisecond
	s := openService(t, delegTestConfig(t, lease))
	holder := newClient(t, s.Addr()) // a session that never renews: a killed client
	b := libClient(t, s.Addr())
	d, err := b.Mkdir(t.Context(), rootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var rr rpc.ReserveInosResp
	if err := holder.call(rpc.MReserveInos, &rpc.ReserveInosReq{Hdr: holder.hdr(), Count: 8}, &rr); err != nil {
		t.Fatal(err)
	}
	var g rpc.DelegateResp
	if err := holder.call(rpc.MDelegate, &rpc.DelegateReq{Hdr: holder.hdr(), Dir: d.Ino}, &g); err != nil {
		t.Fatal(err)
	}
	// Half a lease later (the holder's session expires half a lease into
	// the wait, well before a revocation would be due) another session
	// creates there.
	time.Sleep(lease / 2)
	start := time.Now()
	if _, err := b.Mkdir(t.Context(), d.Ino, "after", 0o755, 0, 0); err != nil {
		t.Fatalf("create in the dead holder's directory: %v", err)
	}
	if waited := time.Since(start); waited > 2*lease {
		t.Fatalf("the create waited %v, more than the holder's lease (%v) allows", waited, lease)
	}
	if _, ok := s.fsm.delegs.holder(d.Ino); ok {
		t.Fatal("the dead holder's delegation is still recorded")
	}
	if _, err := s.db.Get(schema.SessionKey(holder.id)); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the create passed before the dead holder's session expired (%v)", err)
	}
	if n := sessionHeld(t, s, holder.id); n != 0 {
		t.Fatalf("the expired session still holds %d range or delegation keys", n)
	}
}

// TestDelegationRevokedAfterLease: a holder that renews its session but
// never returns a recalled delegation loses it after a lease; the waiting
// operation then proceeds.
func TestDelegationRevokedAfterLease(t *testing.T) {
	const lease = 1500 * time.Millisecond
	s := openService(t, delegTestConfig(t, lease))
	a, b := libClient(t, s.Addr()), libClient(t, s.Addr())
	d, err := a.Mkdir(t.Context(), rootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Delegate(t.Context(), d.Ino); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, _, err := b.ReadDir(t.Context(), d.Ino, "", 10, false); err != nil {
		t.Fatalf("readdir of a directory whose holder never returns it: %v", err)
	}
	if waited := time.Since(start); waited < lease/2 {
		t.Fatalf("readdir waited only %v: the delegation was not honoured", waited)
	}
	if _, ok := s.fsm.delegs.holder(d.Ino); ok {
		t.Fatal("delegation not revoked")
	}
	if s.sess.known(a.ClientID()) == false {
		t.Fatal("the holder's session ended: only its delegation should")
	}
}

// TestDelegationRecalledAtLeaderChange: three voters; after a leader
// change every delegation counts as recalled: the holder hears of it at
// once, and another session's operation waits for its return.
func TestDelegationRecalledAtLeaderChange(t *testing.T) {
	g := newGroup(t, 3)
	g.start(0, 1, 2)
	l := g.leader()
	a, b := libClient(t, g.peers...), libClient(t, g.peers...)
	ctx := t.Context()
	d, err := a.Mkdir(ctx, rootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := a.Delegate(ctx, d.Ino)
	if err != nil {
		t.Fatal(err)
	}
	g.stop(l)
	g.leader()
	dirs, err := a.WaitRecall(ctx, 100*time.Millisecond)
	if err != nil || len(dirs) != 1 || dirs[0] != d.Ino {
		t.Fatalf("recalls after a leader change: %v %v, want [%d] at once", dirs, err, d.Ino)
	}
	done := lookupAsync(b, d.Ino, "x")
	time.Sleep(200 * time.Millisecond) // the lookup reaches the gate (it cannot pass it)
	select {
	case err := <-done:
		t.Fatalf("lookup answered (%v) before the return", err)
	default:
	}
	if err := a.ReturnDelegation(ctx, d.Ino, gr.Epoch); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("lookup after the return: %v, want ENOENT", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lookup still waits after the return")
	}
}

// TestSnapshotKeepsRangesAndDelegations: a snapshot restored into another
// state machine carries the sessions' ranges and delegations (the table
// the recall gate reads is rebuilt from it).
func TestSnapshotKeepsRangesAndDelegations(t *testing.T) {
	now := int64(1_700_000_000_000_000_000)
	src := newTestFSM(t)
	applyAll(src, [][]byte{
		(&command{Op: opInit, Now: now}).encode(nil),
		(&command{Op: opSessionOpen, Now: now, Host: "h", LeaseMs: 1000}).encode(nil),
		(&command{Op: opReserveInos, Now: now, Hdr: reqHeader{ClientID: 1, Seq: 1}, Size: 10}).encode(nil),
		(&command{Op: opDelegate, Now: now, Hdr: reqHeader{ClientID: 1, Seq: 2}, Ino: rootIno}).encode(nil),
	}, 4, 1)
	snap, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	dst := newTestFSM(t)
	if err := dst.Restore(nopCloser{bytes.NewReader(sink.Bytes())}); err != nil {
		t.Fatal(err)
	}
	if g, ok := dst.delegs.holder(rootIno); !ok || g.Client != 1 || g.Epoch != 4 {
		t.Fatalf("restored delegation %+v %v", g, ok)
	}
	if dst.ctr.NextIno != 12 {
		t.Fatalf("restored NextIno %d, want 12 (2 + the 10 reserved)", dst.ctr.NextIno)
	}
	// The restored range is the session's: a batch uses it.
	res := applyAll(dst, [][]byte{(&command{Op: opCreateBatch, Now: now, Hdr: reqHeader{ClientID: 1},
		Cands: []layout.Candidate{{ID: 1, FreeBytes: 1}},
		Batch: []batchCreate{{Seq: 3, Parent: rootIno, Name: "f", Ino: 5, Mode: 0o644}}}).encode(nil)}, 1, dst.AppliedIndex()+1)
	resp := res[0].(*result).ans.msg.(*rpc.CreateBatchResp)
	if e := resp.Results[0].Err(); e != nil || resp.Results[0].Attr.Ino != 5 {
		t.Fatalf("batch on the restored range: %v %+v", e, resp.Results[0].Attr)
	}
}

// A number a live session reserved is known to the orphan checks
// (MInodesKnown, fsck): a client writes chunks under it before its
// create reaches the service. The session's end makes it an orphan's.
func TestReservedNumbersKnownWhileSessionLives(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	raw := newClient(t, s.Addr())
	a := libClient(t, s.Addr())
	r := reserve(t, a, 8)
	known := func() []bool {
		var resp rpc.InodesKnownResp
		if err := raw.call(rpc.MInodesKnown, &rpc.InodesKnownReq{Inos: []uint64{r.start, r.end - 1, r.end}}, &resp); err != nil {
			t.Fatal(err)
		}
		return resp.Known
	}
	if got := known(); !got[0] || !got[1] || got[2] {
		t.Fatalf("reserved [%d,%d): known %v for first, last, past the end; want true, true, false", r.start, r.end, got)
	}
	a.Close()
	if got := known(); got[0] || got[1] {
		t.Fatalf("after the session's end: known %v, want none", got)
	}
}
