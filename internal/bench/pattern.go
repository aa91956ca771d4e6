package bench

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt marks a read-back whose bytes differ from what was written.
var ErrCorrupt = errors.New("data verification failed")

// The data pattern. A file is a sequence of 4 KiB blocks; the block at byte
// offset b (a multiple of 4096) of file f, written in a run with nonce n,
// holds
//
//	offset  size  content
//	0       8     little-endian b                   where the block belongs
//	8       8     little-endian key(f, n)           which file, which run
//	16      4080  body(f, n)                         pseudo-random, the same in every block
//
// so every byte is a function of (file, nonce, offset): data written to the
// wrong place, from another file or from an earlier run (stale data), a
// zeroed page, a block shifted by a few bytes (the body is random, so a
// shift changes it) or a flipped bit all change it.
//
// Why this shape (the harness must not be slower than what it measures):
//
//   - Writing costs 16 bytes per 4 KiB. A writer fills its reused record
//     buffer once before the clock starts (prime) and then, per record, only
//     patches the 16-byte headers (stamp): the bodies in the buffer are
//     already right, because they do not depend on the offset.
//   - Checking is two integer compares and one bytes.Equal of 4080 bytes per
//     block against a body that stays in L1; bytes.Equal is the runtime's
//     SIMD memequal (tens of GB/s per core). An earlier layout of 512-byte
//     sectors paid a function call per 504 bytes and a copy of every body on
//     every write, which cost 10–20% against fio on a CPU-bound (tmpfs) run.
//
// Offsets and lengths that are not multiples of 4096 take a byte-by-byte
// slow path (byteAt); the workloads only produce them for odd sizes.
const (
	blockBytes  = 4096
	headerBytes = 16
	bodyBytes   = blockBytes - headerBytes
)

// mix64 is the splitmix64 finaliser: neighbouring inputs, unrelated outputs.
func mix64(x uint64) uint64 {
	z := x + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// pattern is the per-(file, run) state: header key and block body.
type pattern struct {
	key  uint64
	body [bodyBytes]byte
}

// newPattern is the pattern of file id file in the run with nonce nonce
// (the runner picks a fresh nonce per write pass; readers get the writer's).
func newPattern(file, nonce uint64) *pattern {
	p := &pattern{key: mix64(file ^ mix64(nonce))}
	for j := 0; j < bodyBytes/8; j++ {
		binary.LittleEndian.PutUint64(p.body[8*j:], mix64(p.key+uint64(j)+1))
	}
	return p
}

// byteAt is the pattern byte at offset o (the slow path for partial blocks).
func (p *pattern) byteAt(o int64) byte {
	r := o & (blockBytes - 1)
	switch {
	case r < 8:
		return byte(uint64(o-r) >> (8 * uint(r)))
	case r < headerBytes:
		return byte(p.key >> (8 * uint(r-8)))
	}
	return p.body[r-headerBytes]
}

// aligned reports whether [off, off+len) is whole blocks.
func aligned(n int, off int64) bool {
	return off&(blockBytes-1) == 0 && n&(blockBytes-1) == 0
}

// fill writes the pattern at offset off into buf.
func (p *pattern) fill(buf []byte, off int64) {
	i := 0
	for ; i < len(buf) && (off+int64(i))&(blockBytes-1) != 0; i++ {
		buf[i] = p.byteAt(off + int64(i))
	}
	for ; i+blockBytes <= len(buf); i += blockBytes {
		p.putHeader(buf[i:], off+int64(i))
		copy(buf[i+headerBytes:i+blockBytes], p.body[:])
	}
	for ; i < len(buf); i++ {
		buf[i] = p.byteAt(off + int64(i))
	}
}

func (p *pattern) putHeader(b []byte, off int64) {
	binary.LittleEndian.PutUint64(b, uint64(off))
	binary.LittleEndian.PutUint64(b[8:], p.key)
}

// header is the 16-byte header of the block at aligned offset off.
func (p *pattern) header(off int64) (h [headerBytes]byte) {
	p.putHeader(h[:], off)
	return h
}

// prime fills buf with the pattern of some block-aligned offset, so that
// stamp can later turn it into the pattern of any block-aligned offset.
func (p *pattern) prime(buf []byte) { p.fill(buf, 0) }

// stamp makes buf the pattern at offset off by rewriting only the headers
// (of a last, partial block: as much of its header as fits).
// Precondition: every byte of buf was last written by prime or stamp of
// this pattern (so the bodies are right). When off is not block-aligned it
// fills buf in full instead, which breaks the precondition for later
// calls: callers stamp only at aligned offsets.
func (p *pattern) stamp(buf []byte, off int64) {
	if off&(blockBytes-1) != 0 {
		p.fill(buf, off)
		return
	}
	i := 0
	for ; i+blockBytes <= len(buf); i += blockBytes {
		binary.LittleEndian.PutUint64(buf[i:], uint64(off+int64(i)))
	}
	if i < len(buf) {
		h := p.header(off + int64(i))
		copy(buf[i:], h[:8])
	}
}

// check verifies buf against the pattern at offset off and returns an
// error wrapping ErrCorrupt naming the first bad byte.
func (p *pattern) check(buf []byte, off int64, name string) error {
	return p.checkFrom(buf, off, off, name)
}

// checkFrom is check of buf read from offset fileOff of the file (the
// offset an error names) holding the pattern from offset off.
func (p *pattern) checkFrom(buf []byte, off, fileOff int64, name string) error {
	i := 0
	for ; i < len(buf) && (off+int64(i))&(blockBytes-1) != 0; i++ {
		if err := p.checkByte(buf, i, off, fileOff, name); err != nil {
			return err
		}
	}
	for ; i+blockBytes <= len(buf); i += blockBytes {
		b := buf[i : i+blockBytes : i+blockBytes]
		if binary.LittleEndian.Uint64(b) != uint64(off+int64(i)) ||
			binary.LittleEndian.Uint64(b[8:]) != p.key ||
			!bytes.Equal(b[headerBytes:], p.body[:]) {
			for j := i; j < i+blockBytes; j++ {
				if err := p.checkByte(buf, j, off, fileOff, name); err != nil {
					return err
				}
			}
		}
	}
	// A partial last block from an aligned offset (a small file): one
	// compare of header and body prefix, bytes only on a mismatch.
	if n := len(buf) - i; n > 0 && (off+int64(i))&(blockBytes-1) == 0 {
		h := p.header(off + int64(i))
		b := buf[i:]
		if nh := min(n, headerBytes); bytes.Equal(b[:nh], h[:nh]) &&
			(n <= headerBytes || bytes.Equal(b[headerBytes:], p.body[:n-headerBytes])) {
			return nil
		}
	}
	for ; i < len(buf); i++ {
		if err := p.checkByte(buf, i, off, fileOff, name); err != nil {
			return err
		}
	}
	return nil
}

func (p *pattern) checkByte(buf []byte, i int, off, fileOff int64, name string) error {
	if want := p.byteAt(off + int64(i)); buf[i] != want {
		return fmt.Errorf("%w: file %s offset %d: read 0x%02x, want 0x%02x", ErrCorrupt, name, fileOff+int64(i), buf[i], want)
	}
	return nil
}

// fillPattern and checkPattern are the one-shot forms.
func fillPattern(buf []byte, file, nonce uint64, off int64) { newPattern(file, nonce).fill(buf, off) }

func checkPattern(buf []byte, file, nonce uint64, off int64, name string) error {
	return newPattern(file, nonce).check(buf, off, name)
}
