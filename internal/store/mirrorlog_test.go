package store

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/stratafs/strata/internal/rpc"
)

// encodeMirrorLogV1 is a mirror.log of version 1 (32-byte records, no
// block bitmap) holding recs, as the first release wrote it.
func encodeMirrorLogV1(recs []mlRec) []byte {
	b := encodeMirrorLogHeader(1)
	for _, r := range recs {
		var x [mirrorLogRecordBytesV1]byte
		x[0] = r.kind
		binary.LittleEndian.PutUint32(x[4:], r.group)
		binary.LittleEndian.PutUint64(x[8:], r.ino)
		binary.LittleEndian.PutUint64(x[16:], r.arg)
		binary.LittleEndian.PutUint32(x[28:], crc32.Checksum(x[:28], castagnoli))
		b = append(b, x[:]...)
	}
	return b
}

// TestMirrorLogFormat1: a version 1 file decodes (its region records as
// whole regions) and opens; the first write rewrites it as version 2 with
// the old records kept; a newer version refuses to open, saying so.
func TestMirrorLogFormat1(t *testing.T) {
	old := []mlRec{{kind: mlBegin, group: 2, arg: 7}, {kind: mlRegion, group: 2, ino: 5, arg: 3},
		{kind: mlTruncate, group: 2, ino: 6, arg: 4096}, {kind: mlWhole, group: suspectGroup, ino: 9}}
	b := encodeMirrorLogV1(old)
	// A torn fifth record.
	b = append(b, encodeMirrorLogV1([]mlRec{{kind: mlRegion, group: 2, ino: 5, arg: 4}})[mirrorLogHeaderBytes:][:20]...)
	recs, end, err := decodeMirrorLog(b)
	if err != nil || end != mirrorLogHeaderBytes+4*mirrorLogRecordBytesV1 || len(recs) != 4 {
		t.Fatalf("decode of version 1: %d records, end %d, %v", len(recs), end, err)
	}
	want := append([]mlRec(nil), old...)
	want[1].blocks = allBlocks
	for i := range want {
		if recs[i] != want[i] {
			t.Fatalf("record %d: %+v, want %+v", i, recs[i], want[i])
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, mirrorLogName)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := openMirrorLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	if begun, n := l.pending(2); !begun || n != 2 {
		t.Fatalf("version 1 opened: begun %v, %d chunks", begun, n)
	}
	// Blocks of the region recorded whole: nothing new, the file stays.
	if err := l.record(regionRecs(2, 5, 3<<20+100, 9000)); err != nil {
		t.Fatal(err)
	}
	if got := mustReadFile(t, path); len(got) != len(b) {
		t.Fatalf("a change already recorded rewrote the file: %d bytes, was %d", len(got), len(b))
	}
	added := regionRecs(2, 8, 0, 1)
	if err := l.record(added); err != nil {
		t.Fatal(err)
	}
	l.close()
	nb := mustReadFile(t, path)
	if v := mirrorLogVersion(nb); v != mirrorLogFormat {
		t.Fatalf("after a write the file is of version %d, want %d", v, mirrorLogFormat)
	}
	recs, _, err = decodeMirrorLog(nb)
	if err != nil {
		t.Fatal(err)
	}
	got := map[mlRec]bool{}
	for _, r := range recs {
		got[r] = true
	}
	for _, r := range append(want, added...) {
		if !got[r] {
			t.Fatalf("rewritten file lacks %+v: %+v", r, recs)
		}
	}
	if len(recs) != len(want)+1 {
		t.Fatalf("rewritten file: %d records, want %d", len(recs), len(want)+1)
	}
	// A newer version refuses, naming it.
	binary.LittleEndian.PutUint16(nb[8:], mirrorLogFormat+1)
	binary.LittleEndian.PutUint32(nb[28:], crc32.Checksum(nb[:28], castagnoli))
	if err := os.WriteFile(path, nb, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = openMirrorLog(dir)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "format version 3") {
		t.Fatalf("open of a newer version: %v, want ErrFormat naming version 3", err)
	}
}

// TestMirrorLogBlocks: a region's records OR their blocks; a change of
// blocks already recorded writes nothing; a torn or damaged 64-byte
// record at the tail is ignored and the next append goes there.
func TestMirrorLogBlocks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, mirrorLogName)
	l, err := openMirrorLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	size := func() int { return len(mustReadFile(t, path)) }
	version := func() uint16 { return mirrorLogVersion(mustReadFile(t, path)) }
	if v := version(); v != 1 {
		t.Fatalf("a new empty mirror.log is of version %d, want 1 (older releases open it)", v)
	}
	steps := []struct {
		off, n uint64
		grows  bool
	}{
		{1<<20 + 4096, 4096, true},      // block 1 of region 1
		{1<<20 + 4096 + 10, 100, false}, // inside it
		{1<<20 + 4000, 200, true},       // unaligned: blocks 0 and 1
		{1<<20 + 8192, 3 * 4096, true},  // blocks 2..4
		{1 << 20, 5 * 4096, false},      // blocks 0..4: all recorded
	}
	for i, st := range steps {
		before := size()
		if err := l.record(regionRecs(3, 11, st.off, st.n)); err != nil {
			t.Fatal(err)
		}
		if grew := size() > before; grew != st.grows {
			t.Fatalf("step %d: the file grew %v, want %v", i, grew, st.grows)
		}
	}
	l.close()
	b := mustReadFile(t, path)
	// A damaged whole record, then half a record.
	bad := mlRec{kind: mlRegion, group: 3, ino: 11, arg: 9, blocks: blockSpan(0, 1)}.encode(nil)
	bad[30] ^= 1
	b = append(append(b, bad...), bad[:mirrorLogRecordBytes/2]...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = openMirrorLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.record(regionRecs(3, 11, 7<<20, 1)); err != nil {
		t.Fatal(err)
	}
	l.close()
	recs, end, err := decodeMirrorLog(mustReadFile(t, path))
	if err != nil || end != mirrorLogHeaderBytes+4*mirrorLogRecordBytes || len(recs) != 4 {
		t.Fatalf("after an append over the damaged tail: %d records, end %d, %v", len(recs), end, err)
	}
	set := newChangeSet()
	for _, r := range recs {
		set.add(r)
	}
	ic := set.inos[11]
	if got := ic.regions[1]; got != blockSpan(0, 5) {
		t.Fatalf("region 1's blocks %x, want 0..4", got)
	}
	if got := ic.regions[7]; got != blockSpan(0, 1) {
		t.Fatalf("region 7's blocks %x, want block 0", got)
	}
	if _, ok := ic.regions[9]; ok || len(ic.regions) != 2 {
		t.Fatalf("regions %v: the damaged record was read", ic.regions)
	}
	// Emptied, the file is of version 1 again.
	l, err = openMirrorLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if v := version(); v != mirrorLogFormat {
		t.Fatalf("with records the file is of version %d", v)
	}
	l.take(3)
	if err := l.done(3); err != nil {
		t.Fatal(err)
	}
	if v, n := version(), size(); v != 1 || n != mirrorLogHeaderBytes {
		t.Fatalf("emptied: version %d, %d bytes; want a bare version 1 header", v, n)
	}
}

