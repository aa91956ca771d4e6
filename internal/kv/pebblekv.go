package kv

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Options tunes a pebble-backed Store. The zero value is usable.
type Options struct {
	// CacheBytes is the block cache size; default 64 MiB. Pebble charges
	// its memtables to the same cache, so the cache is made this much
	// larger than two memtables (the one being written and one being
	// flushed); else the memtables take it all and every read of a table
	// block goes to the file.
	CacheBytes int64
	// MemTableBytes is the memtable size; default 32 MiB.
	MemTableBytes uint64
	// Logger receives the engine's messages; default slog.Default().
	Logger *slog.Logger
	// NoWAL turns the engine's own write-ahead log off: for a store whose
	// every write can be replayed from a log kept elsewhere (the metadata
	// state machine, replayed from the raft log). Writes then reach disk
	// only when a memtable is flushed; Sync, Close and Apply(true) flush.
	NoWAL bool
	// BeforeFlush, when set, runs before each memtable flush starts
	// writing. The state machine uses it to make the raft log durable up
	// to everything applied so far, so that the persisted state never runs
	// ahead of the persisted log. It must not call back into the store.
	BeforeFlush func()
	// FS is the file system the engine keeps its files on; default the
	// operating system's (vfs.Default). Tests pass a faulty one: pebble's
	// vfs/errorfs wrapper (EIO on a write or sync, ENOSPC) or its
	// crash-simulating memory file system (vfs.NewCrashableMem, whose
	// CrashClone keeps only what was synced).
	FS FS
}

// FS is the engine's file-system interface (pebble's vfs.FS).
type FS = vfs.FS

// pebblekv is the Store over a pebble database.
type pebblekv struct {
	db     *pebble.DB
	dir    string
	noWAL  bool
	bg     *bgErrors
	giveUp time.Duration // flushGiveUp when the store opened
}

var _ Store = (*pebblekv)(nil)

// Open opens (creating if needed) the pebble store in dir.
func Open(dir string, opts Options) (Store, error) {
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = 64 << 20
	}
	if opts.MemTableBytes == 0 {
		opts.MemTableBytes = 32 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cache := pebble.NewCache(opts.CacheBytes + 2*int64(opts.MemTableBytes))
	defer cache.Unref()
	lg := opts.Logger.With("kv", dir)
	bg := &bgErrors{log: lg, logEvery: bgLogEvery, runGap: bgRunGap}
	po := &pebble.Options{
		Cache:              cache,
		MemTableSize:       opts.MemTableBytes,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{lg},
		DisableWAL:         opts.NoWAL,
		EventListener:      &pebble.EventListener{BackgroundError: bg.note},
		FS:                 opts.FS,
	}
	if po.FS == nil {
		po.FS = vfs.Default
	}
	if f := opts.BeforeFlush; f != nil {
		po.EventListener.FlushBegin = func(pebble.FlushInfo) { f() }
	}
	// Bloom filters on every level: the metadata service's hot reads are
	// point lookups, many of them for absent keys (a new name, a dedupe
	// record), which without a filter touch every level.
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("open kv store %s: %w", dir, err)
	}
	return &pebblekv{db: db, dir: dir, noWAL: opts.NoWAL, bg: bg, giveUp: flushGiveUp}, nil
}

// bgErrors collects the engine's background errors (failed flushes and
// compactions). Pebble retries a failed flush at once, without end: with a
// vanished or full disk that is tens of thousands of errors a second, a
// core spinning and, logged each, a log that fills the disk. So a run of
// errors is logged once, then at most once per bgLogEvery with the count
// in between, and past bgSpinLimit errors in a run each one waits
// bgBackoff before the engine retries (the callback runs on the engine's
// flush goroutine: the wait slows only work that is failing anyway).
type bgErrors struct {
	log *slog.Logger
	// logEvery and runGap are bgLogEvery and bgRunGap when the store
	// opened (the engine's goroutines read them; tests change the
	// package's values).
	logEvery, runGap time.Duration
	mu               sync.Mutex
	// since is when the current run of errors began; last the latest
	// error and at when it came; n the errors of the run.
	since, at, logged time.Time
	last              error
	n, unlogged       int
}

