// Package layout is the pure striping arithmetic of Strata: which target holds
// a byte of a file and where inside that target's chunk file it lives, and how
// a new file's targets are chosen.
//
// # Concepts
//
// A file's data is cut into stripe units of StripeSize bytes. Unit k lives on
// Targets[k mod StripeCount]. Each (file, target) pair has one chunk file; the
// units of that target are stored back to back in it, so unit k sits at chunk
// offset (k / StripeCount) * StripeSize.
//
//	file:   | u0 | u1 | u2 | u3 | u4 | u5 | ...      (count = 3)
//	slot 0: | u0 | u3 | ...
//	slot 1: | u1 | u4 | ...
//	slot 2: | u2 | u5 | ...
//
// Architecture Invariant: this package does no I/O and keeps no state.
package layout

import (
	"errors"
	"fmt"
	"sort"
)

const (
	// DefaultStripeSize is the stripe unit of a file whose directory sets none.
	DefaultStripeSize = 1 << 20
	// MaxDefaultStripeCount caps the default stripe count (design.md).
	MaxDefaultStripeCount = 8
	// MinStripeSize and MaxStripeSize bound the stripe unit.
	MinStripeSize = 64 << 10
	MaxStripeSize = 256 << 20
	// MaxStripeCount bounds the number of targets of one file.
	MaxStripeCount = 256

	// MaxChunkBytes is the longest chunk file Strata makes on a target:
	// 16 TiB − 4 KiB, the largest file of ext4 with 4 KiB blocks, the
	// smallest limit of the file systems targets are meant to sit on
	// (xfs and btrfs hold 8 and 16 EiB). A storage server refuses to
	// serve a target whose file system cannot hold a file this long, and
	// refuses writes and truncates past it (EFBIG); clients refuse the
	// file sizes it implies (Layout.MaxFileSize) before acknowledging.
	MaxChunkBytes = 1<<44 - 4096
)

// GroupBit marks a target id in Layout.Targets that names a mirror group
// (group number id &^ GroupBit) instead of a single target: the chunk of
// that slot lives on both targets of the group (docs/design/0014). A
// file's targets are all groups or none.
const GroupBit uint32 = 1 << 31

// IsGroup reports whether a Layout.Targets id names a mirror group.
func IsGroup(id uint32) bool { return id&GroupBit != 0 }

// ErrInvalid marks a layout that breaks the rules in Validate.
var ErrInvalid = errors.New("invalid layout")

// Layout says how a file is striped. For a directory it is the default given
// to new children; there Targets is empty and StripeCount 0 means "default".
type Layout struct {
	StripeSize  uint32   // bytes per stripe unit; a multiple of MinStripeSize
	StripeCount uint32   // number of targets the file spans
	Targets     []uint32 // target ids, len == StripeCount for a file
}

// Validate checks a file layout.
func (l Layout) Validate() error {
	var errs []error
	if l.StripeSize < MinStripeSize || l.StripeSize > MaxStripeSize || l.StripeSize%MinStripeSize != 0 {
		errs = append(errs, fmt.Errorf("%w: stripe size %d must be a multiple of %d between %d and %d",
			ErrInvalid, l.StripeSize, MinStripeSize, MinStripeSize, MaxStripeSize))
	}
	if l.StripeCount == 0 || l.StripeCount > MaxStripeCount {
		errs = append(errs, fmt.Errorf("%w: stripe count %d must be 1..%d", ErrInvalid, l.StripeCount, MaxStripeCount))
	}
	if int(l.StripeCount) != len(l.Targets) {
		errs = append(errs, fmt.Errorf("%w: stripe count %d but %d targets", ErrInvalid, l.StripeCount, len(l.Targets)))
	}
	groups := 0
	for _, t := range l.Targets {
		if IsGroup(t) {
			groups++
		}
	}
	if groups != 0 && groups != len(l.Targets) {
		errs = append(errs, fmt.Errorf("%w: %d of %d targets are mirror groups (all or none)", ErrInvalid, groups, len(l.Targets)))
	}
	seen := map[uint32]bool{}
	for _, t := range l.Targets {
		if seen[t] {
			errs = append(errs, fmt.Errorf("%w: target %d appears twice", ErrInvalid, t))
		}
		seen[t] = true
	}
	return errors.Join(errs...)
}

// Extent is one contiguous piece of a file range that lies in a single stripe
// unit, and so in a single chunk file.
type Extent struct {
	Slot     int   // index into Layout.Targets
	FileOff  int64 // offset in the file
	ChunkOff int64 // offset in the slot's chunk file
	Len      int64
}

