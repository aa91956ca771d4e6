package chaos

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
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
	// RecordBytes is the writer's record size (0: no writer).
	RecordBytes int
	// MaxWriterBytes bounds the writer's file; it starts a new file after.
	MaxWriterBytes int64
}

// Op is one timed operation of the load.
type Op struct {
	Kind       string // create, stat, remove, write+fsync
	Worker     int    // -1: the writer
	Start, End time.Duration
	Err        error
}

// Load is a running load. Its operations are recorded until Stop.
type Load struct {
	cfg   LoadConfig
	epoch time.Time
	stop  chan struct{}
	wg    sync.WaitGroup

	mu  sync.Mutex
	ops []Op

	workers []*worker
	writer  *writer
}

// worker's bookkeeping, owned by its goroutine until Stop returns.
type worker struct {
	dir       string
	next      int
	live      []string        // acknowledged creates not yet removed, oldest first
	ambiguous map[string]bool // an error left the outcome unknown
}

type writer struct {
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
	l := &Load{cfg: cfg, epoch: time.Now(), stop: make(chan struct{})}
	for i := range cfg.Workers {
		w := &worker{dir: filepath.Join(cfg.Dir, fmt.Sprintf("w%02d", i)), ambiguous: map[string]bool{}}
		if err := os.MkdirAll(w.dir, 0o755); err != nil {
			return nil, fmt.Errorf("load directory: %w", err)
		}
		l.workers = append(l.workers, w)
	}
	if cfg.RecordBytes > 0 {
		l.writer = &writer{dir: filepath.Join(cfg.Dir, "writer"), records: map[string]int{}, failed: map[string]bool{}}
		if err := os.MkdirAll(l.writer.dir, 0o755); err != nil {
			return nil, fmt.Errorf("load directory: %w", err)
		}
	}
	for i, w := range l.workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.runWorker(i, w)
		}()
	}
	if l.writer != nil {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.runWriter()
		}()
	}
	return l, nil
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
	end := l.Now()
	l.mu.Lock()
	l.ops = append(l.ops, Op{Kind: kind, Worker: worker, Start: start, End: end, Err: err})
	l.mu.Unlock()
	return err
}

func (l *Load) runWorker(id int, w *worker) {
	for !l.stopped() {
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
			continue
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

func (l *Load) runWriter() {
	w := l.writer
	size := l.cfg.RecordBytes
	for !l.stopped() {
		name := fmt.Sprintf("records-%03d", w.file)
		file := w.file
		w.file++
		f, err := os.OpenFile(filepath.Join(w.dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			l.timed("write+fsync", -1, func() error { return fmt.Errorf("open %s: %w", name, err) })
			w.failed[name] = true
			continue
		}
		for n := 0; !l.stopped() && int64(n+1)*int64(size) <= l.cfg.MaxWriterBytes; n++ {
			rec := record(file, n, size)
			err := l.timed("write+fsync", -1, func() error {
				if _, err := f.WriteAt(rec, int64(n)*int64(size)); err != nil {
					return err
				}
				return f.Sync()
			})
			if err != nil {
				w.failed[name] = true
				break
			}
			w.records[name] = n + 1
		}
		f.Close()
		if old := fmt.Sprintf("records-%03d", file-keepFiles+1); file-keepFiles+1 >= 0 && !w.failed[old] {
			if n, ok := w.records[old]; ok {
				bad := l.checkRecords(old, n)
				w.checked += n
				w.bad = append(w.bad, bad...)
				if len(bad) == 0 {
					os.Remove(filepath.Join(w.dir, old))
				}
				delete(w.records, old)
			}
		}
	}
}

// checkRecords reads back the first n records of the writer's file name.
func (l *Load) checkRecords(name string, n int) (bad []string) {
	f, err := os.Open(filepath.Join(l.writer.dir, name))
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", name, err)}
	}
	defer f.Close()
	var file int
	fmt.Sscanf(name, "records-%d", &file)
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
}

// OK reports whether nothing was lost, doubled or corrupted.
func (c Check) OK() bool { return len(c.Lost) == 0 && len(c.Extra) == 0 && len(c.Bad) == 0 }

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
	if w := l.writer; w != nil {
		c.Records, c.Bad = w.checked, slices.Clone(w.bad)
		for name, n := range w.records {
			c.Records += n
			c.Bad = append(c.Bad, l.checkRecords(name, n)...)
		}
	}
	sort.Strings(c.Lost)
	sort.Strings(c.Extra)
	return c, nil
}