var (
	// bgLogEvery spaces the log lines of a run of background errors.
	bgLogEvery = 10 * time.Second
	// bgRunGap ends a run: an error after a quiet gap this long starts a
	// new one.
	bgRunGap = time.Second
)

const (
	bgSpinLimit = 100
	bgBackoff   = 20 * time.Millisecond
)

func (b *bgErrors) note(err error) {
	now := time.Now()
	b.mu.Lock()
	if b.since.IsZero() || now.Sub(b.at) > b.runGap {
		b.since, b.n = now, 0
	}
	b.last, b.at = err, now
	b.n++
	spin := b.n > bgSpinLimit
	n := b.unlogged
	log := b.logged.IsZero() || now.Sub(b.logged) >= b.logEvery
	if log {
		b.logged, b.unlogged = now, 0
	} else {
		b.unlogged++
	}
	b.mu.Unlock()
	if log {
		b.log.Error("kv store background error (the engine retries)", "err", err, "repeated_since_last_line", n)
	}
	if spin {
		time.Sleep(bgBackoff)
	}
}

// failing returns the latest error of a run that has lasted at least d,
// with errors still coming since start. A run that began before start
// counts from its own beginning: a flush that follows one which gave up
// (Close after a failed snapshot) gives up at once, not after another d.
func (b *bgErrors) failing(start time.Time, d time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.at.Before(start) { // none since this flush began (or none at all)
		return nil
	}
	if now.Sub(b.since) < d || now.Sub(b.at) > d {
		return nil
	}
	return b.last
}

// bgHealthWindow is how recent a background error must be to make the
// store unhealthy (Health): the engine retries a failing flush every
// bgBackoff, so a failure that persists is never older than that.
var bgHealthWindow = 30 * time.Second

// health describes the current run of errors, if its latest error is
// recent.
func (b *bgErrors) health(dir string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() {
		return nil
	}
	ago := time.Since(b.at)
	if ago > bgHealthWindow {
		return nil
	}
	return fmt.Errorf("kv store %s: %d background errors over %v, the latest %v ago: %w",
		dir, b.n, b.at.Sub(b.since).Round(time.Second), ago.Round(time.Millisecond), b.last)
}

// flushGiveUp is how long Flush waits on a flush that keeps failing before
// it returns the error (a flush that is merely slow is waited for).
var flushGiveUp = 10 * time.Second

func (s *pebblekv) Get(key []byte) ([]byte, error) { return get(s.db, key) }

func (s *pebblekv) NewIter(lower, upper []byte) (Iter, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("kv iterator: %w", err)
	}
	return iter{it}, nil
}

func (s *pebblekv) NewBatch() Batch {
	return &batch{b: s.db.NewIndexedBatch(), noWAL: s.noWAL, db: s.db}
}

func (s *pebblekv) NewSnapshot() Snapshot { return snapshot{s.db.NewSnapshot()} }

func (s *pebblekv) Sync() error {
	if s.noWAL {
		return s.Flush()
	}
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("kv sync: %w", err)
	}
	return nil
}

func (s *pebblekv) Flush() error {
	// AsyncFlush itself waits when the engine stalls writes (memtables
	// full, and flushes failing: a full disk), so it runs under await too.
	err, stuck := s.await(func() error {
		done, err := s.db.AsyncFlush()
		if err != nil {
			return fmt.Errorf("kv flush: %w", err)
		}
		<-done
		return nil
	})
	if stuck != nil {
		return fmt.Errorf("kv flush of %s failing for over %v: %w", s.dir, s.giveUp, stuck)
	}
	return err
}

// await runs op and returns its error, unless the engine's background
// writes keep failing meanwhile (for s.giveUp, errors still coming since
// op began): then it returns the latest of those as stuck at once, and op
// stays behind, blocked in the engine — the store is failing anyway.
func (s *pebblekv) await(op func() error) (err, stuck error) {
	start := time.Now()
	res := make(chan error, 1)
	go func() { res <- op() }()
	t := time.NewTicker(min(s.giveUp/10, time.Second))
	defer t.Stop()
	for {
		select {
		case err := <-res:
			return err, nil
		case <-t.C:
			if stuck := s.bg.failing(start, s.giveUp); stuck != nil {
				return nil, stuck
			}
		}
	}
}

