package meta

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

func lk(c *client, ino, owner, start, end uint64, typ uint32) *rpc.LockReq {
	return &rpc.LockReq{ClientID: c.id, Ino: ino, Owner: owner, Start: start, End: end, Type: typ, Pid: uint32(owner)}
}

func getlk(t *testing.T, c *client, r *rpc.LockReq) rpc.LockResp {
	t.Helper()
	var resp rpc.LockResp
	if err := c.call(rpc.MGetLk, r, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestLocks(t *testing.T) {
	cfg := testConfig(t, "")
	fc := fakeClock(t, &cfg) // lock waits follow it
	s := openService(t, cfg)
	waitLeaderLoop(t, fc)
	a := newClient(t, s.Addr())
	a.registerTargets("127.0.0.1:1", "u1")
	b := newClient(t, s.Addr())
	f := a.mustCreate(1, "f", fileMode)
	setlk := func(c *client, r *rpc.LockReq) error { return c.call(rpc.MSetLk, r, nil) }

	if err := setlk(a, lk(a, f.Ino, 1, 0, 99, rpc.LockWrite)); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, setlk(b, lk(b, f.Ino, 1, 50, 60, rpc.LockRead)), syscall.EAGAIN, "conflicting read lock")
	if got := getlk(t, b, lk(b, f.Ino, 1, 50, 60, rpc.LockRead)); got.Type != rpc.LockWrite || got.Start != 0 || got.End != 99 || got.Pid != 1 {
		t.Fatalf("getlk = %+v", got)
	}
	if err := setlk(b, lk(b, f.Ino, 1, 100, 200, rpc.LockWrite)); err != nil {
		t.Fatalf("disjoint lock: %v", err)
	}
	// range split: unlocking the middle leaves two pieces
	if err := setlk(a, lk(a, f.Ino, 1, 40, 59, rpc.LockUnlock)); err != nil {
		t.Fatal(err)
	}
	if got := getlk(t, b, lk(b, f.Ino, 1, 40, 59, rpc.LockWrite)); got.Type != rpc.LockUnlock {
		t.Fatalf("hole still locked: %+v", got)
	}
	if got := getlk(t, b, lk(b, f.Ino, 1, 60, 60, rpc.LockWrite)); got.Type != rpc.LockWrite || got.Start != 60 || got.End != 99 {
		t.Fatalf("right piece = %+v", got)
	}
	if got := getlk(t, b, lk(b, f.Ino, 1, 0, 0, rpc.LockWrite)); got.Start != 0 || got.End != 39 {
		t.Fatalf("left piece = %+v", got)
	}
	// read locks share
	if err := setlk(a, lk(a, f.Ino, 1, 300, 400, rpc.LockRead)); err != nil {
		t.Fatal(err)
	}
	if err := setlk(b, lk(b, f.Ino, 1, 350, 450, rpc.LockRead)); err != nil {
		t.Fatalf("shared read: %v", err)
	}
	// same client, other owner (another process or OFD) conflicts too
	wantErrno(t, setlk(a, lk(a, f.Ino, 2, 0, 10, rpc.LockWrite)), syscall.EAGAIN, "other owner of the same client")
	// merge: adjacent locks of one owner coalesce
	setlk(a, lk(a, f.Ino, 1, 40, 59, rpc.LockWrite))
	if got := getlk(t, b, lk(b, f.Ino, 1, 0, ^uint64(0), rpc.LockWrite)); got.Start != 0 || got.End != 99 {
		t.Fatalf("merged lock = %+v", got)
	}

	// flock is independent of record locks
	fl := &rpc.LockReq{ClientID: b.id, Ino: f.Ino, Owner: 9, Type: rpc.LockWrite, Flock: true}
	if err := setlk(b, fl); err != nil {
		t.Fatalf("flock beside record locks: %v", err)
	}
	fla := &rpc.LockReq{ClientID: a.id, Ino: f.Ino, Owner: 8, Type: rpc.LockRead, Flock: true}
	wantErrno(t, setlk(a, fla), syscall.EAGAIN, "flock conflict")

	// Wait: granted when the holder lets go within the bounded wait
	done := make(chan error, 1)
	go func() {
		w := *fla
		w.Wait = true
		done <- setlk(a, &w)
	}()
	// Waiting on the conflict, the waiter's bounded wait (a timer) joins
	// the leader loop's tickers.
	if !fc.WaitPending(3, 10*time.Second) {
		t.Fatalf("the flock waiter never waited (%d timers pending)", fc.Pending())
	}
	fl.Type = rpc.LockUnlock
	setlk(b, fl)
	if err := <-done; err != nil {
		t.Fatalf("waiting flock: %v", err)
	}
	// Wait gives up after lockWait (a second), not before
	w := lk(b, f.Ino, 1, 0, 0, rpc.LockWrite)
	w.Wait = true
	go func() { done <- setlk(b, w) }()
	if !fc.WaitPending(3, 10*time.Second) {
		t.Fatalf("the lock waiter never waited (%d timers pending)", fc.Pending())
	}
	fc.Advance(lockWait - time.Millisecond)
	if n := fc.Pending(); n != 3 {
		t.Fatalf("%d timers pending just before the wait's end, want 3 (the wait ended early?)", n)
	}
	fc.Advance(time.Millisecond)
	wantErrno(t, returns(t, "bounded lock wait", done), syscall.EAGAIN, "bounded wait")

	// SessionClose releases every lock of the session
	if err := a.call(rpc.MSessionClose, &rpc.SessionCloseReq{ClientID: a.id}, nil); err != nil {
		t.Fatal(err)
	}
	if got := getlk(t, b, lk(b, f.Ino, 1, 0, ^uint64(0), rpc.LockWrite)); got.Type != rpc.LockUnlock && got.Pid != 1 {
		t.Fatalf("after session close = %+v", got)
	}
	if err := setlk(b, lk(b, f.Ino, 1, 0, 99, rpc.LockWrite)); err != nil {
		t.Fatalf("lock after holder's session closed: %v", err)
	}
	wantErrno(t, setlk(a, lk(a, f.Ino, 1, 0, 1, rpc.LockRead)), syscall.ESTALE, "lock from closed session")
	wantErrno(t, a.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: a.id}, nil), syscall.ESTALE, "heartbeat of closed session")
}

