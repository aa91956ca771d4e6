package meta

import (
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/clock"
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
