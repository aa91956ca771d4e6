package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rounds"
)

// The changed record of a mirror group's primary (docs/design/0014 §
// Resync).
//
// While a group is degraded its primary acknowledges mutations the
// secondary lacks; each one first puts its change — the chunk, the 1 MiB
// regions it touched and which 4 KiB blocks of each, a truncate's new
// length, a remove — in the local target's mirror.log and waits until
// that is durable (one fdatasync shared by the mutations that arrive
// meanwhile: rounds, as dirty.log). The resync copies just those blocks.
// A change already recorded (same group, chunk, region, and blocks among
// those recorded) costs nothing more.
//
// A begin record says that from then on every change of the group on this
// target is recorded, for the secondary it names: the primary writes it
// when the group becomes degraded with it as primary. A resync with no
// begin record for its secondary (a replaced, empty target; a record lost)
// copies every chunk instead.
//
// When a resync ends (MirrorResyncDone accepted), the file is rewritten
// without the group's records that the resync copied (records made after
// it took them stay).
//
// Suspects: a target opened after an unclean stop hands the chunks its
// intent log names (dirty.log: mutated since their last sync) to this log
// as whole-chunk records of group 0, before the intent log forgets them. A
// primary may have applied changes of those chunks that it never
// forwarded; once the group map says which group the target serves
// (consumeSuspects, resync.go), a primary copies them to the secondary; a
// secondary hands them to its primary (SMirrorSuspects), which records
// them for the group's resync, and refuses reads of them until then.

// Format of TARGET/mirror.log, version 2 (integers little-endian):
//
//	header, 32 bytes
//	0      8    magic "STRATMLG"
//	8      2    format version (2)
//	10     2    reserved, zero
//	12     4    record size (64)
//	16     12   reserved, zero
//	28     4    CRC32C of bytes 0..27
//
//	records, 64 bytes each, appended from offset 32
//	0      1    kind: 1 begin, 2 region, 3 truncate, 4 whole chunk
//	1      3    reserved, zero
//	4      4    group id (0: a suspect, with kind 4)
//	8      8    inode number (begin: 0)
//	16     8    begin: the secondary's target id; region: region number
//	            (offset >> 20); truncate: the new length; whole: 0
//	24     32   region: the changed 4 KiB blocks of the region, a bitmap
//	            (bit i of byte j: block 8j+i); other kinds: zero
//	56     4    reserved, zero
//	60     4    CRC32C of bytes 0..59
//
// Records of one region OR their bitmaps together. A write marks every
// block it touches (an unaligned edge marks its whole block).
//
// Version 1 had 32-byte records: bytes 0..23 as above, 24..27 reserved,
// CRC32C of 0..27 at 28, and no bitmap — a region record meant the whole
// region. It is still read (its region records as full bitmaps); the first
// write after such a file is opened rewrites it whole as version 2. A file
// without records is written as version 1 (a bare header), so that a
// release that reads only version 1 still opens a target with nothing
// recorded (mirror.log is created at every target's open).
//
// The records are read up to the first whose CRC or reserved bytes are
// wrong (a torn append); appends continue there. A damaged header or a
// newer version makes the target refuse to open (a lost record would let
// a resync skip a change). The file is created and rewritten whole
// (written, synced, renamed into place).
//
// Version history: 1 — initial (target format 4: an older release ignores
// the file, which is only read while mirror groups are in use). 2 — 64-byte
// records; a region record carries the bitmap of its changed 4 KiB blocks,
// so a resync after scattered small writes copies those blocks, not whole
// regions (a release that reads only version 1 refuses the file).
const (
	mirrorLogName        = "mirror.log"
	mirrorLogFormat      = 2
	mirrorLogHeaderBytes = 32
	mirrorLogRecordBytes = 64
	// mirrorLogRecordBytesV1: a version 1 file's record size.
	mirrorLogRecordBytesV1 = 32

	mlBegin    = 1
	mlRegion   = 2
	mlTruncate = 3
	mlWhole    = 4

	// mirrorRegionShift: the record's unit of change, 1 MiB, made of
	// regionBlockCount 4 KiB blocks (the bitmap).
	mirrorRegionShift = 20
	regionBlockCount  = 1 << (mirrorRegionShift - blockShift)
	// maxRecordRegions: a change of more regions is recorded as the whole
	// chunk.
	maxRecordRegions = 4096
)

var mirrorLogMagic = [8]byte{'S', 'T', 'R', 'A', 'T', 'M', 'L', 'G'}

