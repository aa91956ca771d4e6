package chaos

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// LoadConfig shapes the load.
type LoadConfig struct {
	// Dir is where the load works (a directory on the mount).
	Dir string
	// Workers create, stat and remove files, each in its own directory;
	// Keep is how many of its files a worker keeps before it removes its
	// oldest (so creates and removes interleave).
	Workers, Keep int
	// RecordBytes is the writers' record size (0: no writer).
	RecordBytes int
	// Writers: how many writers append records and fsync each (default 1
	// when RecordBytes is set), each to its own files in Dir/writer.
	Writers int
	// MaxWriterBytes bounds a writer's file; it starts a new file after.
	MaxWriterBytes int64
	// Readers read ReadBytes (default 4 KiB) at random offsets, each from
	// a fresh open, and check the bytes: half the reads from ReadFiles
	// files of ReadFileBytes written (and fsync'ed) in Dir/read before the
	// load starts (default 8 of 8 MiB), half from the writers' records
	// whose fsync was acknowledged before the read began.
	Readers, ReadFiles, ReadBytes int
	ReadFileBytes                 int64
	// Lockers: lock files in Dir/locks, each with a locker taking and
	// releasing a write lock on a byte range of it in a loop and checking
	// mutual exclusion (locks.go).
	Lockers int
}

// Op is one timed operation of the load.
type Op struct {
	Kind       string // create, stat, remove, write+fsync, read, lock (the wait), locked-io
	Worker     int    // -1-i: writer i; -100-i: reader i; -200-i: locker i
	Start, End time.Duration
	Err        error
}

// Load is a running load. Its operations are recorded until Stop.
type Load struct {
	cfg   LoadConfig
	epoch time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
	// lockerThreads: the OS threads (tid → true) the lockers run on.
	lockerThreads sync.Map

	mu  sync.Mutex
	ops []Op

	// gate: every operation holds it shared; Pause takes it whole, so
	// that none is under way. gen counts Resumes: the writers reopen
	// their files after one (the mount may have been restarted).
	gate sync.RWMutex
	gen  atomic.Int64

	workers []*worker
	writers []*writer
	readers []*reader
	lockers []*locker
	dead    deadHolders

	// acked: the writers' files (name → file id and records acknowledged
	// by fsync) the readers may read; rmMu is held shared by a reader
	// while it reads one, whole by a writer removing one.
	ackMu sync.Mutex
	acked map[string]ackedFile
	rmMu  sync.RWMutex
	// powerBad: what checkAcked found (kept for Verify).
	powerBad []string
}

type ackedFile struct{ id, n int }

// reader's findings, owned by its goroutine until Stop returns.
type reader struct {
	reads   int
	corrupt []string // "path offset: why", the first maxCorrupt
	bad     int
	// files: the pre-written files it has open, opened in Load.gen gen.
	files map[string]*os.File
	gen   int64
}

// file returns path opened for reading: kept open across reads if keep
// (all reopened after a Resume), else a fresh open the caller closes.
func (r *reader) file(l *Load, path string, keep bool) (f *os.File, done func(), err error) {
	if !keep {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, err
		}
		return f, func() { f.Close() }, nil
	}
	if g := l.gen.Load(); g != r.gen || r.files == nil {
		r.closeFiles()
		r.files, r.gen = map[string]*os.File{}, g
	}
	if f := r.files[path]; f != nil {
		return f, func() {}, nil
	}
	f, err = os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	r.files[path] = f
	return f, func() {}, nil
}

// drop closes path's kept handle (after an error: the next read reopens).
func (r *reader) drop(path string) {
	if f := r.files[path]; f != nil {
		f.Close()
		delete(r.files, path)
	}
}

func (r *reader) closeFiles() {
	for _, f := range r.files {
		f.Close()
	}
	r.files = nil
}

// maxCorrupt bounds the corrupt reads each reader describes.
const maxCorrupt = 20

// worker's bookkeeping, owned by its goroutine until Stop returns.
type worker struct {
	dir       string
	next      int
	live      []string        // acknowledged creates not yet removed, oldest first
	ambiguous map[string]bool // an error left the outcome unknown
}

type writer struct {
	id      int
	dir     string
	file    int
	records map[string]int // file name → records acknowledged by fsync
	failed  map[string]bool
	// checked, bad: records of files already verified and removed (the
	// writer keeps at most keepFiles files, so the disk use is bounded).
	checked int
	bad     []string
}

