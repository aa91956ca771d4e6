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
