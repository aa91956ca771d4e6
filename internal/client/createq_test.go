package client

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// delegatedDir makes directory name with client a (create delegations
// on), runs creates there until a holds its delegation and has inode
// numbers reserved, and returns the directory.
func delegatedDir(t *testing.T, a *Client, name string) rpc.Attr {
	t.Helper()
	d, err := a.Mkdir(context.Background(), RootIno, name, 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	createN(t, a, d.Ino, "pre", delegAfterCreates)
	waitHolding(t, a, d.Ino)
	if err := testutil.WaitFor(10*time.Second, func() error {
		a.deleg.mu.Lock()
		defer a.deleg.mu.Unlock()
		if p := &a.deleg.pool; p.next >= p.end {
			return errors.New("no inode numbers reserved yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

// holder is a client with create delegations on under policy, which
// keeps what it holds for a minute without creates.
func holder(tc *testCluster, policy string) *Client {
	a := tc.client(func(c *Config) { c.CreateDelegation = true; c.SyncPolicy = policy })
	a.deleg.mu.Lock()
	a.deleg.idle = time.Minute
	a.deleg.mu.Unlock()
	return a
}

func createWrite(t *testing.T, c *Client, dir uint64, name string, data []byte) error {
	t.Helper()
	bg := context.Background()
	f, err := c.CreateOpen(bg, dir, name, 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	if _, err := f.WriteAt(bg, data, 0); err != nil {
		t.Fatalf("write %s: %v", name, err)
	}
	return f.Release(bg)
}

// Under a held delegation, creates are answered here and reach the
// service in batches; each file's close waits for its create, so another
// client then finds every file with its data; a lookup of a missing name
// is answered here.
func TestLocalCreatesFlushInBatches(t *testing.T) {
	for _, policy := range []string{SyncPolicyAsync, SyncPolicySync} {
		t.Run(policy, func(t *testing.T) {
			tc := startCluster(t, clusterOpts{})
			bg := context.Background()
			a := holder(tc, policy)
			b := tc.client(nil)
			d := delegatedDir(t, a, "d")

			creates, batches := a.Calls("meta", rpc.MCreate), a.Calls("meta", rpc.MCreateBatch)
			commits, folded := a.Calls("meta", rpc.MCommitSize), a.Ops("create_folded")
			lookups := a.Calls("meta", rpc.MLookup)
			const n = 50
			for i := 0; i < n; i++ {
				if _, err := a.Lookup(bg, d.Ino, fmt.Sprint("f", i)); !errors.Is(err, syscall.ENOENT) {
					t.Fatalf("lookup of a missing name: %v, want ENOENT", err)
				}
				if err := createWrite(t, a, d.Ino, fmt.Sprint("f", i), []byte(fmt.Sprint("data of f", i))); err != nil {
					t.Fatalf("close of f%d: %v", i, err)
				}
			}
			if got := a.Calls("meta", rpc.MCreate) - creates; got != 0 {
				t.Errorf("%d creates went to the service one by one under the delegation", got)
			}
			if got := a.Calls("meta", rpc.MLookup) - lookups; got != 0 {
				t.Errorf("%d lookups of missing names asked the service under the delegation", got)
			}
			if got := a.Calls("meta", rpc.MCreateBatch) - batches; got == 0 || got > n {
				t.Errorf("%d batches for %d creates", got, n)
			}
			// A close finding its create still queued hands it the size:
			// no size commit of its own.
			f, c := a.Ops("create_folded")-folded, a.Calls("meta", rpc.MCommitSize)-commits
			if f == 0 || f+c < n {
				t.Errorf("%d closes folded their size into the create, %d committed it, of %d", f, c, n)
			}
			t.Logf("%d of %d closes folded, %d size commits, %d batches", f, n, c, a.Calls("meta", rpc.MCreateBatch)-batches)
			if policy == SyncPolicySync {
				if q := a.Queued(); q != 0 {
					t.Errorf("%d creates still queued after every close under sync", q)
				}
			}
			// B reads them all (its first call recalls A's delegation).
			for i := 0; i < n; i++ {
				want := fmt.Sprint("data of f", i)
				at, err := b.Lookup(bg, d.Ino, fmt.Sprint("f", i))
				if err != nil {
					t.Fatalf("B's lookup of f%d: %v", i, err)
				}
				if at.Size != uint64(len(want)) || at.Mode != syscall.S_IFREG|0o644 || at.Nlink != 1 {
					t.Fatalf("f%d as B sees it: size %d mode %o nlink %d", i, at.Size, at.Mode, at.Nlink)
				}
				f, err := b.Open(bg, at.Ino, syscall.O_RDONLY)
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 64)
				k, err := f.ReadAt(bg, buf, 0)
				f.Release(bg)
				if err != nil || string(buf[:k]) != want {
					t.Fatalf("B reads f%d: %q, %v; want %q", i, buf[:k], err, want)
				}
			}
			if a.Holding(d.Ino) {
				t.Fatal("A still holds the delegation after B's lookups")
			}
		})
	}
}

// Files created here and still open are flushed when another client's
// call recalls the delegation: that call sees them.
func TestLocalCreatesSeenOnRecall(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := holder(tc, SyncPolicyAsync)
	b := tc.client(nil)
	d := delegatedDir(t, a, "d")
	var open []*File
	for i := 0; i < 10; i++ {
		f, err := a.CreateOpen(bg, d.Ino, fmt.Sprint("open", i), 0o600, 0, 0, syscall.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, f)
	}
	ents, _, err := b.ReadDir(bg, d.Ino, "", 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name] = true
	}
	for i := 0; i < 10; i++ {
		if !names[fmt.Sprint("open", i)] {
			t.Fatalf("B's readdir misses open%d, created by A and open there (listing %v)", i, names)
		}
	}
	for _, f := range open {
		if err := f.Release(bg); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	if a.Holding(d.Ino) {
		t.Fatal("A still holds the delegation after B's readdir")
	}
}

// A create answered here that the service refuses (its name exists: the
// holder's view was wrong) fails the file's fsync with EIO, or — closed
// before its create was sent, under async — the next SyncMeta (syncfs),
// once; the name then is the service's to answer.
func TestLocalCreateRefusedFailsClose(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := holder(tc, SyncPolicyAsync)
	d := delegatedDir(t, a, "d")
	orig, err := a.Lookup(bg, d.Ino, "pre0")
	if err != nil {
		t.Fatal(err)
	}
	a.deleg.mu.Lock()
	delete(a.deleg.dirs[d.Ino].names, "pre0") // forget an existing name
	a.deleg.mu.Unlock()
	batches := a.Calls("meta", rpc.MCreateBatch)
	f, err := a.CreateOpen(bg, d.Ino, "pre0", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bg, []byte("lost"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(bg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync of a refused create: %v, want EIO", err)
	}
	f.Release(bg)
	if err := a.SyncMeta(bg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("SyncMeta after a refused create: %v, want EIO", err)
	}
	if err := a.SyncMeta(bg); err != nil {
		t.Fatalf("second SyncMeta: %v, want the refusal reported once", err)
	}
	a.deleg.mu.Lock()
	delete(a.deleg.dirs[d.Ino].names, "pre1")
	a.deleg.mu.Unlock()
	if err := createWrite(t, a, d.Ino, "pre1", []byte("lost too")); err != nil {
		t.Logf("close of a refused create: %v", err) // folded and not waited for (async), or waited for: either is right
	}
	if err := a.SyncMeta(bg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("SyncMeta after a refused create closed earlier: %v, want EIO", err)
	}
	if a.Calls("meta", rpc.MCreateBatch) == batches {
		t.Fatal("the create was not sent in a batch")
	}
	got, err := a.Lookup(bg, d.Ino, "pre0")
	if err != nil || got.Ino != orig.Ino || got.Size != 0 {
		t.Fatalf("lookup after the refused create: inode %d size %d, %v; want the original %d", got.Ino, got.Size, err, orig.Ino)
	}
}

// SyncMeta (syncfs) sends what is queued, and unmount gives back the
// delegation only after its queue went out.
func TestLocalCreatesFlushedAtUnmount(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := tc.client(func(c *Config) { c.CreateDelegation = true; c.SyncPolicy = SyncPolicyAsync })
	b := tc.client(nil)
	d := delegatedDir(t, a, "d")
	f, err := a.CreateOpen(bg, d.Ino, "x", 0o600, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SyncMeta(bg); err != nil {
		t.Fatal(err)
	}
	if q := a.Queued(); q != 0 {
		t.Fatalf("%d creates queued after SyncMeta", q)
	}
	if err := f.Release(bg); err != nil {
		t.Fatal(err)
	}
	var held []*File
	for i := 0; i < 5; i++ {
		g, err := a.CreateOpen(bg, d.Ino, fmt.Sprint("y", i), 0o600, 0, 0, syscall.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, g)
	}
	for _, g := range held {
		g.Release(bg)
	}
	a.Close()
	for _, name := range []string{"x", "y0", "y4"} {
		if _, err := b.Lookup(bg, d.Ino, name); err != nil {
			t.Fatalf("%s after A's unmount: %v", name, err)
		}
	}
}

// A directory whose creates are still queued here is not empty: rmdir
// sends them first and fails with ENOTEMPTY.
func TestRmdirOfDirectoryWithQueuedCreates(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := holder(tc, SyncPolicyAsync)
	d := delegatedDir(t, a, "d")
	sub := delegatedDir(t, a, "sub")
	for i := 0; i < delegAfterCreates; i++ {
		if _, err := a.Unlink(bg, sub.Ino, fmt.Sprint("pre", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Rename(bg, RootIno, "sub", d.Ino, "sub", 0); err != nil {
		t.Fatal(err)
	}
	a.deleg.mu.Lock()
	a.deleg.flushDelay = time.Hour // nothing but a caller sends the queue
	a.deleg.mu.Unlock()
	if err := createWrite(t, a, sub.Ino, "x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if a.Queued() != 1 {
		t.Fatalf("%d creates queued, want the one just closed", a.Queued())
	}
	if err := a.Rmdir(bg, d.Ino, "sub"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir of a directory holding a queued create: %v, want ENOTEMPTY", err)
	}
	if _, err := tc.client(nil).Lookup(bg, sub.Ino, "x"); err != nil {
		t.Fatalf("the queued file after the refused rmdir: %v", err)
	}
}

// The pool hands out every number it reserved before it moves on: the
// remainder of a range is used before the range reserved ahead, not left
// to the session as one of its few ranges (rpc.MaxSessionRanges).
// TestInoPoolRefillOnlyWhenLow: a grant's refill with numbers enough in
// the pool asks for none (a range the pool cannot keep would be wasted).
func TestInoPoolRefillOnlyWhenLow(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	a := holder(tc, SyncPolicyAsync)
	d := a.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pool.asking, d.pool.refusedTil = false, time.Time{}
	d.pool.session, d.pool.next, d.pool.end, d.pool.spareStart, d.pool.spareEnd = a.ClientID(), 1000, 1000+inoPoolLow, 0, 0
	d.refillLocked()
	if d.pool.asking {
		t.Fatal("a pool holding inoPoolLow numbers asked for more")
	}
	d.pool.next++ // one below the mark
	d.refillLocked()
	if !d.pool.asking {
		t.Fatal("a low pool did not ask for more")
	}
}

func TestInoPoolUsesEveryNumber(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	a := holder(tc, SyncPolicyAsync)
	d := a.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pool.asking = true // no background reservation: the ranges come from here
	id := a.ClientID()
	if !d.pool.add(id, 1000, 600) {
		t.Fatal("an empty pool refused a range")
	}
	var got []uint64
	take := func(n int) {
		for i := 0; i < n; i++ {
			ino, ok := d.takeInoLocked()
			if !ok {
				t.Fatalf("the pool ran dry after %d numbers", len(got))
			}
			got = append(got, ino)
		}
	}
	take(100) // 500 left: low, a reservation would be asked for
	if !d.pool.add(id, 5000, 600) {
		t.Fatal("a pool with numbers left refused the range reserved ahead")
	}
	if d.pool.add(id, 9000, 600) {
		t.Fatal("a pool holding a spare took a third range")
	}
	take(1100)
	for i, ino := range got {
		want := uint64(1000 + i)
		if i >= 600 {
			want = uint64(5000 + i - 600)
		}
		if ino != want {
			t.Fatalf("number %d handed out: %d, want %d (every number of a range before the next)", i, ino, want)
		}
	}
	if ino, ok := d.takeInoLocked(); ok {
		t.Fatalf("both ranges handed out, and then %d", ino)
	}
}

// TestTakeBatch: a flush leaves the creates of files still being written
// (within holdWriting) queued, in order, unless forced; a batch holds at
// most rpc.MaxCreateBatch creates and maxBatchInline inline bytes (but
// always one create).
func TestTakeBatch(t *testing.T) {
	now := time.Now()
	mk := func(writing bool, age time.Duration, inline int) *queuedCreate {
		q := &queuedCreate{writing: writing, at: now.Add(-age)}
		if inline > 0 {
			q.bc.Inline = make([]byte, inline)
		}
		return q
	}
	held, old, a, b := mk(true, 0, 0), mk(true, 2*holdWriting, 0), mk(false, 0, 0), mk(false, 0, 0)
	batch, rest := takeBatchLocked([]*queuedCreate{held, a, old, b}, false, now)
	if len(batch) != 3 || batch[0] != a || batch[1] != old || batch[2] != b || len(rest) != 1 || rest[0] != held {
		t.Fatalf("batch %v rest %v: want [a old b] and [held]", batch, rest)
	}
	if batch, rest = takeBatchLocked([]*queuedCreate{held, a}, true, now); len(batch) != 2 || batch[0] != held || len(rest) != 0 {
		t.Fatalf("forced: batch %v rest %v", batch, rest)
	}
	var many []*queuedCreate
	for i := 0; i < rpc.MaxCreateBatch+3; i++ {
		many = append(many, mk(false, 0, 0))
	}
	if batch, rest = takeBatchLocked(many, false, now); len(batch) != rpc.MaxCreateBatch || len(rest) != 3 {
		t.Fatalf("%d creates: batch of %d, %d left", len(many), len(batch), len(rest))
	}
	big := []*queuedCreate{mk(false, 0, maxBatchInline-10), mk(false, 0, 20), mk(false, 0, 5)}
	if batch, rest = takeBatchLocked(big, false, now); len(batch) != 1 || len(rest) != 2 || rest[0] != big[1] {
		t.Fatalf("inline bytes: batch of %d, %d left", len(batch), len(rest))
	}
	if batch, _ = takeBatchLocked([]*queuedCreate{mk(false, 0, 2*maxBatchInline)}, false, now); len(batch) != 1 {
		t.Fatal("a create larger than the bound alone was not sent")
	}
}
