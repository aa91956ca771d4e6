package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// The first mutation of a clean chunk syncs neither the chunk's sidecar nor
// its data: the durable trace is its record in the target's intent log.
func TestFirstMutationOfCleanChunkSyncsNoSidecar(t *testing.T) {
	e := newEnv(t, 1, nil)
	e.mustWrite(1, 1, 0, pattern(1, 3901), true) // created and synced: clean
	c := e.s.cache.lookup(e.s.targets[0], 1)
	if c == nil {
		t.Fatal("chunk not open after its write")
	}
	sumFd, dataFd := c.sumFd, c.dataFd
	e.s.cache.release(c)
	var mu sync.Mutex
	var synced []int
	hook := func(fd int) {
		mu.Lock()
		synced = append(synced, fd)
		mu.Unlock()
	}
	testHookFdatasync.Store(&hook)
	t.Cleanup(func() { testHookFdatasync.Store(nil) })
	e.mustWrite(1, 1, 100, []byte("rewrite of a clean chunk"), false)
	testHookFdatasync.Store(nil)
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(synced, sumFd) || slices.Contains(synced, dataFd) {
		t.Fatalf("the first mutation of a clean chunk fdatasynced its files (sidecar fd %d, data fd %d): %v", sumFd, dataFd, synced)
	}
	if f := chunkFlags(t, e.dirs[0], 1); f&flagDirty == 0 {
		t.Fatal("the sidecar does not say dirty after the mutation")
	}
}

// readDirtyLog decodes target dir's intent log.
func readDirtyLog(t *testing.T, dir string) (epoch uint64, inos []uint64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, dirtyLogName))
	if err != nil {
		t.Fatal(err)
	}
	d, err := decodeDirtyLog(b)
	if err != nil {
		t.Fatalf("intent log: %v", err)
	}
	return d.epoch, d.inos
}

// First mutations of many clean chunks on a target while a log round runs
// share the next round: two log fdatasyncs for nine first mutations, none
// answered before the round that covers it, each chunk named in the log.
func TestConcurrentFirstMutationsShareLogSyncs(t *testing.T) {
	e := newEnv(t, 1, nil)
	const n = 9
	for i := uint64(1); i <= n; i++ {
		e.mustWrite(1, i, 0, pattern(int(i), 3901), true)
	}
	l := e.s.targets[0].dlog
	var mu sync.Mutex
	rounds := 0
	release := make(chan struct{})
	hook := func(int) {
		mu.Lock()
		rounds++
		r := rounds
		mu.Unlock()
		if r == 1 {
			<-release
		}
	}
	testHookDirtyLogSync.Store(&hook)
	t.Cleanup(func() { testHookDirtyLogSync.Store(nil) })
	syncs0 := l.syncs.Load()
	mutate := func(ino uint64) error { return e.write(1, ino, 7, []byte("first mutation"), false) }
	first := make(chan error, 1)
	go func() { first <- mutate(1) }()
	waitFor(t, "the first log round to start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rounds == 1
	})
	errs := make(chan error, n-1)
	for i := uint64(2); i <= n; i++ {
		go func() { errs <- mutate(i) }()
	}
	waitFor(t, "the later first mutations to join the next round", func() bool {
		return l.rounds.Waiting() == int(n-1)
	})
	select {
	case err := <-errs:
		t.Fatalf("a first mutation was answered before its log round: %v", err)
	default:
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := l.syncs.Load() - syncs0; got != 2 {
		t.Fatalf("%d first mutations made %d log fdatasyncs, want 2 (one running, one shared by the rest)", n, got)
	}
	_, inos := readDirtyLog(t, e.dirs[0])
	slices.Sort(inos)
	if want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}; !slices.Equal(inos, want) {
		t.Fatalf("log names %v, want %v", inos, want)
	}
}