// TestSessionExpiryReleasesLocks: a session that stops heartbeating keeps
// its locks for its lease and loses them (and the session) after it, on a
// fake clock: the lease runs out when the test moves time, not when it has
// slept long enough.
func TestSessionExpiryReleasesLocks(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.SessionLease = 10 * time.Second // leader loop ticks every second
	fc := fakeClock(t, &cfg)
	s := openService(t, cfg)
	waitLeaderLoop(t, fc)
	a := newClient(t, s.Addr())
	b := newClient(t, s.Addr())
	if err := a.call(rpc.MSetLk, lk(a, 1, 1, 0, 10, rpc.LockWrite), nil); err != nil {
		t.Fatal(err)
	}
	// b keeps heartbeating, a goes silent. Up to 9 s in (each second's
	// expiry pass done before the next tick is taken), a keeps its lock.
	for i := 0; i < 9; i++ {
		if err := b.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: b.id}, nil); err != nil {
			t.Fatal(err)
		}
		fc.Advance(time.Second)
	}
	wantErrno(t, b.call(rpc.MSetLk, lk(b, 1, 1, 0, 10, rpc.LockWrite), nil), syscall.EAGAIN, "lock held by a session 9 s into its 10 s lease")
	if err := b.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: b.id}, nil); err != nil {
		t.Fatal(err)
	}
	fc.Advance(2 * time.Second) // 11 s: a's lease is over
	waitFor(t, "the lock of the expired session released", func() bool {
		return b.call(rpc.MSetLk, lk(b, 1, 1, 0, 10, rpc.LockWrite), nil) == nil
	})
	wantErrno(t, a.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: a.id}, nil), syscall.ESTALE, "heartbeat after expiry")
	if err := b.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: b.id}, nil); err != nil {
		t.Fatalf("the heartbeating session expired too: %v", err)
	}
}