// Locate maps a file offset to (slot, chunk offset).
func (l Layout) Locate(off int64) (slot int, chunkOff int64) {
	s := int64(l.StripeSize)
	unit := off / s
	return int(unit % int64(l.StripeCount)), (unit/int64(l.StripeCount))*s + off%s
}

// Split cuts [off, off+n) into extents that each stay inside one stripe unit,
// in file order.
func (l Layout) Split(off, n int64) []Extent {
	if n <= 0 {
		return nil
	}
	s := int64(l.StripeSize)
	out := make([]Extent, 0, n/s+2)
	for n > 0 {
		slot, co := l.Locate(off)
		piece := s - off%s
		if piece > n {
			piece = n
		}
		out = append(out, Extent{Slot: slot, FileOff: off, ChunkOff: co, Len: piece})
		off += piece
		n -= piece
	}
	return out
}

// ChunkFrom is the first offset in slot's chunk file whose byte lies at or
// after file offset off: off's own chunk offset when off falls on slot,
// else the start of slot's next stripe unit after off.
func (l Layout) ChunkFrom(off int64, slot int) int64 {
	s := int64(l.StripeSize)
	c := int64(l.StripeCount)
	unit := off / s
	row, col := unit/c, unit%c
	switch {
	case col == int64(slot):
		return row*s + off%s
	case col < int64(slot):
		return row * s
	default:
		return (row + 1) * s
	}
}

// FileOff is the file offset of the byte at chunkOff in slot's chunk file
// (the inverse of Locate).
func (l Layout) FileOff(slot int, chunkOff int64) int64 {
	s := int64(l.StripeSize)
	row := chunkOff / s
	return (row*int64(l.StripeCount)+int64(slot))*s + chunkOff%s
}

// ChunkSize is the length the chunk file of slot must have for a file of
// fileSize bytes (bytes of the slot's units that lie below fileSize).
func (l Layout) ChunkSize(fileSize int64, slot int) int64 {
	if fileSize <= 0 {
		return 0
	}
	s := int64(l.StripeSize)
	c := int64(l.StripeCount)
	full := fileSize / s // complete units
	rem := fileSize % s
	// Units with index ≡ slot (mod c) below full.
	n := full / c
	if full%c > int64(slot) {
		n++
	}
	size := n * s
	if rem > 0 && full%c == int64(slot) {
		size += rem
	}
	return size
}

// MaxFileSize is the largest size a file of this layout can have: the
// size at which the chunk of slot 0 (the first to fill) holds
// MaxChunkBytes. Every full row of stripe units adds StripeCount units,
// so it is about StripeCount × 16 TiB (16 TiB for one target, 128 TiB for
// eight). A layout without a stripe size or count gets MaxChunkBytes.
func (l Layout) MaxFileSize() int64 {
	s, c := int64(l.StripeSize), int64(l.StripeCount)
	if s <= 0 || c <= 0 {
		return MaxChunkBytes
	}
	rows := int64(MaxChunkBytes) / s // full units every chunk can hold
	return rows*c*s + int64(MaxChunkBytes)%s
}

// Candidate is a target that a new file may be placed on.
type Candidate struct {
	ID        uint32
	FreeBytes uint64
}

// DefaultCount is the stripe count used when none is set: all targets, capped.
func DefaultCount(targets int) uint32 {
	if targets > MaxDefaultStripeCount {
		return MaxDefaultStripeCount
	}
	return uint32(targets)
}

// Choose picks count distinct targets for a new file. It walks the candidates
// round-robin from position start (the caller advances start per file so that
// load spreads), but skips targets with less than a quarter of the median
// free space while enough others remain: free-space weighting that keeps a
// nearly full target from taking new stripes. Deterministic for equal inputs.
func Choose(cands []Candidate, count int, start uint64) ([]uint32, error) {
	if count <= 0 {
		return nil, fmt.Errorf("%w: stripe count %d", ErrInvalid, count)
	}
	if len(cands) < count {
		return nil, fmt.Errorf("%w: stripe count %d but only %d targets", ErrInvalid, count, len(cands))
	}
	sorted := append([]Candidate(nil), cands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	frees := make([]uint64, len(sorted))
	for i, c := range sorted {
		frees[i] = c.FreeBytes
	}
	sort.Slice(frees, func(i, j int) bool { return frees[i] < frees[j] })
	median := frees[len(frees)/2]
	var roomy, tight []Candidate
	for _, c := range sorted {
		if c.FreeBytes*4 < median {
			tight = append(tight, c)
		} else {
			roomy = append(roomy, c)
		}
	}
	pool := roomy
	if len(pool) < count {
		pool = append(pool, tight...)
	}
	out := make([]uint32, 0, count)
	for i := 0; i < count; i++ {
		out = append(out, pool[(start+uint64(i))%uint64(len(pool))].ID)
	}
	return out, nil
}