// setSidecarClean writes a clean header into ino's sidecar in dir, as a
// crash that lost the (unsynced) dirty flag leaves it.
func setSidecarClean(t *testing.T, dir string, ino uint64) {
	t.Helper()
	f, err := os.OpenFile(sumPath(dir, ino), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sumHeader{version: sumFormat, block: blockSize, ino: ino}.encode()
	if _, err := f.WriteAt(h[:], 0); err != nil {
		t.Fatal(err)
	}
}

// writeBehind writes b into ino's data file in dir at off, as a crash that
// kept a write's data but not its sums leaves it.
func writeBehind(t *testing.T, dir string, ino uint64, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(dataPath(dir, ino), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A crash after the log record was durable, with the sidecar still saying
// clean and data and sums disagreeing on disk: the chunk is recomputed,
// not reported as rot. A clean chunk the log does not name still is.
func TestCrashAfterLogRecordRecomputes(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	data := pattern(2, 32<<10)
	e.mustWrite(1, 1, 0, data, true)
	e.mustWrite(1, 1, 4096, []byte("unsynced"), false)
	e.mustWrite(1, 2, 0, data, true)
	e.crash()
	setSumsClean(t, e.dirs[0], 1)
	behind := []byte("data on disk without its sums")
	writeBehind(t, e.dirs[0], 1, 20000, behind)
	writeBehind(t, e.dirs[0], 2, 20000, behind)
	e.start()
	want := append([]byte(nil), data...)
	copy(want[4096:], "unsynced")
	copy(want[20000:], behind)
	got, err := e.read(1, 1, 0, 64<<10)
	if err != nil {
		t.Fatalf("chunk named in the intent log after a crash: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("chunk named in the intent log after a crash: first diff at %d", firstDiff(got, want))
	}
	if out := logs.String(); !strings.Contains(out, "recomputed chunk checksums") || !strings.Contains(out, "intent log names chunks") {
		t.Fatalf("no recovery log lines:\n%s", out)
	}
	if _, err := e.read(1, 2, 16384, 8192); !errors.Is(err, syscall.EIO) {
		t.Fatalf("clean chunk changed behind the server: want EIO, got %v", err)
	}
	if _, inos := readDirtyLog(t, e.dirs[0]); len(inos) != 0 {
		t.Fatalf("intent log not emptied at open: %v", inos)
	}
}

func TestDecodeDirtyLog(t *testing.T) {
	b := encodeDirtyLogHeader(5)
	b = appendDirtyLogRecord(b, 5, 10, 0x11)
	b = appendDirtyLogRecord(b, 5, 11, 0x22)
	whole := len(b)
	torn := appendDirtyLogRecord(slices.Clone(b), 5, 12, 0x33)
	for name, c := range map[string][]byte{
		"torn record":       torn[:len(torn)-10],
		"bad record crc":    append(slices.Clone(torn[:len(torn)-1]), torn[len(torn)-1]^1),
		"other epoch":       appendDirtyLogRecord(slices.Clone(b), 4, 12, 0x33),
		"zeros past end":    append(slices.Clone(b), make([]byte, 64)...),
		"no tail":           b,
		"older run behind":  appendDirtyLogRecord(appendDirtyLogRecord(slices.Clone(b), 5, 3, 0x33), 5, 4, 0x44),
		"gap in sequence":   appendDirtyLogRecord(slices.Clone(b), 5, 13, 0x33),
		"torn after a slot": append(appendDirtyLogRecord(slices.Clone(b), 6, 12, 0x44), 1, 2, 3),
	} {
		d, err := decodeDirtyLog(c)
		if err != nil || d.epoch != 5 || !slices.Equal(d.inos, []uint64{0x11, 0x22}) || d.valid != whole {
			t.Errorf("%s: %+v, %v; want epoch 5 naming [11 22] in %d bytes", name, d, err, whole)
		}
		if want := uint64(11); name == "gap in sequence" {
			if d.maxSeq != 13 {
				t.Errorf("%s: highest sequence number %d, want 13", name, d.maxSeq)
			}
		} else if !d.seen || d.maxSeq != want {
			t.Errorf("%s: highest sequence number %d (seen %v), want %d", name, d.maxSeq, d.seen, want)
		}
	}
	// A new run from the first slot hides the older one behind it.
	run := appendDirtyLogRecord(encodeDirtyLogHeader(5), 5, 12, 0x77)
	run = append(run, b[dirtyLogHeaderBytes+dirtyLogRecordBytes:]...)
	if d, err := decodeDirtyLog(run); err != nil || !slices.Equal(d.inos, []uint64{0x77}) || d.maxSeq != 12 {
		t.Errorf("new run over an old one: %+v, %v; want [77] up to sequence 12", d, err)
	}
	reserved := encodeDirtyLogHeader(1)
	reserved[25] = 1
	fixHeaderCRC(reserved)
	for name, c := range map[string][]byte{
		"short header": b[:20],
		"bad magic":    append([]byte("XTRATDLG"), b[8:]...),
		"bad crc":      append(slices.Clone(b[:28]), 0, 0, 0, 0),
		"reserved set": reserved,
	} {
		if _, err := decodeDirtyLog(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	h := encodeDirtyLogHeader(1)
	h[8] = dirtyLogFormat + 1
	fixHeaderCRC(h)
	if _, err := decodeDirtyLog(h); !errors.Is(err, errDirtyLogNewer) {
		t.Errorf("newer version: %v", err)
	}
}

// fixHeaderCRC sets the CRC of a header the test changed.
func fixHeaderCRC(h []byte) {
	binary.LittleEndian.PutUint32(h[28:], crc32.Checksum(h[:28], castagnoli))
}

// A torn last record (a round cut by a crash, never waited for) is
// ignored: the target opens, the records before it count.
func TestDirtyLogTornTailIgnored(t *testing.T) {
	e := newEnv(t, 1, nil)
	data := pattern(3, 16<<10)
	e.mustWrite(1, 1, 0, data, true)
	e.mustWrite(1, 2, 0, data, true)
	e.crash()
	epoch, _ := readDirtyLog(t, e.dirs[0])
	b := encodeDirtyLogHeader(epoch)
	b = appendDirtyLogRecord(b, epoch, 0, 1)
	rec2 := appendDirtyLogRecord(nil, epoch, 1, 2)
	b = append(b, rec2[:12]...)
	if err := os.WriteFile(filepath.Join(e.dirs[0], dirtyLogName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	behind := []byte("changed")
	writeBehind(t, e.dirs[0], 1, 5000, behind)
	writeBehind(t, e.dirs[0], 2, 5000, behind)
	e.start()
	want := append([]byte(nil), data...)
	copy(want[5000:], behind)
	if got := e.mustRead(1, 1, 0, 32<<10); !bytes.Equal(got, want) {
		t.Fatal("chunk named by the last whole record not recomputed")
	}
	if _, err := e.read(1, 2, 4096, 4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("chunk named only by the torn record: want EIO (not named), got %v", err)
	}
	if _, inos := readDirtyLog(t, e.dirs[0]); len(inos) != 0 {
		t.Fatalf("intent log not emptied at open: %v", inos)
	}
}

// A checkpoint never drops the record of a chunk that is still dirty: not
// when other chunks of the log become clean, not when the log is rewritten
// to bound its size; once every chunk it names is clean, the next record
// starts the log afresh, and a clean stop leaves it empty.
func TestDirtyLogCheckpointKeepsDirtyChunks(t *testing.T) {
	old := dirtyLogCompactMin.Swap(1)
	t.Cleanup(func() { dirtyLogCompactMin.Store(old) })
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	data := pattern(4, 8<<10)
	sync1 := func(ino uint64) {
		t.Helper()
		if err := e.call(rpc.SSync, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}}); err != nil {
			t.Fatal(err)
		}
	}
	for ino := uint64(1); ino <= 10; ino++ {
		e.mustWrite(1, ino, 0, data, true)
	}
	epoch0, _ := readDirtyLog(t, e.dirs[0])
	for ino := uint64(1); ino <= 8; ino++ {
		e.mustWrite(1, ino, 10, []byte("mutation"), false)
	}
	for ino := uint64(1); ino <= 7; ino++ {
		sync1(ino)
	}
	if _, inos := readDirtyLog(t, e.dirs[0]); !slices.Contains(inos, 8) {
		t.Fatalf("log lost the record of dirty chunk 8 when the others became clean: %v", inos)
	}
	// 8 records, one chunk still dirty: the next round rewrites the log.
	e.mustWrite(1, 9, 10, []byte("mutation"), false)
	epoch, inos := readDirtyLog(t, e.dirs[0])
	slices.Sort(inos)
	if epoch != epoch0+1 || !slices.Equal(inos, []uint64{8, 9}) {
		t.Fatalf("rewritten log: epoch %d names %v; want epoch %d naming [8 9]", epoch, inos, epoch0+1)
	}
	sync1(9)
	if _, inos := readDirtyLog(t, e.dirs[0]); !slices.Contains(inos, 8) {
		t.Fatalf("log lost the record of dirty chunk 8: %v", inos)
	}
	e.crash()
	setSumsClean(t, e.dirs[0], 8)
	writeBehind(t, e.dirs[0], 8, 5000, []byte("unsynced"))
	writeBehind(t, e.dirs[0], 1, 5000, []byte("behind"))
	e.start()
	if _, err := e.read(1, 8, 0, 8<<10); err != nil {
		t.Fatalf("dirty chunk kept in the log across checkpoints: %v", err)
	}
	if !strings.Contains(logs.String(), "recomputed chunk checksums") {
		t.Fatal("chunk 8 not recomputed")
	}
	if _, err := e.read(1, 1, 4096, 4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("chunk made clean before the crash and changed behind the server: want EIO, got %v", err)
	}
	e.mustWrite(1, 8, 10, []byte("again"), false)
	if _, inos := readDirtyLog(t, e.dirs[0]); !slices.Equal(inos, []uint64{8}) {
		t.Fatalf("log names %v, want [8]", inos)
	}
	sync1(8)
	e.mustWrite(1, 10, 10, []byte("mutation"), false)
	if _, inos := readDirtyLog(t, e.dirs[0]); !slices.Equal(inos, []uint64{10}) {
		t.Fatalf("log after every chunk it named became clean names %v, want only the new record [10]", inos)
	}
	e.stop()
	if _, inos := readDirtyLog(t, e.dirs[0]); len(inos) != 0 {
		t.Fatalf("log not emptied by a clean stop: %v", inos)
	}
}

// A target written by a release before the intent log (format 1, no
// dirty.log) opens: its dirty sidecars recover as before, it is upgraded
// to format 2 with an empty log, and first mutations use the log. A log
// of a newer version or with a damaged header is refused, naming it.
func TestTargetWithoutDirtyLogOpens(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, nil)
	data := pattern(5, 8<<10)
	e.mustWrite(1, 1, 0, data, true)
	e.mustWrite(1, 2, 0, data, false) // new: dirty in its sidecar, not in the log
	e.crash()
	dir := e.dirs[0]
	if err := os.Remove(filepath.Join(dir, dirtyLogName)); err != nil {
		t.Fatal(err)
	}
	id, err := readOrFormat(dir)
	if err != nil {
		t.Fatal(err)
	}
	id.Format = 1
	if err := writeIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	e.start()
	if got := e.mustRead(1, 2, 0, 16<<10); !bytes.Equal(got, data) || !strings.Contains(logs.String(), "recomputed chunk checksums") {
		t.Fatal("dirty chunk of an old target not recovered")
	}
	if got := e.mustRead(1, 1, 0, 16<<10); !bytes.Equal(got, data) {
		t.Fatal("clean chunk of an old target wrong")
	}
	if id, err = readOrFormat(dir); err != nil || id.Format != targetFormat {
		t.Fatalf("identity after open: format %d (%v), want %d", id.Format, err, targetFormat)
	}
	e.mustWrite(1, 1, 0, []byte("x"), false)
	if _, inos := readDirtyLog(t, dir); !slices.Equal(inos, []uint64{1}) {
		t.Fatalf("log of an upgraded target names %v, want [1]", inos)
	}
	e.stop()
	if _, inos := readDirtyLog(t, dir); len(inos) != 0 {
		t.Fatalf("log not emptied by a clean stop: %v", inos)
	}

	h := encodeDirtyLogHeader(1)
	h[8] = dirtyLogFormat + 1
	fixHeaderCRC(h)
	for name, content := range map[string][]byte{"newer version": h, "damaged header": []byte("not a log at all, longer than 32 bytes")} {
		if err := os.WriteFile(filepath.Join(dir, dirtyLogName), content, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(e.cfg)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), dirtyLogName) {
			t.Errorf("%s: open gave %v, want ErrFormat naming %s", name, err, dirtyLogName)
		}
	}
}

func FuzzDirtyLog(f *testing.F) {
	b := encodeDirtyLogHeader(3)
	f.Add(slices.Clone(b))
	b = appendDirtyLogRecord(b, 3, 7, 42)
	f.Add(slices.Clone(b))
	b = appendDirtyLogRecord(b, 3, 8, 43)
	f.Add(append(slices.Clone(b), 1, 2, 3))
	f.Add(appendDirtyLogRecord(slices.Clone(b), 3, 2, 44))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeDirtyLog(b)
		if err != nil || len(b) == 0 {
			return
		}
		// The run is exactly what an encoder writes for its records.
		again := encodeDirtyLogHeader(d.epoch)
		if len(d.inos) > 0 {
			first := binary.LittleEndian.Uint64(b[dirtyLogHeaderBytes+16:])
			for i, ino := range d.inos {
				again = appendDirtyLogRecord(again, d.epoch, first+uint64(i), ino)
			}
			if !d.seen || d.maxSeq < first+uint64(len(d.inos)-1) {
				t.Fatalf("highest sequence number %d below the run's", d.maxSeq)
			}
		}
		if d.valid > len(b) || !bytes.Equal(again, b[:d.valid]) {
			t.Fatalf("run of %d bytes differs from its re-encoding", d.valid)
		}
	})
}
