package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get([]byte("a")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get absent: %v", err)
	}
	b := s.NewBatch()
	for i := 0; i < 10; i++ {
		b.Set([]byte(fmt.Sprintf("k%d", i)), []byte{byte(i)})
	}
	// an indexed batch reads its own writes
	if v, err := b.Get([]byte("k3")); err != nil || v[0] != 3 {
		t.Fatalf("batch read-your-writes: %v %v", v, err)
	}
	b.Delete([]byte("k5"))
	b.DeleteRange([]byte("k7"), []byte("k9"))
	if b.Count() != 12 {
		t.Fatalf("count %d", b.Count())
	}
	if err := b.Apply(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	snap := s.NewSnapshot()
	b = s.NewBatch()
	b.Set([]byte("k0"), []byte("new"))
	b.Apply(false)
	b.Close()
	if v, _ := snap.Get([]byte("k0")); string(v) != "\x00" {
		t.Fatalf("snapshot sees later write: %q", v)
	}
	snap.Close()
	it, err := s.NewIter([]byte("k"), PrefixEnd([]byte("k")))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, string(it.Key()))
	}
	it.Close()
	if fmt.Sprint(keys) != "[k0 k1 k2 k3 k4 k6 k9]" {
		t.Fatalf("keys %v", keys)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "cp")
	if err := s.Checkpoint(cp); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, cp} {
		s2, err := Open(d, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := s2.Get([]byte("k0")); err != nil || string(v) != "new" {
			t.Fatalf("%s after reopen: %q %v", d, v, err)
		}
		s2.Close()
	}
}

func TestPrefixEnd(t *testing.T) {
	for in, want := range map[string]string{"a": "b", "a\xff": "b", "\xff\xff": ""} {
		if got := string(PrefixEnd([]byte(in))); got != want {
			t.Errorf("PrefixEnd(%q) = %q, want %q", in, got, want)
		}
	}
}