// keepFiles is how many of its files the writer keeps before it verifies
// and removes the oldest.
const keepFiles = 3

// StartLoad begins the load at once.
func StartLoad(cfg LoadConfig) (*Load, error) {
	if cfg.Keep <= 0 {
		cfg.Keep = 50
	}
	if cfg.MaxWriterBytes <= 0 {
		cfg.MaxWriterBytes = 256 << 20
	}
	if cfg.RecordBytes > 0 && cfg.Writers <= 0 {
		cfg.Writers = 1
	}
	if cfg.RecordBytes <= 0 {
		cfg.Writers = 0
	}
	if cfg.ReadFiles <= 0 {
		cfg.ReadFiles = 8
	}
	if cfg.ReadFileBytes <= 0 {
		cfg.ReadFileBytes = 8 << 20
	}
	if cfg.ReadBytes <= 0 {
		cfg.ReadBytes = 4096
	}
	l := &Load{cfg: cfg, epoch: time.Now(), stop: make(chan struct{}), acked: map[string]ackedFile{}}
	if cfg.Readers > 0 {
		if err := l.prewrite(); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Workers {
		w := &worker{dir: filepath.Join(cfg.Dir, fmt.Sprintf("w%02d", i)), ambiguous: map[string]bool{}}
		if err := os.MkdirAll(w.dir, 0o755); err != nil {
			return nil, fmt.Errorf("load directory: %w", err)
		}
		l.workers = append(l.workers, w)
	}
	for i := range cfg.Writers {
		w := &writer{id: i, dir: filepath.Join(cfg.Dir, "writer"), records: map[string]int{}, failed: map[string]bool{}}
		if err := os.MkdirAll(w.dir, 0o755); err != nil {
			return nil, fmt.Errorf("load directory: %w", err)
		}
		l.writers = append(l.writers, w)
	}
	for range cfg.Readers {
		l.readers = append(l.readers, &reader{})
	}
	if err := l.makeLockFiles(); err != nil {
		return nil, err
	}
	for i, w := range l.workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.runWorker(i, w)
		}()
	}
	for _, w := range l.writers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.runWriter(w)
		}()
	}
	for i, r := range l.readers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.runReader(i, r)
		}()
	}
	for _, k := range l.lockers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.runLocker(k)
		}()
	}
	return l, nil
}

// Pause waits until no operation of the load is under way and holds the
// next ones until Resume (a power-loss trial kills every process between
// operations: each writer's last one was an acknowledged fsync).
func (l *Load) Pause() { l.gate.Lock() }

// Resume lets the load go on after Pause; the writers reopen their files.
func (l *Load) Resume() {
	l.gen.Add(1)
	l.gate.Unlock()
}

// Now is the load's clock (time since it started).
func (l *Load) Now() time.Duration { return time.Since(l.epoch) }

func (l *Load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// timed runs f and records it.
func (l *Load) timed(kind string, worker int, f func() error) error {
	start := l.Now()
	err := f()
	l.record(Op{Kind: kind, Worker: worker, Start: start, End: l.Now(), Err: err})
	return err
}

// record adds a finished operation.
func (l *Load) record(op Op) {
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

func (l *Load) runWorker(id int, w *worker) {
	for !l.stopped() {
		l.gate.RLock()
		l.workerStep(id, w)
		l.gate.RUnlock()
	}
}

// workerStep creates a file, stats it and removes the oldest one kept.
func (l *Load) workerStep(id int, w *worker) {
	name := fmt.Sprintf("f%07d", w.next)
	w.next++
	path := filepath.Join(w.dir, name)
	err := l.timed("create", id, func() error {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	})
	if err != nil {
		w.ambiguous[name] = true
		return
	}
	w.live = append(w.live, name)
	l.timed("stat", id, func() error {
		_, err := os.Stat(path)
		return err
	})
	if len(w.live) > l.cfg.Keep {
		old := w.live[0]
		w.live = w.live[1:]
		if err := l.timed("remove", id, func() error { return os.Remove(filepath.Join(w.dir, old)) }); err != nil {
			w.ambiguous[old] = true
		}
	}
}

// record returns record n of the writer's file: a header (file, n, crc of
// the rest) and a pattern that depends on both, so a lost, torn or
// misplaced record is found.
func record(file, n, size int) []byte {
	b := make([]byte, size)
	for i := 16; i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(file)<<48^uint64(n)<<24^uint64(i))
	}
	binary.LittleEndian.PutUint32(b[0:], uint32(file))
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	binary.LittleEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[16:]))
	return b
}

