package store

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// FuzzSumHeaderChecked is FuzzSumHeader past the checksum: the header's
// CRC is made right before decoding, so that mutations reach the version,
// block size and inode checks. A header that decodes is the one encoded.
func FuzzSumHeaderChecked(f *testing.F) {
	h := sumHeader{version: sumFormat, flags: flagDirty, block: blockSize, ino: 7}.encode()
	f.Add(h[:])
	h = sumHeader{version: sumFormat + 1, block: blockSize, ino: 7}.encode()
	f.Add(h[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= sumHeaderBytes {
			binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
		}
		got, st, err := decodeSumHeader(b, 7)
		switch st {
		case headerOK:
			if err != nil || got.version != sumFormat || got.block != blockSize || got.ino != 7 {
				t.Fatalf("accepted bad header %+v %v", got, err)
			}
			// Reserved bytes of b may be non-zero: compare the fields.
			again := got.encode()
			if a, st, err := decodeSumHeader(again[:], 7); st != headerOK || a != got {
				t.Fatalf("%+v re-decodes to %+v, %v", got, a, err)
			}
		case headerCorrupt:
			if err == nil {
				t.Fatal("corrupt header without an error")
			}
		}
	})
}

// FuzzMirrorLog: decodeMirrorLog on any bytes (both versions; with
// fixCRC the header's and each record's CRC made right first, so that
// mutations reach the version, kind, reserved and bitmap checks) never
// panics; what decodes ends on a record boundary and re-encodes, as
// version 2, to a file that decodes to the same records.
func FuzzMirrorLog(f *testing.F) {
	recs := []mlRec{{kind: mlBegin, group: 2, arg: 7}, {kind: mlRegion, group: 2, ino: 5, arg: 3, blocks: blockSpan(3, 70)},
		{kind: mlTruncate, group: 2, ino: 6, arg: 4096}, {kind: mlWhole, ino: 9}}
	v2 := encodeMirrorLogHeader(mirrorLogFormat)
	for _, r := range recs {
		v2 = r.encode(v2)
	}
	f.Add(v2, false)
	f.Add(v2[:len(v2)-10], true)
	f.Add(encodeMirrorLogV1(recs), false)
	f.Add(encodeMirrorLogV1(recs), true)
	f.Fuzz(func(t *testing.T, b []byte, fixCRC bool) {
		if fixCRC && len(b) >= mirrorLogHeaderBytes {
			binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
			size := int(binary.LittleEndian.Uint32(b[12:]))
			if size == mirrorLogRecordBytes || size == mirrorLogRecordBytesV1 {
				for off := mirrorLogHeaderBytes; off+size <= len(b); off += size {
					x := b[off : off+size]
					binary.LittleEndian.PutUint32(x[size-4:], crc32.Checksum(x[:size-4], castagnoli))
				}
			}
		}
		got, end, err := decodeMirrorLog(b)
		if err != nil {
			return
		}
		size := mirrorLogRecordBytes
		if mirrorLogVersion(b) == 1 {
			size = mirrorLogRecordBytesV1
		}
		if end > len(b) || (end-mirrorLogHeaderBytes)%size != 0 || (end-mirrorLogHeaderBytes)/size != len(got) {
			t.Fatalf("%d records end at %d of %d (record size %d)", len(got), end, len(b), size)
		}
		again := encodeMirrorLogHeader(mirrorLogFormat)
		for _, r := range got {
			again = r.encode(again)
		}
		back, end2, err := decodeMirrorLog(again)
		if err != nil || end2 != len(again) || len(back) != len(got) {
			t.Fatalf("re-encoded: %d of %d records, end %d of %d, %v", len(back), len(got), end2, len(again), err)
		}
		for i := range got {
			if back[i] != got[i] {
				t.Fatalf("record %d re-decodes to %+v, was %+v", i, back[i], got[i])
			}
		}
	})
}
