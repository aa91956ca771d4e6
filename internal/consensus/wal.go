package consensus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stratafs/strata/internal/failpoint"
	"golang.org/x/sys/unix"
)

// wal is raft's LogStore: an append-only log in preallocated segment files.
//
// Why not the pebble store it replaced: every metadata mutation waits for
// one raft append to be durable, so the latency of that fsync bounds the
// metadata rate of a few clients. Appending to a growing file makes each
// fdatasync commit a journal transaction for the new size and blocks
// (measured here: ~450 µs), while overwriting blocks that already exist
// needs only the data flush (~105 µs). So segments are created full size
// and zero-filled ahead of use by a background goroutine, and appends
// overwrite zeros.
//
// Segment file format, version 1 (integers little-endian):
//
//	offset size  field
//	0      8     magic "STRATWAL"
//	8      1     version (1)
//	9      7     reserved, 0
//	16     8     index of the first entry the segment was created for
//	24     40    reserved, 0
//	64     ...   records: length (4), CRC32C of payload (4), payload
//	             payload = uvarint raft index, then encodeLog's entry
//	             a length of 0 ends the segment's records
//
// Recovery scans each segment up to the first zero length. In the last
// segment a record whose CRC does not match, or whose index does not follow
// its predecessor, is a write torn by a crash and ends the log; anywhere
// else it is corruption and refuses to open. Truncating the tail writes a
// zero length over the first dropped record (and syncs) before the entries
// are forgotten, so a restart cannot resurrect them; the segment files after
// it are removed and the directory synced, so that a machine crash cannot
// bring them back either (nor the files of a log deleted whole).
//
// Head truncation (after snapshots) deletes whole segments only; entries
// of a partly truncated segment stay readable until the segment goes. After
// a restart FirstIndex may so be lower than before, which raft tolerates:
// those entries are committed and consistent with the snapshot.
//
// Deferred sync (deferSync): StoreLogs then returns once the entries are
// written (in the page cache: they survive a crash of the process, not of
// the machine) and a background syncer makes them durable — at once when
// somebody waits (WaitDurable), else at most syncDelay after the first
// unsynced write: that write arms a timer, and later writes find it armed
// until the syncer it wakes takes every entry written so far (into a sync
// it starts, a running one that covers them, or the next one to start
// when maxSyncs run). Shortly after a wait was answered (eagerWindow)
// StoreLogs also starts the entries' write-out to the device
// (sync_file_range), and their sync when none runs, so that the next
// wait's sync is mostly a cache flush; that is an optimisation, not a
// bound: without a waiter only syncDelay bounds how long an entry stays
// off stable storage. One fdatasync covers every entry written before it
// started, however many raft batches that was. Up to maxSyncs run at once:
// an entry waited for while one runs gets its own sync at once rather than
// waiting for the running one to end. The caller decides which answers
// wait for durability; see consensus.Config.DeferSync.
type wal struct {
	dir     string
	segSize int64
	log     *slog.Logger

	wmu sync.Mutex // serialises StoreLogs and DeleteRange
	// smu is held (shared) around fdatasync of segments and (exclusive)
	// around closing them, so that a syncer never syncs a closed file.
	smu sync.RWMutex

	deferSync bool
	syncDelay time.Duration
	ds        struct {
		sync.Mutex
		written, synced uint64            // last index written; last index on stable storage
		dirty           map[*segment]bool // segments written since their last fdatasync
		flushing        map[*segment]int  // segments running syncs flush (count of syncs)
		runs            []*syncRun        // the running syncs
		again           bool              // a sync was refused for maxSyncs: start one when one ends
		done            chan struct{}     // closed when the next sync ends
		waiters         int
		lastWait        time.Time // when a durability wait was last answered
		armed           bool      // a delayed sync is scheduled
		err             error     // sticky: after a failed fdatasync nothing is durable
	}
	// failed is the latest append that failed, and when.
	failed struct {
		sync.Mutex
		err error
		at  time.Time
	}
	kick chan struct{} // wakes a syncer
	// syncAppends, when set, reports whether StoreLogs must make its
	// entries durable before returning even with deferSync (a node that
	// is not the leader: its acknowledgement counts towards a commit).
	syncAppends func() bool
	fault       atomic.Pointer[LogFault] // walfault.go
	// syncSegment, when set (tests), replaces the deferred syncer's
	// fdatasync of a segment (fdatasyncSegment), to delay, observe or
	// fail it.
	syncSegment func(*segment) error
	// afterSyncs, when set (tests), runs after a sync's fdatasyncs,
	// before their result is published.
	afterSyncs func()
	// removedSynced, when set (tests), is told of each directory sync
	// that makes segment removals durable, with the files still present.
	removedSynced func(remaining []string)

	mu struct {
		sync.RWMutex
		// segs is in index order; the last is being written. Only the
		// last may be empty (a tail cut at its first entry): locateLocked
		// searches the others, so storeLogs drops an empty segment it
		// rotates past, and recovery and head cuts remove empty ones.
		segs        []*segment
		first, last uint64 // 0, 0 when empty
	}

	prealloc chan preallocated // the next zero-filled segment, when ready
	want     chan struct{}     // asks the preallocator for the next segment
	stop     chan struct{}
	wg       sync.WaitGroup
}

