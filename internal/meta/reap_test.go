package meta

import (
	"testing"
	"time"
)

// TestReapPacer: the reaper runs at every tick while clients are quiet,
// yields while they are busy for at most maxDefer, and never yields when
// space is low or deferral is off.
func TestReapPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := reapPacer{last: t0}
	var req uint64
	tick := func(i int, perSecond uint64, lowSpace bool, maxDefer time.Duration) bool {
		req += perSecond
		return p.due(t0.Add(time.Duration(i)*time.Second), req, maxDefer, lowSpace)
	}
	if !tick(1, 10, false, 10*time.Second) {
		t.Fatal("quiet: not due")
	}
	for i := 2; i <= 10; i++ {
		if tick(i, 5000, false, 10*time.Second) {
			t.Fatalf("busy tick %d (%v after the last pass): due", i, time.Duration(i-1)*time.Second)
		}
	}
	if !tick(11, 5000, false, 10*time.Second) {
		t.Fatal("busy for maxDefer: still deferred")
	}
	if tick(12, 5000, false, 10*time.Second) {
		t.Fatal("busy right after a pass: due")
	}
	if !tick(13, 100, false, 10*time.Second) {
		t.Fatal("quiet again: not due")
	}
	if !tick(14, 5000, true, 10*time.Second) {
		t.Fatal("busy but low on space: deferred")
	}
	if !tick(15, 5000, false, -1) {
		t.Fatal("deferral off: deferred")
	}
}
