package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt marks a read-back whose bytes differ from what was written.
var ErrCorrupt = errors.New("data verification failed")

// The data pattern. Byte offset o of file f holds byte (o mod 8) of the
// little-endian 64-bit word
//
//	w(f, o) = fileKey(f) ^ (o &^ 7) * 0x9E3779B97F4A7C15
//
// so every aligned word names both its file and its offset: data written to
// the wrong place, a stale block, a zeroed page or a flipped bit all change
// it. Generating or checking a word costs a multiply and a xor, a few GB/s
// per core — small beside a file system's own cost.
const patternMul = 0x9E3779B97F4A7C15

// fileKey mixes a file id (splitmix64 finaliser) so that neighbouring files
// get unrelated words.
func fileKey(file uint64) uint64 {
	z := file + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// fillPattern writes the pattern of file at offset off into buf.
func fillPattern(buf []byte, file uint64, off int64) {
	key := fileKey(file)
	i := 0
	// Leading bytes up to the next word boundary.
	for ; i < len(buf) && (off+int64(i))&7 != 0; i++ {
		o := off + int64(i)
		buf[i] = byte((key ^ uint64(o&^7)*patternMul) >> (8 * uint(o&7)))
	}
	o := uint64(off + int64(i))
	for ; i+8 <= len(buf); i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], key^o*patternMul)
		o += 8
	}
	for ; i < len(buf); i++ {
		o := off + int64(i)
		buf[i] = byte((key ^ uint64(o&^7)*patternMul) >> (8 * uint(o&7)))
	}
}

// checkPattern verifies buf against the pattern of file at offset off and
// returns an error wrapping ErrCorrupt naming the first bad byte.
func checkPattern(buf []byte, file uint64, off int64, name string) error {
	key := fileKey(file)
	i := 0
	for ; i < len(buf) && (off+int64(i))&7 != 0; i++ {
		if err := checkByte(buf, i, key, off, name); err != nil {
			return err
		}
	}
	o := uint64(off + int64(i))
	for ; i+8 <= len(buf); i += 8 {
		if binary.LittleEndian.Uint64(buf[i:]) != key^o*patternMul {
			for j := i; j < i+8; j++ {
				if err := checkByte(buf, j, key, off, name); err != nil {
					return err
				}
			}
		}
		o += 8
	}
	for ; i < len(buf); i++ {
		if err := checkByte(buf, i, key, off, name); err != nil {
			return err
		}
	}
	return nil
}

func checkByte(buf []byte, i int, key uint64, off int64, name string) error {
	o := off + int64(i)
	want := byte((key ^ uint64(o&^7)*patternMul) >> (8 * uint(o&7)))
	if buf[i] != want {
		return fmt.Errorf("%w: file %s offset %d: read 0x%02x, want 0x%02x", ErrCorrupt, name, o, buf[i], want)
	}
	return nil
}
