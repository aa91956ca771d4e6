package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Inline sums: a small chunk is one file (docs/design/0011, "Inline sums")
//
// A cold read of a small chunk with a sidecar touches two files on the
// target's file system: the data file's inode and block, and the sidecar's
// inode and block. On a target whose chunk sums are "inline" (identity
// field chunk_sums 2, target format 4), a chunk of up to inlineMaxBlocks
// blocks keeps its sidecar header's fields and its block sums in an
// extended attribute of its data file instead (inlineXattr). ext4 keeps an
// attribute this small inside the inode (256-byte inodes: up to 60 bytes of
// value with this name; XFS and btrfs keep it with the inode too), so
// opening the data file brings the sums along: a cold small-chunk read is
// an inode and a data block, as a plain file's.
//
// The attribute plays the sidecar's part in the crash protocol (chunk.go's
// essay) unchanged: its dirty flag is written without a sync, the intent
// log's record makes the first mutation after a sync durable, a sync makes
// data and attribute durable (fsync of the data file, or the syncfs round:
// an attribute is inode metadata, which fdatasync does not promise to
// write), and a chunk whose attribute says clean and that the log does not
// name has data and sums that agree on stable storage.
//
// Which form a chunk has: a chunk with a sidecar (.sum) is in sidecar form;
// one without is inline. The attribute is looked for first; a chunk with
// both exists only inside a mutation that outgrows the inline limit
// (convertToSidecar: the sidecar is written whole, dirty, then the
// attribute removed) — that mutation's chunk is named by the intent log
// until a sync, which makes the removal durable, so after a crash the
// log's recovery finds it and drops the attribute (markDirtyForRecovery).
// A chunk never goes back from sidecar to inline form. A new chunk gets no
// attribute until its first write (nor a sidecar): a crash before leaves a
// data file with neither, which is recomputed like a missing sidecar.
//
// Attribute value, version 1 (integers little-endian):
//
//	offset size field
//	0      1    version (1)
//	1      1    flags: bit 0 = dirty (as the sidecar header's)
//	2      2    reserved, zero
//	4      4·n  one stored sum per block b (storedSum), n ≤ inlineMaxBlocks
//	4+4n   4    CRC32C of bytes 0..4+4n-1
//
// Blocks past n (holes, or past the end of file) have the sum 0, as a
// sidecar's holes do.
//
// Version history: 1 — initial (target format 4).
const (
	inlineXattr      = "user.strata.sums"
	inlineFormat     = 1
	inlineHeader     = 4
	inlineMaxBlocks  = 12 // 48 KiB: 56 bytes of value, inside a 256-byte ext4 inode
	inlineValueBytes = inlineHeader + 4*inlineMaxBlocks + 4
)

// Values of the identity's chunk_sums field (target format 4 on).
const (
	sumsSidecar = 1 // every chunk has a sidecar (formats 1 to 3)
	sumsInline  = 2 // chunks of up to inlineMaxBlocks blocks keep their sums in inlineXattr
)

// inlineSums is the in-memory copy of an inline chunk's attribute. Its
// sums are read and written under the chunk's region locks (an inline
// chunk lies in region 0, so every reader and writer of its sums holds
// stripe 0); mu orders the attribute writes of writers and flag changes.
type inlineSums struct {
	mu    sync.Mutex
	sums  []byte // 4 per block, as stored; len ≤ 4·inlineMaxBlocks
	flags uint16
}