// name of the writer's file seq.
func (w *writer) name(seq int) string { return fmt.Sprintf("records-%d-%03d", w.id, seq) }

// fileID is what the records of writer w's file seq carry as their file.
func fileID(w, seq int) int { return w<<20 | seq }

func (l *Load) runWriter(w *writer) {
	size := l.cfg.RecordBytes
	for !l.stopped() {
		name := w.name(w.file)
		seq := w.file
		w.file++
		path := filepath.Join(w.dir, name)
		l.gate.RLock()
		gen := l.gen.Load()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		l.gate.RUnlock()
		if err != nil {
			l.timed("write+fsync", -1-w.id, func() error { return fmt.Errorf("open %s: %w", name, err) })
			w.failed[name] = true
			continue
		}
		l.ackMu.Lock()
		l.acked[name] = ackedFile{id: fileID(w.id, seq)}
		l.ackMu.Unlock()
		for n := 0; !l.stopped() && int64(n+1)*int64(size) <= l.cfg.MaxWriterBytes; n++ {
			rec := record(fileID(w.id, seq), n, size)
			l.gate.RLock()
			if g := l.gen.Load(); g != gen { // resumed after a restart of everything: a fresh handle
				f.Close()
				if f, err = os.OpenFile(path, os.O_WRONLY, 0); err != nil {
					l.gate.RUnlock()
					l.timed("write+fsync", -1-w.id, func() error { return fmt.Errorf("reopen %s: %w", name, err) })
					w.failed[name] = true
					break
				}
				gen = g
			}
			err := l.timed("write+fsync", -1-w.id, func() error {
				if _, err := f.WriteAt(rec, int64(n)*int64(size)); err != nil {
					return err
				}
				return f.Sync()
			})
			l.gate.RUnlock()
			if err != nil {
				w.failed[name] = true
				break
			}
			w.records[name] = n + 1
			l.ackMu.Lock()
			l.acked[name] = ackedFile{id: fileID(w.id, seq), n: n + 1}
			l.ackMu.Unlock()
		}
		if f != nil {
			f.Close()
		}
		if old := w.name(seq - keepFiles + 1); seq-keepFiles+1 >= 0 && !w.failed[old] {
			if n, ok := w.records[old]; ok {
				l.gate.RLock()
				bad := l.checkRecords(w.dir, old, fileID(w.id, seq-keepFiles+1), n)
				l.gate.RUnlock()
				w.checked += n
				w.bad = append(w.bad, bad...)
				l.rmMu.Lock()
				l.ackMu.Lock()
				delete(l.acked, old)
				l.ackMu.Unlock()
				if len(bad) == 0 {
					os.Remove(filepath.Join(w.dir, old))
				}
				l.rmMu.Unlock()
				delete(w.records, old)
			}
		}
	}
}

// checkRecords reads back the first n records of file name in dir, whose
// records carry file id file.
func (l *Load) checkRecords(dir, name string, file, n int) (bad []string) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", name, err)}
	}
	defer f.Close()
	buf := make([]byte, l.cfg.RecordBytes)
	for i := range n {
		if _, err := f.ReadAt(buf, int64(i)*int64(len(buf))); err != nil && !errors.Is(err, io.EOF) {
			bad = append(bad, fmt.Sprintf("%s record %d: %v", name, i, err))
		} else if !bytes.Equal(buf, record(file, i, len(buf))) {
			bad = append(bad, fmt.Sprintf("%s record %d: not as written", name, i))
		}
	}
	return bad
}

// Stop ends the load and waits for its goroutines.
func (l *Load) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// Ops returns the operations recorded so far, in completion order.
func (l *Load) Ops() []Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ops)
}