// Without its own WAL the store persists through flushes only: the hook
// runs before each flush writes, Close flushes, and what was applied is
// there after a reopen.
func TestNoWALFlushHook(t *testing.T) {
	dir := t.TempDir()
	var hooks atomic.Int32
	s, err := Open(dir, Options{NoWAL: true, BeforeFlush: func() { hooks.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	b.Set([]byte("a"), []byte("1"))
	if err := b.Apply(false); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if hooks.Load() == 0 {
		t.Fatal("flush ran without the BeforeFlush hook")
	}
	n := hooks.Load()
	b = s.NewBatch()
	b.Set([]byte("b"), []byte("2"))
	if err := b.Apply(true); err != nil { // durable: a flush, as there is no log
		t.Fatalf("Apply(true) without a WAL: %v", err)
	}
	b.Close()
	if hooks.Load() == n {
		t.Fatal("Apply(true) without a WAL did not flush")
	}
	b = s.NewBatch()
	b.Set([]byte("c"), []byte("3"))
	if err := b.Apply(false); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := s.Close(); err != nil { // flushes "c"
		t.Fatal(err)
	}
	s, err = Open(dir, Options{NoWAL: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for k, want := range map[string]string{"a": "1", "b": "2", "c": "3"} {
		v, err := s.Get([]byte(k))
		if err != nil || string(v) != want {
			t.Fatalf("%s = %q, %v after reopen; want %q", k, v, err, want)
		}
	}
}

// Pebble charges memtables to the block cache: a cache no larger than two
// memtables left no room for table blocks once the memtable filled, and
// every read of a flushed key went to the file. Reads of flushed keys must
// be served from the cache.
func TestBlockCacheSurvivesFullMemtables(t *testing.T) {
	s, err := Open(t.TempDir(), Options{NoWAL: true, MemTableBytes: 4 << 20, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := func(i int) []byte { return binary.BigEndian.AppendUint64([]byte{'k'}, uint64(i)) }
	val := make([]byte, 200)
	const n = 60000 // ~13 MiB: several memtables, flushed
	for i := 0; i < n; i += 500 {
		b := s.NewBatch()
		for j := i; j < i+500; j++ {
			if err := b.Set(key(j), val); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Apply(false); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// Fill the memtable again, as a busy metadata service has it.
	for i := n; i < n+15000; i++ {
		b := s.NewBatch()
		b.Set(key(i), val)
		b.Apply(false)
		b.Close()
	}
	db := s.(*pebblekv).db
	m0 := db.Metrics().BlockCache
	for round := 0; round < 20; round++ {
		for i := 0; i < 2000; i += 37 {
			if _, err := s.Get(key(i)); err != nil {
				t.Fatalf("get %d: %v", i, err)
			}
		}
	}
	m1 := db.Metrics().BlockCache
	hits, misses := m1.Hits-m0.Hits, m1.Misses-m0.Misses
	if hits < 10*misses {
		t.Fatalf("block cache: %d hits, %d misses over repeated reads of flushed keys (cache holds %d bytes)", hits, misses, m1.Size)
	}
}

// A flush that keeps failing — the store's directory vanished, as with a
// dead disk — returns the error instead of waiting forever (a shutdown
// used to hang there), the engine's endless retries log one line rather
// than thousands a second, and Close returns.
func TestFailingFlushGivesUp(t *testing.T) {
	defer func(g, l time.Duration) { flushGiveUp, bgLogEvery = g, l }(flushGiveUp, bgLogEvery)
	flushGiveUp, bgLogEvery = 300*time.Millisecond, time.Hour
	var lines atomic.Int64
	dir := filepath.Join(t.TempDir(), "kv")
	s, err := Open(dir, Options{NoWAL: true, Logger: slog.New(&countHandler{n: &lines})})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := 0; i < 1000; i++ {
		b.Set([]byte(fmt.Sprintf("k%04d", i)), []byte("value"))
	}
	if err := b.Apply(false); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := s.Health(); err != nil {
		t.Fatalf("healthy store reports %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	err = s.Flush()
	if err == nil || !strings.Contains(err.Error(), "failing") {
		t.Fatalf("flush into a vanished directory: %v, want an error saying it keeps failing", err)
	}
	if n := lines.Load(); n != 1 {
		t.Fatalf("%d log lines about background errors, want 1", n)
	}
	if h := s.Health(); h == nil || !strings.Contains(h.Error(), dir) || !strings.Contains(h.Error(), "background errors") {
		t.Fatalf("health of a store whose flush keeps failing: %v, want the error naming %s", h, dir)
	}
	// A second flush while the failures go on gives up without waiting
	// another full period (Close after a failed snapshot).
	pk := s.(*pebblekv)
	pk.giveUp = 2 * time.Second
	time.Sleep(pk.giveUp + 100*time.Millisecond) // the engine keeps retrying meanwhile
	t0 := time.Now()
	if err := s.Flush(); err == nil {
		t.Fatal("second flush into a vanished directory succeeded")
	}
	if d := time.Since(t0); d >= pk.giveUp {
		t.Fatalf("second flush waited %v: the failures had lasted longer than the give-up period already", d)
	}
	if err := s.Close(); err == nil {
		t.Fatal("close of a store whose flush fails reported success")
	}
}

func TestHealthForgetsOldErrors(t *testing.T) {
	defer func(w time.Duration) { bgHealthWindow = w }(bgHealthWindow)
	bgHealthWindow = 50 * time.Millisecond
	b := &bgErrors{log: slog.New(&countHandler{n: new(atomic.Int64)}), logEvery: bgLogEvery, runGap: bgRunGap}
	if err := b.health("d"); err != nil {
		t.Fatalf("no errors yet: %v", err)
	}
	b.note(syscall.ENOSPC)
	b.note(syscall.ENOSPC)
	err := b.health("d")
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "2 background errors") {
		t.Fatalf("after two errors: %v", err)
	}
	time.Sleep(2 * bgHealthWindow)
	if err := b.health("d"); err != nil {
		t.Fatalf("errors older than the window still reported: %v", err)
	}
}

// countHandler counts the records about background errors.
type countHandler struct{ n *atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "background error") {
		h.n.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// With its directory gone the engine cannot flush, memtables fill and
// writes stall — and so does starting a flush. Flush still gives up
// within its bound rather than wait forever (a full metadata disk made
// strata up hang at stop).
func TestFlushGivesUpInWriteStall(t *testing.T) {
	defer func(g, l time.Duration) { flushGiveUp, bgLogEvery = g, l }(flushGiveUp, bgLogEvery)
	flushGiveUp, bgLogEvery = 300*time.Millisecond, time.Hour
	dir := filepath.Join(t.TempDir(), "kv")
	s, err := Open(dir, Options{NoWAL: true, MemTableBytes: 1 << 20, Logger: slog.New(&countHandler{n: new(atomic.Int64)})})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	// Write until a batch blocks (the stall), bounded in count and time.
	stalled := make(chan struct{})
	go func() {
		val := make([]byte, 4096)
		for i := 0; i < 20000; i++ {
			b := s.NewBatch()
			for j := 0; j < 16; j++ {
				b.Set([]byte(fmt.Sprintf("k%06d-%02d", i, j)), val)
			}
			applied := make(chan struct{})
			go func() {
				select {
				case <-applied:
				case <-time.After(2 * time.Second):
					close(stalled)
				}
			}()
			b.Apply(false)
			close(applied)
			b.Close()
			select {
			case <-stalled:
				return
			default:
			}
		}
	}()
	select {
	case <-stalled:
	case <-time.After(60 * time.Second):
		t.Skip("writes never stalled (the engine kept room); nothing to check")
	}
	for _, op := range []struct {
		name string
		f    func() error
	}{{"Flush", s.Flush}, {"Close", s.Close}} {
		res := make(chan error, 1)
		go func() { res <- op.f() }()
		select {
		case err := <-res:
			if err == nil {
				t.Fatalf("%s of a store that cannot write succeeded", op.name)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s hung in the write stall", op.name)
		}
	}
}
