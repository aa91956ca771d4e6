package store

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratafs/strata/internal/rpc"
)

// Background sync (docs/design/0010 § a3)
//
// Under the async policy nothing asks a chunk to be synced until an fsync,
// a close under sync, or the server's stop. So that data written under
// async is not left undurable for as long as the process runs, every
// target runs a background round each Config.SyncInterval (default 5 s,
// ext4's journal commit interval): it takes the chunks this process made
// dirty and has not synced since (target.unsynced: those in the open-chunk
// cache and those evicted from it, target.ours), oldest first, and syncs
// each through chunk.sync — the path an SSync takes, so a round is a group
// commit like any other (one syncfs for the chunks that join it while the
// dirty-page bound allows, else each chunk's fdatasyncs) and clears each
// flag only if the chunk's mutation generation did not move meanwhile.
// A chunk rewritten during its round stays dirty for the next.
//
// A round holds no lock across its syncs (chunk.sync takes the flag only
// to sample and to clear), so writes go on while it runs. It is bounded:
// at most roundChunks chunks or roundBytes written bytes, synced
// syncBatch at a time (each batch joins one or two syncfs rounds); a round
// cut short by the bound is followed by the next after a tenth of the
// interval instead of the whole. The rounds stop with Close, which then
// syncs everything left (syncChunks, the same path) and says in its one
// closing line how many chunks and bytes that was.

// Bounds of one background round and of the syncs run concurrently.
const (
	roundChunks = 4096
	roundBytes  = 1 << 30
	syncBatch   = 256
)

// unsyncedChunk is a chunk of target.unsynced: when it became dirty and
// the bytes written to it since (an overwrite counts again).
type unsyncedChunk struct {
	since time.Time
	bytes uint64
}

// noteDirty records that the chunk became dirty now (created, or mutated
// after a sync). Called with the chunk's flag held exclusively.
func (t *target) noteDirty(ino uint64) {
	t.unsynced.Lock()
	if _, ok := t.unsynced.m[ino]; !ok {
		t.unsynced.m[ino] = unsyncedChunk{since: time.Now()}
	}
	t.unsynced.Unlock()
}

// noteWritten counts n bytes written to a dirty chunk. Called with the
// chunk's flag held shared, so that no sync marks it clean meanwhile.
func (t *target) noteWritten(ino uint64, n int) {
	t.unsynced.Lock()
	u, ok := t.unsynced.m[ino]
	if !ok {
		u.since = time.Now()
	}
	u.bytes += uint64(n)
	t.unsynced.m[ino] = u
	t.unsynced.Unlock()
}

// noteSynced drops the chunk from the record: synced and clean, or removed.
func (t *target) noteSynced(ino uint64) {
	t.unsynced.Lock()
	delete(t.unsynced.m, ino)
	t.unsynced.Unlock()
}

// unsyncedFigures are the target's chunks written and not yet synced, the
// bytes written to them, and the age of the oldest.
func (t *target) unsyncedFigures(now time.Time) rpc.TargetUnsynced {
	t.unsynced.Lock()
	defer t.unsynced.Unlock()
	var f rpc.TargetUnsynced
	var oldest time.Time
	for _, u := range t.unsynced.m {
		f.Chunks++
		f.Bytes += u.bytes
		if oldest.IsZero() || u.since.Before(oldest) {
			oldest = u.since
		}
	}
	if !oldest.IsZero() {
		f.OldestMs = max(now.Sub(oldest).Milliseconds(), 0)
	}
	return f
}

// unsyncedBatch returns the inodes of the oldest unsynced chunks, at most
// maxChunks of them and, past the first, maxBytes of written bytes, and
// whether chunks were left out.
func (t *target) unsyncedBatch(maxChunks int, maxBytes uint64) (inos []uint64, more bool) {
	type entry struct {
		ino uint64
		unsyncedChunk
	}
	t.unsynced.Lock()
	all := make([]entry, 0, len(t.unsynced.m))
	for ino, u := range t.unsynced.m {
		all = append(all, entry{ino, u})
	}
	t.unsynced.Unlock()
	slices.SortFunc(all, func(a, b entry) int { return a.since.Compare(b.since) })
	var bytes uint64
	for _, e := range all {
		if len(inos) == maxChunks || (len(inos) > 0 && bytes+e.bytes > maxBytes) {
			return inos, true
		}
		inos = append(inos, e.ino)
		bytes += e.bytes
	}
	return inos, false
}