// regionBlocks is the bitmap of a region's changed 4 KiB blocks: block i
// is bit i%64 of word i/64.
type regionBlocks [regionBlockCount / 64]uint64

// allBlocks is a whole region.
var allBlocks = func() (b regionBlocks) {
	for i := range b {
		b[i] = ^uint64(0)
	}
	return b
}()

// blockSpan answers the bitmap of blocks [b0, b1).
func blockSpan(b0, b1 uint64) (b regionBlocks) {
	for i := b0; i < b1 && i < regionBlockCount; i++ {
		b[i/64] |= 1 << (i % 64)
	}
	return b
}

// covers reports whether every block of o is in b.
func (b regionBlocks) covers(o regionBlocks) bool {
	for i := range b {
		if o[i]&^b[i] != 0 {
			return false
		}
	}
	return true
}

func (b regionBlocks) or(o regionBlocks) regionBlocks {
	for i := range b {
		b[i] |= o[i]
	}
	return b
}

// count answers the number of blocks in b.
func (b regionBlocks) count() int {
	n := 0
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	return n
}

// runs answers b's runs of consecutive blocks, as [first, end) pairs in
// order.
func (b regionBlocks) runs() [][2]uint64 {
	var out [][2]uint64
	for i := uint64(0); i < regionBlockCount; {
		if b[i/64]&(1<<(i%64)) == 0 {
			i++
			continue
		}
		j := i + 1
		for j < regionBlockCount && b[j/64]&(1<<(j%64)) != 0 {
			j++
		}
		out = append(out, [2]uint64{i, j})
		i = j
	}
	return out
}

// mlRec is one record.
type mlRec struct {
	kind   uint8
	group  uint32
	ino    uint64
	arg    uint64
	blocks regionBlocks // of a region record
}

func (r mlRec) encode(b []byte) []byte {
	var x [mirrorLogRecordBytes]byte
	x[0] = r.kind
	binary.LittleEndian.PutUint32(x[4:], r.group)
	binary.LittleEndian.PutUint64(x[8:], r.ino)
	binary.LittleEndian.PutUint64(x[16:], r.arg)
	if r.kind == mlRegion {
		for i, w := range r.blocks {
			binary.LittleEndian.PutUint64(x[24+8*i:], w)
		}
	}
	binary.LittleEndian.PutUint32(x[60:], crc32.Checksum(x[:60], castagnoli))
	return append(b, x[:]...)
}

// decodeRecord parses one record of a file of version v (len(x) its
// record size); ok is false for a torn or damaged one.
func decodeRecord(x []byte, v uint16) (r mlRec, ok bool) {
	crcAt := len(x) - 4
	if binary.LittleEndian.Uint32(x[crcAt:]) != crc32.Checksum(x[:crcAt], castagnoli) ||
		x[1]|x[2]|x[3] != 0 || binary.LittleEndian.Uint32(x[crcAt-4:]) != 0 || x[0] < mlBegin || x[0] > mlWhole {
		return r, false
	}
	r = mlRec{kind: x[0], group: binary.LittleEndian.Uint32(x[4:]),
		ino: binary.LittleEndian.Uint64(x[8:]), arg: binary.LittleEndian.Uint64(x[16:])}
	switch {
	case v == 1 && r.kind == mlRegion:
		r.blocks = allBlocks
	case v == 1:
	case r.kind == mlRegion:
		for i := range r.blocks {
			r.blocks[i] = binary.LittleEndian.Uint64(x[24+8*i:])
		}
	default:
		for _, c := range x[24:56] {
			if c != 0 {
				return mlRec{}, false // the bitmap is reserved for other kinds
			}
		}
	}
	return r, true
}