func TestRegistry(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.ServerTimeout = 10 * time.Second
	fc := fakeClock(t, &cfg)
	s := openService(t, cfg)
	waitLeaderLoop(t, fc)
	c := newClient(t, s.Addr())
	r1 := c.registerTargets("10.0.0.1:7000", "uuid-a", "uuid-b")
	r2 := c.registerTargets("10.0.0.2:7000", "uuid-c")
	if r1.ServerID == r2.ServerID || len(r1.TargetIDs) != 2 || r2.TargetIDs[0] == r1.TargetIDs[0] {
		t.Fatalf("registrations %+v %+v", r1, r2)
	}
	if again := c.registerTargets("10.0.0.1:7000", "uuid-b", "uuid-a"); again.ServerID != r1.ServerID || again.TargetIDs[0] != r1.TargetIDs[1] || again.TargetIDs[1] != r1.TargetIDs[0] {
		t.Fatalf("re-registration = %+v, first %+v", again, r1)
	}
	wantErrno(t, c.call(rpc.MServerHeartbeat, &rpc.ServerHeartbeatReq{ServerID: 99}, nil), syscall.ESTALE, "heartbeat of unknown server")
	var lt rpc.ListTargetsResp
	if err := c.call(rpc.MListTargets, &rpc.Empty{}, &lt); err != nil || len(lt.Targets) != 3 {
		t.Fatalf("list targets = %+v %v", lt, err)
	}
	for _, tg := range lt.Targets {
		if !tg.Alive || tg.Addr == "" || tg.TotalBytes == 0 {
			t.Fatalf("target %+v", tg)
		}
	}
	// server 2 keeps beating, server 1 goes silent: alive for its 10 s,
	// dead after them.
	alive := func() map[uint32]bool {
		t.Helper()
		if err := c.call(rpc.MListTargets, &rpc.Empty{}, &lt); err != nil {
			t.Fatal(err)
		}
		m := map[uint32]bool{}
		for _, tg := range lt.Targets {
			m[tg.ID] = tg.Alive
		}
		return m
	}
	beat2 := func() {
		t.Helper()
		if err := c.call(rpc.MServerHeartbeat, &rpc.ServerHeartbeatReq{ServerID: r2.ServerID, Targets: []rpc.TargetUsage{{ID: r2.TargetIDs[0], TotalBytes: 10, FreeBytes: 5}}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 9; i++ {
		beat2()
		fc.Advance(time.Second)
	}
	if m := alive(); !m[r1.TargetIDs[0]] || !m[r1.TargetIDs[1]] || !m[r2.TargetIDs[0]] {
		t.Fatalf("9 s into a 10 s server timeout, targets alive: %v, want all", m)
	}
	beat2()
	fc.Advance(2 * time.Second)
	if m := alive(); m[r1.TargetIDs[0]] || m[r1.TargetIDs[1]] || !m[r2.TargetIDs[0]] {
		t.Fatalf("11 s after server %d's last heartbeat, targets alive: %v, want only server %d's", r1.ServerID, m, r2.ServerID)
	}
	// new files only go to live targets
	if f := c.mustCreate(1, "f", fileMode); len(f.Layout.Targets) != 1 || f.Layout.Targets[0] != r2.TargetIDs[0] {
		t.Fatalf("file on dead targets: %+v", f.Layout)
	}

	s.Close()
	s2 := openService(t, testConfig(t, dir))
	c2 := newClient(t, s2.Addr())
	if again := c2.registerTargets("10.0.0.9:7000", "uuid-a", "uuid-b"); again.ServerID != r1.ServerID || again.TargetIDs[0] != r1.TargetIDs[0] || again.TargetIDs[1] != r1.TargetIDs[1] {
		t.Fatalf("after restart (new address) = %+v, first %+v", again, r1)
	}
	if again := c2.registerTargets("10.0.0.2:7000", "uuid-c"); again.ServerID != r2.ServerID || again.TargetIDs[0] != r2.TargetIDs[0] {
		t.Fatalf("after restart = %+v, first %+v", again, r2)
	}
}

// reapingSetup starts a metadata service that reaps orphans after grace, a
// fake store serving two targets, and a client that registered them. With
// fc, the service runs on that fake clock and its leader loop is running.
func reapingSetup(t *testing.T, grace time.Duration, fc *clock.Fake) (*fakeStore, *client, rpc.RegisterServerResp) {
	t.Helper()
	cfg := testConfig(t, "")
	cfg.OrphanGrace = grace
	if fc != nil {
		cfg.Clock = fc
	}
	s := openService(t, cfg)
	if fc != nil {
		waitLeaderLoop(t, fc)
	}
	store := newFakeStore(t)
	c := newClient(t, s.Addr())
	return store, c, c.registerTargets(store.addr, "t1", "t2")
}

// reapTickOf is the reaper's tick for an orphan grace (leaderLoop).
func reapTickOf(grace time.Duration) time.Duration {
	return clampDur(grace/4, 50*time.Millisecond, time.Second)
}

// fakeReapingSetup is reapingSetup on a fake clock, which it returns with
// the reaper's tick.
func fakeReapingSetup(t *testing.T, grace time.Duration) (*clock.Fake, time.Duration, *fakeStore, *client, rpc.RegisterServerResp) {
	t.Helper()
	fc := clock.NewFake(time.Now())
	store, c, reg := reapingSetup(t, grace, fc)
	return fc, reapTickOf(grace), store, c, reg
}

// TestOrphanReaping, on a fake clock: an unlinked file's data goes once the
// grace has passed and its client has reported its open files since the
// unlink without it — not before, and not while the client holds it open.
// Each check follows reaper passes that have run to their end.
func TestOrphanReaping(t *testing.T) {
	const grace = 2 * time.Second
	fc, tick, store, c, reg := fakeReapingSetup(t, grace)
	f := c.mustCreate(1, "f", fileMode)
	g := c.mustCreate(1, "g", fileMode)

	// the client holds f open; g is closed
	beat := func(open ...uint64) {
		if err := c.heartbeat(open...); err != nil {
			t.Fatal(err)
		}
	}
	beat(f.Ino)
	c.unlink(1, "f")
	c.unlink(1, "g")
	// Nothing is reaped before every session has reported its open files
	// since the unlink (the client might have opened g a moment ago), even
	// long past the grace.
	steps(fc, int(2*grace/tick), tick)
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks removed before the session reported", n)
	}
	beat(f.Ino) // listed after the previous answer, from before the unlinks
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks removed on a list from before the unlinks", n)
	}
	beat(f.Ino) // listed after the unlinks
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 2 {
		t.Fatalf("%d chunks removed after the session reported f open, want g's 2", n)
	}
	for _, ch := range store.removed() {
		if ch.Ino != g.Ino {
			t.Fatalf("removed chunks of open file: %+v", ch)
		}
	}
	_, err := c.getattr(g.Ino)
	wantErrno(t, err, syscall.ENOENT, "reaped inode")
	if a := c.mustGetattr(f.Ino); a.Nlink != 0 {
		t.Fatalf("open orphan = %+v", a)
	}
	// the client closes f
	beat()
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 4 {
		t.Fatalf("%d chunks removed after f was closed, want 4", n)
	}
	seen := map[uint32]bool{}
	for _, ch := range store.removed()[2:] {
		if ch.Ino != f.Ino {
			t.Fatalf("unexpected removal %+v", ch)
		}
		seen[ch.Target] = true
	}
	if !seen[reg.TargetIDs[0]] || !seen[reg.TargetIDs[1]] {
		t.Fatalf("removals on targets %v, want %v", seen, reg.TargetIDs)
	}
	_, err = c.getattr(f.Ino)
	wantErrno(t, err, syscall.ENOENT, "reaped inode f")
}

// A file made with O_TMPFILE is an orphan from its start: reaped once its
// client's lists, made after the create, no longer name it — not on the
// strength of a list made before it existed — unless linkat named it.
func TestTmpfileReaping(t *testing.T) {
	const grace = 400 * time.Millisecond
	fc, tick, store, c, _ := fakeReapingSetup(t, grace)
	if err := c.heartbeat(); err != nil {
		t.Fatal(err)
	}
	tmp, err := c.tmpfile(1, fileMode)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.tmpfile(1, fileMode)
	if err != nil {
		t.Fatal(err)
	}
	// A list dated before the creates (as the client's are while its open
	// is under way) does not count, whatever it lacks.
	if err := c.heartbeat(); err != nil {
		t.Fatal(err)
	}
	steps(fc, int(2*grace/tick), tick) // past the grace, passes done
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks of new tmpfiles removed on a list older than their creation", n)
	}
	for i := 0; i < 3; i++ { // both open
		if err := c.heartbeat(tmp.Ino, kept.Ino); err != nil {
			t.Fatal(err)
		}
		steps(fc, 1, tick)
	}
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks of open tmpfiles removed", n)
	}
	if _, err := c.link(kept.Ino, 1, "kept"); err != nil {
		t.Fatal(err)
	}
	if err := c.heartbeat(); err != nil { // both closed
		t.Fatal(err)
	}
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 2 {
		t.Fatalf("%d chunks removed once the tmpfiles were closed, want the unnamed one's 2", n)
	}
	for _, ch := range store.removed() {
		if ch.Ino != tmp.Ino {
			t.Fatalf("removed a chunk of inode %d, want only the unnamed tmpfile %d", ch.Ino, tmp.Ino)
		}
	}
	_, err = c.getattr(tmp.Ino)
	wantErrno(t, err, syscall.ENOENT, "the reaped tmpfile")
	if a, err := c.lookup(1, "kept"); err != nil || a.Nlink != 1 {
		t.Fatalf("named tmpfile after reaping = %+v, %v", a, err)
	}
}

