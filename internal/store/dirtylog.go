package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rounds"
)

// Intent log of the dirty flag (docs/design/0010 § a4)
//
// The first mutation of a clean chunk must leave a durable trace before it
// touches data or sums (chunk.go's essay). Instead of an fdatasync of the
// chunk's own sidecar header, that trace is a record in the target's
// dirty.log: beginMutation has the chunk's inode number written there and
// waits for the log's next fdatasync, which every first mutation on the
// target that arrived meanwhile shares (group commit, as the metadata
// log's): a waiter joins the next round that starts after it asked, never
// the one running; the first waiter with no round running runs it at once
// (a lone writer is not delayed). The sidecar header still gets its dirty
// flag, written through the page cache without a sync: it is what this
// process (and a reopen after eviction) reads, and a crash may lose it —
// the log does not.
//
// The file is extended with zeros ahead of its records (dirtyLogGrowBytes
// at a time), so that a round overwrites blocks that exist: its fdatasync
// writes them and flushes the device, without a metadata commit for a new
// file size (an append plus fdatasync cost 1.2–2× an overwrite here).
//
// Recovery: when a target opens, every chunk its log names gets its
// sidecar header's dirty flag set and synced, then the log is emptied; the
// chunks are recomputed when next opened, like any chunk whose header says
// dirty (chunk.recover).
//
// Checkpoints: the log must name every chunk that was mutated since its
// last sync, and may name more (a chunk named needlessly costs one
// recomputation after a crash). durable holds the chunks whose record is in
// the file and that are not clean yet; a sync that makes a chunk clean
// (chunk.sync: data and sums durable, no mutation since) or a remove drops
// it. When none is left, every record in the file names a clean chunk, and
// the next round writes from the first record slot again: its records
// carry sequence numbers that continue the file's, so a reader stops where
// the new run meets the old one (no truncate, no extra sync; a crash
// before that round only names clean chunks). While chunks stay dirty the
// run grows; once it holds more than max(dirtyLogCompactMin, 2 × the
// chunks that must stay named) records, a round writes a new file with
// just those (and its own records), fdatasyncs it and renames it over the
// old one: the log never stops naming a dirty chunk, and its size stays
// within a constant factor of the number of dirty chunks (a file grown
// large is replaced by a small one at the next run that starts afresh). A
// removed chunk is dropped at once: its bytes are never read again (inode
// numbers are not reused), so a crash that undoes the unlink leaves an
// orphan that is removed, not read. A clean stop, with every chunk clean,
// zeroes the first record slot and syncs: the next open finds an empty log.
//
// Errors: a round whose write or fdatasync fails fails its callers (their
// chunks stay clean and unchanged) and marks the log broken; the next round
// replaces the file whole, so no record's durability rests on a page whose
// write-back failed.

// Format of TARGET/dirty.log, version 1 (all integers little-endian):
//
//	header, 32 bytes
//	offset size field
//	0      8    magic "STRATDLG"
//	8      2    format version (1)
//	10     2    reserved, zero
//	12     4    record size in bytes (32)
//	16     8    epoch: a new file's epoch is its predecessor's plus 1
//	24     4    reserved, zero
//	28     4    CRC32C of bytes 0..27
//
//	record slots, 32 bytes each, from offset 32
//	0      8    inode number of a chunk that may differ from its sums on disk
//	8      8    the header's epoch
//	16     8    sequence number: one more than the previous record's
//	24     4    reserved, zero
//	28     4    CRC32C of bytes 0..27
//
// The log is the run of records from the first slot on, up to the first
// slot whose CRC, epoch or reserved field is wrong or whose sequence number
// does not follow its predecessor's; the rest is ignored: zeros not
// written yet, a torn tail (a round cut by a crash, never waited for),
// records of an earlier run (smaller sequence numbers) and bytes of an
// earlier file that a crash leaves in this one's blocks (another epoch). A
// writer starting a new run continues the sequence from the highest number
// of any valid slot. A header that is short, damaged, of another record
// size or with reserved bytes set makes the target refuse to open (its
// records cannot be trusted, and ignoring them could report unsynced
// writes as corruption); a newer version is refused too. The file is
// created whole (written, synced and renamed into place), so a crash never
// leaves it without a header.
//
// Version history: 1 — initial (target format 2).
const (
	dirtyLogName        = "dirty.log"
	dirtyLogFormat      = 1
	dirtyLogHeaderBytes = 32
	dirtyLogRecordBytes = 32
	dirtyLogGrowBytes   = 64 << 10
)

