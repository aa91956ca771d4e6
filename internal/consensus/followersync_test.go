package consensus

import (
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFollowerSyncsInline: a follower's append is durable when StoreLogs
// returns, and its fdatasync runs in the goroutine that called StoreLogs
// (raft's follower loop) rather than in the background syncer, so a round
// of replication costs no hand-over to the syncer and back. A leader's
// append (deferred) is still synced by the background syncer.
func TestFollowerSyncsInline(t *testing.T) {
	w, err := openWAL(t.TempDir(), DefaultSegmentBytes, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.setDeferSync(time.Hour)
	var follower sync.Mutex // guards isFollower
	isFollower := true
	w.syncAppends = func() bool { follower.Lock(); defer follower.Unlock(); return isFollower }
	var mu sync.Mutex
	var inline, background int
	w.syncSegment = func(s *segment) error {
		buf := make([]byte, 64<<10)
		stack := string(buf[:runtime.Stack(buf, false)])
		mu.Lock()
		if strings.Contains(stack, "(*wal).StoreLogs") {
			inline++
		} else {
			background++
		}
		mu.Unlock()
		return fdatasyncSegment(s)
	}
	for i := uint64(1); i <= 50; i += 10 {
		if err := w.StoreLogs(walEntries(i, i+9)); err != nil {
			t.Fatal(err)
		}
		if d := w.durableIndex(); d != i+9 {
			t.Fatalf("follower append of %d..%d returned durable only up to %d", i, i+9, d)
		}
	}
	mu.Lock()
	if inline != 5 || background != 0 {
		t.Errorf("follower appends: %d syncs in StoreLogs, %d in the background syncer; want 5 and 0", inline, background)
	}
	inline, background = 0, 0
	mu.Unlock()

	follower.Lock()
	isFollower = false
	follower.Unlock()
	if err := w.StoreLogs(walEntries(51, 60)); err != nil {
		t.Fatal(err)
	}
	if d := w.durableIndex(); d != 50 {
		t.Errorf("leader append (deferred, SyncDelay 1h) durable up to %d at once; want 50", d)
	}
	if err := w.WaitDurable(60, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if inline != 0 || background == 0 {
		t.Errorf("leader append: %d syncs in StoreLogs, %d in the background syncer; want 0 and some", inline, background)
	}
}