// Check is the outcome of Verify.
type Check struct {
	// Files are the files the workers' directories should hold.
	Files int `json:"files"`
	// Lost: acknowledged creates (not removed) missing; Extra: files that
	// exist but were never acknowledged or whose remove was; Ambiguous:
	// names of operations that failed, either outcome accepted.
	Lost      []string `json:"lost"`
	Extra     []string `json:"extra"`
	Ambiguous int      `json:"ambiguous"`
	// Records: 1 MiB records acknowledged by fsync and checked; Bad: those
	// missing or not as written.
	Records int      `json:"records"`
	Bad     []string `json:"bad"`
	// Reads: the readers' reads; CorruptReads: those whose bytes were not
	// the file's (a pre-written file's, or an acknowledged record's: a
	// stale read), the first few described in Corrupt.
	Reads        int      `json:"reads"`
	CorruptReads int      `json:"corrupt_reads"`
	Corrupt      []string `json:"corrupt"`
	// LockGrants: the lockers' critical sections; LockViolations: ranges
	// found held by a live holder when granted, or changed while held
	// (mutual exclusion broken), the first few of each locker.
	LockGrants     int      `json:"lock_grants"`
	LockViolations []string `json:"lock_violations"`
}

// OK reports whether nothing was lost, doubled or corrupted, and no lock
// was held by two at once.
func (c Check) OK() bool {
	return len(c.Lost) == 0 && len(c.Extra) == 0 && len(c.Bad) == 0 && c.CorruptReads == 0 && len(c.LockViolations) == 0
}

// Verify compares the directories with what the load was told (after Stop).
func (l *Load) Verify() (Check, error) {
	var c Check
	for _, w := range l.workers {
		ents, err := os.ReadDir(w.dir)
		if err != nil {
			return c, fmt.Errorf("list %s: %w", w.dir, err)
		}
		have := map[string]bool{}
		for _, e := range ents {
			have[e.Name()] = true
		}
		want := map[string]bool{}
		for _, n := range w.live {
			want[n] = true
		}
		c.Files += len(want)
		c.Ambiguous += len(w.ambiguous)
		for n := range want {
			if !have[n] && !w.ambiguous[n] {
				c.Lost = append(c.Lost, filepath.Join(w.dir, n))
			}
		}
		for n := range have {
			if !want[n] && !w.ambiguous[n] {
				c.Extra = append(c.Extra, filepath.Join(w.dir, n))
			}
		}
	}
	c.Bad = []string{}
	for _, w := range l.writers {
		c.Records += w.checked
		c.Bad = append(c.Bad, w.bad...)
		for name, n := range w.records {
			var seq int
			fmt.Sscanf(name, w.name(0)[:len(w.name(0))-3]+"%d", &seq)
			c.Records += n
			c.Bad = append(c.Bad, l.checkRecords(w.dir, name, fileID(w.id, seq), n)...)
		}
	}
	c.Bad = append(c.Bad, l.powerBad...)
	c.Corrupt = []string{}
	for _, r := range l.readers {
		c.Reads += r.reads
		c.CorruptReads += r.bad
		c.Corrupt = append(c.Corrupt, r.corrupt...)
	}
	c.LockViolations = []string{}
	for _, k := range l.lockers {
		c.LockGrants += k.grants
		c.LockViolations = append(c.LockViolations, k.violations...)
	}
	l.dead.mu.Lock()
	c.LockViolations = append(c.LockViolations, l.dead.seen...)
	l.dead.mu.Unlock()
	sort.Strings(c.Lost)
	sort.Strings(c.Extra)
	return c, nil
}

// pattern fills b with the content of pre-written file k at offset off
// (a multiple of 8): every 8 bytes depend on the file and their offset,
// so a misplaced, stale or foreign block is found.
func pattern(b []byte, k int, off int64) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(k+1)<<48^uint64(off+int64(i))^0x9e3779b97f4a7c15)
	}
}

// readPath is pre-written file k.
func (l *Load) readPath(k int) string {
	return filepath.Join(l.cfg.Dir, "read", fmt.Sprintf("data-%02d", k))
}