// An open-file list made before its client opened a file, which reaches
// the service after another client unlinked it, does not let the reaper
// take the file: the list's age is what counts (the answer time the client
// echoes), not when the heartbeat arrived.
func TestOrphanNotReapedOnStaleOpenList(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.OrphanGrace = 400 * time.Millisecond
	tick := reapTickOf(cfg.OrphanGrace)
	fc := fakeClock(t, &cfg)
	s := openService(t, cfg)
	waitLeaderLoop(t, fc)
	store := newFakeStore(t)
	a := newClient(t, s.Addr())
	b := newClient(t, s.Addr())
	a.registerTargets(store.addr, "t1")
	f := a.mustCreate(1, "f", fileMode)
	if err := a.heartbeat(); err != nil { // a's list, made before a opens f
		t.Fatal(err)
	}
	listedAfter := a.now.Load()
	fc.Advance(tick)
	// a opens f; b unlinks it; b reports (twice: its second list is
	// known to postdate the unlink).
	if _, err := b.unlink(1, "f"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		fc.Advance(tick)
		if err := b.heartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	// a's heartbeat with the list made before its open arrives now.
	stale := &rpc.SessionHeartbeatReq{ClientID: a.id, ListedAfter: listedAfter}
	if err := a.call(rpc.MSessionHeartbeat, stale, &rpc.SessionHeartbeatResp{}); err != nil {
		t.Fatal(err)
	}
	steps(fc, int(2*cfg.OrphanGrace/tick), tick) // past the grace, passes done
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks of a file open on a removed on the strength of a list older than the unlink", n)
	}
	// a's next lists name f; once a closes it, f goes.
	for i := 0; i < 2; i++ {
		if err := a.heartbeat(f.Ino); err != nil {
			t.Fatal(err)
		}
		fc.Advance(tick)
	}
	if err := b.heartbeat(); err != nil {
		t.Fatal(err)
	}
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks of an open file removed", n)
	}
	if err := a.heartbeat(); err != nil {
		t.Fatal(err)
	}
	steps(fc, 2, tick)
	if n := len(store.removed()); n != 1 {
		t.Fatalf("%d chunks removed after a closed f, want 1", n)
	}
}