var dirtyLogMagic = [8]byte{'S', 'T', 'R', 'A', 'T', 'D', 'L', 'G'}

// dirtyLogCompactMin: the fewest records with which a log is rewritten to
// hold only the chunks that must stay named (see the essay). A variable for
// tests.
var dirtyLogCompactMin atomic.Int64

func init() { dirtyLogCompactMin.Store(4096) }

func encodeDirtyLogHeader(epoch uint64) []byte {
	b := make([]byte, dirtyLogHeaderBytes)
	copy(b[0:8], dirtyLogMagic[:])
	binary.LittleEndian.PutUint16(b[8:], dirtyLogFormat)
	binary.LittleEndian.PutUint32(b[12:], dirtyLogRecordBytes)
	binary.LittleEndian.PutUint64(b[16:], epoch)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

func appendDirtyLogRecord(b []byte, epoch, seq, ino uint64) []byte {
	var r [dirtyLogRecordBytes]byte
	binary.LittleEndian.PutUint64(r[0:], ino)
	binary.LittleEndian.PutUint64(r[8:], epoch)
	binary.LittleEndian.PutUint64(r[16:], seq)
	binary.LittleEndian.PutUint32(r[28:], crc32.Checksum(r[:28], castagnoli))
	return append(b, r[:]...)
}

// errDirtyLogNewer: the log was written by a newer release.
var errDirtyLogNewer = errors.New("intent log of a newer format version")

// decodedDirtyLog is what decodeDirtyLog finds in a log file.
type decodedDirtyLog struct {
	epoch uint64
	inos  []uint64 // of the run's records, in order, possibly repeated
	valid int      // bytes of header and run
	// maxSeq is the highest sequence number of any valid slot (of the run
	// or not); seen says whether there is one.
	maxSeq uint64
	seen   bool
}

// decodeDirtyLog parses a whole dirty.log. An empty file is an empty log
// of epoch 0.
func decodeDirtyLog(b []byte) (decodedDirtyLog, error) {
	var d decodedDirtyLog
	if len(b) == 0 {
		return d, nil
	}
	if len(b) < dirtyLogHeaderBytes {
		return d, fmt.Errorf("header cut short at %d bytes", len(b))
	}
	h := b[:dirtyLogHeaderBytes]
	if string(h[0:8]) != string(dirtyLogMagic[:]) {
		return d, fmt.Errorf("bad magic %q", h[0:8])
	}
	if got, want := binary.LittleEndian.Uint32(h[28:]), crc32.Checksum(h[:28], castagnoli); got != want {
		return d, fmt.Errorf("header checksum %08x, computed %08x", got, want)
	}
	if v := binary.LittleEndian.Uint16(h[8:]); v != dirtyLogFormat {
		if v > dirtyLogFormat {
			return d, fmt.Errorf("%w: version %d, this build reads only %d", errDirtyLogNewer, v, dirtyLogFormat)
		}
		return d, fmt.Errorf("format version %d", v)
	}
	if rs := binary.LittleEndian.Uint32(h[12:]); rs != dirtyLogRecordBytes {
		return d, fmt.Errorf("record size %d, want %d", rs, dirtyLogRecordBytes)
	}
	if binary.LittleEndian.Uint16(h[10:]) != 0 || binary.LittleEndian.Uint32(h[24:]) != 0 {
		return d, errors.New("reserved header bytes set")
	}
	d.epoch = binary.LittleEndian.Uint64(h[16:])
	d.valid = dirtyLogHeaderBytes
	inRun := true
	var prev uint64
	for off := dirtyLogHeaderBytes; off+dirtyLogRecordBytes <= len(b); off += dirtyLogRecordBytes {
		r := b[off : off+dirtyLogRecordBytes]
		ok := binary.LittleEndian.Uint32(r[28:]) == crc32.Checksum(r[:28], castagnoli) &&
			binary.LittleEndian.Uint64(r[8:]) == d.epoch && binary.LittleEndian.Uint32(r[24:]) == 0
		seq := binary.LittleEndian.Uint64(r[16:])
		if ok {
			d.maxSeq = max(d.maxSeq, seq)
			d.seen = true
		}
		if inRun && ok && (off == dirtyLogHeaderBytes || seq == prev+1) {
			d.inos = append(d.inos, binary.LittleEndian.Uint64(r[0:]))
			d.valid = off + dirtyLogRecordBytes
			prev = seq
		} else {
			inRun = false
		}
	}
	return d, nil
}

// dirtyLog is a target's intent log of the dirty flag.
type dirtyLog struct {
	path string

	// ioMu is held by whoever writes or replaces the file; the fields
	// below it change only under it.
	ioMu    sync.Mutex
	fd      int
	epoch   uint64
	seq     uint64 // the next record's sequence number
	run     int64  // records of the current run (from the first slot)
	size    int64  // the file's length: header, run, zeros or older slots
	cleared bool   // the first slot is zeros on disk (the log is empty)
	broken  bool   // a round failed: the next replaces the file whole

	mu sync.Mutex
	// durable: chunks whose record is in the file and that are not clean
	// yet (see the essay). A record written by a round enters it before
	// the round's callers are answered.
	durable map[uint64]struct{}

	rounds rounds.Rounds[uint64] // one write (and fdatasync) of inodes per round

	syncs atomic.Uint64 // fdatasyncs of the log, for tests and measurements
}

// testHookDirtyLogSync, when set (tests), runs in every round before its
// fdatasync, with the number of records the round writes.
var testHookDirtyLogSync atomic.Pointer[func(n int)]

// openDirtyLog opens t's intent log, creating it if the target has none (a
// new target, or one written by a release before it). The chunks a log
// left by an unclean shutdown names are marked dirty in their sidecars
// (synced) before the log is emptied.
func openDirtyLog(t *target, log *slog.Logger) (*dirtyLog, error) {
	l := &dirtyLog{path: filepath.Join(t.path, dirtyLogName), fd: -1, durable: map[uint64]struct{}{}}
	_ = os.Remove(l.path + ".tmp") // what a crash left of a replacement
	b, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(b) == 0 {
		if err := l.replace(nil); err != nil {
			return nil, fmt.Errorf("target %s: create %s: %w", t.path, dirtyLogName, err)
		}
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("target %s: read %s: %w", t.path, dirtyLogName, err)
	}
	d, err := decodeDirtyLog(b)
	if err != nil {
		return nil, fmt.Errorf("%w: target %s: %s: %v (it names the chunks written since their last sync; "+
			"moving it away opens the target, but such chunks may then answer checksum errors)", ErrFormat, t.path, dirtyLogName, err)
	}
	fd, err := openRetry(l.path, unix.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("target %s: open %s: %w", t.path, dirtyLogName, err)
	}
	l.fd, l.epoch, l.size = fd, d.epoch, int64(len(b))
	if d.seen {
		l.seq = d.maxSeq + 1
	}
	if len(d.inos) == 0 {
		l.cleared = true
		return l, nil
	}
	seen := map[uint64]bool{}
	marked := 0
	for _, ino := range d.inos {
		if seen[ino] {
			continue
		}
		seen[ino] = true
		m, err := markDirtyForRecovery(t, ino)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("target %s: mark chunk %x dirty from %s: %w", t.path, ino, dirtyLogName, err)
		}
		if m {
			marked++
		}
	}
	l.run = int64(len(d.inos))
	// A mirror group's copy may hold changes of these chunks that its
	// other copy lacks (applied here, not forwarded, before the stop):
	// the mirror log keeps them until the group map says what to do
	// (suspects, mirrorlog.go).
	if t.mlog != nil {
		if err := t.mlog.recordSuspects(seen); err != nil {
			l.close()
			return nil, fmt.Errorf("target %s: hand the chunks of %s to %s: %w", t.path, dirtyLogName, mirrorLogName, err)
		}
	}
	if err := l.clear(); err != nil {
		l.close()
		return nil, fmt.Errorf("target %s: empty %s: %w", t.path, dirtyLogName, err)
	}
	log.Warn("intent log names chunks written before an unclean shutdown; they are recomputed when next opened",
		"target", t.path, "chunks", len(seen), "marked", marked)
	return l, nil
}

