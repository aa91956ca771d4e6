package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/stratafs/strata/internal/rpc"
)

// On-disk format of a chunk, version 1. See docs/design/0002-storage.md.
//
// A chunk is two files in a fan-out directory chunks/XX/YY of the target
// (which one: the target's chunkLayout, target.go; layout 2 uses
// XX = (ino>>16)&0xff, YY = (ino>>8)&0xff, layout 1 XX = ino&0xff,
// YY = (ino>>8)&0xff):
//
//	chunks/XX/YY/<ino as 16 hex digits>.data   the bytes, sparse
//	chunks/XX/YY/<ino as 16 hex digits>.sum    the sidecar below
//
// or, on a target with inline sums (chunk_sums 2) and for a chunk of up to
// inlineMaxBlocks blocks, the .data file alone, the sidecar header's flags
// and the sums in its extended attribute user.strata.sums (inlinesums.go).
//
// Sidecar (all integers little-endian):
//
//	offset size field
//	0      8    magic "STRATSUM"
//	8      2    format version (1)
//	10     2    flags: bit 0 = dirty (written since the last sync; see chunk.go)
//	12     4    block size in bytes (4096)
//	16     8    inode number (detects a misplaced file)
//	24     36   reserved, zero
//	60     4    CRC32C of bytes 0..59
//	64     4·n  one stored sum per data block b, at 64+4b (see storedSum)
//
// Version history: 1 — initial.
//
// A target also holds mirror.log (mirrorlog.go: the changes a mirror
// group's primary made while its secondary was away), with a history of
// its own: 1 — initial (issue 21); 2 — 64-byte records, a region's with
// the bitmap of its changed 4 KiB blocks (a file without records is still
// written as 1). A target without it gets an empty one at open, and older
// releases ignore it.
const (
	blockSize      = 4096
	blockShift     = 12
	sumHeaderBytes = 64
	sumFormat      = 1
	flagDirty      = 1

	// maxChunkBytes bounds offsets and sizes: 2^50 bytes (1 PiB) per chunk.
	maxChunkBytes = 1 << 50
	// maxIOBytes bounds one read: rpc.MaxDataBytes, the most one answer
	// carries.
	maxIOBytes = rpc.MaxDataBytes
)

var sumMagic = [8]byte{'S', 'T', 'R', 'A', 'T', 'S', 'U', 'M'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// zeroBlock is a block of zeros; never written.
var zeroBlock [blockSize]byte

// zeroSum is the CRC32C of a block of zeros.
var zeroSum = crc32.Checksum(zeroBlock[:], castagnoli)

// storedSum is the value kept in the sidecar for block b: the CRC32C of the
// block padded with zeros to blockSize (so a partial last block stays valid
// when the file grows, since the new bytes read as zeros), XORed with the
// CRC32C of a zero block. The XOR makes a block of zeros store 0, which is
// what a hole in the sidecar reads as: holes in the data file (sparse
// writes, truncate up, punch) need no sidecar write and still verify, and a
// sidecar that is shorter than the data (never true for a synced chunk)
// still detects non-zero data.
func storedSum(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b)
	if len(b) < blockSize {
		c = crc32.Update(c, castagnoli, zeroBlock[:blockSize-len(b)])
	}
	return c ^ zeroSum
}

// sumHeader is the decoded sidecar header.
type sumHeader struct {
	version uint16
	flags   uint16
	block   uint32
	ino     uint64
}

func (h sumHeader) encode() [sumHeaderBytes]byte {
	var b [sumHeaderBytes]byte
	copy(b[0:8], sumMagic[:])
	binary.LittleEndian.PutUint16(b[8:], h.version)
	binary.LittleEndian.PutUint16(b[10:], h.flags)
	binary.LittleEndian.PutUint32(b[12:], h.block)
	binary.LittleEndian.PutUint64(b[16:], h.ino)
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return b
}

// headerState says what a sidecar header read from disk means.
type headerState int

const (
	headerOK      headerState = iota
	headerMissing             // short or all zeros: a creation cut by a crash
	headerCorrupt             // bad magic, CRC, version or block size
)

// decodeSumHeader parses b, the first bytes of a sidecar (possibly short).
func decodeSumHeader(b []byte, ino uint64) (sumHeader, headerState, error) {
	if len(b) < sumHeaderBytes || bytes.Equal(b[:sumHeaderBytes], zeroBlock[:sumHeaderBytes]) {
		return sumHeader{}, headerMissing, nil
	}
	b = b[:sumHeaderBytes]
	if !bytes.Equal(b[0:8], sumMagic[:]) {
		return sumHeader{}, headerCorrupt, fmt.Errorf("bad sidecar magic %q", b[0:8])
	}
	if got, want := binary.LittleEndian.Uint32(b[60:]), crc32.Checksum(b[:60], castagnoli); got != want {
		return sumHeader{}, headerCorrupt, fmt.Errorf("sidecar header checksum %08x, computed %08x", got, want)
	}
	h := sumHeader{
		version: binary.LittleEndian.Uint16(b[8:]),
		flags:   binary.LittleEndian.Uint16(b[10:]),
		block:   binary.LittleEndian.Uint32(b[12:]),
		ino:     binary.LittleEndian.Uint64(b[16:]),
	}
	if h.version != sumFormat {
		return h, headerCorrupt, fmt.Errorf("sidecar format version %d, this build reads only %d", h.version, sumFormat)
	}
	if h.block != blockSize {
		return h, headerCorrupt, fmt.Errorf("sidecar block size %d, want %d", h.block, blockSize)
	}
	if h.ino != ino {
		return h, headerCorrupt, fmt.Errorf("sidecar belongs to inode %x", h.ino)
	}
	return h, headerOK, nil
}

// blocks returns the number of blocks that hold size bytes.
func blocks(size int64) int64 { return (size + blockSize - 1) >> blockShift }

// sumOff is the sidecar offset of block b's stored sum.
func sumOff(b int64) int64 { return sumHeaderBytes + 4*b }