// prewrite writes the readers' files (each fsync'ed) before the load.
func (l *Load) prewrite() error {
	if err := os.MkdirAll(filepath.Join(l.cfg.Dir, "read"), 0o755); err != nil {
		return fmt.Errorf("load directory: %w", err)
	}
	buf := make([]byte, 1<<20)
	for k := range l.cfg.ReadFiles {
		f, err := os.OpenFile(l.readPath(k), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("readers' file: %w", err)
		}
		for off := int64(0); off < l.cfg.ReadFileBytes; off += int64(len(buf)) {
			b := buf[:min(int64(len(buf)), l.cfg.ReadFileBytes-off)]
			pattern(b, k, off)
			if _, err := f.WriteAt(b, off); err != nil {
				f.Close()
				return fmt.Errorf("write the readers' file %s: %w", l.readPath(k), err)
			}
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("fsync the readers' file %s: %w", l.readPath(k), err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("close the readers' file %s: %w", l.readPath(k), err)
		}
	}
	return nil
}

// runReader reads at random: a pre-written file (through handles it keeps
// open) or an acknowledged record.
func (l *Load) runReader(id int, r *reader) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	size := l.cfg.ReadBytes
	got, want := make([]byte, size), make([]byte, size)
	defer r.closeFiles()
	for !l.stopped() {
		l.gate.RLock()
		if rng.IntN(2) == 0 || !l.readRecord(id, r, rng, got) {
			k := rng.IntN(l.cfg.ReadFiles)
			off := rng.Int64N(max(1, l.cfg.ReadFileBytes/int64(size))) * int64(size)
			n := int(min(int64(size), l.cfg.ReadFileBytes-off))
			pattern(want[:n], k, off)
			l.readAt(id, r, l.readPath(k), off, got[:n], want[:n], "")
		}
		l.gate.RUnlock()
	}
}

// readRecord reads from a record a writer's fsync acknowledged; false if
// there is none yet.
func (l *Load) readRecord(id int, r *reader, rng *rand.Rand, got []byte) bool {
	l.rmMu.RLock()
	defer l.rmMu.RUnlock()
	l.ackMu.Lock()
	var names []string
	for name, a := range l.acked {
		if a.n > 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		l.ackMu.Unlock()
		return false
	}
	slices.Sort(names) // map order is not the seed's
	name := names[rng.IntN(len(names))]
	a := l.acked[name]
	l.ackMu.Unlock()
	rec := rng.IntN(a.n)
	size := l.cfg.RecordBytes
	in := rng.IntN(max(1, size/len(got))) * len(got)
	n := min(len(got), size-in)
	want := record(a.id, rec, size)[in : in+n]
	l.readAt(id, r, filepath.Join(l.cfg.Dir, "writer", name), int64(rec*size+in), got[:n], want, " (stale: an acknowledged record)")
	return true
}

// readAt is one timed read of len(got) bytes of path at off; bytes other
// than want are a corrupt read. A pre-written file (what "") stays open
// across reads, as a job reading a file at random keeps it open; a
// record's file is opened for the read.
func (l *Load) readAt(id int, r *reader, path string, off int64, got, want []byte, what string) {
	err := l.timed("read", -100-id, func() error {
		f, done, err := r.file(l, path, what == "")
		if err != nil {
			return err
		}
		defer done()
		n, err := f.ReadAt(got, off)
		if err != nil && !(errors.Is(err, io.EOF) && n == len(got)) {
			return fmt.Errorf("read %s at %d: %w", path, off, err)
		}
		return nil
	})
	if err != nil {
		r.drop(path)
		return
	}
	r.reads++
	if !bytes.Equal(got, want) {
		r.bad++
		if len(r.corrupt) < maxCorrupt {
			r.corrupt = append(r.corrupt, fmt.Sprintf("%.1fs %s at %d: %d bytes not as written%s", l.Now().Seconds(), path, off, len(got), what))
		}
	}
}

// ackedCheck is what checkAcked read.
type ackedCheck struct {
	checked int
	bad     []string
}

// checkAcked reads back every record acknowledged so far that is still
// kept (while the load is paused: after a power loss), and keeps what it
// found bad for Verify.
func (l *Load) checkAcked() ackedCheck {
	l.ackMu.Lock()
	acked := maps.Clone(l.acked)
	l.ackMu.Unlock()
	var r ackedCheck
	names := slices.Sorted(maps.Keys(acked))
	for _, name := range names {
		a := acked[name]
		r.checked += a.n
		r.bad = append(r.bad, l.checkRecords(filepath.Join(l.cfg.Dir, "writer"), name, a.id, a.n)...)
	}
	l.powerBad = append(l.powerBad, r.bad...)
	return r
}
