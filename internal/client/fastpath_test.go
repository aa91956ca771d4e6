package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// smallFiles creates n files of one byte each through c and returns their
// inode numbers.
func smallFiles(t *testing.T, c *Client, prefix string, n int) []uint64 {
	t.Helper()
	ctx := context.Background()
	inos := make([]uint64, n)
	for i := range inos {
		f, err := c.CreateOpen(ctx, 1, fmt.Sprintf("%s%d", prefix, i), 0o644, 0, 0, syscall.O_WRONLY)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, []byte{'x'}, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		inos[i] = f.Ino()
	}
	return inos
}

// TestAtimesSentInOneBatch: reading N files sends no SetAttr per file;
// the access times wait in the client (which answers its own stats with
// them) and go in one MSetAtimes at the next flush, after which a second
// client sees them.
func TestAtimesSentInOneBatch(t *testing.T) {
	old := atimeInterval
	atimeInterval = time.Hour // only explicit flushes send
	t.Cleanup(func() { atimeInterval = old })
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	other := tc.client(nil)
	ctx := context.Background()
	const n = 20
	inos := smallFiles(t, c, "a", n)
	before := make([]rpc.Attr, n)
	for i, ino := range inos {
		a, err := other.GetAttr(ctx, ino)
		if err != nil {
			t.Fatal(err)
		}
		before[i] = a
	}
	setattrs, batches := c.Calls("meta", rpc.MSetAttr), c.Calls("meta", rpc.MSetAtimes)
	buf := make([]byte, 8)
	for _, ino := range inos {
		f, err := c.Open(ctx, ino, syscall.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		if k, err := f.ReadAt(ctx, buf, 0); err != nil || k != 1 {
			t.Fatalf("read %d bytes, %v", k, err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mine := make([]int64, n)
	for i, ino := range inos {
		a, err := c.GetAttr(ctx, ino)
		if err != nil {
			t.Fatal(err)
		}
		if a.Atime <= before[i].Mtime {
			t.Fatalf("file %d: this client's stat shows atime %d, not after mtime %d", i, a.Atime, before[i].Mtime)
		}
		if a.Ctime != before[i].Ctime {
			t.Fatalf("file %d: ctime moved from %d to %d on a read", i, before[i].Ctime, a.Ctime)
		}
		mine[i] = a.Atime
	}
	if got := c.Calls("meta", rpc.MSetAtimes) - batches; got != 0 {
		t.Fatalf("%d atime batches sent before the interval or a flush", got)
	}
	if err := c.FlushAtimes(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.Calls("meta", rpc.MSetAttr) - setattrs; got != 0 {
		t.Fatalf("%d reads sent %d SetAttr calls, want none", n, got)
	}
	if got := c.Calls("meta", rpc.MSetAtimes) - batches; got != 1 {
		t.Fatalf("%d reads sent %d atime batches, want 1", n, got)
	}
	for i, ino := range inos {
		a, err := other.GetAttr(ctx, ino)
		if err != nil {
			t.Fatal(err)
		}
		if a.Atime != mine[i] || a.Ctime != before[i].Ctime {
			t.Fatalf("file %d from the second client: atime %d ctime %d, want %d and %d", i, a.Atime, a.Ctime, mine[i], before[i].Ctime)
		}
	}
	// A second flush has nothing to send.
	if err := c.FlushAtimes(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.Calls("meta", rpc.MSetAtimes) - batches; got != 1 {
		t.Fatalf("an empty flush sent a batch (%d in all)", got)
	}
}

// TestAtimesSentWhenBatchFull: atimeBatchMax pending access times go at
// once, without waiting for the interval.
func TestAtimesSentWhenBatchFull(t *testing.T) {
	old := atimeInterval
	atimeInterval = time.Hour
	t.Cleanup(func() { atimeInterval = old })
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	batches := c.Calls("meta", rpc.MSetAtimes)
	now := time.Now().UnixNano()
	for i := 0; i < atimeBatchMax; i++ {
		c.atimes.note(uint64(1<<40+i), now) // files that do not exist are skipped by the service
	}
	err := testutil.WaitFor(10*time.Second, func() error {
		if c.Calls("meta", rpc.MSetAtimes) == batches {
			return errors.New("a full batch of access times was not sent")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAtimesMoveOnlyForward: a batch never moves an atime back (a
// utimes to a later time set meanwhile stays).
func TestAtimesMoveOnlyForward(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	ctx := context.Background()
	ino := smallFiles(t, c, "f", 1)[0]
	later := time.Now().Add(time.Hour).UnixNano()
	if _, err := c.SetAttr(ctx, ino, rpc.SetAttrReq{Valid: rpc.SetAtime, Atime: later}); err != nil {
		t.Fatal(err)
	}
	c.atimes.note(ino, time.Now().UnixNano())
	if err := c.FlushAtimes(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := tc.client(nil).GetAttr(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	if a.Atime != later {
		t.Fatalf("atime %d after a batch of an earlier time, want %d", a.Atime, later)
	}
}

// TestXattrMissesAnsweredLocally: a file this client created has no
// xattrs without asking; a miss the service answered is kept for the
// attribute timeout; this client's own setxattr is seen at once, another
// client's after the timeout.
func TestXattrMissesAnsweredLocally(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	const ttl = 300 * time.Millisecond
	c := tc.client(func(cfg *Config) { cfg.DirAttrTTL = ttl })
	other := tc.client(nil)
	ctx := context.Background()
	gets := func() uint64 { return c.Calls("meta", rpc.MGetXattr) }
	const capName = "security.capability"

	// Created here: no round trip for any number of questions (the
	// kernel asks before each write).
	ino := smallFiles(t, c, "new", 1)[0]
	g := gets()
	for i := 0; i < 10; i++ {
		if _, err := c.GetXattr(ctx, ino, capName); !errors.Is(err, syscall.ENODATA) {
			t.Fatalf("getxattr of a new file: %v, want ENODATA", err)
		}
	}
	if d := gets() - g; d != 0 {
		t.Fatalf("%d GetXattr calls for a file this client just created, want 0", d)
	}

	// Own setxattr: seen at once.
	if err := c.SetXattr(ctx, ino, "user.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if v, err := c.GetXattr(ctx, ino, "user.k"); err != nil || string(v) != "v" {
		t.Fatalf("own setxattr not seen at once: %q, %v", v, err)
	}
	if err := c.RemoveXattr(ctx, ino, "user.k"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetXattr(ctx, ino, "user.k"); !errors.Is(err, syscall.ENODATA) {
		t.Fatalf("own removexattr not seen at once: %v", err)
	}

	// A file made elsewhere: the first miss asks, the next ones do not.
	ino2 := smallFiles(t, other, "theirs", 1)[0]
	g = gets()
	for i := 0; i < 10; i++ {
		if _, err := c.GetXattr(ctx, ino2, capName); !errors.Is(err, syscall.ENODATA) {
			t.Fatalf("getxattr: %v, want ENODATA", err)
		}
	}
	if d := gets() - g; d != 1 {
		t.Fatalf("%d GetXattr calls for 10 misses, want 1", d)
	}

	// Another client's setxattr: seen once the timeout has passed.
	if err := other.SetXattr(ctx, ino2, capName, []byte("cap"), 0); err != nil {
		t.Fatal(err)
	}
	err := testutil.WaitFor(10*time.Second, func() error {
		v, err := c.GetXattr(ctx, ino2, capName)
		switch {
		case err == nil && string(v) == "cap":
			return nil
		case err == nil || errors.Is(err, syscall.ENODATA):
			return fmt.Errorf("another client's setxattr not seen: %q, %v", v, err)
		}
		t.Fatalf("getxattr: %v", err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// writeWhole replaces the contents of name (in the root) through c.
func writeWhole(t *testing.T, c *Client, name string, data []byte) uint64 {
	t.Helper()
	ctx := context.Background()
	a, err := c.Lookup(ctx, 1, name)
	var f *File
	if err == nil {
		f, err = c.Open(ctx, a.Ino, syscall.O_WRONLY|syscall.O_TRUNC)
	} else {
		f, err = c.CreateOpen(ctx, 1, name, 0o644, 0, 0, syscall.O_WRONLY)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return f.Ino()
}

// TestOpenReadsSmallFileMeanwhile: an open after a lookup of a small file
// reads it in parallel with its GetAttr, so the first read makes no
// storage call; close-to-open holds (another client's close between the
// lookup and the open is seen, same size or not).
func TestOpenReadsSmallFileMeanwhile(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	other := tc.client(nil)
	ctx := context.Background()
	// wantReads: storage reads for open and read (-1: not checked; a
	// dropped read at open may be counted after it).
	readAll := func(ino uint64, wantReads int) ([]byte, float64) {
		t.Helper()
		reads := c.Calls("store", rpc.SRead)
		hits := raHits(t, c)
		f, err := c.Open(ctx, ino, syscall.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Release(ctx)
		buf := make([]byte, 8192)
		k, err := f.ReadAt(ctx, buf, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d := c.Calls("store", rpc.SRead) - reads; wantReads >= 0 && d != uint64(wantReads) {
			t.Fatalf("open and read of a small file made %d storage reads, want %d", d, wantReads)
		}
		return buf[:k], raHits(t, c) - hits
	}
	v1 := bytes.Repeat([]byte("a"), 3901)
	ino := writeWhole(t, other, "small", v1)

	if _, err := c.Lookup(ctx, 1, "small"); err != nil {
		t.Fatal(err)
	}
	got, hits := readAll(ino, 1)
	if !bytes.Equal(got, v1) {
		t.Fatalf("read %d bytes, not the file's", len(got))
	}
	if hits != 1 {
		t.Fatal("the read after an open that followed a lookup was not answered by the open's read")
	}

	// No lookup before: the read goes to the store as before.
	if got, hits := readAll(ino, 1); !bytes.Equal(got, v1) || hits != 0 {
		t.Fatalf("open without a lookup: %d bytes, %v answered from memory", len(got), hits)
	}

	// Rewritten elsewhere (same size) between the lookup and the open:
	// the open's mtime is not the lookup's, so its read is dropped (it
	// could predate a write that closed while it ran) and read again.
	if _, err := c.Lookup(ctx, 1, "small"); err != nil {
		t.Fatal(err)
	}
	v2 := bytes.Repeat([]byte("b"), 3901)
	writeWhole(t, other, "small", v2)
	if got, hits := readAll(ino, -1); !bytes.Equal(got, v2) || hits != 0 {
		t.Fatalf("an open after another client's close read %q... (%v answered from memory), want its data", got[:4], hits)
	}

	// Grown elsewhere: the read at open is dropped, the new size read.
	if _, err := c.Lookup(ctx, 1, "small"); err != nil {
		t.Fatal(err)
	}
	v3 := bytes.Repeat([]byte("c"), 5000)
	writeWhole(t, other, "small", v3)
	if got, _ := readAll(ino, -1); !bytes.Equal(got, v3) { // last: its dropped read may be counted late
		t.Fatalf("read %d bytes after the file grew elsewhere, want %d", len(got), len(v3))
	}
}

// raHits is how many reads c answered from read-ahead memory.
func raHits(t *testing.T, c *Client) float64 { return counterValue(t, c.m.raHits) }

// TestOpenReadStalledStoreGivesEIO: the read an open starts runs the
// in-process store's handler on its own goroutine (transport.OnCaller),
// where a stalled disk holds it; the file's first read still fails with
// EIO after the IO timeout instead of waiting for the disk, and once the
// disk answers again the file reads normally.
func TestOpenReadStalledStoreGivesEIO(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	const timeout = 300 * time.Millisecond
	c := tc.client(func(cfg *Config) { cfg.IOTimeout = timeout })
	v := bytes.Repeat([]byte("s"), 3901)
	ino := writeWhole(t, tc.client(nil), "stalled", v)
	ctx := context.Background()
	if _, err := c.Lookup(ctx, 1, "stalled"); err != nil { // the open reads meanwhile
		t.Fatal(err)
	}
	t.Cleanup(failpoint.DisarmAll)
	if err := failpoint.Arm("store/before-read", "1*sleep(4s)"); err != nil {
		t.Fatal(err)
	}
	f, err := c.Open(ctx, ino, syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	start := time.Now()
	_, err = f.ReadAt(ctx, buf, 0)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read while the store's disk stalls: %v after %v, want EIO after the %v IO timeout", err, time.Since(start), timeout)
	}
	f.Release(ctx)
	if failpoint.Armed()["store/before-read"] != 1 {
		t.Fatal("the open's read did not reach the stalled store")
	}
	f, err = c.Open(ctx, ino, syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	if k, err := f.ReadAt(ctx, buf, 0); err != nil || !bytes.Equal(buf[:k], v) {
		t.Fatalf("read after the stall: %d bytes, %v", k, err)
	}
}