type segment struct {
	path  string
	f     *os.File
	base  uint64  // index the segment was created for (file name)
	first uint64  // index of offs[0]
	offs  []int64 // offset of each record; entry first+i at offs[i]
	// terms holds each entry's term as runs: entries from terms[i].first
	// up to the next run's first have terms[i].term. Kept in memory so that
	// asking for an entry's term (Node.EntryTerm, on every close of a new
	// file) reads no file.
	terms []termRun
	end   int64 // offset after the last record
	size  int64 // file size

	closed bool // guarded by wal.smu
}

type termRun struct{ first, term uint64 }

// addTerm records that entry index (the segment's last so far) has term.
func (s *segment) addTerm(index, term uint64) {
	if n := len(s.terms); n == 0 || s.terms[n-1].term != term {
		s.terms = append(s.terms, termRun{index, term})
	}
}

// termAt is the term of entry index, which the segment holds.
func (s *segment) termAt(index uint64) uint64 {
	i := sort.Search(len(s.terms), func(i int) bool { return s.terms[i].first > index })
	if i == 0 {
		return 0
	}
	return s.terms[i-1].term
}

// cutTerms forgets the runs of entries after last.
func (s *segment) cutTerms(last uint64) {
	i := sort.Search(len(s.terms), func(i int) bool { return s.terms[i].first > last })
	s.terms = s.terms[:i]
}

type preallocated struct {
	path string
	f    *os.File
	size int64
	err  error
}

const (
	walMagic       = "STRATWAL"
	walVersion     = 1
	walHeaderBytes = 64
	walRecordHead  = 8
	// DefaultSegmentBytes is the size of a WAL segment file.
	DefaultSegmentBytes = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errWALCorrupt marks a log that cannot be trusted.
var errWALCorrupt = errors.New("raft wal corrupt")

var _ raft.LogStore = (*wal)(nil)

func segName(base uint64) string { return fmt.Sprintf("seg-%020d.wal", base) }

// openWAL opens (or creates) the log in dir.
func openWAL(dir string, segSize int64, lg *slog.Logger) (*wal, error) {
	if segSize <= 0 {
		segSize = DefaultSegmentBytes
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raft wal dir: %w", err)
	}
	w := &wal{dir: dir, segSize: segSize, log: lg, prealloc: make(chan preallocated, 1),
		want: make(chan struct{}, 1), stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	w.ds.dirty = make(map[*segment]bool)
	w.ds.flushing = make(map[*segment]int)
	w.ds.done = make(chan struct{})
	if err := w.recover(); err != nil {
		w.closeFiles()
		return nil, err
	}
	// What a crashed process wrote may still be only in the page cache:
	// make it durable before anything is built on it.
	if n := len(w.mu.segs); n > 0 {
		if err := unix.Fdatasync(int(w.mu.segs[n-1].f.Fd())); err != nil {
			w.closeFiles()
			return nil, fmt.Errorf("raft wal sync at open: %w", err)
		}
	}
	w.ds.written, w.ds.synced = w.mu.last, w.mu.last
	w.wg.Add(1 + maxSyncs)
	go w.preallocLoop()
	for range maxSyncs {
		go w.syncLoop()
	}
	return w, nil
}

// setDeferSync switches deferred sync on (delay: longest wait before an
// unsynced write is synced when nobody waits for it).
func (w *wal) setDeferSync(delay time.Duration) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.deferSync, w.syncDelay = true, delay
}

// syncLoop is one of the background syncers of deferred mode.
func (w *wal) syncLoop() {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		case <-w.kick:
		}
		w.syncOnce(false)
	}
}

func (w *wal) kickSync() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// maxSyncs bounds the fdatasyncs in flight at once. A second one may start
// while the first runs: entries written meanwhile then wait for one sync,
// not for the rest of the running one plus a whole next one.
const maxSyncs = 2

// syncRun is a running sync: upTo is the last index it makes durable, its
// target lowered by every tail cut made while it runs (entries written
// again after a cut may have missed its fdatasyncs; the lowest cut bounds
// what it can claim, not the latest).
type syncRun struct{ upTo uint64 }

// runningUpToLocked is the highest index a running sync makes durable.
func (w *wal) runningUpToLocked() uint64 {
	var m uint64
	for _, r := range w.ds.runs {
		m = max(m, r.upTo)
	}
	return m
}