// encodeMirrorLogHeader answers the header of a file of version v (1 or
// 2).
func encodeMirrorLogHeader(v uint16) []byte {
	size := uint32(mirrorLogRecordBytes)
	if v == 1 {
		size = mirrorLogRecordBytesV1
	}
	b := make([]byte, mirrorLogHeaderBytes)
	copy(b, mirrorLogMagic[:])
	binary.LittleEndian.PutUint16(b[8:], v)
	binary.LittleEndian.PutUint32(b[12:], size)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// decodeMirrorLog parses a whole mirror.log: its records and the length of
// header and valid records.
func decodeMirrorLog(b []byte) ([]mlRec, int, error) {
	if len(b) < mirrorLogHeaderBytes {
		return nil, 0, fmt.Errorf("header cut short at %d bytes", len(b))
	}
	h := b[:mirrorLogHeaderBytes]
	if string(h[:8]) != string(mirrorLogMagic[:]) {
		return nil, 0, fmt.Errorf("bad magic %q", h[:8])
	}
	if got, want := binary.LittleEndian.Uint32(h[28:]), crc32.Checksum(h[:28], castagnoli); got != want {
		return nil, 0, fmt.Errorf("header checksum %08x, computed %08x", got, want)
	}
	v := binary.LittleEndian.Uint16(h[8:])
	size := mirrorLogRecordBytes
	switch v {
	case mirrorLogFormat:
	case 1:
		size = mirrorLogRecordBytesV1
	default:
		return nil, 0, fmt.Errorf("format version %d, this build reads versions 1 to %d (written by a newer release?)", v, mirrorLogFormat)
	}
	if rs := binary.LittleEndian.Uint32(h[12:]); rs != uint32(size) {
		return nil, 0, fmt.Errorf("record size %d, want %d for version %d", rs, size, v)
	}
	var recs []mlRec
	off := mirrorLogHeaderBytes
	for ; off+size <= len(b); off += size {
		r, ok := decodeRecord(b[off:off+size], v)
		if !ok {
			break
		}
		recs = append(recs, r)
	}
	return recs, off, nil
}

// mirrorLogVersion answers the format version of a file that decoded.
func mirrorLogVersion(b []byte) uint16 { return binary.LittleEndian.Uint16(b[8:]) }

// inoChanges is what changed of one chunk.
type inoChanges struct {
	regions  map[uint64]regionBlocks // by region number: its changed blocks
	whole    bool
	hasTrunc bool
	minTrunc uint64 // the smallest length it was truncated to
}

// changeSet is what changed of one group on one target.
type changeSet struct {
	begun bool
	peer  uint32 // the secondary the begin record names
	inos  map[uint64]*inoChanges
}

func newChangeSet() *changeSet { return &changeSet{inos: map[uint64]*inoChanges{}} }

// has reports whether r changes nothing new.
func (c *changeSet) has(r mlRec) bool {
	if r.kind == mlBegin {
		return c.begun && c.peer == uint32(r.arg)
	}
	ic := c.inos[r.ino]
	switch {
	case ic == nil:
		return false
	case ic.whole:
		return r.kind != mlTruncate || ic.hasTrunc && ic.minTrunc <= r.arg
	case r.kind == mlRegion:
		b, ok := ic.regions[r.arg]
		return ok && b.covers(r.blocks)
	case r.kind == mlTruncate:
		return ic.hasTrunc && ic.minTrunc <= r.arg
	}
	return false
}

// add applies r.
func (c *changeSet) add(r mlRec) {
	if r.kind == mlBegin {
		c.begun, c.peer = true, uint32(r.arg)
		return
	}
	ic := c.inos[r.ino]
	if ic == nil {
		ic = &inoChanges{regions: map[uint64]regionBlocks{}}
		c.inos[r.ino] = ic
	}
	switch r.kind {
	case mlRegion:
		ic.regions[r.arg] = ic.regions[r.arg].or(r.blocks)
	case mlTruncate:
		if !ic.hasTrunc || r.arg < ic.minTrunc {
			ic.minTrunc = r.arg
		}
		ic.hasTrunc = true
	case mlWhole:
		ic.whole = true
	}
}

// merge adds o's chunk changes to c.
func (c *changeSet) merge(o *changeSet) {
	for ino, oc := range o.inos {
		for r, b := range oc.regions {
			c.add(mlRec{kind: mlRegion, ino: ino, arg: r, blocks: b})
		}
		if oc.hasTrunc {
			c.add(mlRec{kind: mlTruncate, ino: ino, arg: oc.minTrunc})
		}
		if oc.whole {
			c.add(mlRec{kind: mlWhole, ino: ino})
		}
	}
}

// records lists c's records for group.
func (c *changeSet) records(group uint32) []mlRec {
	var out []mlRec
	if c.begun {
		out = append(out, mlRec{kind: mlBegin, group: group, arg: uint64(c.peer)})
	}
	inos := make([]uint64, 0, len(c.inos))
	for ino := range c.inos {
		inos = append(inos, ino)
	}
	sort.Slice(inos, func(i, j int) bool { return inos[i] < inos[j] })
	for _, ino := range inos {
		ic := c.inos[ino]
		if ic.hasTrunc {
			out = append(out, mlRec{kind: mlTruncate, group: group, ino: ino, arg: ic.minTrunc})
		}
		if ic.whole {
			out = append(out, mlRec{kind: mlWhole, group: group, ino: ino})
		}
		for _, r := range sortedRegions(ic) {
			out = append(out, mlRec{kind: mlRegion, group: group, ino: ino, arg: r, blocks: ic.regions[r]})
		}
	}
	return out
}

func sortedRegions(ic *inoChanges) []uint64 {
	rs := make([]uint64, 0, len(ic.regions))
	for r := range ic.regions {
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i] < rs[j] })
	return rs
}