func TestOrphanWaitsForStore(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.OrphanGrace = 100 * time.Millisecond
	tick := reapTickOf(cfg.OrphanGrace)
	fc := fakeClock(t, &cfg)
	s := openService(t, cfg)
	waitLeaderLoop(t, fc)
	c := newClient(t, s.Addr())
	c.registerTargets("127.0.0.1:1", "t1") // nothing listens there
	f := c.mustCreate(1, "f", fileMode)
	c.unlink(1, "f")
	for i := 0; i < 3; i++ { // lists after the unlink: f may go once its store answers
		fc.Advance(tick)
		if err := c.heartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	steps(fc, 10, tick)
	if a, err := c.getattr(f.Ino); err != nil || a.Nlink != 0 {
		t.Fatalf("orphan reaped without its store: %+v %v", a, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var _ sync.Mutex

// TestOrphanReapingMany: a burst of unlinks is reaped in batches (one Raft
// command for many inodes) and every inode and chunk goes.
func TestOrphanReapingMany(t *testing.T) {
	store, c, _ := reapingSetup(t, 100*time.Millisecond, nil)
	const n = 40 // more than one opCtx's inode cache
	var inos []uint64
	for i := 0; i < n; i++ {
		inos = append(inos, c.mustCreate(1, fmt.Sprintf("f%d", i), fileMode).Ino)
	}
	for i := 0; i < n; i++ {
		c.unlink(1, fmt.Sprintf("f%d", i))
	}
	beat := func() {
		if err := c.heartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "all chunks removed", func() bool { beat(); return len(store.removed()) == 2*n })
	for _, ino := range inos {
		waitFor(t, "inode reaped", func() bool { _, err := c.getattr(ino); return err != nil })
	}
}

// TestOrphanReapingInParts: a round's chunks go to a server in calls of
// at most reapCallChunks; a failed call leaves its chunks (and the rest of
// that server's) to a later round, and everything is removed in the end.
func TestOrphanReapingInParts(t *testing.T) {
	store, c, _ := reapingSetup(t, 100*time.Millisecond, nil)
	store.mu.Lock()
	store.failCall = 2
	store.mu.Unlock()
	const n = 300 // × 2 targets: 600 chunks on one server in one round
	for i := 0; i < n; i++ {
		c.mustCreate(1, fmt.Sprintf("f%d", i), fileMode)
	}
	for i := 0; i < n; i++ {
		c.unlink(1, fmt.Sprintf("f%d", i))
	}
	waitFor(t, "all chunks removed", func() bool {
		if err := c.heartbeat(); err != nil {
			t.Fatal(err)
		}
		return len(store.removed()) >= 2*n
	})
	store.mu.Lock()
	sizes := append([]int(nil), store.sizes...)
	store.mu.Unlock()
	if len(sizes) < 4 {
		t.Fatalf("calls of %v chunks: want the round split in parts and the failed part sent again", sizes)
	}
	for _, n := range sizes {
		if n > reapCallChunks {
			t.Fatalf("a call of %d chunks (calls %v), at most %d", n, sizes, reapCallChunks)
		}
	}
}

// TestCloseWhileReaping: Close stops the reaper before raft, so a reaper
// that is proposing when Close starts cannot leave Close waiting for an
// answer raft will never give (hashicorp/raft does not answer a proposal
// enqueued after its shutdown).
func TestCloseWhileReaping(t *testing.T) {
	for round := 0; round < 3; round++ {
		cfg := testConfig(t, "")
		cfg.OrphanGrace = 10 * time.Millisecond
		s, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		store := newFakeStore(t)
		c := newClient(t, s.Addr())
		c.registerTargets(store.addr, "t1")
		const n = 300
		for i := 0; i < n; i++ {
			c.mustCreate(1, fmt.Sprintf("f%d", i), fileMode)
		}
		for i := 0; i < n; i++ {
			c.unlink(1, fmt.Sprintf("f%d", i))
		}
		// The second heartbeat's list is known to postdate the unlinks.
		for i := 0; i < 2; i++ {
			if err := c.heartbeat(); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "reaping under way", func() bool { return len(store.removed()) > 0 })
		done := make(chan error, 1)
		go func() { done <- s.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("close: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("Close still waiting 60 s after it was called while orphans were being reaped")
		}
	}
}

// TestStatusClientsAndLocks: cluster status names every client session
// (host, mount, liveness) and lists the locks held with their holder; a
// released lock and a closed session disappear from it.
func TestStatusClientsAndLocks(t *testing.T) {
	s, a := newNamespace(t)
	b := newClient(t, s.Addr())
	f := a.mustCreate(1, "f", fileMode)
	g := a.mustCreate(1, "g", fileMode)
	status := func() rpc.ClusterStatusResp {
		t.Helper()
		var cs rpc.ClusterStatusResp
		if err := a.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	if err := a.call(rpc.MSetLk, lk(a, g.Ino, 7, 10, 19, rpc.LockWrite), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.call(rpc.MSetLk, lk(b, f.Ino, 3, 0, math.MaxUint64, rpc.LockRead), nil); err != nil {
		t.Fatal(err)
	}
	fl := lk(b, g.Ino, 4, 0, math.MaxUint64, rpc.LockWrite)
	fl.Flock = true
	if err := b.call(rpc.MSetLk, fl, nil); err != nil {
		t.Fatal(err)
	}

	cs := status()
	if len(cs.Clients) != 2 || cs.Clients[0].ID != a.id || cs.Clients[1].ID != b.id {
		t.Fatalf("clients = %+v, want sessions %d and %d", cs.Clients, a.id, b.id)
	}
	for _, c := range cs.Clients {
		if c.Host != "test" || c.MountPoint != "/t" || c.Pid != 1 || c.LastSeenMs < 0 || c.LastSeenMs > 60_000 || c.OpenedMs <= 0 {
			t.Fatalf("client %+v: want host test, mount /t, pid 1, seen recently", c)
		}
	}
	if cs.Clients[0].Locks != 1 || cs.Clients[1].Locks != 2 {
		t.Fatalf("locks per client = %d, %d; want 1, 2", cs.Clients[0].Locks, cs.Clients[1].Locks)
	}
	want := []rpc.LockInfo{
		{Ino: f.Ino, Client: b.id, Owner: 3, Pid: 3, Type: rpc.LockRead, Start: 0, End: math.MaxUint64},
		{Ino: g.Ino, Client: a.id, Owner: 7, Pid: 7, Type: rpc.LockWrite, Start: 10, End: 19},
		{Ino: g.Ino, Client: b.id, Owner: 4, Pid: 4, Type: rpc.LockWrite, Flock: true, Start: 0, End: math.MaxUint64},
	}
	if cs.LocksTotal != 3 || !reflect.DeepEqual(cs.Locks, want) || cs.LockGrace {
		t.Fatalf("locks total %d grace %v\n got %+v\nwant %+v", cs.LocksTotal, cs.LockGrace, cs.Locks, want)
	}

	// Unlock one; close b's session: its locks go with it.
	if err := a.call(rpc.MSetLk, lk(a, g.Ino, 7, 0, math.MaxUint64, rpc.LockUnlock), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.call(rpc.MSessionClose, &rpc.SessionCloseReq{ClientID: b.id}, nil); err != nil {
		t.Fatal(err)
	}
	cs = status()
	if len(cs.Clients) != 1 || cs.Clients[0].ID != a.id || cs.LocksTotal != 0 || len(cs.Locks) != 0 {
		t.Fatalf("after unlock and close: clients %+v, locks %d %+v", cs.Clients, cs.LocksTotal, cs.Locks)
	}
}

// TestStatusLockListBounded: the status lists at most MaxStatusLocks locks
// but counts them all.
func TestStatusLockListBounded(t *testing.T) {
	tb := newLockTable(slog.Default(), nil)
	n := rpc.MaxStatusLocks + 5
	for i := range n {
		r := &rpc.LockReq{ClientID: 9, Ino: uint64(i%7) + 100, Owner: uint64(i), Start: uint64(i) * 10, End: uint64(i)*10 + 9, Type: rpc.LockWrite}
		if _, err := tb.set(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	st := tb.status(rpc.MaxStatusLocks)
	if st.total != n || len(st.locks) != rpc.MaxStatusLocks || st.byClient[9] != n {
		t.Fatalf("total %d listed %d by client %d; want %d, %d, %d", st.total, len(st.locks), st.byClient[9], n, rpc.MaxStatusLocks, n)
	}
	for i := 1; i < len(st.locks); i++ {
		if st.locks[i].Ino < st.locks[i-1].Ino {
			t.Fatalf("locks not in inode order at %d: %d after %d", i, st.locks[i].Ino, st.locks[i-1].Ino)
		}
	}
}

// TestStatusFreePending: cluster status counts the removed files whose
// chunks wait for the reaper, and the space they hold (reported
// allocation, as st_blocks shows it), until the reaper has freed them.
func TestStatusFreePending(t *testing.T) {
	store, c, _ := reapingSetup(t, 300*time.Millisecond, nil)
	status := func() rpc.ClusterStatusResp {
		t.Helper()
		var cs rpc.ClusterStatusResp
		if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	f := c.mustCreate(1, "f", fileMode)
	g := c.mustCreate(1, "g", fileMode)
	var r rpc.AttrResp
	if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: f.Ino, Size: 3901, Mtime: 1,
		Alloc: []rpc.SlotAlloc{{Slot: 0, Bytes: 4096}}}, &r); err != nil {
		t.Fatal(err)
	}
	alloc := []rpc.SlotAlloc{{Slot: 0, Bytes: 8192}, {Slot: 1, Bytes: 4096}}
	if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: g.Ino, Size: 10000, Mtime: 1, Alloc: alloc}, &r); err != nil {
		t.Fatal(err)
	}
	if cs := status(); cs.FreePendingFiles != 0 || cs.FreePendingBytes != 0 {
		t.Fatalf("before any unlink: pending %d files, %d bytes", cs.FreePendingFiles, cs.FreePendingBytes)
	}
	c.unlink(1, "f")
	c.unlink(1, "g")
	if cs := status(); cs.FreePendingFiles != 2 || cs.FreePendingBytes != 4096+12288 {
		t.Fatalf("after unlinks: pending %d files, %d bytes; want 2, %d", cs.FreePendingFiles, cs.FreePendingBytes, 4096+12288)
	}
	waitFor(t, "chunks removed and status at zero", func() bool {
		if err := c.heartbeat(); err != nil {
			t.Fatal(err)
		}
		cs := status()
		return len(store.removed()) == 4 && cs.FreePendingFiles == 0 && cs.FreePendingBytes == 0
	})
}

// TestCloseWithOrphansOneLine: stopping while removed files wait for their
// chunks (their storage server gone) logs one line that counts them, not a
// line per file, and the reaper's failed rounds one line each at most.
func TestCloseWithOrphansOneLine(t *testing.T) {
	var logs testutil.SyncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	cfg := testConfig(t, "")
	cfg.OrphanGrace = 10 * time.Millisecond
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newClient(t, s.Addr())
	c.registerTargets("127.0.0.1:1", "t1", "t2") // nothing listens there
	const n = 300
	for i := 0; i < n; i++ {
		c.mustCreate(1, fmt.Sprintf("f%d", i), fileMode)
	}
	for i := 0; i < n; i++ {
		c.unlink(1, fmt.Sprintf("f%d", i))
	}
	for i := 0; i < 2; i++ { // the second list postdates the unlinks
		if err := c.heartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a reaper round", func() bool { return strings.Contains(logs.String(), "orphan data not removed yet") })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	summary := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "wait for their chunks to be freed") {
			summary++
			if !strings.Contains(l, fmt.Sprintf("files=%d", n)) {
				t.Errorf("summary does not count %d files: %s", n, l)
			}
		}
	}
	if summary != 1 {
		t.Errorf("%d summary lines at close, want 1:\n%s", summary, out)
	}
	if k := strings.Count(out, "level=WARN"); k >= n {
		t.Errorf("%d warnings for %d waiting files:\n%s", k, n, out)
	}
}