// syncOnce makes every entry written so far durable. It returns at once
// when a running sync already covers them, or (unless wait) when maxSyncs
// are running: the first to finish starts the next.
func (w *wal) syncOnce(wait bool) {
	w.ds.Lock()
	w.ds.armed = false
	for {
		target := w.ds.written
		if target <= w.ds.synced || target <= w.runningUpToLocked() || w.ds.err != nil {
			w.ds.Unlock()
			return
		}
		if len(w.ds.runs) < maxSyncs {
			break
		}
		w.ds.again = true
		if !wait {
			w.ds.Unlock()
			return
		}
		ch := w.ds.done
		w.ds.Unlock()
		<-ch
		w.ds.Lock()
	}
	target := w.ds.written
	// The segments written since their last sync, and those a running
	// sync is flushing: fdatasync makes durable what was written before it
	// was called, whichever call wrote it, so this sync's answer does not
	// depend on the running one finishing first.
	segs := make([]*segment, 0, len(w.ds.dirty)+len(w.ds.flushing))
	for s := range w.ds.dirty {
		segs = append(segs, s)
	}
	for s := range w.ds.flushing {
		if !w.ds.dirty[s] {
			segs = append(segs, s)
		}
	}
	clear(w.ds.dirty)
	for _, s := range segs {
		w.ds.flushing[s]++
	}
	run := &syncRun{upTo: target}
	w.ds.runs = append(w.ds.runs, run)
	w.ds.Unlock()
	err := failpoint.Eval("consensus/before-log-sync")
	w.smu.RLock()
	for _, s := range segs {
		if s.closed {
			continue // removed: its entries are no longer part of the log
		}
		syncSeg := w.fdatasync
		if w.syncSegment != nil {
			syncSeg = w.syncSegment
		}
		if e := syncSeg(s); e != nil {
			err = fmt.Errorf("raft wal sync %s: %w", s.path, e)
			break
		}
	}
	w.smu.RUnlock()
	err = errors.Join(err, failpoint.Eval("consensus/after-log-sync"))
	if w.afterSyncs != nil {
		w.afterSyncs()
	}
	w.ds.Lock()
	for _, s := range segs {
		if w.ds.flushing[s]--; w.ds.flushing[s] == 0 {
			delete(w.ds.flushing, s)
		}
	}
	w.ds.runs = slices.DeleteFunc(w.ds.runs, func(r *syncRun) bool { return r == run })
	if err != nil {
		w.ds.err = err
		w.log.Error("raft wal: fdatasync failed; the log can no longer be made durable", "err", err)
	} else {
		w.ds.synced = max(w.ds.synced, run.upTo)
	}
	again := w.ds.again && w.ds.written > w.ds.synced
	w.ds.again = false
	close(w.ds.done)
	w.ds.done = make(chan struct{})
	w.ds.Unlock()
	if again {
		w.kickSync()
	}
}

// fdatasyncSegment makes what was written to s before the call durable.
func fdatasyncSegment(s *segment) error { return unix.Fdatasync(int(s.f.Fd())) }

// noteWritten records entries written up to last in segs (deferred mode)
// and, when schedule, schedules their sync.
func (w *wal) noteWritten(last uint64, segs []*segment, hot, schedule bool) {
	w.ds.Lock()
	w.ds.written = last
	for _, s := range segs {
		w.ds.dirty[s] = true
	}
	// Sync at once when somebody waits. When somebody waited moments ago
	// (hot), a workload that barriers (creates, each closed) will ask for
	// these entries soon: StoreLogs has started writing them out, and the
	// sync starts now too if none is running, so that the barrier finds it
	// done or nearly (the fdatasync waits for that write-out and then
	// flushes the device's cache). With a
	// sync running it waits for the barrier: syncing every batch at once
	// overlapped syncs, which the device serves one after the other (ct, 4
	// threads × 8,000 creates and closes, 14 alternated rounds: 7,012
	// creates/s against 7,334 for starting at the barrier only); starting
	// one when none runs measured 6,346 against 6,181 (10 alternated
	// rounds, close p50 172 µs against 202) and `strata bench --workloads
	// meta` 6,710 against 6,537 (12 samples each). Otherwise (unlinks,
	// renames nobody fsyncs) one delayed sync covers many.
	now := schedule && (w.ds.waiters > 0 || (hot && len(w.ds.runs) == 0))
	arm := schedule && !now && !w.ds.armed
	if arm {
		w.ds.armed = true
	}
	w.ds.Unlock()
	switch {
	case now:
		w.kickSync()
	case arm:
		time.AfterFunc(w.syncDelay, w.kickSync)
	}
}