// syncLoop runs t's background rounds until Close.
func (s *Server) syncLoop(t *target) {
	defer s.wg.Done()
	wait := s.cfg.SyncInterval
	failing := false
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		n, more, err := s.syncRound(t)
		switch {
		case err != nil && !failing:
			s.log.Warn("background sync round failed; the chunks stay dirty and are tried again next round",
				"target", t.path, "synced", n, "err", err)
		case err == nil && failing:
			s.log.Info("background sync rounds succeed again", "target", t.path)
		}
		failing = err != nil
		wait = s.cfg.SyncInterval
		if more {
			wait /= 10
		}
	}
}

// syncRound is one background round of t: it syncs the oldest unsynced
// chunks within the round's bounds and answers how many it synced and
// whether some were left for the next round.
func (s *Server) syncRound(t *target) (int, bool, error) {
	inos, more := t.unsyncedBatch(roundChunks, roundBytes)
	n, cut, err := s.syncInos(t, inos, s.stop, false)
	return n, more || cut, err
}

// syncInos syncs t's chunks inos, syncBatch at a time (opening those not
// open), and answers how many it synced. It stops early, answering cut,
// when stop is closed between batches. With forget the handles leave the
// cache afterwards (Close, once nothing else uses it).
func (s *Server) syncInos(t *target, inos []uint64, stop <-chan struct{}, forget bool) (done int, cut bool, err error) {
	var errs []error
	for len(inos) > 0 {
		select {
		case <-stop:
			return done, true, errors.Join(errs...)
		default:
		}
		batch := inos[:min(syncBatch, len(inos))]
		inos = inos[len(batch):]
		cs := make([]*chunk, 0, len(batch))
		for _, ino := range batch {
			c, err := s.cache.get(t, ino, false)
			if errors.Is(err, errNotExist) {
				t.noteSynced(ino) // removed meanwhile: nothing to sync
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			cs = append(cs, c)
		}
		n, err := syncChunks(cs)
		for _, c := range cs {
			if forget {
				s.cache.forget(c)
			}
			s.cache.release(c)
		}
		done += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return done, false, errors.Join(errs...)
}

// syncChunks syncs cs concurrently, syncBatch at a time, each through
// chunk.sync, so that they share the target's sync rounds, and answers how
// many succeeded.
func syncChunks(cs []*chunk) (int, error) {
	errs := make([]error, len(cs))
	for from := 0; from < len(cs); from += syncBatch {
		var wg sync.WaitGroup
		for i := from; i < min(from+syncBatch, len(cs)); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = cs[i].sync()
			}()
		}
		wg.Wait()
	}
	n := 0
	for _, err := range errs {
		if err == nil {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// unsyncedCollector exports each target's unsynced figures as gauges,
// measured when scraped.
type unsyncedCollector struct {
	s                      *Server
	chunks, bytes, seconds *prometheus.Desc
}

func newUnsyncedCollector(s *Server) *unsyncedCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("strata_store_"+name, help, []string{"target"}, nil)
	}
	return &unsyncedCollector{s: s,
		chunks:  d("unsynced_chunks", "Chunks written and not yet synced (made durable) on the target."),
		bytes:   d("unsynced_bytes", "Bytes written to the target's unsynced chunks since they became dirty."),
		seconds: d("oldest_unsynced_seconds", "Age of the target's oldest chunk written and not yet synced (0: none)."),
	}
}

func (u *unsyncedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- u.chunks
	ch <- u.bytes
	ch <- u.seconds
}

func (u *unsyncedCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, t := range u.s.targets {
		f := t.unsyncedFigures(now)
		ch <- prometheus.MustNewConstMetric(u.chunks, prometheus.GaugeValue, float64(f.Chunks), t.path)
		ch <- prometheus.MustNewConstMetric(u.bytes, prometheus.GaugeValue, float64(f.Bytes), t.path)
		ch <- prometheus.MustNewConstMetric(u.seconds, prometheus.GaugeValue, float64(f.OldestMs)/1000, t.path)
	}
}