// mirrorLog is a target's changed record.
type mirrorLog struct {
	path string

	ioMu   sync.Mutex // held by whoever writes the file
	fd     int
	end    int64 // where the next record goes
	broken bool  // an append failed: the next write rewrites the file
	old    bool  // the file is of version 1: the next write rewrites it

	mu     sync.Mutex
	groups map[uint32]*changeSet // durable changes, by group

	// suspectsLeft: group 0 may hold suspects (the fast path of
	// suspect, asked by every read at a secondary).
	suspectsLeft atomic.Bool

	rounds rounds.Rounds[[]mlRec]
}

// openMirrorLog opens (or creates) the target's mirror.log.
func openMirrorLog(dir string) (*mirrorLog, error) {
	l := &mirrorLog{path: filepath.Join(dir, mirrorLogName), fd: -1, groups: map[uint32]*changeSet{}}
	_ = os.Remove(l.path + ".tmp")
	b, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := l.rewrite(nil); err != nil {
			return nil, fmt.Errorf("target %s: create %s: %w", dir, mirrorLogName, err)
		}
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("target %s: read %s: %w", dir, mirrorLogName, err)
	}
	recs, end, err := decodeMirrorLog(b)
	if err != nil {
		return nil, fmt.Errorf("%w: target %s: %s: %v (it names what changed on a mirror group's primary while its secondary was away; "+
			"moving it away opens the target, but the secondary then needs a full copy: strata mirror replace)", ErrFormat, dir, mirrorLogName, err)
	}
	for _, r := range recs {
		l.set(r.group).add(r)
	}
	l.suspectsLeft.Store(len(l.set(suspectGroup).inos) > 0)
	fd, err := openRetry(l.path, unix.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("target %s: open %s: %w", dir, mirrorLogName, err)
	}
	l.fd, l.end = fd, int64(end)
	l.old = mirrorLogVersion(b) != mirrorLogFormat
	return l, nil
}

// set answers group's change set (mu held or before sharing).
func (l *mirrorLog) set(group uint32) *changeSet {
	c := l.groups[group]
	if c == nil {
		c = newChangeSet()
		l.groups[group] = c
	}
	return c
}

// record makes recs durable (those that add nothing are skipped): one
// append and fdatasync shared with the concurrent callers.
func (l *mirrorLog) record(recs []mlRec) error {
	l.mu.Lock()
	var todo []mlRec
	for _, r := range recs {
		if !l.set(r.group).has(r) {
			todo = append(todo, r)
		}
	}
	l.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	return l.rounds.Join(todo, l.write)
}

// write appends a round's records and syncs, then adds them to the sets.
func (l *mirrorLog) write(batches [][]mlRec) error {
	l.ioMu.Lock()
	defer l.ioMu.Unlock()
	var all []mlRec
	for _, b := range batches {
		all = append(all, b...)
	}
	var err error
	if l.broken || l.old {
		l.mu.Lock()
		var keep []mlRec
		for g, c := range l.groups {
			keep = append(keep, c.records(g)...)
		}
		l.mu.Unlock()
		err = l.rewriteLocked(append(keep, all...))
	} else {
		var b []byte
		for _, r := range all {
			b = r.encode(b)
		}
		if err = pwriteFull(l.fd, b, l.end); err == nil {
			err = fdatasync(l.fd)
		}
		if err == nil {
			l.end += int64(len(b))
		}
	}
	if err != nil {
		l.broken = true
		return fmt.Errorf("%s: %w", l.path, err)
	}
	l.mu.Lock()
	for _, r := range all {
		l.set(r.group).add(r)
		if r.group == suspectGroup {
			l.suspectsLeft.Store(true)
		}
	}
	l.mu.Unlock()
	return nil
}

// rewrite replaces the file with one holding recs.
func (l *mirrorLog) rewrite(recs []mlRec) error {
	l.ioMu.Lock()
	defer l.ioMu.Unlock()
	return l.rewriteLocked(recs)
}

