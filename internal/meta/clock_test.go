package meta

import (
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// fakeClock puts a fake clock, reading the real time until moved, under
// the service cfg configures.
func fakeClock(t testing.TB, cfg *Config) *clock.Fake {
	t.Helper()
	fc := clock.NewFake(time.Now())
	cfg.Clock = fc
	return fc
}

// waitLeaderLoop waits until the leader loop of the only service on fc
// has made its two tickers (session expiry, reaper): from then on each
// Advance past a tick hands it to the loop.
func waitLeaderLoop(t testing.TB, fc *clock.Fake) {
	t.Helper()
	if !fc.WaitPending(2, 10*time.Second) {
		t.Fatalf("the leader loop's tickers never appeared (%d timers pending)", fc.Pending())
	}
}

// steps advances fc n times by d: each Advance returns once the loop
// took the ticks due, so every tick but the last has been handled.
func steps(fc *clock.Fake, n int, d time.Duration) {
	for range n {
		fc.Advance(d)
	}
}

// TestOrphanGrace: a new leader deletes no removed file's data for its
// orphan grace (clients that hold such files open may not have found it
// yet), even when every session has reported; after the grace it does.
// On a fake clock the 10 s grace takes no time.
func TestOrphanGrace(t *testing.T) {
	fc, tick, store, c, _ := fakeReapingSetup(t, 10*time.Second)
	g := c.mustCreate(1, "g", fileMode)
	if _, err := c.unlink(1, "g"); err != nil {
		t.Fatal(err)
	}
	beat := func() {
		t.Helper()
		if err := c.heartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	for i := 0; i < 8; i++ { // reports made after the unlink, up to 8 s in
		fc.Advance(tick)
		beat()
	}
	fc.Advance(tick) // 9 s: the 8 s pass is done
	if n := len(store.removed()); n != 0 {
		t.Fatalf("%d chunks removed within the orphan grace", n)
	}
	steps(fc, 3, tick) // 12 s: the 11 s pass is done
	if n := len(store.removed()); n != 2 {
		t.Fatalf("%d chunks removed after the orphan grace, want g's 2", n)
	}
	_, err := c.getattr(g.Ino)
	wantErrno(t, err, syscall.ENOENT, "the reaped orphan")
}

// TestLockReclaimAfterRestart, on a fake clock: after a restart of the
// metadata service the lock table starts empty under a new epoch, and new
// locks wait while sessions from before may still reclaim theirs — a lock
// that conflicts with an unreclaimed one is refused (EBUSY after the
// bounded wait), a reclaimed lock keeps excluding others, and once its
// holder goes silent for a lease it is released.
func TestLockReclaimAfterRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SessionLease = 10 * time.Second // loop ticks every second; grace up to 10 s
	fc := fakeClock(t, &cfg)
	s1 := openService(t, cfg)
	a := newClient(t, s1.Addr())
	b := newClient(t, s1.Addr())
	var g rpc.LockGrant
	if err := a.call(rpc.MSetLk, lk(a, 1, 1, 0, 10, rpc.LockWrite), &g); err != nil {
		t.Fatal(err)
	}
	oldEpoch := g.Epoch
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := openService(t, cfg)
	if !fc.WaitPending(3, 10*time.Second) { // the loop's two tickers, the grace period
		t.Fatalf("no grace period and leader loop on the fake clock (%d timers pending)", fc.Pending())
	}
	a.c.Close()
	b.c.Close()
	a.c = transport.NewClient(s2.Addr(), transport.ClientConfig{Key: testKey, Conns: 4})
	b.c = transport.NewClient(s2.Addr(), transport.ClientConfig{Key: testKey, Conns: 4})
	beat := func(c *client, epoch uint64) uint64 {
		t.Helper()
		var r rpc.SessionHeartbeatResp
		if err := c.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: c.id, LockEpoch: epoch}, &r); err != nil {
			t.Fatalf("heartbeat of client %d: %v", c.id, err)
		}
		return r.LockEpoch
	}
	epoch := beat(b, oldEpoch)
	if epoch == oldEpoch {
		t.Fatal("the lock epoch did not change with the restart")
	}
	beat(b, epoch) // b held nothing: reclaimed
	// a has not reclaimed: b's conflicting lock waits its bounded wait,
	// then is told to ask again.
	done := make(chan error, 1)
	go func() { done <- b.call(rpc.MSetLk, lk(b, 1, 1, 5, 5, rpc.LockWrite), nil) }()
	if !fc.WaitPending(4, 10*time.Second) {
		t.Fatalf("b's lock did not wait for the grace period (%d timers pending)", fc.Pending())
	}
	fc.Advance(lockWait)
	wantErrno(t, returns(t, "new lock during the grace period", done), syscall.EBUSY, "new lock while a has not reclaimed")
	// a reclaims its lock and reports the epoch: the grace period is over,
	// and the lock excludes b as before the restart.
	rc := lk(a, 1, 1, 0, 10, rpc.LockWrite)
	rc.Reclaim = true
	if err := a.call(rpc.MSetLk, rc, &g); err != nil || g.Epoch != epoch {
		t.Fatalf("reclaim: epoch %d, %v; want epoch %d", g.Epoch, err, epoch)
	}
	beat(a, epoch)
	wantErrno(t, b.call(rpc.MSetLk, lk(b, 1, 1, 5, 5, rpc.LockWrite), nil), syscall.EAGAIN, "lock conflicting with a reclaimed one")
	// a goes silent; b keeps beating. 9 s later a still holds it; after its
	// 10 s lease it is gone.
	for i := 0; i < 9; i++ {
		beat(b, epoch)
		fc.Advance(time.Second)
	}
	wantErrno(t, b.call(rpc.MSetLk, lk(b, 1, 1, 5, 5, rpc.LockWrite), nil), syscall.EAGAIN, "lock of a session 9 s into its lease")
	beat(b, epoch)
	fc.Advance(2 * time.Second)
	waitFor(t, "a's reclaimed lock released with its session", func() bool {
		return b.call(rpc.MSetLk, lk(b, 1, 1, 5, 5, rpc.LockWrite), nil) == nil
	})
}