// TestRegionRecsAndRuns: a change marks every block it touches, per
// region; runs of marked blocks come out coalesced.
func TestRegionRecsAndRuns(t *testing.T) {
	recs := regionRecs(1, 2, 1<<20-1, 4098) // last byte of region 0, blocks 0..1 of region 1
	if len(recs) != 2 || recs[0].arg != 0 || recs[1].arg != 1 {
		t.Fatalf("records %+v", recs)
	}
	if recs[0].blocks != blockSpan(regionBlockCount-1, regionBlockCount) || recs[1].blocks != blockSpan(0, 2) {
		t.Fatalf("blocks %x / %x", recs[0].blocks, recs[1].blocks)
	}
	if r := regionRecs(1, 2, 0, maxRecordRegions<<mirrorRegionShift+1); len(r) != 1 || r[0].kind != mlWhole {
		t.Fatalf("a change past maxRecordRegions: %+v", r)
	}
	b := blockSpan(0, 3).or(blockSpan(63, 65)).or(blockSpan(200, regionBlockCount))
	got := b.runs()
	want := [][2]uint64{{0, 3}, {63, 65}, {200, regionBlockCount}}
	if len(got) != len(want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("runs %v, want %v", got, want)
		}
	}
	if n := b.count(); n != 3+2+regionBlockCount-200 {
		t.Fatalf("count %d", n)
	}
	if len(allBlocks.runs()) != 1 || allBlocks.count() != regionBlockCount {
		t.Fatalf("a whole region: runs %v", allBlocks.runs())
	}
}

