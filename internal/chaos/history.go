package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/testutil/history"
)

// Histories runs linearizability recorders (internal/testutil/history) on
// the mount beside the load, in segments of segment length, each in a
// fresh directory with its own seed, so that each segment's history is
// checked on its own and the check stays fast however long the run. The
// operations are the namespace's (create, unlink, rename, stat): the
// content operations' model does not yet cover what the mount is known to
// do under concurrent truncates (see the history package's doc).
type Histories struct {
	dir     string
	seed    int64
	segment time.Duration
	stop    chan struct{}
	wg      sync.WaitGroup
	// gate is held shared through every segment; Pause takes it whole.
	gate sync.RWMutex

	mu       sync.Mutex
	segments int
	ops      int
	failures []string
}

// StartHistories begins recording under dir.
func StartHistories(dir string, seed int64, segment time.Duration) (*Histories, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("history directory: %w", err)
	}
	h := &Histories{dir: dir, seed: seed, segment: segment, stop: make(chan struct{})}
	h.wg.Add(1)
	go h.run()
	return h, nil
}

func (h *Histories) run() {
	defer h.wg.Done()
	kinds := []history.Kind{history.Create, history.Unlink, history.Rename, history.Stat}
	for n := 0; ; n++ {
		select {
		case <-h.stop:
			return
		default:
		}
		h.gate.RLock()
		h.segment1(n, kinds)
		h.gate.RUnlock()
	}
}

// Pause waits for the segment under way to end and holds the next one
// until Resume (a power-loss trial).
func (h *Histories) Pause() { h.gate.Lock() }

// Resume lets the recorders go on after Pause.
func (h *Histories) Resume() { h.gate.Unlock() }

// segment1 records and checks segment n.
func (h *Histories) segment1(n int, kinds []history.Kind) {
	label := fmt.Sprintf("segment %d (seed %d)", n, h.seed+int64(n))
	hist, err := history.Run(history.Config{Root: filepath.Join(h.dir, fmt.Sprintf("s%04d", n)), Workers: 3,
		Seed: h.seed + int64(n), Duration: h.segment, Stall: 60 * time.Second, Kinds: kinds})
	var problems []string
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s: %v", label, err))
	}
	if hist != nil {
		ops := hist.Ops()
		if err := history.Check(ops, label); err != nil {
			problems = append(problems, fmt.Sprintf("%s: not linearizable: %v", label, err))
		}
		if err := history.ExactlyOnce(ops); err != nil {
			problems = append(problems, fmt.Sprintf("%s: exactly-once: %v", label, err))
		}
		h.mu.Lock()
		h.ops += len(ops)
		h.mu.Unlock()
	}
	h.mu.Lock()
	h.segments++
	h.failures = append(h.failures, problems...)
	h.mu.Unlock()
}

// Stop ends recording after the current segment and returns how many
// segments and operations were checked and what failed.
func (h *Histories) Stop() (segments, ops int, failures []string) {
	close(h.stop)
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.segments, h.ops, h.failures
}
