package consensus

import (
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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

// TestFollowerAnswersOnlyWhenDurable: a follower answers an AppendEntries
// that carried entries only once a sync covering them has completed. Both
// followers' syncs are held; the leader cannot commit the entry (it needs
// one follower's answer) until they are let go.
func TestFollowerAnswersOnlyWhenDurable(t *testing.T) {
	tr := startTrio(t, func(c *Config) { c.DeferSync, c.SyncDelay = true, time.Hour })
	l := tr.leader(nil)
	if _, err := l.Apply(u64(1), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var held atomic.Int32
	var followers []*Node
	for _, n := range tr.nodes {
		if n == l {
			continue
		}
		followers = append(followers, n)
		n.SetLogFault(func(op, _ string) error {
			if op != "sync" {
				return nil
			}
			held.Add(1)
			select { // bounded: a test that fails must still end
			case <-release:
			case <-time.After(20 * time.Second):
			}
			return nil
		})
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	idx := l.Stats().CommitIndex + 1
	done := make(chan error, 1)
	go func() { _, err := l.Apply(u64(2), 15*time.Second); done <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for held.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if held.Load() < 2 {
		t.Fatalf("followers' syncs held: %d, want both", held.Load())
	}
	time.Sleep(300 * time.Millisecond) // time for a premature answer to arrive
	if ci := l.Stats().CommitIndex; ci >= idx {
		t.Fatalf("leader committed %d while both followers' syncs were held: a follower answered before its entries were durable", ci)
	}
	select {
	case err := <-done:
		t.Fatalf("apply answered (%v) while both followers' syncs were held", err)
	default:
	}
	close(release)
	released = true
	for _, f := range followers {
		f.SetLogFault(nil)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("apply after the syncs completed: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("apply not answered after the syncs completed")
	}
	if ci := l.Stats().CommitIndex; ci < idx {
		t.Errorf("commit index %d after the apply, want at least %d", ci, idx)
	}
}