// rewriteLocked writes recs as version 2 or, when there are none, an
// empty file of version 1, which a release that reads only version 1
// still opens (mirror.log is created at every target's open): the first
// append then rewrites it as version 2.
func (l *mirrorLog) rewriteLocked(recs []mlRec) error {
	v := uint16(mirrorLogFormat)
	if len(recs) == 0 {
		v = 1
	}
	b := encodeMirrorLogHeader(v)
	for _, r := range recs {
		b = r.encode(b)
	}
	fd, err := replaceFile(l.path, b, nil)
	if err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(l.path)); err != nil {
		unix.Close(fd)
		return err
	}
	if l.fd >= 0 {
		unix.Close(l.fd)
	}
	l.fd, l.end, l.broken, l.old = fd, int64(len(b)), false, v != mirrorLogFormat
	return nil
}

// take hands group's recorded chunk changes to a resync and starts the
// group's set afresh (keeping the begin record); the file keeps them until
// done. Answers begun and the begin record's secondary.
func (l *mirrorLog) take(group uint32) (taken *changeSet, begun bool, peer uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.set(group)
	taken = &changeSet{inos: c.inos}
	c.inos = map[uint64]*inoChanges{}
	return taken, c.begun, c.peer
}

// giveBack returns the changes of a resync that did not finish.
func (l *mirrorLog) giveBack(group uint32, taken *changeSet) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.set(group).merge(taken)
	if group == suspectGroup {
		l.suspectsLeft.Store(true)
	}
}

// done drops the changes a finished resync took (they are no longer in
// the sets) and the group's begin record, and rewrites the file with what
// is left.
func (l *mirrorLog) done(group uint32) error {
	l.ioMu.Lock()
	defer l.ioMu.Unlock()
	l.mu.Lock()
	c := l.set(group)
	c.begun, c.peer = false, 0
	var keep []mlRec
	for g, c := range l.groups {
		keep = append(keep, c.records(g)...)
	}
	if group == suspectGroup && len(c.inos) == 0 {
		l.suspectsLeft.Store(false)
	}
	l.mu.Unlock()
	return l.rewriteLocked(keep)
}

// recordSuspects records the chunks inos as suspects (group 0).
func (l *mirrorLog) recordSuspects(inos map[uint64]bool) error {
	recs := make([]mlRec, 0, len(inos))
	for ino := range inos {
		recs = append(recs, mlRec{kind: mlWhole, group: suspectGroup, ino: ino})
	}
	return l.record(recs)
}

// suspectGroup is the group of the suspects' records.
const suspectGroup = 0

// suspect reports whether chunk ino is among the suspects not yet dealt
// with (a secondary refuses reads of it meanwhile: resync.go).
func (l *mirrorLog) suspect(ino uint64) bool {
	if !l.suspectsLeft.Load() {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.groups[suspectGroup]
	return c != nil && c.inos[ino] != nil
}

// suspectInos answers the suspects' inode numbers, in order, leaving
// them recorded.
func (l *mirrorLog) suspectInos() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.set(suspectGroup)
	out := make([]uint64, 0, len(c.inos))
	for ino := range c.inos {
		out = append(out, ino)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// pending answers how many chunks of group have recorded changes (tests,
// status).
func (l *mirrorLog) pending(group uint32) (begun bool, chunks int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.set(group)
	return c.begun, len(c.inos)
}

// close closes the file.
func (l *mirrorLog) close() {
	l.ioMu.Lock()
	defer l.ioMu.Unlock()
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

// regionRecs are the records of a change of [off, off+n) of chunk ino: a
// region each, with the 4 KiB blocks the change touches, or the whole
// chunk past maxRecordRegions.
func regionRecs(group uint32, ino uint64, off, n uint64) []mlRec {
	if n == 0 {
		return nil
	}
	end := off + n
	r0, r1 := off>>mirrorRegionShift, (end-1)>>mirrorRegionShift
	if end < off || r1-r0 >= maxRecordRegions {
		return []mlRec{{kind: mlWhole, group: group, ino: ino}}
	}
	out := make([]mlRec, 0, r1-r0+1)
	for r := r0; r <= r1; r++ {
		base := r << mirrorRegionShift
		b0 := (max(off, base) - base) >> blockShift
		b1 := (min(end, base+1<<mirrorRegionShift) - base + blockSize - 1) >> blockShift
		out = append(out, mlRec{kind: mlRegion, group: group, ino: ino, arg: r, blocks: blockSpan(b0, b1)})
	}
	return out
}
