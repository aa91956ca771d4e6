package consensus

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func walEntries(from, to uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: 1 + i/100, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(i)}, int(i%300))})
	}
	return out
}

func checkRange(t *testing.T, w *wal, first, last uint64) {
	t.Helper()
	f, _ := w.FirstIndex()
	l, _ := w.LastIndex()
	if f != first || l != last {
		t.Fatalf("bounds %d..%d, want %d..%d", f, l, first, last)
	}
	for i := first; i <= last && first != 0; i++ {
		var got raft.Log
		if err := w.GetLog(i, &got); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
		want := walEntries(i, i)[0]
		if got.Index != i || got.Term != want.Term || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("entry %d: %+v", i, got)
		}
	}
	var l2 raft.Log
	if err := w.GetLog(last+1, &l2); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog past the end: %v", err)
	}
}

func TestWALStoreRotateRecover(t *testing.T) {
	dir := t.TempDir()
	const seg = 64 << 10 // small segments: many rotations
	w, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 2000; i += 50 {
		if err := w.StoreLogs(walEntries(i, i+49)); err != nil {
			t.Fatal(err)
		}
	}
	checkRange(t, w, 1, 2000)
	if err := w.StoreLogs(walEntries(3000, 3000)); err == nil {
		t.Fatal("non-contiguous append accepted")
	}
	// An entry larger than a segment gets a segment of its own.
	big := &raft.Log{Index: 2001, Term: 9, Data: bytes.Repeat([]byte("B"), 3*seg)}
	if err := w.StoreLogs([]*raft.Log{big}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "seg-*.wal"))
	if len(segs) < 5 {
		t.Fatalf("only %d segments", len(segs))
	}
	w, err = openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var got raft.Log
	if err := w.GetLog(2001, &got); err != nil || len(got.Data) != 3*seg {
		t.Fatalf("big entry after restart: %v %d", err, len(got.Data))
	}
	l, _ := w.LastIndex()
	if l != 2001 {
		t.Fatalf("last after restart %d", l)
	}
	for i := uint64(1); i <= 2000; i += 97 {
		var e raft.Log
		if err := w.GetLog(i, &e); err != nil || !bytes.Equal(e.Data, walEntries(i, i)[0].Data) {
			t.Fatalf("entry %d after restart: %v", i, err)
		}
	}
}