func (s *pebblekv) Health() error { return s.bg.health(s.dir) }

func (s *pebblekv) Checkpoint(dir string) error {
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("kv checkpoint to %s: %w", dir, err)
	}
	return nil
}

func (s *pebblekv) Close() error {
	var flushErr error
	if s.noWAL {
		flushErr = s.Flush()
	}
	// The engine's Close waits for writes stalled behind flushes that keep
	// failing (a full disk): bounded like Flush, abandoning it then.
	err, stuck := s.await(s.db.Close)
	switch {
	case stuck != nil:
		return errors.Join(flushErr, fmt.Errorf("kv close of %s abandoned: the engine is stuck on writes failing for over %v: %w", s.dir, s.giveUp, stuck))
	case err != nil:
		return errors.Join(flushErr, fmt.Errorf("kv close: %w", err))
	}
	return flushErr
}

type getter interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

func get(g getter, key []byte) ([]byte, error) {
	v, c, err := g.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("kv get: %w", err)
	}
	out := make([]byte, len(v))
	copy(out, v)
	c.Close()
	return out, nil
}

// batch is an indexed pebble batch.
type batch struct {
	b     *pebble.Batch
	noWAL bool
	db    *pebble.DB
}

func (b *batch) Get(key []byte) ([]byte, error) { return get(b.b, key) }

func (b *batch) NewIter(lower, upper []byte) (Iter, error) {
	it, err := b.b.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("kv batch iterator: %w", err)
	}
	return iter{it}, nil
}

func (b *batch) Set(key, value []byte) error   { return b.b.Set(key, value, nil) }
func (b *batch) Delete(key []byte) error       { return b.b.Delete(key, nil) }
func (b *batch) DeleteRange(s, e []byte) error { return b.b.DeleteRange(s, e, nil) }
func (b *batch) Count() int                    { return int(b.b.Count()) }

func (b *batch) Apply(sync bool) error {
	wo := pebble.NoSync
	if sync && !b.noWAL {
		wo = pebble.Sync
	}
	if err := b.b.Commit(wo); err != nil {
		return fmt.Errorf("kv commit batch: %w", err)
	}
	if sync && b.noWAL {
		if err := b.db.Flush(); err != nil { // no log to sync: persist the memtable
			return fmt.Errorf("kv commit batch: flush: %w", err)
		}
	}
	return nil
}

func (b *batch) Close() error { return b.b.Close() }

type snapshot struct{ s *pebble.Snapshot }

func (s snapshot) Get(key []byte) ([]byte, error) { return get(s.s, key) }
func (s snapshot) NewIter(lower, upper []byte) (Iter, error) {
	it, err := s.s.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("kv snapshot iterator: %w", err)
	}
	return iter{it}, nil
}
func (s snapshot) Close() error { return s.s.Close() }

type iter struct{ it *pebble.Iterator }

func (i iter) First() bool          { return i.it.First() }
func (i iter) Last() bool           { return i.it.Last() }
func (i iter) SeekGE(k []byte) bool { return i.it.SeekGE(k) }
func (i iter) Next() bool           { return i.it.Next() }
func (i iter) Prev() bool           { return i.it.Prev() }
func (i iter) Valid() bool          { return i.it.Valid() }
func (i iter) Key() []byte          { return i.it.Key() }
func (i iter) Value() []byte        { return i.it.Value() }
func (i iter) Error() error         { return i.it.Error() }
func (i iter) Close() error         { return i.it.Close() }

// pebbleLogger forwards the engine's messages to slog.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg)
	panic("pebble fatal: " + msg) // the engine's invariant broke; pebble expects no return
}

// PrefixEnd returns the smallest key greater than every key with prefix p
// (nil if none exists), for use as an iterator's upper bound.
func PrefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