// appendSyncTimeout bounds a follower's wait for its batch to be durable.
const appendSyncTimeout = 30 * time.Second

// healthWindow is how long a failed append keeps the log unhealthy.
var healthWindow = 30 * time.Second

// health is the error that stopped syncing, if one did, else an append
// that failed within healthWindow.
func (w *wal) health() error {
	w.ds.Lock()
	err := w.ds.err
	w.ds.Unlock()
	if err != nil {
		return fmt.Errorf("raft log can no longer be made durable: %w", err)
	}
	w.failed.Lock()
	defer w.failed.Unlock()
	if w.failed.err != nil && time.Since(w.failed.at) <= healthWindow {
		return fmt.Errorf("raft log append failed %v ago: %w", time.Since(w.failed.at).Round(time.Millisecond), w.failed.err)
	}
	return nil
}

// durableIndex is the last index on stable storage.
func (w *wal) durableIndex() uint64 {
	w.ds.Lock()
	defer w.ds.Unlock()
	return w.ds.synced
}

// eagerWindow bounds how long after the answer to a durability wait (or
// during one) StoreLogs starts writing new entries out at once, and a sync
// when none runs (see noteWritten). It counts from the answer: a sync
// slower than the window must not make the waiter's next change cold.
const eagerWindow = 10 * time.Millisecond

// errWALClosed answers waits on a closed log.
var errWALClosed = errors.New("raft wal closed")

// WaitDurable returns once every entry up to index is on stable storage,
// or with an error when the wait exceeds timeout or syncing failed.
func (w *wal) WaitDurable(index uint64, timeout time.Duration) error {
	return w.waitDurable(nil, index, timeout)
}

// errWaitCancelled answers a wait whose caller gave up.
var errWaitCancelled = errors.New("raft wal: wait for durability cancelled")

// waitDurable is WaitDurable that also ends (errWaitCancelled) when cancel
// is closed; cancel may be nil.
func (w *wal) waitDurable(cancel <-chan struct{}, index uint64, timeout time.Duration) error {
	var timer <-chan time.Time
	w.ds.Lock()
	defer w.ds.Unlock()
	// The waiter's next change comes after the answer: count the eager
	// window from here, not from the start of a wait that a slow sync
	// may have outlasted the window.
	defer func() { w.ds.lastWait = time.Now() }()
	for {
		if index > w.ds.written {
			index = w.ds.written // entries cut from the tail are not waited for
		}
		if w.ds.synced >= index {
			return nil
		}
		if w.ds.err != nil {
			return w.ds.err
		}
		select {
		case <-w.stop:
			// Closing: the syncer is gone (Close syncs once more). Sync
			// here rather than fail a wait that Close would satisfy.
			w.ds.Unlock()
			w.syncOnce(true)
			w.ds.Lock()
			if w.ds.synced >= min(index, w.ds.written) {
				return nil
			}
			if w.ds.err != nil {
				return w.ds.err
			}
			return errWALClosed
		default:
		}
		ch := w.ds.done
		w.ds.waiters++
		w.ds.Unlock()
		w.kickSync()
		if timer == nil {
			t := time.NewTimer(timeout)
			defer t.Stop()
			timer = t.C
		}
		var timedOut, cancelled bool
		select {
		case <-ch:
		case <-timer:
			timedOut = true
		case <-cancel:
			cancelled = true
		}
		w.ds.Lock()
		w.ds.waiters--
		if w.ds.synced >= min(index, w.ds.written) {
			return nil
		}
		if timedOut {
			return fmt.Errorf("raft wal: entry %d not durable after %v", index, timeout)
		}
		if cancelled {
			return errWaitCancelled
		}
	}
}

func (w *wal) recover() error {
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("raft wal: %w", err)
	}
	var bases []uint64
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(w.dir, name)) // an unfinished preallocation
			continue
		}
		if !strings.HasPrefix(name, "seg-") || !strings.HasSuffix(name, ".wal") {
			continue
		}
		base, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, "seg-"), ".wal"), 10, 64)
		if err != nil {
			return fmt.Errorf("%w: unexpected file %s", errWALCorrupt, name)
		}
		bases = append(bases, base)
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	var prev uint64 // last index seen
	for i, base := range bases {
		lastSeg := i == len(bases)-1
		s, err := w.openSegment(base, prev, lastSeg)
		if err != nil {
			return err
		}
		if len(s.offs) == 0 && !lastSeg {
			// Holds no entry (a crash between a rotation past an empty
			// segment and its removal): only the last may be empty.
			s.f.Close()
			if err := os.Remove(s.path); err != nil {
				return fmt.Errorf("raft wal: remove empty segment: %w", err)
			}
			continue
		}
		w.mu.segs = append(w.mu.segs, s)
		if len(s.offs) > 0 {
			prev = s.first + uint64(len(s.offs)) - 1
			if w.mu.first == 0 {
				w.mu.first = s.first
			}
			w.mu.last = prev
		}
	}
	return nil
}

