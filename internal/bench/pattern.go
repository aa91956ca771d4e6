package bench

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt marks a read-back whose bytes differ from what was written.
var ErrCorrupt = errors.New("data verification failed")

// The data pattern. A file is a sequence of 512-byte sectors; the sector at
// byte offset s of file f holds
//
//	bytes 0..7     little-endian key(f) ^ s        the stamp: names file and offset
//	bytes 8..511   template(f)                      504 bytes derived from key(f)
//
// so every byte is a function of (file, offset): data written to the wrong
// place or from another file, a zeroed page or a flipped bit all change it.
// Generating a sector is one store and a 504-byte copy, checking it one
// compare and a 504-byte bytes.Equal — both run at memory speed (SIMD),
// which keeps the check's CPU cost small beside the file system's even on
// two cores (a per-word arithmetic pattern cost ~15% of a 2-core machine at
// 2.5 GB/s).
const (
	sectorBytes   = 512
	stampBytes    = 8
	templateBytes = sectorBytes - stampBytes
)

// fileKey mixes a file id (splitmix64 finaliser) so that neighbouring files
// get unrelated patterns.
func fileKey(file uint64) uint64 {
	z := file + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// pattern is the per-file state: key and template.
type pattern struct {
	key uint64
	tpl [templateBytes]byte
}

func newPattern(file uint64) *pattern {
	p := &pattern{key: fileKey(file)}
	for j := 0; j < templateBytes/8; j++ {
		binary.LittleEndian.PutUint64(p.tpl[8*j:], fileKey(p.key+uint64(j)+1))
	}
	return p
}

// byteAt is the pattern byte at offset o (the slow path for partial sectors).
func (p *pattern) byteAt(o int64) byte {
	r := o & (sectorBytes - 1)
	if r < stampBytes {
		return byte((p.key ^ uint64(o-r)) >> (8 * uint(r)))
	}
	return p.tpl[r-stampBytes]
}

// fill writes the pattern at offset off into buf.
func (p *pattern) fill(buf []byte, off int64) {
	i := 0
	for ; i < len(buf) && (off+int64(i))&(sectorBytes-1) != 0; i++ {
		buf[i] = p.byteAt(off + int64(i))
	}
	for ; i+sectorBytes <= len(buf); i += sectorBytes {
		binary.LittleEndian.PutUint64(buf[i:], p.key^uint64(off+int64(i)))
		copy(buf[i+stampBytes:i+sectorBytes], p.tpl[:])
	}
	for ; i < len(buf); i++ {
		buf[i] = p.byteAt(off + int64(i))
	}
}

// check verifies buf against the pattern at offset off and returns an
// error wrapping ErrCorrupt naming the first bad byte.
func (p *pattern) check(buf []byte, off int64, name string) error {
	i := 0
	for ; i < len(buf) && (off+int64(i))&(sectorBytes-1) != 0; i++ {
		if err := p.checkByte(buf, i, off, name); err != nil {
			return err
		}
	}
	for ; i+sectorBytes <= len(buf); i += sectorBytes {
		if binary.LittleEndian.Uint64(buf[i:]) != p.key^uint64(off+int64(i)) ||
			!bytes.Equal(buf[i+stampBytes:i+sectorBytes], p.tpl[:]) {
			for j := i; j < i+sectorBytes; j++ {
				if err := p.checkByte(buf, j, off, name); err != nil {
					return err
				}
			}
		}
	}
	for ; i < len(buf); i++ {
		if err := p.checkByte(buf, i, off, name); err != nil {
			return err
		}
	}
	return nil
}

func (p *pattern) checkByte(buf []byte, i int, off int64, name string) error {
	o := off + int64(i)
	if want := p.byteAt(o); buf[i] != want {
		return fmt.Errorf("%w: file %s offset %d: read 0x%02x, want 0x%02x", ErrCorrupt, name, o, buf[i], want)
	}
	return nil
}

// fillPattern and checkPattern are the one-shot forms.
func fillPattern(buf []byte, file uint64, off int64) { newPattern(file).fill(buf, off) }

func checkPattern(buf []byte, file uint64, off int64, name string) error {
	return newPattern(file).check(buf, off, name)
}