func TestWALTornTailIsDropped(t *testing.T) {
	dir := t.TempDir()
	w, err := openWAL(dir, 1<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs(walEntries(1, 100)); err != nil {
		t.Fatal(err)
	}
	w.mu.RLock()
	s := w.mu.segs[0]
	end := s.end
	w.mu.RUnlock()
	w.Close()
	// A crash in the middle of the next append: a record head and half a payload.
	f, _ := os.OpenFile(s.path, os.O_RDWR, 0)
	rec := encodeRecord(nil, walEntries(101, 101)[0])
	f.WriteAt(rec[:len(rec)/2+4], end)
	f.Close()
	w, err = openWAL(dir, 1<<20, slog.Default())
	if err != nil {
		t.Fatalf("open after torn write: %v", err)
	}
	checkRange(t, w, 1, 100)
	// The log continues over the torn bytes.
	if err := w.StoreLogs(walEntries(101, 120)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w, _ = openWAL(dir, 1<<20, slog.Default())
	defer w.Close()
	checkRange(t, w, 1, 120)
}

func TestWALCorruptionInsideRefused(t *testing.T) {
	dir := t.TempDir()
	w, _ := openWAL(dir, 64<<10, slog.Default())
	for i := uint64(1); i <= 1000; i += 100 {
		if err := w.StoreLogs(walEntries(i, i+99)); err != nil {
			t.Fatal(err)
		}
	}
	w.mu.RLock()
	first := w.mu.segs[0]
	off := first.offs[3]
	w.mu.RUnlock()
	w.Close()
	f, _ := os.OpenFile(first.path, os.O_RDWR, 0)
	f.WriteAt([]byte{0xff}, off+12) // flip a payload byte of a sealed segment
	f.Close()
	if _, err := openWAL(dir, 64<<10, slog.Default()); !errors.Is(err, errWALCorrupt) {
		t.Fatalf("want errWALCorrupt, got %v", err)
	}
}

func TestWALTruncation(t *testing.T) {
	dir := t.TempDir()
	const seg = 32 << 10
	w, _ := openWAL(dir, seg, slog.Default())
	if err := w.StoreLogs(walEntries(1, 1000)); err != nil {
		t.Fatal(err)
	}
	before, _ := filepath.Glob(filepath.Join(dir, "seg-*.wal"))
	// Head: whole segments below the cut go.
	if err := w.DeleteRange(1, 600); err != nil {
		t.Fatal(err)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "seg-*.wal"))
	if len(after) >= len(before) {
		t.Fatalf("head truncation kept all %d segments", len(before))
	}
	checkRange(t, w, 601, 1000)
	// Tail: a conflicting suffix is cut, and stays cut across a restart.
	if err := w.DeleteRange(900, 1000); err != nil {
		t.Fatal(err)
	}
	checkRange(t, w, 601, 899)
	w.Close()
	w, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	l, _ := w.LastIndex()
	if l != 899 {
		t.Fatalf("tail cut resurrected: last %d", l)
	}
	if err := w.StoreLogs(walEntries(900, 950)); err != nil {
		t.Fatal(err)
	}
	f, _ := w.FirstIndex()
	checkRange(t, w, f, 950)
	// Everything.
	if err := w.DeleteRange(f, 950); err != nil {
		t.Fatal(err)
	}
	checkRange(t, w, 0, 0)
	if err := w.StoreLogs(walEntries(951, 960)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w, _ = openWAL(dir, seg, slog.Default())
	defer w.Close()
	checkRange(t, w, 951, 960)
}

func TestWALMigratesPebbleLog(t *testing.T) {
	dir := t.TempDir()
	old, err := openLogStore(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.StoreLogs(walEntries(5, 40)); err != nil {
		t.Fatal(err)
	}
	w, _ := openWAL(filepath.Join(dir, "wal"), 1<<20, slog.Default())
	if err := migrateLog(old, w); err != nil {
		t.Fatal(err)
	}
	checkRange(t, w, 5, 40)
	if f, _ := old.FirstIndex(); f != 0 {
		t.Fatalf("old store still has entries from %d", f)
	}
	w.Close()
	old.Close()
}

func BenchmarkWALStoreLog(b *testing.B) {
	w, err := openWAL(b.TempDir(), DefaultSegmentBytes, slog.Default())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	data := bytes.Repeat([]byte("x"), 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := w.StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPebbleStoreLog(b *testing.B) {
	s, err := openLogStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := bytes.Repeat([]byte("x"), 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}

// In deferred mode an append returns before its fdatasync; the entries are
// readable at once, a waiter gets them durable, the background syncer makes
// them durable without a waiter, and close leaves nothing unsynced.
func TestWALDeferredSync(t *testing.T) {
	dir := t.TempDir()
	const seg = 64 << 10
	w, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	// An hour: only waiters (and close) can make entries durable.
	w.setDeferSync(time.Hour)
	for i := uint64(1); i <= 500; i += 50 {
		if err := w.StoreLogs(walEntries(i, i+49)); err != nil {
			t.Fatal(err)
		}
	}
	checkRange(t, w, 1, 500) // readable before durable
	if d := w.durableIndex(); d != 0 {
		t.Fatalf("durable index %d before anybody waited (sync delay one hour)", d)
	}
	if err := w.WaitDurable(120, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := w.durableIndex(); d != 500 {
		t.Fatalf("durable index %d after a wait; one sync covers everything written (500)", d)
	}
	// A wait beyond the log waits for what exists only.
	if err := w.WaitDurable(10_000, time.Second); err != nil {
		t.Fatal(err)
	}

	// Without a waiter, a short delay syncs on its own.
	w.setDeferSync(5 * time.Millisecond)
	if err := w.StoreLogs(walEntries(501, 700)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.durableIndex() < 700 {
		if time.Now().After(deadline) {
			t.Fatalf("durable index %d 10 s after the append; the syncer never ran", w.durableIndex())
		}
		time.Sleep(time.Millisecond)
	}

	// A tail cut lowers the marks; waiting for a cut entry does not hang.
	w.setDeferSync(time.Hour)
	if err := w.StoreLogs(walEntries(701, 800)); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteRange(751, 800); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitDurable(800, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := w.durableIndex(); d != 750 {
		t.Fatalf("durable index %d after a cut at 751 and a wait, want 750", d)
	}
	if err := w.StoreLogs(walEntries(751, 900)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if d := w.durableIndex(); d != 900 {
		t.Fatalf("durable index %d after close, want 900", d)
	}
	if err := w.WaitDurable(900, time.Second); err != nil {
		t.Fatalf("wait after close: %v", err)
	}
	w2, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	checkRange(t, w2, 1, 900)
}

// Concurrent appends and waiters: every wait returns with its entry durable.
func TestWALDeferredSyncConcurrent(t *testing.T) {
	w, err := openWAL(t.TempDir(), 1<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.setDeferSync(time.Hour)
	var mu sync.Mutex // raft appends from one goroutine at a time
	next := uint64(1)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				mu.Lock()
				i := next
				next++
				err := w.StoreLogs(walEntries(i, i))
				mu.Unlock()
				if err != nil {
					errs <- err
					return
				}
				if err := w.WaitDurable(i, 10*time.Second); err != nil {
					errs <- err
					return
				}
				if d := w.durableIndex(); d < i {
					errs <- fmt.Errorf("entry %d not durable after its wait (durable %d)", i, d)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A second sync may start while one runs; it must flush the running one's
// segments too, because it may finish first and then claims everything
// written before it started. At most maxSyncs run at once.
func TestWALOverlappingSyncs(t *testing.T) {
	const seg = 16 << 10
	// Find the first entry that no longer fits the first segment.
	scratch, err := openWAL(t.TempDir(), seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	j := uint64(1)
	for ; len(scratch.mu.segs) < 2; j++ {
		if err := scratch.StoreLogs(walEntries(j, j)); err != nil {
			t.Fatal(err)
		}
	}
	j-- // entry j opened the second segment
	scratch.Close()

	w, err := openWAL(t.TempDir(), seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.setDeferSync(time.Hour)

	var mu sync.Mutex
	var calls []string // segment of each fdatasync, in order
	running, most := 0, 0
	first := true
	blocked := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) }) // before w.Close, also on failure
	w.syncSegment = func(s *segment) error {
		mu.Lock()
		calls = append(calls, s.path)
		running++
		most = max(most, running)
		block := first
		first = false
		mu.Unlock()
		if block {
			close(blocked)
			<-release
		}
		err := fdatasyncSegment(s)
		mu.Lock()
		running--
		mu.Unlock()
		return err
	}
	if err := w.StoreLogs(walEntries(1, j-1)); err != nil {
		t.Fatal(err)
	}
	firstSeg := w.mu.segs[0].path
	waitA := make(chan error, 1)
	go func() { waitA <- w.WaitDurable(j-1, 20*time.Second) }()
	<-blocked // sync 1 is inside its fdatasync of the first segment

	// Written only to the second segment, while sync 1 still runs.
	if err := w.StoreLogs(walEntries(j, j+50)); err != nil {
		t.Fatal(err)
	}
	if n := len(w.mu.segs); n != 2 {
		t.Fatalf("%d segments, want 2", n)
	}
	if err := w.WaitDurable(j+50, 20*time.Second); err != nil {
		t.Fatalf("second wait while the first sync hangs: %v", err)
	}
	if d := w.durableIndex(); d < j+50 {
		t.Fatalf("durable index %d after the second sync, want %d", d, j+50)
	}
	mu.Lock()
	second := append([]string(nil), calls[1:]...)
	mu.Unlock()
	found := false
	for _, p := range second {
		found = found || p == firstSeg
	}
	if !found {
		t.Fatalf("the second sync flushed %v, not the first segment %s that the still running first sync had taken", second, firstSeg)
	}
	select {
	case err := <-waitA:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiter of the first segment's entries not released by the second sync")
	}
	releaseOnce.Do(func() { close(release) })

	// Many waiters at once: never more than maxSyncs fdatasyncs together.
	next := j + 51
	var wg sync.WaitGroup
	for k := 0; k < 8; k++ {
		if err := w.StoreLogs(walEntries(next, next+9)); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(i uint64) {
			defer wg.Done()
			if err := w.WaitDurable(i, 20*time.Second); err != nil {
				t.Error(err)
			}
		}(next + 9)
		next += 10
	}
	wg.Wait()
	if d := w.durableIndex(); d < next-1 {
		t.Fatalf("durable index %d, want %d", d, next-1)
	}
	mu.Lock()
	defer mu.Unlock()
	if most > maxSyncs {
		t.Fatalf("%d fdatasyncs ran at once, limit %d", most, maxSyncs)
	}
}

// A sync that finished its fdatasyncs before two tail cuts and publishes
// after them claims only what the lower cut kept: the entries rewritten
// after the first cut were not in its fdatasyncs, and the second cut's
// sync flushed another segment. (The cut handling remembered the latest
// cut only and published the sync's whole target; on a follower a machine
// crash could then lose entries counted durable. The window is a syncer
// stalled between its fdatasyncs and the publication; afterSyncs holds it
// there.)
func TestWALSyncAnswerAfterTwoCuts(t *testing.T) {
	w, err := openWAL(t.TempDir(), 16<<10, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.setDeferSync(time.Hour) // nothing syncs but what the test starts
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	first := true
	w.afterSyncs = func() {
		if first { // the sync of 1..b, held after its fdatasyncs
			first = false
			close(reached)
			<-release
		}
	}
	segOf := func(i uint64) *segment {
		w.mu.RLock()
		defer w.mu.RUnlock()
		s, _, _, ok := w.locateLocked(i)
		if !ok {
			t.Fatalf("entry %d not in the log", i)
		}
		return s
	}
	// Entries 1..b over two segments; b is the last of the second.
	b := uint64(1)
	for ; len(w.mu.segs) < 3; b++ {
		if err := w.StoreLogs(stressEntries(b, b, 1)); err != nil {
			t.Fatal(err)
		}
	}
	b -= 2 // entry b+1 opened the third segment: cut it
	if err := w.DeleteRange(b+1, b+1); err != nil {
		t.Fatal(err)
	}
	a := b
	for segOf(a) == segOf(b) {
		a--
	}
	// A sync of 1..b with nobody waiting (a hot append starts it), held
	// after its fdatasyncs.
	w.ds.Lock()
	w.ds.lastWait = time.Now()
	w.ds.Unlock()
	if err := w.StoreLogs(stressEntries(b+1, b+1, 1)); err != nil {
		t.Fatal(err)
	}
	target := b + 1
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the hot append started no sync")
	}
	w.ds.Lock()
	w.ds.lastWait = time.Time{} // what follows starts no sync
	w.ds.Unlock()
	// A follower's first cut in the first segment, the rewrite in a newer
	// term past the held sync's target into new segments, a second cut
	// above that target in a segment the rewrite reached later.
	c1 := a - 5
	if err := w.DeleteRange(c1, target); err != nil {
		t.Fatal(err)
	}
	last := target + 400
	if err := w.StoreLogs(stressEntries(c1, last, 2)); err != nil {
		t.Fatal(err)
	}
	c2 := last - 10
	if segOf(c2) == segOf(c1) || segOf(c2) == segOf(target) {
		t.Fatalf("the second cut at %d is in the segment of %d or %d: the test's layout went wrong", c2, c1, target)
	}
	if err := w.DeleteRange(c2, last); err != nil {
		t.Fatal(err)
	}
	once.Do(func() { close(release) })
	if !syncsRunning(w, 0) {
		t.Fatal("the released sync did not end")
	}
	if d := w.durableIndex(); d >= c1 {
		t.Fatalf("durable index %d: entries %d..%d, rewritten after the sync's fdatasyncs, are counted durable", d, c1, min(d, target))
	}
	if err := w.WaitDurable(target, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// The log knows every entry's term without reading it: after appends
// across segments, a restart and a tail cut rewritten in a newer term.
func TestWALTerms(t *testing.T) {
	dir := t.TempDir()
	const seg = 16 << 10
	w, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	check := func(w *wal, from, to uint64, term func(uint64) uint64) {
		t.Helper()
		for i := from; i <= to; i++ {
			got, ok := w.termOf(i)
			if !ok || got != term(i) {
				t.Fatalf("term of %d: %d, %v; want %d", i, got, ok, term(i))
			}
		}
	}
	orig := func(i uint64) uint64 { return 1 + i/100 }
	if err := w.StoreLogs(walEntries(1, 350)); err != nil {
		t.Fatal(err)
	}
	check(w, 1, 350, orig)
	if _, ok := w.termOf(351); ok {
		t.Fatal("term of an entry past the end")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w, err = openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	check(w, 1, 350, orig)
	// A follower's conflicting suffix: cut 250.. and append term 9 there.
	if err := w.DeleteRange(250, 350); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.termOf(250); ok {
		t.Fatal("term of a cut entry")
	}
	var logs []*raft.Log
	for i := uint64(250); i <= 260; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 9, Type: raft.LogCommand})
	}
	if err := w.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	check(w, 1, 249, orig)
	check(w, 250, 260, func(uint64) uint64 { return 9 })
	// Head truncation: compacted entries have no term here.
	if err := w.DeleteRange(1, 120); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.termOf(120); ok {
		t.Fatal("term of a compacted entry")
	}
	check(w, 121, 249, orig)
}

// A waiter whose caller gives up returns at once, not when the (hanging)
// sync ends or the timeout expires; one that was satisfied meanwhile
// reports success.
func TestWALWaitCancelled(t *testing.T) {
	w, err := openWAL(t.TempDir(), 1<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.setDeferSync(time.Hour)
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	w.syncSegment = func(s *segment) error { <-release; return fdatasyncSegment(s) }
	if err := w.StoreLogs(walEntries(1, 5)); err != nil {
		t.Fatal(err)
	}
	cancel := make(chan struct{})
	res := make(chan error, 1)
	go func() { res <- w.waitDurable(cancel, 5, time.Minute) }()
	time.Sleep(20 * time.Millisecond) // the sync is stuck in syncSegment
	close(cancel)
	select {
	case err := <-res:
		if !errors.Is(err, errWaitCancelled) {
			t.Fatalf("cancelled wait: %v, want errWaitCancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled wait did not return")
	}
	once.Do(func() { close(release) })
	if err := w.waitDurable(cancel, 5, 10*time.Second); err != nil && !errors.Is(err, errWaitCancelled) {
		t.Fatal(err)
	}
	if err := w.WaitDurable(5, 10*time.Second); err != nil {
		t.Fatalf("wait after the sync was released: %v", err)
	}
}

// syncsRunning waits (10 s at most) until n syncs run; false if they never
// do.
func syncsRunning(w *wal, n int) bool {
	for deadline := time.Now().Add(10 * time.Second); ; {
		w.ds.Lock()
		k := len(w.ds.runs)
		w.ds.Unlock()
		if k == n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// holdNextSync makes the next fdatasync of w's syncer wait until the
// channel last given to hold is closed.
func holdNextSync(w *wal) (hold func(release chan struct{})) {
	var mu sync.Mutex
	var next chan struct{}
	w.syncSegment = func(s *segment) error {
		mu.Lock()
		ch := next
		next = nil
		mu.Unlock()
		if ch != nil {
			<-ch
		}
		return fdatasyncSegment(s)
	}
	return func(ch chan struct{}) {
		mu.Lock()
		next = ch
		mu.Unlock()
	}
}

// Moments after a durability wait (a workload of closes), an append with no
// sync running starts one at once, so that the next wait finds it done;
// with a sync running it does not start a second; long after the last
// wait an append waits for the sync delay.
func TestWALSyncStartsEarlyWhileWaitsAreFrequent(t *testing.T) {
	w, err := openWAL(t.TempDir(), 1<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	hold := holdNextSync(w)
	defer w.Close()
	w.setDeferSync(time.Hour) // nothing syncs by the delay during the test
	durableBy := func(want uint64, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for w.durableIndex() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: durable index %d, want %d", what, w.durableIndex(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	hot := func() {
		w.ds.Lock()
		w.ds.lastWait = time.Now()
		w.ds.Unlock()
	}

	if err := w.StoreLogs(walEntries(1, 10)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if d := w.durableIndex(); d != 0 {
		t.Fatalf("durable index %d with nobody waiting lately (sync delay one hour)", d)
	}
	if err := w.WaitDurable(10, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	hot()
	if err := w.StoreLogs(walEntries(11, 20)); err != nil {
		t.Fatal(err)
	}
	durableBy(20, "an append right after a wait, no sync running")

	// A sync running (held in syncSegment): the next hot append leaves its
	// entries for the next wait.
	ch := make(chan struct{})
	hold(ch)
	hot()
	if err := w.StoreLogs(walEntries(21, 30)); err != nil {
		t.Fatal(err)
	}
	if !syncsRunning(w, 1) { // the sync of 21..30 starts and is held
		close(ch)
		t.Fatal("an append right after a wait started no sync")
	}
	hot()
	if err := w.StoreLogs(walEntries(31, 40)); err != nil {
		t.Fatal(err)
	}
	close(ch)
	durableBy(30, "the held sync")
	time.Sleep(50 * time.Millisecond)
	if d := w.durableIndex(); d != 30 {
		t.Fatalf("durable index %d: an append made while a sync ran started another", d)
	}
	if err := w.WaitDurable(40, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// The eager window counts from the answer to a wait, not from its start:
// a sync slower than the window (a loaded disk) must not leave the append
// that follows the answer at once to the sync delay. TestMetaBarriers met
// this: the barrier's fdatasync took 43 ms, and the create after it waited
// for the test cluster's hour-long delay.
func TestWALEagerWindowFromAnswer(t *testing.T) {
	w, err := openWAL(t.TempDir(), 1<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	hold := holdNextSync(w)
	w.setDeferSync(time.Hour) // only the eager path can sync without a waiter
	next := uint64(1)
	// An append that comes later than the window after the answer proves
	// nothing (the machine stalled): try again, a few times.
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Skip("every append came more than the eager window after its wait's answer")
		}
		if err := w.StoreLogs(walEntries(next, next+9)); err != nil {
			t.Fatal(err)
		}
		ch := make(chan struct{})
		hold(ch)
		waited := make(chan error, 1)
		go func(i uint64) { waited <- w.WaitDurable(i, 10*time.Second) }(next + 9)
		time.Sleep(3 * eagerWindow) // the sync is held past the window
		close(ch)
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		answered := time.Now()
		next += 10
		if err := w.StoreLogs(walEntries(next, next+9)); err != nil {
			t.Fatal(err)
		}
		if time.Since(answered) >= eagerWindow/2 {
			if err := w.WaitDurable(next+9, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			next += 10
			continue
		}
		want := next + 9
		next += 10
		deadline := time.Now().Add(2 * time.Second)
		for w.durableIndex() < want {
			if time.Now().After(deadline) {
				t.Fatalf("durable index %d: the append right after a wait's answer started no sync (sync delay one hour)", w.durableIndex())
			}
			time.Sleep(time.Millisecond)
		}
		return
	}
}

// A log whose appends fail, or whose sync failed, says so in health; a
// healthy one says nothing.
func TestWALHealth(t *testing.T) {
	defer func(h time.Duration) { healthWindow = h }(healthWindow)
	healthWindow = 200 * time.Millisecond
	dir := t.TempDir()
	const seg = 16 << 10
	w, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.StoreLogs(walEntries(1, 10)); err != nil {
		t.Fatal(err)
	}
	if err := w.health(); err != nil {
		t.Fatalf("healthy log: %v", err)
	}

	// The directory vanishes: the next segment cannot be made.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	var appendErr error
	for i := uint64(11); i < 2000 && appendErr == nil; i += 10 {
		appendErr = w.StoreLogs(walEntries(i, i+9))
	}
	if appendErr == nil {
		t.Fatal("appends into a removed directory kept succeeding")
	}
	h := w.health()
	if h == nil || !strings.Contains(h.Error(), "append failed") || !strings.Contains(h.Error(), appendErr.Error()) {
		t.Fatalf("health after a failed append: %v (append: %v)", h, appendErr)
	}
	time.Sleep(2 * healthWindow)
	if h := w.health(); h != nil {
		t.Fatalf("a failed append older than the window is still reported: %v", h)
	}
}

// A failed fdatasync stops the log for good, and health keeps saying so.
func TestWALHealthAfterFailedSync(t *testing.T) {
	w, err := openWAL(t.TempDir(), 1<<20, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	w.setDeferSync(time.Hour)
	if err := w.StoreLogs(walEntries(1, 5)); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.syncSegment = func(s *segment) error { s.f.Close(); return fdatasyncSegment(s) } // EBADF
	if err := w.WaitDurable(5, 10*time.Second); err == nil {
		t.Fatal("wait for a sync that failed succeeded")
	}
	h := w.health()
	if h == nil || !strings.Contains(h.Error(), "no longer be made durable") {
		t.Fatalf("health after a failed sync: %v", h)
	}
}

// syncModel keeps, per segment, the content that the deferred syncer's
// fdatasyncs have made durable: a copy of the file taken before each
// fdatasync, kept once it returns (the newest copy wins). What a crash of
// the machine leaves of a segment includes that copy.
type syncModel struct {
	mu     sync.Mutex
	copies int
	segs   map[*segment]syncedCopy
}

type syncedCopy struct {
	n int // order of the copies
	b []byte
}

// sync is the wal's syncSegment.
func (m *syncModel) sync(s *segment) error {
	b := make([]byte, s.size)
	m.mu.Lock() // copies are numbered in the order they are read
	m.copies++
	n := m.copies
	_, err := s.f.ReadAt(b, 0)
	m.mu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := fdatasyncSegment(s); err != nil {
		return err
	}
	m.mu.Lock()
	if c, ok := m.segs[s]; !ok || c.n < n {
		m.segs[s] = syncedCopy{n, b}
	}
	m.mu.Unlock()
	return nil
}

// check fails unless entry index, as appended in term, is in the synced
// copy of the segment that holds it.
func (m *syncModel) check(w *wal, index, term uint64) error {
	w.mu.RLock()
	s, _, _, ok := w.locateLocked(index)
	w.mu.RUnlock()
	if !ok {
		return fmt.Errorf("entry %d is not in the log", index)
	}
	m.mu.Lock()
	b := m.segs[s].b
	m.mu.Unlock()
	var l raft.Log
	for off := int64(walHeaderBytes); off+walRecordHead <= int64(len(b)); {
		n := int64(binary.LittleEndian.Uint32(b[off:]))
		if n == 0 || off+walRecordHead+n > int64(len(b)) {
			break
		}
		payload := b[off+walRecordHead : off+walRecordHead+n]
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(b[off+4:]) {
			break
		}
		idx, err := decodeRecord(payload, &l)
		if err != nil {
			break
		}
		if idx == index {
			if l.Term != term || !bytes.Equal(l.Data, stressData(index, term)) {
				return fmt.Errorf("entry %d of term %d: the synced copy of %s holds the entry of term %d", index, term, s.path, l.Term)
			}
			return nil
		}
		off += walRecordHead + n
	}
	return fmt.Errorf("entry %d of term %d is in no finished fdatasync of %s", index, term, s.path)
}

func stressData(index, term uint64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, index)
	b = binary.LittleEndian.AppendUint64(b, term)
	return append(b, bytes.Repeat([]byte{byte(term)}, int(index*7+term)%200)...)
}

func stressEntries(from, to, term uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: stressData(i, term)})
	}
	return out
}

// The deferred syncer under stress: batches appended one at a time (as
// raft appends) from several goroutines, some waiting for durability and
// most not, random pauses in the appenders, around each fdatasync and
// before a sync publishes, a follower's tail cuts (now and then two
// conflicting appends in a row) and snapshot head cuts. Every appended
// entry becomes durable by itself (liveness: the sync delay is 5 ms; the
// bound is 2 s only because the machine is shared), no wait returns
// before a finished fdatasync covered the entry as it is in the log now,
// and the durable index never runs ahead of the finished fdatasyncs.
func TestWALSyncStress(t *testing.T) {
	const (
		segSize   = 16 << 10 // small: rotations all the time
		appenders = 6
		run       = 1500 * time.Millisecond
		bound     = 2 * time.Second
	)
	w, err := openWAL(t.TempDir(), segSize, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	pause := func(one int, most time.Duration) {
		if rand.IntN(one) == 0 {
			time.Sleep(rand.N(most))
		}
	}
	m := &syncModel{segs: make(map[*segment]syncedCopy)}
	w.syncSegment = func(s *segment) error {
		pause(4, 3*time.Millisecond)
		err := m.sync(s)
		pause(4, 3*time.Millisecond)
		return err
	}
	w.afterSyncs = func() { pause(4, 3*time.Millisecond) } // cuts may come in here
	w.setDeferSync(5 * time.Millisecond)

	type appended struct {
		last uint64
		at   time.Time
	}
	var (
		failed atomic.Bool
		// cutMu is held shared from an append that is waited for to its
		// check, and exclusively by cuts.
		cutMu    sync.RWMutex
		appendMu sync.Mutex // one append at a time; guards what follows
		next     = uint64(1)
		term     = uint64(1)
		pending  []appended // batches not yet seen durable, in order
		waits    atomic.Int64
		cuts     int
	)
	fail := func(format string, a ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, a...)
		}
	}
	appendLocked := func(n uint64) error {
		if err := w.StoreLogs(stressEntries(next, next+n-1, term)); err != nil {
			return err
		}
		next += n
		pending = append(pending, appended{next - 1, time.Now()})
		return nil
	}
	appendBatch := func() (last, tm uint64, err error) {
		appendMu.Lock()
		defer appendMu.Unlock()
		if err := appendLocked(1 + uint64(rand.IntN(20))); err != nil {
			return 0, 0, err
		}
		return next - 1, term, nil
	}
	cutTail := func(c uint64) error {
		if err := w.DeleteRange(c, next-1); err != nil {
			return err
		}
		next, term = c, term+1
		cuts++
		for i := range pending {
			pending[i].last = min(pending[i].last, c-1)
		}
		return nil
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range appenders {
		wg.Go(func() {
			for time.Since(start) < run && !failed.Load() {
				if rand.IntN(4) == 0 {
					cutMu.RLock()
					last, tm, err := appendBatch()
					if err == nil {
						waits.Add(1)
						if err = w.WaitDurable(last, bound); err == nil {
							err = m.check(w, last, tm)
						}
					}
					cutMu.RUnlock()
					if err != nil {
						fail("append and wait: %v", err)
					}
				} else if _, _, err := appendBatch(); err != nil {
					fail("append: %v", err)
				}
				// Mostly short pauses, now and then one past the sync
				// delay and the eager window.
				if rand.IntN(10) == 0 {
					time.Sleep(5*time.Millisecond + rand.N(15*time.Millisecond))
				} else {
					pause(2, 2*time.Millisecond)
				}
			}
		})
	}
	wg.Go(func() { // cuts, as a follower and after snapshots
		for time.Since(start) < run && !failed.Load() {
			time.Sleep(5*time.Millisecond + rand.N(20*time.Millisecond))
			cutMu.Lock()
			appendMu.Lock()
			first, _ := w.FirstIndex()
			last, _ := w.LastIndex()
			var err error
			switch {
			case last-first > 3000:
				err = w.DeleteRange(first, last-1000)
			case last > first+50:
				// Now and then two conflicting appends in a row: cut,
				// append, cut within what was appended.
				c := last - uint64(rand.IntN(40))
				err = cutTail(c)
				if k := 10 + uint64(rand.IntN(50)); err == nil && rand.IntN(2) == 0 {
					if err = appendLocked(k); err == nil {
						err = cutTail(c + 1 + uint64(rand.IntN(int(k))))
					}
				}
			}
			appendMu.Unlock()
			cutMu.Unlock()
			if err != nil {
				fail("cut: %v", err)
			}
		}
	})
	// Liveness: nobody needs to wait for an entry to become durable. And
	// the durable index is never ahead of the finished fdatasyncs: the
	// last entries up to it are in the synced copies as they are now.
	stopped := make(chan struct{})
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		var seen uint64
		for {
			appendMu.Lock()
			d := w.durableIndex()
			if d != seen {
				seen = d
				first, _ := w.FirstIndex()
				for i := max(first, d-min(d, 20)+1); i <= d && !failed.Load(); i++ {
					var l raft.Log
					err := w.GetLog(i, &l)
					if err == nil {
						err = m.check(w, i, l.Term)
					}
					if err != nil {
						fail("durable index %d: %v", d, err)
					}
				}
			}
			for len(pending) > 0 && pending[0].last <= d {
				pending = pending[1:]
			}
			var late appended
			if len(pending) > 0 && time.Since(pending[0].at) > bound {
				late = pending[0]
			}
			appendMu.Unlock()
			if late.last != 0 {
				w.ds.Lock()
				fail("entry %d appended %v ago is not durable (durable %d, written %d, syncs running %d, armed %v)",
					late.last, time.Since(late.at).Round(time.Millisecond), w.ds.synced, w.ds.written, len(w.ds.runs), w.ds.armed)
				w.ds.Unlock()
				return
			}
			select {
			case <-stopped:
				appendMu.Lock()
				n := len(pending)
				appendMu.Unlock()
				if n == 0 {
					return
				}
			default:
			}
			time.Sleep(time.Millisecond)
		}
	}()
	wg.Wait()
	close(stopped)
	<-checked
	m.mu.Lock()
	copies := m.copies
	m.mu.Unlock()
	t.Logf("%d entries appended, %d waits, %d tail cuts, %d fdatasyncs", next-1, waits.Load(), cuts, copies)
	if !failed.Load() && (waits.Load() == 0 || cuts == 0) {
		t.Fatalf("the stress did not stress: %d waits, %d tail cuts", waits.Load(), cuts)
	}
}

// A tail cut exactly at the last segment's first entry leaves that segment
// empty. Every entry before it must still be found (the search over the
// segments once skipped past the empty one and answered "not found" for
// the entries of the segment before it: TestWALSyncStress saw this in a CI
// run), and so after an append that cannot use the empty segment (an
// outsized entry: a new segment takes its place), after a head cut and
// across a restart.
func TestWALCutAtSegmentStart(t *testing.T) {
	dir := t.TempDir()
	const seg = 4 << 10
	w, last := walTwoSegments(t, dir, seg)
	defer func() { w.Close() }()
	var err error
	c := w.mu.segs[1].first // the last segment's first entry
	if err := w.DeleteRange(c, last); err != nil {
		t.Fatal(err)
	}
	checkRange(t, w, 1, c-1)
	if term, ok := w.termOf(c - 1); !ok || term != walEntries(c-1, c-1)[0].Term {
		t.Fatalf("term of %d: %d, %v", c-1, term, ok)
	}
	// An entry larger than a segment: it goes into a segment of its own.
	big := &raft.Log{Index: c, Term: 9, Type: raft.LogCommand, Data: bytes.Repeat([]byte{7}, 2*seg)}
	if err := w.StoreLogs([]*raft.Log{big}); err != nil {
		t.Fatal(err)
	}
	checkBig := func() {
		t.Helper()
		var got raft.Log
		if err := w.GetLog(c, &got); err != nil || got.Term != 9 || !bytes.Equal(got.Data, big.Data) {
			t.Fatalf("GetLog(%d): term %d, %d bytes, %v", c, got.Term, len(got.Data), err)
		}
	}
	checkBig()
	for i := uint64(1); i < c; i++ {
		var got raft.Log
		if err := w.GetLog(i, &got); err != nil {
			t.Fatalf("after the outsized append: GetLog(%d): %v", i, err)
		}
	}
	// The head cut removes the first segment only; the outsized entry's
	// file stays.
	if err := w.DeleteRange(1, w.mu.segs[0].first+uint64(len(w.mu.segs[0].offs))-1); err != nil {
		t.Fatal(err)
	}
	first, _ := w.FirstIndex()
	checkBig()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w, err = openWAL(dir, seg, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if f, _ := w.FirstIndex(); f != first {
		t.Fatalf("first %d after the restart, want %d", f, first)
	}
	if l, _ := w.LastIndex(); l != c {
		t.Fatalf("last %d after the restart, want %d", l, c)
	}
	checkBig()
	for i := first; i < c; i++ {
		var got raft.Log
		if err := w.GetLog(i, &got); err != nil {
			t.Fatalf("after the restart: GetLog(%d): %v", i, err)
		}
	}
}

// Recovery drops a segment file that holds no entry between two that do
// (left by a crash between a rotation past an emptied segment and its
// removal); kept, it made the entries before it not found.
func TestWALRecoverEmptySegmentBetween(t *testing.T) {
	dir := t.TempDir()
	const seg = 4 << 10
	w, last := walTwoSegments(t, dir, seg)
	second := w.mu.segs[1].base
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, seg)
	f, err := os.Open(filepath.Join(dir, segName(1)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(hdr[:walHeaderBytes], 0)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, segName(second-1))
	if err := os.WriteFile(empty, hdr, 0o600); err != nil {
		t.Fatal(err)
	}
	if w, err = openWAL(dir, seg, slog.Default()); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	checkRange(t, w, 1, last)
	if _, err := os.Stat(empty); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the empty segment is still there: %v", err)
	}
}

// walTwoSegments opens a log in dir and appends entries one at a time
// until the second segment holds one; last is the last entry.
func walTwoSegments(t *testing.T, dir string, seg int64) (w *wal, last uint64) {
	t.Helper()
	w, err := openWAL(dir, seg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	for len(w.mu.segs) < 2 {
		last++
		if err := w.StoreLogs(walEntries(last, last)); err != nil {
			w.Close()
			t.Fatal(err)
		}
	}
	return w, last
}

// A cut that removes segment files syncs the directory before it returns,
// after the removals: a machine crash must not bring the files back (a
// tail's would make recovery refuse the log; a whole log's would hold
// entries raft dropped).
func TestWALCutRemovalsSynced(t *testing.T) {
	for _, whole := range []bool{false, true} {
		w, last := walTwoSegments(t, t.TempDir(), 16<<10)
		second := w.mu.segs[1].path
		var synced [][]string
		w.removedSynced = func(names []string) { synced = append(synced, names) }
		from := uint64(2) // inside the first segment: the second one goes
		if whole {
			from = 1
		}
		if err := w.DeleteRange(from, last); err != nil {
			t.Fatal(err)
		}
		if len(synced) != 1 {
			t.Fatalf("whole=%v: %d directory syncs after the removals, want 1", whole, len(synced))
		}
		if slices.Contains(synced[0], filepath.Base(second)) {
			t.Fatalf("whole=%v: the directory was synced with %s still there", whole, second)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