// openSegment scans one segment. prev is the index before its first record
// (0 when unknown). A torn record is tolerated only in the last segment.
func (w *wal) openSegment(base, prev uint64, last bool) (*segment, error) {
	path := filepath.Join(w.dir, segName(base))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("raft wal: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("raft wal: %w", err)
	}
	s := &segment{path: path, f: f, base: base, size: st.Size(), end: walHeaderBytes}
	var hdr [walHeaderBytes]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil || string(hdr[:8]) != walMagic {
		f.Close()
		return nil, fmt.Errorf("%w: %s: bad header", errWALCorrupt, path)
	}
	if hdr[8] != walVersion {
		f.Close()
		return nil, fmt.Errorf("%w: %s: format version %d, this build reads %d", errWALCorrupt, path, hdr[8], walVersion)
	}
	var head [walRecordHead]byte
	var l raft.Log
	for s.end+walRecordHead <= s.size {
		if _, err := f.ReadAt(head[:], s.end); err != nil {
			f.Close()
			return nil, fmt.Errorf("raft wal %s: %w", path, err)
		}
		n := int64(binary.LittleEndian.Uint32(head[:4]))
		if n == 0 {
			break
		}
		bad := func(why string) (*segment, error) {
			if last {
				w.log.Warn("raft wal: ignoring a torn record at the end of the log", "segment", path, "offset", s.end, "why", why)
				return s, nil
			}
			f.Close()
			return nil, fmt.Errorf("%w: %s offset %d: %s", errWALCorrupt, path, s.end, why)
		}
		if s.end+walRecordHead+n > s.size {
			return bad("record past the end of the segment")
		}
		payload := make([]byte, n)
		if _, err := f.ReadAt(payload, s.end+walRecordHead); err != nil {
			f.Close()
			return nil, fmt.Errorf("raft wal %s: %w", path, err)
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(head[4:]) {
			return bad("checksum mismatch")
		}
		idx, err := decodeRecord(payload, &l)
		if err != nil {
			return bad(err.Error())
		}
		if prev != 0 && idx != prev+1 {
			return bad(fmt.Sprintf("index %d after %d", idx, prev))
		}
		if len(s.offs) == 0 {
			s.first = idx
		}
		s.offs = append(s.offs, s.end)
		s.addTerm(idx, l.Term)
		s.end += walRecordHead + n
		prev = idx
	}
	return s, nil
}

func decodeRecord(payload []byte, l *raft.Log) (uint64, error) {
	idx, n := binary.Uvarint(payload)
	if n <= 0 {
		return 0, fmt.Errorf("%w: record index", errBadLog)
	}
	if err := decodeLog(payload[n:], l); err != nil {
		return 0, err
	}
	l.Index = idx
	return idx, nil
}

// preallocLoop prepares the next zero-filled segment when asked (once the
// current one is half full), so that rotation does not wait for it.
func (w *wal) preallocLoop() {
	defer w.wg.Done()
	for {
		select {
		case <-w.want:
		case <-w.stop:
			return
		}
		p := w.preallocate(w.segSize)
		select {
		case w.prealloc <- p:
		case <-w.stop:
			if p.f != nil {
				p.f.Close()
				os.Remove(p.path)
			}
			return
		}
	}
}

// preallocate creates a zero-filled, synced temporary segment of size bytes.
func (w *wal) preallocate(size int64) preallocated {
	f, err := os.CreateTemp(w.dir, "seg-*.tmp")
	if err != nil {
		return preallocated{err: fmt.Errorf("raft wal preallocate: %w", err)}
	}
	p := preallocated{path: f.Name(), f: f, size: size}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size && err == nil; off += int64(len(zeros)) {
		n := min(int64(len(zeros)), size-off)
		_, err = f.WriteAt(zeros[:n], off)
	}
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if err != nil {
		f.Close()
		os.Remove(p.path)
		return preallocated{err: fmt.Errorf("raft wal preallocate %d bytes: %w", size, err)}
	}
	return p
}

// newSegment installs a preallocated file as the segment for base.
func (w *wal) newSegment(base uint64, need int64) (*segment, error) {
	var p preallocated
	if need+walHeaderBytes+walRecordHead > w.segSize {
		p = w.preallocate(need + walHeaderBytes + walRecordHead) // an outsized entry
	} else {
		select {
		case p = <-w.prealloc:
		default:
			p = w.preallocate(w.segSize) // none ready: the first segment, or a burst
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	var hdr [walHeaderBytes]byte
	copy(hdr[:], walMagic)
	hdr[8] = walVersion
	binary.LittleEndian.PutUint64(hdr[16:], base)
	path := filepath.Join(w.dir, segName(base))
	err := func() error {
		if _, err := p.f.WriteAt(hdr[:], 0); err != nil {
			return err
		}
		if err := unix.Fdatasync(int(p.f.Fd())); err != nil {
			return err
		}
		if err := os.Rename(p.path, path); err != nil {
			return err
		}
		return syncDir(w.dir)
	}()
	if err != nil {
		p.f.Close()
		os.Remove(p.path)
		return nil, fmt.Errorf("raft wal new segment %d: %w", base, err)
	}
	return &segment{path: path, f: p.f, base: base, end: walHeaderBytes, size: p.size}, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (w *wal) FirstIndex() (uint64, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.mu.first, nil
}

func (w *wal) LastIndex() (uint64, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.mu.last, nil
}

// locateLocked finds the segment and record bounds of index.
func (w *wal) locateLocked(index uint64) (*segment, int64, int64, bool) {
	if index < w.mu.first || index > w.mu.last || w.mu.first == 0 {
		return nil, 0, 0, false
	}
	segs := w.mu.segs
	if n := len(segs); n > 0 && len(segs[n-1].offs) == 0 {
		// The segment being written, emptied by a tail cut. Searched with
		// the others, its false answer after their true ones would send
		// the search past the segment holding index.
		segs = segs[:n-1]
	}
	i := sort.Search(len(segs), func(i int) bool {
		s := segs[i]
		return s.first+uint64(len(s.offs))-1 >= index
	})
	if i == len(segs) || segs[i].first > index {
		return nil, 0, 0, false
	}
	s := segs[i]
	k := index - s.first
	start := s.offs[k]
	end := s.end
	if k+1 < uint64(len(s.offs)) {
		end = s.offs[k+1]
	}
	return s, start, end, true
}

func (w *wal) GetLog(index uint64, l *raft.Log) error {
	w.mu.RLock()
	s, start, end, ok := w.locateLocked(index)
	if !ok {
		w.mu.RUnlock()
		return raft.ErrLogNotFound
	}
	buf := make([]byte, end-start)
	_, err := s.f.ReadAt(buf, start)
	w.mu.RUnlock()
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("raft wal read %d: %w", index, err)
	}
	payload := buf[walRecordHead:]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(buf[4:8]) {
		return fmt.Errorf("%w: entry %d in %s: checksum mismatch", errWALCorrupt, index, s.path)
	}
	idx, err := decodeRecord(payload, l)
	if err != nil {
		return fmt.Errorf("raft wal entry %d: %w", index, err)
	}
	if idx != index {
		return fmt.Errorf("%w: entry %d holds index %d", errWALCorrupt, index, idx)
	}
	return nil
}

// termOf is the term of entry index; ok is false when the log does not
// hold it.
func (w *wal) termOf(index uint64) (term uint64, ok bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	s, _, _, ok := w.locateLocked(index)
	if !ok {
		return 0, false
	}
	return s.termAt(index), true
}

func (w *wal) StoreLog(l *raft.Log) error { return w.StoreLogs([]*raft.Log{l}) }

// StoreLogs appends the entries and makes them durable with one
// fdatasync per touched segment: raft's batch is the group commit. A
// failure is remembered for health.
//
// A follower (syncAppends) returns only once its batch is durable, and
// syncs it in the calling goroutine (raft's follower loop, which waits for
// the answer anyway): no hand-over to the background syncer and back, and
// no separate start of the write-out (sync_file_range) before the
// fdatasync that does it. With three voters on one 2-core machine these
// hand-overs and syscalls were a measurable part of each round's CPU
// (docs/design/0012, "Cost of the quorum: measured").
func (w *wal) StoreLogs(logs []*raft.Log) error {
	follower := len(logs) > 0 && w.deferSync && w.syncAppends != nil && w.syncAppends()
	err := w.storeLogs(logs, follower)
	if err == nil && follower {
		w.syncOnce(true)
		err = w.WaitDurable(logs[len(logs)-1].Index, appendSyncTimeout)
	}
	if err != nil {
		w.failed.Lock()
		w.failed.err, w.failed.at = err, time.Now()
		w.failed.Unlock()
	}
	return err
}

// storeLogs writes the entries; with deferred sync they are durable at the
// next sync, which is scheduled here unless inline (the caller syncs).
func (w *wal) storeLogs(logs []*raft.Log, inline bool) error {
	if len(logs) == 0 {
		return nil
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.mu.RLock()
	last := w.mu.last
	var cur *segment
	if n := len(w.mu.segs); n > 0 {
		cur = w.mu.segs[n-1]
	}
	w.mu.RUnlock()
	if last != 0 && logs[0].Index != last+1 {
		return fmt.Errorf("raft wal: append of %d after %d is not contiguous", logs[0].Index, last)
	}
	// Plan: records go into the current segment while they fit (leaving
	// room for a terminating zero length), then into new segments.
	type write struct {
		seg   *segment
		at    int64 // file offset of buf
		buf   []byte
		first uint64 // index of buf's first record
		offs  []int64
	}
	var writes []*write
	var wr *write
	var end int64
	if cur != nil {
		end = cur.end
	}
	writing := cur // the segment being written before these entries
	for _, l := range logs {
		rec := encodeRecord(nil, l)
		if cur == nil || end+int64(len(rec))+walRecordHead > cur.size {
			s, err := w.newSegment(l.Index, int64(len(rec)))
			if err != nil {
				return err
			}
			cur, end, wr = s, s.end, nil
		}
		if wr == nil || wr.seg != cur {
			wr = &write{seg: cur, at: end, first: l.Index}
			writes = append(writes, wr)
		}
		wr.offs = append(wr.offs, end)
		wr.buf = append(wr.buf, rec...)
		end += int64(len(rec))
	}
	if cur.end > cur.size/2 || end > cur.size/2 {
		select { // time to prepare the next segment
		case w.want <- struct{}{}:
		default:
		}
	}
	hot := false
	if w.deferSync {
		w.ds.Lock()
		err := w.ds.err
		hot = !inline && (w.ds.waiters > 0 || time.Since(w.ds.lastWait) < min(2*w.syncDelay, eagerWindow))
		w.ds.Unlock()
		if err != nil {
			return err
		}
	}
	for _, x := range writes {
		if err := w.injected("write", x.seg.path); err != nil {
			return fmt.Errorf("raft wal write %s: %w", x.seg.path, err)
		}
		if _, err := x.seg.f.WriteAt(x.buf, x.at); err != nil {
			return fmt.Errorf("raft wal write %s: %w", x.seg.path, err)
		}
		if w.deferSync {
			if hot {
				// Somebody will soon wait for these entries (see
				// noteWritten): start writing them to the device now, so
				// that the sync the wait asks for finds the data there and
				// is a cache flush only. An error shows in that sync.
				// Leaving it out was measured again (2026-11-28, 14
				// alternated pairs, docs/design/0015): unlinks each
				// followed by a barrier and NFS REMOVE on a sync export
				// lose with it out (6/6 and 5/6 quiet pairs), creates
				// closed one by one gain (6/6): kept.
				_ = unix.SyncFileRange(int(x.seg.f.Fd()), x.at, int64(len(x.buf)), unix.SYNC_FILE_RANGE_WRITE)
			}
			continue
		}
		if err := w.fdatasync(x.seg); err != nil {
			return fmt.Errorf("raft wal sync %s: %w", x.seg.path, err)
		}
	}
	lastIdx := logs[len(logs)-1].Index
	if w.deferSync {
		segs := make([]*segment, len(writes))
		for i, x := range writes {
			segs[i] = x.seg
		}
		w.noteWritten(lastIdx, segs, hot, !inline)
	} else {
		w.ds.Lock()
		w.ds.written, w.ds.synced = lastIdx, lastIdx
		w.ds.Unlock()
	}
	// A current segment emptied by a tail cut that the entries do not go
	// into (an outsized first entry) is dropped: only the last segment may
	// be empty. Its file holds no entry; the new segment may have taken
	// its name already (same base).
	var drop *segment
	if writing != nil && len(writing.offs) == 0 && writes[0].seg != writing {
		drop = writing
		w.smu.Lock() // s.closed, against a running sync
		defer w.smu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if drop != nil {
		w.mu.segs = w.mu.segs[:len(w.mu.segs)-1]
		drop.closed = true
		drop.f.Close()
		if !slices.ContainsFunc(writes, func(x *write) bool { return x.seg.path == drop.path }) {
			if err := os.Remove(drop.path); err != nil {
				w.log.Warn("raft wal: remove empty segment", "segment", drop.path, "err", err)
			}
		}
	}
	for _, x := range writes {
		if n := len(w.mu.segs); n == 0 || w.mu.segs[n-1] != x.seg {
			w.mu.segs = append(w.mu.segs, x.seg)
		}
		if len(x.seg.offs) == 0 {
			x.seg.first = x.first
		}
		x.seg.offs = append(x.seg.offs, x.offs...)
		for _, l := range logs[x.first-logs[0].Index:][:len(x.offs)] {
			x.seg.addTerm(l.Index, l.Term)
		}
		x.seg.end = x.at + int64(len(x.buf))
	}
	if w.mu.first == 0 {
		w.mu.first = logs[0].Index
	}
	w.mu.last = lastIdx
	return nil
}

// DeleteRange removes [min, max]. Raft only cuts the head (after a
// snapshot) or the tail (a follower's conflicting suffix).
func (w *wal) DeleteRange(min, max uint64) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.smu.Lock()
	defer w.smu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.first == 0 || max < w.mu.first || min > w.mu.last {
		return nil
	}
	switch {
	case min <= w.mu.first && max >= w.mu.last:
		for _, s := range w.mu.segs {
			s.closed = true
			s.f.Close()
			os.Remove(s.path)
		}
		w.mu.segs, w.mu.first, w.mu.last = nil, 0, 0
		w.cutWritten(0)
		// The removals must be durable before raft goes on (a snapshot
		// install follows): segments back after a machine crash would hold
		// entries raft dropped, possibly of an old term.
		if err := w.syncRemovals(); err != nil {
			return err
		}
	case min <= w.mu.first: // head
		keep := w.mu.segs[:0]
		for _, s := range w.mu.segs {
			if s != w.mu.segs[len(w.mu.segs)-1] && (len(s.offs) == 0 || s.first+uint64(len(s.offs))-1 <= max) {
				s.closed = true
				s.f.Close()
				if err := os.Remove(s.path); err != nil {
					w.log.Warn("raft wal: remove segment", "segment", s.path, "err", err)
				}
				continue
			}
			keep = append(keep, s)
		}
		w.mu.segs = keep
		w.mu.first = max + 1
	case max >= w.mu.last: // tail
		s, start, _, ok := w.locateLocked(min)
		if !ok {
			return fmt.Errorf("raft wal: tail cut at %d not found", min)
		}
		var zero [walRecordHead]byte
		if _, err := s.f.WriteAt(zero[:], start); err != nil {
			return fmt.Errorf("raft wal cut %s: %w", s.path, err)
		}
		if err := unix.Fdatasync(int(s.f.Fd())); err != nil {
			return fmt.Errorf("raft wal cut %s: %w", s.path, err)
		}
		s.offs = s.offs[:min-s.first]
		s.cutTerms(min - 1)
		s.end = start
		keep, removed := w.mu.segs[:0], false
		for _, x := range w.mu.segs {
			if x.base > s.base {
				x.closed = true
				x.f.Close()
				os.Remove(x.path)
				removed = true
				continue
			}
			keep = append(keep, x)
		}
		w.mu.segs = keep
		w.mu.last = min - 1
		if w.mu.last < w.mu.first {
			w.mu.first, w.mu.last = 0, 0
		}
		w.cutWritten(min - 1)
		// The zero length written above ends the log, but segments after it
		// back after a machine crash would make recovery refuse the log
		// (records that do not follow) or take them for a torn tail.
		if removed {
			if err := w.syncRemovals(); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("raft wal: cannot delete %d..%d inside %d..%d", min, max, w.mu.first, w.mu.last)
	}
	return nil
}

// syncRemovals makes the removal of segment files durable.
func (w *wal) syncRemovals() error {
	if err := syncDir(w.dir); err != nil {
		return fmt.Errorf("raft wal: sync %s after removing segments: %w", w.dir, err)
	}
	if w.removedSynced != nil {
		ents, _ := os.ReadDir(w.dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		w.removedSynced(names)
	}
	return nil
}

// cutWritten lowers the written and synced marks after a tail cut (the cut
// itself was synced).
func (w *wal) cutWritten(last uint64) {
	w.ds.Lock()
	w.ds.written = min(w.ds.written, last)
	w.ds.synced = min(w.ds.synced, last)
	for _, r := range w.ds.runs { // rewritten entries may miss their fdatasyncs
		r.upTo = min(r.upTo, last)
	}
	w.ds.Unlock()
}

// Close stops the preallocator and the syncer, makes every written entry
// durable and closes the segments.
func (w *wal) Close() error {
	select {
	case <-w.stop:
		return nil
	default:
	}
	close(w.stop)
	// Drain a preallocated file the loop already handed over.
	select {
	case p := <-w.prealloc:
		if p.f != nil {
			p.f.Close()
			os.Remove(p.path)
		}
	default:
	}
	w.wg.Wait()
	w.syncOnce(true)
	w.ds.Lock()
	err := w.ds.err
	w.ds.Unlock()
	w.closeFiles()
	return err
}

func (w *wal) closeFiles() {
	w.smu.Lock()
	defer w.smu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.mu.segs {
		s.closed = true
		s.f.Close()
	}
	w.mu.segs = nil
}

func encodeRecord(b []byte, l *raft.Log) []byte {
	b = append(b, make([]byte, walRecordHead)...)
	b = binary.AppendUvarint(b, l.Index)
	b = encodeLog(b, l)
	payload := b[walRecordHead:]
	binary.LittleEndian.PutUint32(b[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(payload, castagnoli))
	return b
}
