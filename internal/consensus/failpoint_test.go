package consensus

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/failpoint"
)

// The deferred syncer's failpoints: an error before or after the
// fdatasyncs fails the sync (stickily: nothing is durable after a failed
// sync), so a waiter gets the injected error, not a success; a sleep there
// holds the waiter up.
func TestWALSyncFailpoints(t *testing.T) {
	for _, point := range []string{"consensus/before-log-sync", "consensus/after-log-sync"} {
		t.Run(point, func(t *testing.T) {
			t.Cleanup(failpoint.DisarmAll)
			w, err := openWAL(t.TempDir(), 64<<10, slog.Default())
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			w.setDeferSync(time.Hour) // only waiters sync
			if err := failpoint.Arm(point, "sleep(100ms)"); err != nil {
				t.Fatal(err)
			}
			if err := w.StoreLogs(walEntries(1, 10)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := w.WaitDurable(10, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d < 100*time.Millisecond {
				t.Errorf("wait answered after %v, before the armed sleep(100ms) at %s ended", d, point)
			}
			if err := failpoint.Arm(point, "error"); err != nil {
				t.Fatal(err)
			}
			if err := w.StoreLogs(walEntries(11, 20)); err != nil {
				t.Fatal(err)
			}
			err = w.WaitDurable(20, 10*time.Second)
			if !errors.Is(err, failpoint.ErrInjected) {
				t.Fatalf("wait after a sync failed at %s: %v, want the injected error", point, err)
			}
			if d := w.durableIndex(); d != 10 {
				t.Errorf("durable index %d after the failed sync, want 10", d)
			}
			failpoint.DisarmAll()
			err = w.StoreLogs(walEntries(21, 21))
			if err == nil {
				err = w.WaitDurable(21, 10*time.Second)
			}
			if !errors.Is(err, failpoint.ErrInjected) {
				t.Errorf("a sync failure must stay sticky; the next append and wait: %v", err)
			}
		})
	}
}
