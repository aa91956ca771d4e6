package kv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stratafs/strata/internal/testutil"
)

// within runs f and fails the test if it has not returned after d: an
// injected disk fault must give an error, never a hang.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s still running after %v (hung on the failing disk)", what, d)
		return nil
	}
}

// failOn injects errorfs.ErrInjected into the given operations on files
// whose name ends in suffix ("" for every file).
func failOn(suffix string, kinds ...errorfs.OpKind) errorfs.Injector {
	return errorfs.InjectorFunc(func(op errorfs.Op) error {
		if slices.Contains(kinds, op.Kind) && strings.HasSuffix(op.Path, suffix) {
			return errorfs.ErrInjected
		}
		return nil
	})
}

func put(s Store, key, val string, sync bool) error {
	b := s.NewBatch()
	defer b.Close()
	if err := b.Set([]byte(key), []byte(val)); err != nil {
		return err
	}
	return b.Apply(sync)
}

// TestInjectedSyncErrorIsFatal: with Options.FS an errorfs whose syncs
// fail, a synced write neither hangs nor succeeds: pebble cannot go on
// with a write-ahead log whose sync failed, so Apply panics in the caller
// (fail-stop: the process ends, and a replicated service fails over to
// another voter). Writes before the fault were acknowledged normally.
func TestInjectedSyncErrorIsFatal(t *testing.T) {
	syncs := &errorfs.Toggle{Injector: failOn("", errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo)}
	s, err := Open("/db", Options{FS: errorfs.Wrap(vfs.NewMem(), syncs)})
	if err != nil {
		t.Fatal(err)
	}
	if err := put(s, "before", "1", true); err != nil {
		t.Fatalf("synced write before the fault: %v", err)
	}
	syncs.On()
	var panicked any
	err = within(t, 10*time.Second, "synced write", func() (err error) {
		defer func() { panicked = recover() }()
		return put(s, "during", "2", true)
	})
	if panicked == nil {
		t.Fatalf("synced write on a failing disk returned %v, want a fatal engine error", err)
	}
	if msg := fmt.Sprint(panicked); !strings.Contains(msg, "injected error") {
		t.Fatalf("panic does not name the disk error: %s", msg)
	}
	// The engine is unusable now (its commit pipeline is stuck by design);
	// the store is abandoned as a crashed process's would be.
}

// TestInjectedWriteErrorFailsFlush: a store without its own WAL (the
// metadata state machine's) reaches disk only by flushing; with writes to
// table files failing, Sync returns the error after the give-up time
// instead of waiting forever.
func TestInjectedWriteErrorFailsFlush(t *testing.T) {
	old := flushGiveUp
	flushGiveUp = 500 * time.Millisecond
	t.Cleanup(func() { flushGiveUp = old })
	writes := &errorfs.Toggle{Injector: failOn(".sst", errorfs.OpCreate, errorfs.OpFileWrite)}
	s, err := Open("/db", Options{FS: errorfs.Wrap(vfs.NewMem(), writes), NoWAL: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := put(s, "k", "v", false); err != nil {
		t.Fatal(err)
	}
	writes.On()
	err = within(t, 30*time.Second, "Sync", s.Sync)
	if !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Sync with table writes failing: want the injected error, got %v", err)
	}
	if s.Health() == nil {
		t.Error("Health is nil while every flush fails")
	}
	writes.Off()
	if err := within(t, 30*time.Second, "Sync after the fault", s.Sync); err != nil {
		t.Fatalf("Sync after the fault cleared: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCrashKeepsSyncedDropsUnsynced: on pebble's crash-simulating memory
// file system, a crash (CrashClone with no unsynced data) keeps what a
// synced Apply wrote and what Sync made durable, and drops a write that was
// only applied without sync, although its bytes had reached the file (a
// clone that keeps unsynced data has it: the write is large enough for the
// engine to write it out, not just buffer it).
func TestCrashKeepsSyncedDropsUnsynced(t *testing.T) {
	mem := vfs.NewCrashableMem()
	s, err := Open("/db", Options{FS: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := put(s, "synced", "1", true); err != nil {
		t.Fatal(err)
	}
	if err := put(s, "then-synced", "2", false); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("u", 1<<20)
	if err := put(s, "unsynced", big, false); err != nil {
		t.Fatal(err)
	}
	// reopen opens a crash clone and returns the value of "unsynced" ("" if
	// absent) after checking the synced keys.
	reopen := func(cfg vfs.CrashCloneCfg) string {
		t.Helper()
		s2, err := Open("/db", Options{FS: mem.CrashClone(cfg)})
		if err != nil {
			t.Fatalf("reopen after the crash: %v", err)
		}
		defer s2.Close()
		for k, want := range map[string]string{"synced": "1", "then-synced": "2"} {
			if v, err := s2.Get([]byte(k)); err != nil || string(v) != want {
				t.Errorf("%s after the crash: %q %v, want %q", k, v, err, want)
			}
		}
		v, err := s2.Get([]byte("unsynced"))
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		return string(v)
	}
	if err := testutil.WaitFor(10*time.Second, func() error {
		if reopen(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(1, 2))}) != big {
			return errors.New("the unsynced write is not in the files yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v := reopen(vfs.CrashCloneCfg{}); v != "" {
		t.Errorf("unsynced write survived the crash (%d bytes)", len(v))
	}
}