// markDirtyForRecovery sets the dirty flag in the sidecar header (or the
// inline sums) of t's chunk ino and syncs it, if they say clean; it
// reports whether it did. A chunk without sums or with damaged ones is
// left as it is: opening it recovers it or refuses it anyway. A chunk with
// both inline sums and a sidecar was cut by a crash while its sums moved
// to the sidecar (convertToSidecar): the attribute is dropped and the
// sidecar marked.
func markDirtyForRecovery(t *target, ino uint64) (bool, error) {
	dir, base := t.chunkPath(ino)
	sumPath := filepath.Join(dir, base+".sum")
	if t.sums == sumsInline {
		if done, marked, err := markInlineDirty(filepath.Join(dir, base+".data"), sumPath); done || err != nil {
			return marked, err
		}
	}
	fd, err := openRetry(sumPath, unix.O_RDWR, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	var b [sumHeaderBytes]byte
	n, err := preadFull(fd, b[:], 0)
	if err != nil {
		return false, err
	}
	h, state, _ := decodeSumHeader(b[:n], ino)
	if state != headerOK || h.flags&flagDirty != 0 {
		return false, nil
	}
	h.flags |= flagDirty
	enc := h.encode()
	if err := pwriteFull(fd, enc[:], 0); err != nil {
		return false, err
	}
	return true, fdatasync(fd)
}

// markInlineDirty is markDirtyForRecovery's part for inline sums: done
// says whether the chunk was dealt with (else its sidecar, if any, is).
func markInlineDirty(dataPath, sumPath string) (done, marked bool, err error) {
	fd, err := openRetry(dataPath, unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	defer unix.Close(fd)
	flags, sums, found, err := readInline(fd)
	var damaged errInlineDamaged
	if !found || err != nil && !errors.As(err, &damaged) {
		return false, false, err
	}
	if _, serr := os.Lstat(sumPath); serr == nil {
		if err := removeInline(fd); err != nil {
			return false, false, err
		}
		return false, false, fsync(fd)
	}
	if damaged.error != nil || flags&flagDirty != 0 {
		return true, false, nil
	}
	if err := writeInline(fd, flags|flagDirty, sums); err != nil {
		return true, false, err
	}
	return true, true, fsync(fd)
}

// record makes the log name chunk ino durably: one write and fdatasync
// of the log (rounds) that started after the call.
func (l *dirtyLog) record(ino uint64) error {
	l.mu.Lock()
	_, named := l.durable[ino]
	l.mu.Unlock()
	if named {
		return nil // named already (a mutation whose header write failed)
	}
	return l.rounds.Join(ino, l.write)
}

// write makes the records of inos durable: after the run's records, from
// the first slot when no record of the run names a dirty chunk any more,
// or in a new file with the records that must stay (see the essay).
func (l *dirtyLog) write(inos []uint64) error {
	l.ioMu.Lock()
	defer l.ioMu.Unlock()
	n, limit := int64(len(inos)), dirtyLogCompactMin.Load()
	l.mu.Lock()
	keep := int64(len(l.durable))
	rewrite := l.broken ||
		keep > 0 && l.run+n > max(limit, 2*(keep+n)) || // bound the run
		keep == 0 && l.size > dirtyLogHeaderBytes+2*limit*dirtyLogRecordBytes+dirtyLogGrowBytes // shrink the file
	var all []uint64
	if rewrite {
		all = make([]uint64, 0, keep+n)
		for ino := range l.durable {
			all = append(all, ino)
		}
	}
	l.mu.Unlock()
	var err error
	if rewrite {
		err = l.replace(append(all, inos...))
	} else {
		if keep == 0 {
			l.run = 0
		}
		err = l.append(inos)
	}
	if err != nil {
		l.broken = true
		return err
	}
	l.mu.Lock()
	for _, ino := range inos {
		l.durable[ino] = struct{}{}
	}
	l.mu.Unlock()
	return nil
}

// encodeRecords encodes records for inos from sequence number seq on, and
// zeros after them up to the next multiple of dirtyLogGrowBytes if they
// end past size, the file's length, when written at off.
func encodeRecords(epoch, seq uint64, inos []uint64, off, size int64) []byte {
	end := off + int64(len(inos))*dirtyLogRecordBytes
	n := end - off
	if end > size {
		n = (end+dirtyLogGrowBytes-1)/dirtyLogGrowBytes*dirtyLogGrowBytes - off
	}
	b := make([]byte, 0, n)
	for i, ino := range inos {
		b = appendDirtyLogRecord(b, epoch, seq+uint64(i), ino)
	}
	return b[:n]
}

// append writes records for inos after the run's records and syncs.
// Called with ioMu held.
func (l *dirtyLog) append(inos []uint64) error {
	off := dirtyLogHeaderBytes + l.run*dirtyLogRecordBytes
	b := encodeRecords(l.epoch, l.seq, inos, off, l.size)
	if err := pwriteFull(l.fd, b, off); err != nil {
		return err
	}
	l.size = max(l.size, off+int64(len(b)))
	l.run += int64(len(inos))
	l.seq += uint64(len(inos))
	l.cleared = false
	if h := testHookDirtyLogSync.Load(); h != nil {
		(*h)(len(inos))
	}
	l.syncs.Add(1)
	return fdatasync(l.fd)
}

// replace writes a new log file of the next epoch holding records for
// inos, syncs it and renames it over the old one. Called with ioMu held
// (or before the log is shared).
func (l *dirtyLog) replace(inos []uint64) error {
	epoch := l.epoch + 1
	b := append(encodeDirtyLogHeader(epoch), encodeRecords(epoch, 0, inos, dirtyLogHeaderBytes, 0)...)
	fd, err := replaceFile(l.path, b, func() {
		if h := testHookDirtyLogSync.Load(); h != nil {
			(*h)(len(inos))
		}
		l.syncs.Add(1)
	})
	if err != nil {
		return err
	}
	if l.fd >= 0 {
		unix.Close(l.fd)
	}
	l.fd, l.epoch, l.seq, l.run, l.size = fd, epoch, uint64(len(inos)), int64(len(inos)), int64(len(b))
	l.cleared, l.broken = len(inos) == 0, false
	// The rename is durable with the directory; until then a crash leaves
	// the old file, whose durable records named every chunk that must
	// stay named (this round's callers have not mutated anything yet).
	if err := syncDir(filepath.Dir(l.path)); err != nil {
		l.broken = true
		return err
	}
	return nil
}

// clear zeroes the first record slot and syncs: the log is empty. Called
// with ioMu held (or before the log is shared) when every record names a
// clean chunk.
func (l *dirtyLog) clear() error {
	if err := pwriteFull(l.fd, make([]byte, dirtyLogRecordBytes), dirtyLogHeaderBytes); err != nil {
		return err
	}
	l.size = max(l.size, dirtyLogHeaderBytes+dirtyLogRecordBytes)
	l.syncs.Add(1)
	if err := fdatasync(l.fd); err != nil {
		return err
	}
	l.run, l.cleared = 0, true
	return nil
}

// clean drops chunk ino from the chunks the log must name: it was synced
// and not mutated since, or removed. Once none is left, the next round
// starts a new run (see the essay).
func (l *dirtyLog) clean(ino uint64) {
	l.mu.Lock()
	delete(l.durable, ino)
	l.mu.Unlock()
}

// close empties the log durably if every chunk it names is clean (as after
// a clean stop) and closes it.
func (l *dirtyLog) close() error {
	l.ioMu.Lock()
	defer l.ioMu.Unlock()
	if l.fd < 0 {
		return nil
	}
	l.mu.Lock()
	empty := len(l.durable) == 0
	l.mu.Unlock()
	var err error
	if empty && !l.cleared && !l.broken {
		err = l.clear()
	}
	unix.Close(l.fd)
	l.fd = -1
	return err
}

// replaceFile writes b to path's ".tmp" sibling, fdatasyncs it (calling
// beforeSync first, if set) and renames it over path; it answers the new
// file's descriptor, open for reading and writing. The rename is durable
// once the caller syncs the directory.
func replaceFile(path string, b []byte, beforeSync func()) (int, error) {
	tmp := path + ".tmp"
	fd, err := openRetry(tmp, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o644)
	if err != nil {
		return -1, err
	}
	err = pwriteFull(fd, b, 0)
	if err == nil {
		if beforeSync != nil {
			beforeSync()
		}
		err = fdatasync(fd)
	}
	if err == nil {
		err = unix.Rename(tmp, path)
	}
	if err != nil {
		unix.Close(fd)
		_ = unix.Unlink(tmp)
		return -1, err
	}
	return fd, nil
}