// TestMirrorResyncRandomBlocks: scattered 4 KiB writes (and an unaligned
// one, and one that extends the chunk) while the group is degraded; the
// resync copies exactly the blocks written — the resync byte counter and
// the done report equal the distinct blocks' bytes — and both copies end
// equal.
func TestMirrorResyncRandomBlocks(t *testing.T) {
	p := newMirrorPair(t, nil)
	const size = 8 << 20
	inos := []uint64{0x900, 0x901}
	for i, ino := range inos {
		base := pattern(20+i, size)
		for off := 0; off < size; off += 1 << 20 {
			if err := p.gwrite(p.a, ino, uint64(off), base[off:off+1<<20], false); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.b.stop()
	type change struct {
		ino, off uint64
		n        int
	}
	rng := rand.New(rand.NewPCG(21, 4))
	var changes []change
	for i := 0; i < 300; i++ {
		changes = append(changes, change{inos[rng.IntN(2)], uint64(rng.IntN(size/blockSize)) * blockSize, blockSize})
	}
	changes = append(changes,
		change{0x900, 3<<20 + 5000, 6000},        // unaligned: blocks 1..2 of region 3
		change{0x901, 5 << 20, 6 * blockSize},    // a run of six blocks
		change{0x901, size - 100, 300},           // past the end: the chunk grows by 200 bytes
		change{0x900, 6<<20 + 2*blockSize, 4096}) // beside blocks maybe written
	blocks := map[[2]uint64]bool{}
	newSize := map[uint64]uint64{0x900: size, 0x901: size}
	for i, c := range changes {
		err := p.gwrite(p.a, c.ino, c.off, pattern(100+i, c.n), false)
		if err != nil {
			t.Fatalf("write %d while degraded: %v", i, err)
		}
		for b := c.off / blockSize; b <= (c.off+uint64(c.n)-1)/blockSize; b++ {
			blocks[[2]uint64{c.ino, b}] = true
		}
		newSize[c.ino] = max(newSize[c.ino], c.off+uint64(c.n))
	}
	if g := p.meta.group(1); g.State != rpc.GroupDegraded {
		t.Fatalf("group not degraded: %+v", g)
	}
	// The bytes of the distinct blocks written, up to each chunk's end.
	var want uint64
	for k := range blocks {
		want += min((k[1]+1)*blockSize, newSize[k[0]]) - k[1]*blockSize
	}
	resyncPair(t, p)
	waitInSync(t, p, 30*time.Second)
	for _, ino := range inos {
		p.sameCopies(ino)
	}
	m := &dto.Metric{}
	if err := p.a.s.mm.resyncBytes.WithLabelValues("1").Write(m); err != nil {
		t.Fatal(err)
	}
	if got := uint64(m.GetCounter().GetValue()); got != want {
		t.Fatalf("resync sent %d bytes, want %d (%d distinct blocks written)", got, want, len(blocks))
	}
	done := p.meta.reported(rpc.MirrorResyncDone)
	if len(done) != 1 || done[0].Done != want || done[0].Total != want {
		t.Fatalf("resync-done reports %+v, want one of %d bytes", done, want)
	}
}