func encodeInline(flags uint16, sums []byte) []byte {
	b := make([]byte, inlineHeader+len(sums)+4)
	b[0] = inlineFormat
	b[1] = byte(flags)
	copy(b[inlineHeader:], sums)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

// decodeInline parses an attribute value.
func decodeInline(b []byte) (flags uint16, sums []byte, err error) {
	if len(b) < inlineHeader+4 || (len(b)-inlineHeader-4)%4 != 0 || len(b) > inlineValueBytes {
		return 0, nil, fmt.Errorf("inline sums of %d bytes", len(b))
	}
	if got, want := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32.Checksum(b[:len(b)-4], castagnoli); got != want {
		return 0, nil, fmt.Errorf("inline sums checksum %08x, computed %08x", got, want)
	}
	if b[0] != inlineFormat {
		return 0, nil, fmt.Errorf("inline sums format version %d, this build reads only %d", b[0], inlineFormat)
	}
	if b[2] != 0 || b[3] != 0 || b[1]&^flagDirty != 0 {
		return 0, nil, fmt.Errorf("inline sums with unknown flags %02x %02x %02x", b[1], b[2], b[3])
	}
	return uint16(b[1]), append([]byte(nil), b[inlineHeader:len(b)-4]...), nil
}

// readInline reads fd's attribute: found is false if it has none.
func readInline(fd int) (flags uint16, sums []byte, found bool, err error) {
	var b [inlineValueBytes + 4]byte
	for {
		n, err := unix.Fgetxattr(fd, inlineXattr, b[:])
		switch {
		case err == unix.EINTR:
			continue
		case errors.Is(err, unix.ENODATA):
			return 0, nil, false, nil
		case errors.Is(err, unix.ERANGE):
			return 0, nil, true, errInlineDamaged{fmt.Errorf("inline sums longer than %d bytes", inlineValueBytes)}
		case err != nil:
			return 0, nil, false, err
		}
		flags, sums, err = decodeInline(b[:n])
		if err != nil {
			return 0, nil, true, errInlineDamaged{err}
		}
		return flags, sums, true, nil
	}
}

// errInlineDamaged: the attribute is there but cannot be trusted.
type errInlineDamaged struct{ error }

func (e errInlineDamaged) Unwrap() error { return e.error }

func writeInline(fd int, flags uint16, sums []byte) error {
	v := encodeInline(flags, sums)
	for {
		err := unix.Fsetxattr(fd, inlineXattr, v, 0)
		if err != unix.EINTR {
			return err
		}
	}
}

func removeInline(fd int) error {
	for {
		err := unix.Fremovexattr(fd, inlineXattr)
		if err == unix.EINTR {
			continue
		}
		if errors.Is(err, unix.ENODATA) {
			return nil
		}
		return err
	}
}

// fsync syncs a data file with its inode (and so its attribute).
func fsync(fd int) error { return syncFd(fd, unix.Fsync) }

// inlineSupported reports whether dir's file system keeps user extended
// attributes of inlineValueBytes on a file (probed on a temporary file).
func inlineSupported(dir string) (bool, error) {
	f, err := os.CreateTemp(dir, ".xattr-probe-*")
	if err != nil {
		return false, fmt.Errorf("target %s: probe extended attributes: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	err = writeInline(int(f.Fd()), flagDirty, make([]byte, 4*inlineMaxBlocks))
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("target %s: probe extended attributes: %w", dir, err)
	}
	return true, nil
}

// sumsOf is the chunk sums form an identity names; an error if this build
// does not know it.
func sumsOf(id identity) (int, error) {
	if id.Format < 4 {
		if id.ChunkSums == 0 {
			return sumsSidecar, nil
		}
	} else if id.ChunkSums == 0 {
		return 0, fmt.Errorf("format version %d names no chunk sums form", id.Format)
	}
	switch id.ChunkSums {
	case sumsSidecar, sumsInline:
		return id.ChunkSums, nil
	}
	return 0, fmt.Errorf("chunk sums form %d, this build knows only forms 1 and 2 (made by a newer Strata release?)", id.ChunkSums)
}

// Sums I/O of a chunk in either form. Callers hold the region locks of the
// blocks they touch (inline chunks: stripe 0).

// readSums reads the stored sums of blocks b0.. into dst; it returns how
// many bytes it found (the rest reads as 0, holes).
func (c *chunk) readSums(dst []byte, b0 int64) (int, error) {
	if inl := c.inl.Load(); inl != nil {
		if 4*b0 >= int64(len(inl.sums)) {
			return 0, nil
		}
		return copy(dst, inl.sums[4*b0:]), nil
	}
	return preadFull(c.sumFd, dst, sumOff(b0))
}

// writeSums stores src as the sums of blocks b0..; on an error it returns
// how many bytes were stored (an inline chunk stores all or nothing).
func (c *chunk) writeSums(src []byte, b0 int64) (int, error) {
	inl := c.inl.Load()
	if inl == nil {
		defer c.pages.drop(b0, b0+int64(len(src))/4)
		return pwritePartial(c.sumFd, src, sumOff(b0))
	}
	end := 4*b0 + int64(len(src))
	if end > 4*inlineMaxBlocks {
		return 0, fmt.Errorf("inline sums: block %d past the inline limit", end/4-1) // broken invariant: the mutation converts first
	}
	inl.mu.Lock()
	defer inl.mu.Unlock()
	old := inl.sums
	sums := old
	if int64(len(sums)) < end {
		sums = make([]byte, end)
		copy(sums, old)
	} else {
		sums = append([]byte(nil), old...)
	}
	copy(sums[4*b0:], src)
	if err := writeInline(c.dataFd, inl.flags, sums); err != nil {
		return 0, err
	}
	inl.sums = sums
	return len(src), nil
}

// truncateSums drops the stored sums of blocks nb and after.
func (c *chunk) truncateSums(nb int64) error {
	inl := c.inl.Load()
	if inl == nil {
		defer c.pages.drop(nb, -1)
		return unix.Ftruncate(c.sumFd, sumOff(nb))
	}
	inl.mu.Lock()
	defer inl.mu.Unlock()
	if int64(len(inl.sums)) <= 4*nb {
		return nil
	}
	sums := inl.sums[: 4*nb : 4*nb]
	if err := writeInline(c.dataFd, inl.flags, sums); err != nil {
		return err
	}
	inl.sums = sums
	return nil
}

// zeroSumRange sets the stored sums of blocks [b0, b1) to 0.
func (c *chunk) zeroSumRange(b0, b1 int64) error {
	inl := c.inl.Load()
	if inl == nil {
		defer c.pages.drop(b0, b1)
		return zeroSums(c.sumFd, b0, b1)
	}
	n := max(0, min(b1, int64(len(inl.sums))/4)-b0)
	if n == 0 {
		return nil
	}
	_, err := c.writeSums(make([]byte, 4*n), b0)
	return err
}

// outgrows reports whether a mutation that makes the chunk reach end needs
// the sidecar form first.
func (c *chunk) outgrows(end int64) bool {
	return c.inl.Load() != nil && blocks(end) > inlineMaxBlocks
}

// growForm moves an inline chunk's sums to a sidecar before a write that
// ends at end makes it too large for the inline form. Called inside the
// mutation, without region locks.
func (c *chunk) growForm(end int64) error {
	if !c.outgrows(end) {
		return nil
	}
	c.lock(allStripes, true)
	defer c.unlock(allStripes, true)
	if !c.outgrows(end) {
		return nil
	}
	return c.convertToSidecar()
}

// convertToSidecar moves an inline chunk's sums into a new sidecar (before
// a mutation makes it larger than the inline limit). Called inside a
// mutation (the chunk is dirty and named by the intent log) with every
// region locked: the sidecar is written whole with its dirty flag, then
// the attribute removed; whatever a crash leaves of this is recomputed.
func (c *chunk) convertToSidecar() error {
	inl := c.inl.Load()
	if inl == nil {
		return nil
	}
	dir, base := c.t.chunkPath(c.ino)
	sfd, err := openRetry(filepath.Join(dir, base+".sum"), unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o644)
	if err != nil {
		return c.ioErr("create sidecar", 0, err)
	}
	c.t.createdIn(dir)
	h := sumHeader{version: sumFormat, flags: flagDirty, block: blockSize, ino: c.ino}.encode()
	err = pwriteFull(sfd, h[:], 0)
	if err == nil && len(inl.sums) > 0 {
		err = pwriteFull(sfd, inl.sums, sumOff(0))
	}
	if err == nil {
		err = removeInline(c.dataFd)
	}
	if err != nil {
		unix.Close(sfd)
		_ = unix.Unlink(filepath.Join(dir, base+".sum"))
		return c.ioErr("move sums to a sidecar", 0, err)
	}
	c.sumFd = sfd
	c.inl.Store(nil)
	return nil
}

// inlineSumsForNewTargets: new targets on a file system with user extended
// attributes get the inline form. Tests of the sidecar form turn it off.
var inlineSumsForNewTargets atomic.Bool

func init() { inlineSumsForNewTargets.Store(true) }
