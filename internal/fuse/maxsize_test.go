package fuse

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/layout"
)

// TestMaxFileSize: writes, truncates and fallocates at or past the largest
// file of a file's layout fail with EFBIG at once and change nothing (they
// used to be acknowledged and then lost, or answered EINVAL); a write
// across the limit is cut short at it; the last byte below the limit is
// stored and reads back (the chunk file is sparse, as long as the chunk
// limit: the targets' file system must hold that).
func TestMaxFileSize(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	dir, c := tc.mount(nil)
	p := filepath.Join(dir, "big")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer f.Close()
	fd := int(f.Fd())
	_, err = f.WriteAt([]byte("hello"), 0)
	must(t, err)
	must(t, f.Sync())
	var st unix.Stat_t
	must(t, unix.Fstat(fd, &st))
	a, err := c.GetAttr(context.Background(), st.Ino)
	must(t, err)
	limit := a.Layout.MaxFileSize()
	if want := int64(a.Layout.StripeCount) * (layout.MaxChunkBytes - int64(a.Layout.StripeSize)); limit < want {
		t.Fatalf("limit %d of a file over %d targets", limit, a.Layout.StripeCount)
	}
	t.Logf("layout %d × %d bytes: largest file %d bytes", a.Layout.StripeCount, a.Layout.StripeSize, limit)
	// Told to tools through the layout attribute (`strata stripe get`).
	xb := make([]byte, 4096)
	xn, err := unix.Getxattr(p, layoutXattr, xb)
	must(t, err)
	var lj layout.Xattr
	must(t, json.Unmarshal(xb[:xn], &lj))
	if lj.MaxFileBytes != limit {
		t.Fatalf("%s says the largest file is %d bytes, want %d", layoutXattr, lj.MaxFileBytes, limit)
	}

	sizeIs := func(what string, want int64) {
		t.Helper()
		if got := sizesOf(t, fd, p); got != [3]int64{want, want, want} {
			t.Fatalf("after %s: fstat, stat, lseek(SEEK_END) say %v; want %d", what, got, want)
		}
	}
	efbig := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, syscall.EFBIG) {
			t.Fatalf("%s: %v, want EFBIG", what, err)
		}
	}
	for _, off := range []int64{limit, limit + 1, 1<<50 - 2, 1 << 53} {
		n, err := unix.Pwrite(fd, []byte{'x'}, off)
		efbig("pwrite at "+strconv.FormatInt(off, 10), err)
		if n > 0 {
			t.Fatalf("pwrite at %d wrote %d bytes", off, n)
		}
		efbig("ftruncate to "+strconv.FormatInt(off+1, 10), unix.Ftruncate(fd, off+1))
		efbig("fallocate at "+strconv.FormatInt(off, 10), unix.Fallocate(fd, 0, off, 1))
		efbig("fallocate(KEEP_SIZE) at "+strconv.FormatInt(off, 10), unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, off, 1))
		efbig("truncate by path to "+strconv.FormatInt(off+1, 10), unix.Truncate(p, off+1))
		sizeIs("refused changes at "+strconv.FormatInt(off, 10), 5)
	}
	efbig("fallocate up to one past the limit", unix.Fallocate(fd, 0, limit-10, 11))
	// Nothing refused was kept for later: fsync has nothing to report.
	must(t, f.Sync())
	sizeIs("fsync", 5)

	// Across the limit: cut short at it.
	n, err := unix.Pwrite(fd, []byte("AB"), limit-1)
	if err != nil || n != 1 {
		t.Fatalf("pwrite of 2 bytes at limit-1: %d, %v; want 1 byte", n, err)
	}
	sizeIs("a write up to the limit", limit)
	// copy_file_range (served by the daemon) too.
	src := filepath.Join(dir, "src")
	must(t, os.WriteFile(src, []byte("12345"), 0o644))
	sf, err := os.Open(src)
	must(t, err)
	defer sf.Close()
	inOff, outOff := int64(0), limit-1
	if k, err := unix.CopyFileRange(int(sf.Fd()), &inOff, fd, &outOff, 5, 0); err != nil || k != 1 {
		t.Fatalf("copy_file_range of 5 bytes to limit-1: %d, %v; want 1 byte", k, err)
	}
	inOff, outOff = 0, limit
	_, err = unix.CopyFileRange(int(sf.Fd()), &inOff, fd, &outOff, 5, 0)
	efbig("copy_file_range to the limit", err)
	n, err = unix.Pwrite(fd, []byte("A"), limit-1)
	if err != nil || n != 1 {
		t.Fatalf("pwrite of the last byte: %d, %v", n, err)
	}
	sizeIs("copies up to the limit", limit)
	must(t, f.Sync())
	must(t, unix.Ftruncate(fd, limit)) // at the limit: allowed
	must(t, unix.Fallocate(fd, 0, limit-1, 1))
	efbig("ftruncate to limit+1", unix.Ftruncate(fd, limit+1))
	sizeIs("ftruncate and fallocate at the limit", limit)
	must(t, f.Close())
	efbig("truncate of the closed file to limit+1", unix.Truncate(p, limit+1))

	// Another open reads it all back.
	g, err := os.Open(p)
	must(t, err)
	defer g.Close()
	b := make([]byte, 5)
	if _, err := g.ReadAt(b, 0); err != nil || string(b) != "hello" {
		t.Fatalf("head: %q %v", b, err)
	}
	if _, err := g.ReadAt(b[:1], limit-1); err != nil || b[0] != 'A' {
		t.Fatalf("last byte: %q %v", b[:1], err)
	}
	must(t, os.Truncate(p, 5)) // let the targets' chunk go
}
