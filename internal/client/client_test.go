package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

var bg = context.Background()

// pattern returns n bytes of a deterministic pattern for (seed, off).
func pattern(seed byte, off int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		x := uint64(off+int64(i)) * 0x9E3779B97F4A7C15
		b[i] = byte(x>>56) ^ seed
	}
	return b
}

func mkdir(t *testing.T, c *Client, parent uint64, name string) rpc.Attr {
	t.Helper()
	a, err := c.Mkdir(bg, parent, name, 0o755, 0, 0)
	if err != nil {
		t.Fatalf("mkdir %s: %v", name, err)
	}
	return a
}

func create(t *testing.T, c *Client, parent uint64, name string, flags int) *File {
	t.Helper()
	f, err := c.CreateOpen(bg, parent, name, 0o644, 0, 0, flags)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return f
}

func readAll(t *testing.T, c *Client, ino uint64, flags int) []byte {
	t.Helper()
	f, err := c.Open(bg, ino, flags)
	if err != nil {
		t.Fatalf("open %d: %v", ino, err)
	}
	defer f.Release(bg)
	size := int64(f.Size())
	out := make([]byte, size)
	// Read in odd-sized sequential pieces (exercises read-ahead).
	for off := int64(0); off < size; {
		n := min(int64(777_777), size-off)
		k, err := f.ReadAt(bg, out[off:off+n], off)
		if err != nil {
			t.Fatalf("read %d at %d: %v", ino, off, err)
		}
		if int64(k) != n {
			t.Fatalf("short read %d at %d: %d of %d", ino, off, k, n)
		}
		off += n
	}
	return out
}

func TestStripedRoundTrip(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 2})
	c := tc.client(nil)
	c2 := tc.client(nil)
	for _, count := range []uint32{1, 2, 4} {
		for _, ss := range []uint32{64 << 10, 1 << 20} {
			for _, direct := range []bool{false, true} {
				name := fmt.Sprintf("c%d-s%d-d%v", count, ss, direct)
				t.Run(name, func(t *testing.T) {
					d := mkdir(t, c, RootIno, name)
					if _, err := c.SetDirLayout(bg, d.Ino, ss, count); err != nil {
						t.Fatalf("set layout: %v", err)
					}
					flags := syscall.O_RDWR
					if direct {
						flags |= syscall.O_DIRECT
					}
					f := create(t, c, d.Ino, "f", flags)
					a := f.Attr()
					if a.Layout.StripeCount != count || a.Layout.StripeSize != ss || len(a.Layout.Targets) != int(count) {
						t.Fatalf("layout %+v, want count %d size %d", a.Layout, count, ss)
					}
					size := int64(5*ss) + 12345
					want := make([]byte, size)
					rng := rand.New(rand.NewSource(int64(count)*int64(ss) + 1))
					// Random pieces crossing stripe boundaries, in random order.
					for off := int64(0); off < size; {
						n := min(int64(rng.Intn(int(ss)*2)+1), size-off)
						copy(want[off:], pattern(byte(count), off, int(n)))
						off += n
					}
					type piece struct{ off, n int64 }
					var pieces []piece
					for off := int64(0); off < size; {
						n := min(int64(rng.Intn(int(ss)*3/2)+1), size-off)
						pieces = append(pieces, piece{off, n})
						off += n
					}
					rng.Shuffle(len(pieces), func(i, j int) { pieces[i], pieces[j] = pieces[j], pieces[i] })
					for _, p := range pieces {
						if _, err := f.WriteAt(bg, want[p.off:p.off+p.n], p.off); err != nil {
							t.Fatalf("write: %v", err)
						}
					}
					// Read back through the same handle before close.
					got := make([]byte, size)
					if n, err := f.ReadAt(bg, got, 0); err != nil || int64(n) != size {
						t.Fatalf("read own writes: %d %v", n, err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("own read differs: %s", diff(got, want))
					}
					if st, err := c.GetAttr(bg, a.Ino); err != nil || int64(st.Size) != size {
						t.Fatalf("getattr before close: size %d err %v, want %d", st.Size, err, size)
					}
					if err := f.Release(bg); err != nil {
						t.Fatalf("release: %v", err)
					}
					// Every target of the layout holds its chunk.
					for slot, tgt := range a.Layout.Targets {
						st := chunkStat(t, c, tgt, a.Ino)
						if wantSz := a.Layout.ChunkSize(size, slot); !st.Exists || int64(st.Size) != wantSz {
							t.Fatalf("slot %d target %d: chunk %+v, want size %d", slot, tgt, st, wantSz)
						}
					}
					// Another client sees it after close (close-to-open).
					if got := readAll(t, c2, a.Ino, 0); !bytes.Equal(got, want) {
						t.Fatalf("other client read differs: %s", diff(got, want))
					}
				})
			}
		}
	}
}

func TestSparseTruncateLarge(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 2})
	c := tc.client(nil)
	f := create(t, c, RootIno, "sparse", syscall.O_RDWR)
	ino := f.Ino()
	data := []byte("hello, strata")
	if _, err := f.WriteAt(bg, data, 10<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bg, data, 0); err != nil {
		t.Fatal(err)
	}
	const big = 5 << 30
	if _, err := f.WriteAt(bg, data, big); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(bg); err != nil {
		t.Fatal(err)
	}
	if a, _ := c.GetAttr(bg, ino); a.Size != big+uint64(len(data)) {
		t.Fatalf("size %d, want %d", a.Size, big+len(data))
	}
	buf := make([]byte, 64<<10)
	for _, off := range []int64{1 << 20, 9 << 20, 3 << 30, big - int64(len(buf))} {
		if n, err := f.ReadAt(bg, buf, off); err != nil || n != len(buf) {
			t.Fatalf("read hole at %d: %d %v", off, n, err)
		}
		if !bytes.Equal(buf, make([]byte, len(buf))) {
			t.Fatalf("hole at %d not zero", off)
		}
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(bg, got, big); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read at 5 GiB: %q %v", got, err)
	}
	f.Release(bg)

	// Truncate down into the middle of the second write, then up.
	if _, err := c.SetAttr(bg, ino, rpc.SetAttrReq{Valid: rpc.SetSize, Size: 10<<20 + 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetAttr(bg, ino, rpc.SetAttrReq{Valid: rpc.SetSize, Size: 12 << 20}); err != nil {
		t.Fatal(err)
	}
	all := readAll(t, c, ino, 0)
	if len(all) != 12<<20 {
		t.Fatalf("size after truncates %d", len(all))
	}
	want := make([]byte, 12<<20)
	copy(want, data)
	copy(want[10<<20:], data[:5])
	if !bytes.Equal(all, want) {
		t.Fatalf("content after truncate down/up differs")
	}
	// Truncate through an open handle with buffered writes.
	f, err := c.Open(bg, ino, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bg, []byte("xyz"), 100)
	if _, err := c.SetAttr(bg, ino, rpc.SetAttrReq{Valid: rpc.SetSize, Size: 101}); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(bg); err != nil {
		t.Fatal(err)
	}
	all = readAll(t, c, ino, 0)
	if len(all) != 101 || all[100] != 'x' || !bytes.Equal(all[:len(data)], data) {
		t.Fatalf("after truncate with buffered writes: len %d", len(all))
	}
}

func TestNTo1(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 2})
	clients := []*Client{tc.client(nil), tc.client(nil)}
	f := create(t, clients[0], RootIno, "shared", syscall.O_RDWR)
	ino := f.Ino()
	f.Release(bg)
	const writers, rounds, region = 8, 4, 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%2]
			f, err := c.Open(bg, ino, syscall.O_WRONLY)
			if err != nil {
				errs <- err
				return
			}
			for r := 0; r < rounds; r++ {
				off := int64(r*writers+w) * region
				if _, err := f.WriteAt(bg, pattern(byte(w), off, region), off); err != nil {
					errs <- err
				}
			}
			errs <- f.Release(bg)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := readAll(t, clients[1], ino, 0)
	if len(got) != writers*rounds*region {
		t.Fatalf("size %d, want %d", len(got), writers*rounds*region)
	}
	for i := 0; i < writers*rounds; i++ {
		off := int64(i) * region
		if !bytes.Equal(got[off:off+region], pattern(byte(i%writers), off, region)) {
			t.Fatalf("region %d differs", i)
		}
	}
}

func TestDeadStoreEIO(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 1})
	c := tc.client(func(cfg *Config) { cfg.IOTimeout = 2 * time.Second })
	d := mkdir(t, c, RootIno, "one")
	if _, err := c.SetDirLayout(bg, d.Ino, 0, 1); err != nil {
		t.Fatal(err)
	}
	// One file per store (count 1, round-robin placement).
	byAddr := map[string]*File{}
	for i := 0; i < 8 && len(byAddr) < 2; i++ {
		f := create(t, c, d.Ino, fmt.Sprintf("f%d", i), syscall.O_RDWR)
		addr := c.Targets()[f.Attr().Layout.Targets[0]].Addr
		if _, ok := byAddr[addr]; ok {
			f.Release(bg)
			continue
		}
		if _, err := f.WriteAt(bg, []byte("before"), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Fsync(bg); err != nil {
			t.Fatal(err)
		}
		byAddr[addr] = f
	}
	dead, live := byAddr[tc.stores[1].Addr()], byAddr[tc.stores[0].Addr()]
	if dead == nil || live == nil {
		t.Fatalf("could not place files on both stores: %v", byAddr)
	}
	tc.stopStore(1)
	start := time.Now()
	dead.WriteAt(bg, []byte("after"), 0)
	err := dead.Fsync(bg)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync on dead store: %v, want EIO", err)
	}
	if el := time.Since(start); el > 8*time.Second {
		t.Fatalf("EIO took %v", el)
	}
	buf := make([]byte, 6)
	if _, err := dead.ReadAt(bg, buf, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read on dead store: %v, want EIO", err)
	}
	var te *TargetError
	if !errors.As(err, &te) || te.Addr == "" {
		t.Fatalf("error does not name the server: %v", err)
	}
	// The other file keeps working.
	if _, err := live.WriteAt(bg, []byte("still"), 0); err != nil {
		t.Fatal(err)
	}
	if err := live.Fsync(bg); err != nil {
		t.Fatalf("fsync on live store: %v", err)
	}
	if _, err := live.ReadAt(bg, buf[:5], 0); err != nil || string(buf[:5]) != "still" {
		t.Fatalf("read on live store: %q %v", buf[:5], err)
	}
	live.Release(bg)
	dead.Release(bg)
}

func TestMetaRestart(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2})
	c := tc.client(nil)
	f := create(t, c, RootIno, "before", syscall.O_RDWR)
	f.WriteAt(bg, []byte("data"), 0)
	if err := f.Release(bg); err != nil {
		t.Fatal(err)
	}
	tc.meta.Close()
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(time.Second)
		tc.startMeta(tc.metaAddr)
	}()
	defer func() { <-restarted }()
	// These run while the service is down and must succeed once it is back.
	a, err := c.Lookup(bg, RootIno, "before")
	if err != nil {
		t.Fatalf("lookup across restart: %v", err)
	}
	if a.Size != 4 {
		t.Fatalf("size after restart %d", a.Size)
	}
	f2 := create(t, c, RootIno, "after", syscall.O_RDWR)
	f2.WriteAt(bg, []byte("more"), 0)
	if err := f2.Release(bg); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c, a.Ino, 0); string(got) != "data" {
		t.Fatalf("read after restart %q", got)
	}
}

// TestLocksSurviveMetaRestart: locks live in the service's memory; after a
// restart the clients reclaim them before anybody else may lock, so a lock
// held across the restart still excludes the other client.
func TestLocksSurviveMetaRestart(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a := tc.client(nil)
	b := tc.client(nil)
	f := create(t, a, RootIno, "locked", syscall.O_RDWR)
	defer f.Release(bg)
	ino := f.Ino()
	held := []Lock{
		{Ino: ino, Owner: 1, Start: 0, End: 99, Type: rpc.LockWrite, Pid: 11},
		{Ino: ino, Owner: 1, Start: 200, End: 299, Type: rpc.LockRead, Pid: 11},
		{Ino: ino, Owner: 7, Start: 0, End: ^uint64(0), Type: rpc.LockWrite, Pid: 11, Flock: true},
	}
	for _, l := range held {
		if err := a.SetLk(bg, l, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	// a let go of part of its write lock before the restart: that part must
	// not come back with the reclaim.
	if err := a.SetLk(bg, Lock{Ino: ino, Owner: 1, Start: 90, End: 99, Type: rpc.LockUnlock, Pid: 11}, false, nil); err != nil {
		t.Fatal(err)
	}
	tc.restartMeta()

	lb := Lock{Ino: ino, Owner: 2, Start: 50, End: 60, Type: rpc.LockRead, Pid: 22}
	if err := b.SetLk(bg, lb, false, nil); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("lock conflicting with one held across the restart: %v, want EAGAIN", err)
	}
	r, err := b.GetLk(bg, lb)
	if err != nil || r.Type != rpc.LockWrite || r.Start != 0 || r.End != 89 || r.Pid != 11 {
		t.Fatalf("getlk after restart: %+v %v, want a's write lock 0..89", r, err)
	}
	if err := b.SetLk(bg, Lock{Ino: ino, Owner: 2, Start: 90, End: 99, Type: rpc.LockWrite, Pid: 22}, false, nil); err != nil {
		t.Fatalf("lock on the range a released before the restart: %v", err)
	}
	if err := b.SetLk(bg, Lock{Ino: ino, Owner: 2, Start: 250, End: 260, Type: rpc.LockWrite, Pid: 22}, false, nil); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("write lock over a's reclaimed read lock: %v, want EAGAIN", err)
	}
	if err := b.SetLk(bg, Lock{Ino: ino, Owner: 8, Start: 0, End: ^uint64(0), Type: rpc.LockRead, Pid: 22, Flock: true}, false, nil); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("flock over a's reclaimed flock: %v, want EAGAIN", err)
	}
	// a still works with its locks: unlocking lets b in.
	if err := a.SetLk(bg, Lock{Ino: ino, Owner: 1, Start: 0, End: ^uint64(0), Type: rpc.LockUnlock, Pid: 11}, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLk(bg, lb, false, nil); err != nil {
		t.Fatalf("lock after a released: %v", err)
	}
	if n := a.heldCount(); n != 1 {
		t.Fatalf("a holds %d locks, want 1 (the flock)", n)
	}
}

// TestLostLockFailsOpenHandles: when the service drops this client's
// session (lease expired, evicted) while it holds a lock, and another
// client takes the lock, the handles the lock was taken through fail with
// EIO — reads, writes, close — instead of going on unprotected; the file's
// other handles, other files and a new open of the same file work.
func TestLostLockFailsOpenHandles(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a := tc.client(nil)
	b := tc.client(nil)
	f := lockedFile(t, a, "guarded")
	bystander := openFile(t, a, f.Ino())
	g := create(t, a, RootIno, "unguarded", syscall.O_RDWR)
	defer g.Release(bg)
	// The service ends a's session, as when its lease runs out; its locks go.
	if err := b.metaCall(bg, rpc.MSessionClose, &rpc.SessionCloseReq{ClientID: a.clientID.Load()}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLk(bg, Lock{Ino: f.Ino(), Owner: 2, Start: 0, End: 9, Type: rpc.LockWrite, Pid: 22}, false, nil); err != nil {
		t.Fatalf("b takes the lock a lost: %v", err)
	}
	// a learns it at its next heartbeat and opens a new session.
	if err := a.heartbeat(bg); err != nil {
		t.Fatal(err)
	}
	if n := a.heldCount(); n != 0 {
		t.Fatalf("a still counts %d held locks", n)
	}
	if _, err := g.WriteAt(bg, []byte("fine"), 0); err != nil {
		t.Fatalf("write to a file without locks: %v", err)
	}
	checkLockLost(t, a, f, bystander)
}

// A lock request refused through a handle (EAGAIN: another client holds
// the range) does not tie the handle to its owner: when the owner later
// loses a lock it took through another handle, only that handle fails.
func TestRefusedLockLeavesHandleAlone(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a := tc.client(nil)
	b := tc.client(nil)
	f := create(t, a, RootIno, "shared", syscall.O_RDWR)
	if _, err := f.WriteAt(bg, []byte("before"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(bg); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLk(bg, Lock{Ino: f.Ino(), Owner: 2, Start: 100, End: 199, Type: rpc.LockWrite, Pid: 22}, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.SetLk(bg, Lock{Ino: f.Ino(), Owner: 1, Start: 0, End: 9, Type: rpc.LockWrite, Pid: 11}, false, nil); err != nil {
		t.Fatal(err)
	}
	tried := openFile(t, a, f.Ino())
	if err := tried.SetLk(bg, Lock{Ino: f.Ino(), Owner: 1, Start: 100, End: 109, Type: rpc.LockWrite, Pid: 11}, false, nil); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("lock over b's range: %v, want EAGAIN", err)
	}
	if err := b.metaCall(bg, rpc.MSessionClose, &rpc.SessionCloseReq{ClientID: a.clientID.Load()}, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.heartbeat(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bg, []byte("unguarded"), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write through the handle whose lock was lost: %v, want EIO", err)
	}
	got := make([]byte, 6)
	if n, err := tried.ReadAt(bg, got, 0); err != nil || string(got[:n]) != "before" {
		t.Fatalf("read through the handle whose lock request was refused: %q %v, want \"before\"", got[:n], err)
	}
	if _, err := tried.WriteAt(bg, []byte("after!"), 0); err != nil {
		t.Fatalf("write through the handle whose lock request was refused: %v", err)
	}
	if err := tried.Release(bg); err != nil {
		t.Fatalf("close of the handle whose lock request was refused: %v", err)
	}
	if err := f.Release(bg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("close of the handle whose lock was lost: %v, want EIO", err)
	}
}

// lockedFile creates name in the root through c, writes "before" to it
// durably and takes a write lock over the whole file (owner 1, pid 11).
func lockedFile(t *testing.T, c *Client, name string) *File {
	t.Helper()
	f := create(t, c, RootIno, name, syscall.O_RDWR)
	if _, err := f.WriteAt(bg, []byte("before"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(bg); err != nil {
		t.Fatal(err)
	}
	if err := f.SetLk(bg, Lock{Ino: f.Ino(), Owner: 1, Start: 0, End: ^uint64(0), Type: rpc.LockWrite, Pid: 11}, false, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// openFile opens ino read-write through c.
func openFile(t *testing.T, c *Client, ino uint64) *File {
	t.Helper()
	h, err := c.Open(bg, ino, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// checkLockLost checks that f, whose lock was lost, fails writes, reads and
// its close with EIO, that bystander — a handle on the same file opened
// before the loss, through which no lock was taken (another process's) —
// works on and closes cleanly, and that a new handle on the file reads
// "before".
func checkLockLost(t *testing.T, c *Client, f, bystander *File) {
	t.Helper()
	got := make([]byte, 6)
	if n, err := bystander.ReadAt(bg, got, 0); err != nil || string(got[:n]) != "before" {
		t.Fatalf("read through a handle that took no lock: %q %v, want \"before\"", got[:n], err)
	}
	if err := bystander.Release(bg); err != nil {
		t.Fatalf("close of a handle that took no lock: %v", err)
	}
	if _, err := f.WriteAt(bg, []byte("unguarded"), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write through a handle whose lock was lost: %v, want EIO", err)
	}
	if _, err := f.ReadAt(bg, make([]byte, 6), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read through a handle whose lock was lost: %v, want EIO", err)
	}
	// A new handle, while f still holds the file open: the owner that
	// lost its lock may lock again through it (a range the other client
	// does not hold), and the old loss does not count against it.
	h := openFile(t, c, f.Ino())
	defer h.Release(bg)
	if err := h.SetLk(bg, Lock{Ino: f.Ino(), Owner: 1, Start: 100, End: 199, Type: rpc.LockWrite, Pid: 11}, false, nil); err != nil {
		t.Fatalf("lock again after the loss: %v", err)
	}
	if n, err := h.ReadAt(bg, got, 0); err != nil || string(got[:n]) != "before" {
		t.Fatalf("read through a new handle: %q %v, want \"before\"", got[:n], err)
	}
	if err := f.Release(bg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("close of a handle whose lock was lost: %v, want EIO", err)
	}
}

// A lock whose reclaim the restarted service refuses — the grace period
// ended and another client took a conflicting lock before this client's
// reclaim arrived — is lost like one of an expired session: forgotten, and
// the handles it was taken through fail with EIO; the client's other locks
// and new ones work under the new epoch.
func TestRefusedReclaimFailsOpenHandles(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a := tc.client(nil)
	b := tc.client(nil)
	f := lockedFile(t, a, "contested")
	bystander := openFile(t, a, f.Ino())
	kept := create(t, a, RootIno, "kept", syscall.O_RDWR)
	defer kept.Release(bg)
	ino := f.Ino()
	if err := kept.SetLk(bg, Lock{Ino: kept.Ino(), Owner: 1, Start: 0, End: 99, Type: rpc.LockWrite, Pid: 11}, false, nil); err != nil {
		t.Fatal(err)
	}
	// Hold off a's reclaim (its heartbeat may come at any time; the
	// reclaim then waits here) while the grace period is made to end
	// without it: b reports the new epoch, and a heartbeat in a's name
	// reports it for a, as a reclaim that came too late would have.
	a.locks.rw.Lock()
	tc.restartMeta()
	if err := b.heartbeat(bg); err != nil {
		t.Fatal(err)
	}
	epoch := b.lockEpoch()
	if err := b.metaCall(bg, rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: a.clientID.Load(), OpenInodes: []uint64{ino, kept.Ino()}, LockEpoch: epoch}, &rpc.SessionHeartbeatResp{}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLk(bg, Lock{Ino: ino, Owner: 2, Start: 0, End: 9, Type: rpc.LockWrite, Pid: 22}, false, nil); err != nil {
		a.locks.rw.Unlock()
		t.Fatalf("b takes a conflicting lock after the grace period: %v", err)
	}
	a.locks.rw.Unlock()
	if err := a.heartbeat(bg); err != nil {
		t.Fatal(err)
	}
	if n := a.heldCount(); n != 1 {
		t.Fatalf("a counts %d held locks, want 1 (the reclaimed one)", n)
	}
	if a.lockEpoch() != epoch {
		t.Fatalf("a's lock epoch %d, want the service's %d", a.lockEpoch(), epoch)
	}
	checkLockLost(t, a, f, bystander)
	// The reclaimed lock is held: b cannot take it.
	if err := b.SetLk(bg, Lock{Ino: kept.Ino(), Owner: 2, Start: 50, End: 60, Type: rpc.LockRead, Pid: 22}, false, nil); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("b locks a range a reclaimed: %v, want EAGAIN", err)
	}
	if _, err := kept.WriteAt(bg, []byte("still mine"), 0); err != nil {
		t.Fatalf("write under the reclaimed lock: %v", err)
	}
	// a locks the file again once b lets go.
	if err := b.SetLk(bg, Lock{Ino: ino, Owner: 2, Start: 0, End: 9, Type: rpc.LockUnlock, Pid: 22}, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.SetLk(bg, Lock{Ino: ino, Owner: 1, Start: 0, End: 9, Type: rpc.LockWrite, Pid: 11}, false, nil); err != nil {
		t.Fatalf("a locks the file again: %v", err)
	}
}

// TestENOSPC: targets whose free space is all below their reserve have
// nothing a write may use. statfs (df on a mount) says so — no space
// available — and a create is refused with ENOSPC naming the reason,
// instead of a file placed where its first write fails. (A write that
// meets the reserve on a target that still had room is the store's test,
// TestENOSPCKeepsDataIntact, and test/TestFullTargetGivesENOSPC.)
func TestENOSPC(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2, reserve: 1 << 62})
	c := tc.client(nil)
	fs, err := c.StatFS(bg)
	if err != nil {
		t.Fatal(err)
	}
	if fs.AvailBytes != 0 {
		t.Fatalf("statfs: %d bytes available where every write meets ENOSPC", fs.AvailBytes)
	}
	if fs.TotalBytes == 0 || fs.FreeBytes == 0 {
		t.Fatalf("statfs: size %d, free %d: want the disk's figures (only the available space is taken by the reserve)", fs.TotalBytes, fs.FreeBytes)
	}
	_, err = c.CreateOpen(bg, RootIno, "full", 0o644, 0, 0, syscall.O_RDWR)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "full") {
		t.Fatalf("create with every target below its reserve: %v, want ENOSPC saying the targets are full", err)
	}
}

func TestOpenUnlinked(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2})
	c := tc.client(nil)
	other := tc.client(nil)
	f := create(t, c, RootIno, "doomed", syscall.O_RDWR)
	want := pattern(7, 0, 3<<20)
	f.WriteAt(bg, want, 0)
	if err := f.Fsync(bg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the open set reaches the service
	a, err := other.Unlink(bg, RootIno, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	if a.Nlink != 0 {
		t.Fatalf("nlink after unlink %d", a.Nlink)
	}
	time.Sleep(3 * time.Second) // several reaper passes (grace 1 s)
	got := make([]byte, len(want))
	if n, err := f.ReadAt(bg, got, 0); err != nil || n != len(want) || !bytes.Equal(got, want) {
		t.Fatalf("read of open unlinked file: %d %v", n, err)
	}
	if err := f.Release(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lookup(bg, RootIno, "doomed"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("lookup after unlink: %v", err)
	}
}

// An open under way — its answer in, its inode not yet in the open set —
// keeps the reaper off a file another client unlinks meanwhile: the
// heartbeats made then are dated no later than the open's start. Opening
// a file that was unlinked elsewhere and is not open here fails ENOENT.
func TestOpenUnderWayHoldsReaper(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2})
	a := tc.client(nil)
	b := tc.client(nil)
	f := create(t, b, RootIno, "x", syscall.O_RDWR)
	if _, err := f.WriteAt(bg, pattern(3, 0, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	ino := f.Ino()
	if err := f.Release(bg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // a's heartbeats are dated from here on
		if err := a.heartbeat(bg); err != nil {
			t.Fatal(err)
		}
	}
	tok := a.beginOpen()
	if _, err := b.Unlink(bg, RootIno, "x"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := a.heartbeat(bg); err != nil {
			t.Fatal(err)
		}
		if err := b.heartbeat(bg); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * time.Second) // several reaper passes (grace 1 s)
	if _, err := b.GetAttr(bg, ino); err != nil {
		t.Fatalf("the unlinked file was reaped while an open of it was under way: %v", err)
	}
	a.endOpen(tok)
	if _, err := a.Open(bg, ino, syscall.O_RDONLY); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open of a file unlinked elsewhere: %v, want ENOENT", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := a.heartbeat(bg); err != nil {
			t.Fatal(err)
		}
		if _, err := b.GetAttr(bg, ino); errors.Is(err, syscall.ENOENT) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphan was not reaped once the open had ended")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestNamespace(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	long := string(bytes.Repeat([]byte("a"), 256))
	if _, err := c.Create(bg, RootIno, long, 0o644, 0, 0); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Fatalf("create long name: %v", err)
	}
	d := mkdir(t, c, RootIno, "dir")
	for i := 0; i < 2500; i++ {
		if _, err := c.Create(bg, d.Ino, fmt.Sprintf("e%05d", i), 0o600, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	after := ""
	for {
		ents, eof, err := c.ReadDir(bg, d.Ino, after, 1000, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if seen[e.Name] {
				t.Fatalf("duplicate %s", e.Name)
			}
			seen[e.Name] = true
			after = e.Name
		}
		if eof {
			break
		}
	}
	if len(seen) != 2500 {
		t.Fatalf("listed %d entries", len(seen))
	}
	if _, err := c.Symlink(bg, d.Ino, "ln", "/target", 0, 0); err != nil {
		t.Fatal(err)
	}
	a, err := c.ResolvePath(bg, "/dir/ln")
	if err != nil {
		t.Fatal(err)
	}
	if s, err := c.Readlink(bg, a.Ino); err != nil || s != "/target" {
		t.Fatalf("readlink %q %v", s, err)
	}
	if err := c.SetXattr(bg, a.Ino, "user.k", []byte("v"), 0); err == nil {
		if v, err := c.GetXattr(bg, a.Ino, "user.k"); err != nil || string(v) != "v" {
			t.Fatalf("getxattr %q %v", v, err)
		}
	}
	if err := c.Rmdir(bg, RootIno, "dir"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir non-empty: %v", err)
	}
	// Locks: a second client conflicts; SetLk with wait gets EINTR on cancel.
	other := tc.client(nil)
	f := create(t, c, RootIno, "locked", syscall.O_RDWR)
	defer f.Release(bg)
	l := Lock{Ino: f.Ino(), Owner: 1, Start: 0, End: ^uint64(0), Type: rpc.LockWrite, Pid: 1}
	if err := c.SetLk(bg, l, false, nil); err != nil {
		t.Fatal(err)
	}
	l2 := l
	l2.Owner = 2
	if err := other.SetLk(bg, l2, false, nil); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("conflicting lock: %v", err)
	}
	cancel := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(cancel) })
	if err := other.SetLk(bg, l2, true, cancel); !errors.Is(err, syscall.EINTR) {
		t.Fatalf("waiting lock cancelled: %v", err)
	}
}

func diff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("len %d, want %d", len(got), len(want))
	}
	first, last, n := -1, -1, 0
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			last = i
			n++
		}
	}
	return fmt.Sprintf("%d bytes differ in [%d, %d]", n, first, last)
}

// TestReadBuffers: sequential reads answered from read-ahead blocks without
// copying hold the bytes of ReadAt, stay unchanged until Release, and give
// the memory budget back.
func TestReadBuffers(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 2})
	c := tc.client(nil)
	c2 := tc.client(nil)
	for _, ss := range []uint32{64 << 10, 1 << 20} {
		t.Run(fmt.Sprintf("s%d", ss), func(t *testing.T) {
			d := mkdir(t, c, RootIno, fmt.Sprintf("rb%d", ss))
			if _, err := c.SetDirLayout(bg, d.Ino, ss, 4); err != nil {
				t.Fatal(err)
			}
			f := create(t, c, d.Ino, "f", syscall.O_RDWR)
			size := int64(6<<20) + 4321
			want := pattern(7, 0, int(size))
			if _, err := f.WriteAt(bg, want, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Release(bg); err != nil {
				t.Fatal(err)
			}
			r, err := c2.Open(bg, f.Ino(), syscall.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			type heldRead struct {
				rd  ReadData
				off int64
			}
			var held []heldRead
			zeroCopy := 0
			p := make([]byte, 256<<10)
			for off := int64(0); off < size; off += int64(len(p)) {
				rd, err := r.ReadBuffers(bg, p, off)
				if err != nil {
					t.Fatal(err)
				}
				if rd.Len() != int(min(int64(len(p)), size-off)) {
					t.Fatalf("read at %d: %d bytes", off, rd.Len())
				}
				n := 0
				for _, b := range rd.Bufs {
					got = append(got, b...)
					n += len(b)
					if len(b) > 0 && &b[0] != &p[0] {
						zeroCopy++
					}
				}
				if n != rd.Len() {
					t.Fatalf("read at %d: Bufs hold %d bytes, Len %d", off, n, rd.Len())
				}
				held = append(held, heldRead{rd, off})
				if len(held) > 3 { // keep a few answers alive while reading on
					h := held[0]
					held = held[1:]
					checkHeld(t, &h.rd, want[h.off:])
					h.rd.Release()
				}
			}
			for i := range held {
				checkHeld(t, &held[i].rd, want[held[i].off:])
				held[i].rd.Release()
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("ReadBuffers differs: %s", diff(got, want))
			}
			if zeroCopy == 0 {
				t.Fatal("no read was answered from read-ahead blocks")
			}
			if err := r.Release(bg); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				c2.budget.mu.Lock()
				avail := c2.budget.avail
				c2.budget.mu.Unlock()
				if avail == c2.budget.max {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("budget %d of %d after release", avail, c2.budget.max)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// checkHeld verifies that a held read answer still holds the file's bytes
// (want starts at the answer's offset).
func checkHeld(t *testing.T, rd *ReadData, want []byte) {
	t.Helper()
	var b []byte
	for _, s := range rd.Bufs {
		b = append(b, s...)
	}
	if !bytes.Equal(b, want[:len(b)]) {
		t.Fatal("a held read answer changed before its release")
	}
}

// metaCallCount is how many metadata calls c has made.
func metaCallCount(t *testing.T, c *Client) float64 { return counterValue(t, c.m.metaOps) }

// counterValue is the value of counter m.
func counterValue(t *testing.T, m prometheus.Counter) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}

// logIndexes returns the metadata log's durable and applied indexes.
func logIndexes(t *testing.T, c *Client) (durable, applied uint64) {
	t.Helper()
	st, err := c.ClusterStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.DurableIndex, st.AppliedIndex
}

// SyncMeta is the barrier that makes namespace changes durable; the
// changes themselves are answered before. Under the sync policy a close
// that wrote nothing waits for nothing (TestEmptyCloseDurableBySyncDelay),
// a close that wrote data commits its size durably and with it the create;
// under strict every close is a barrier. The cluster's sync delay is an
// hour: only barriers (and the log's eager start after one) sync.
func TestMetaBarriers(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	strict := tc.client(func(cfg *Config) { cfg.SyncPolicy = SyncPolicyStrict })
	ctx := context.Background()
	durable := func() (d, a uint64) { return logIndexes(t, c) }
	// The log syncs at once after a recent durability wait (the session
	// open was one): wait past that window to see a change answered
	// before its sync.
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Mkdir(ctx, 1, "d", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if d, a := durable(); d >= a {
		t.Fatalf("mkdir answered with durable %d >= applied %d", d, a)
	}
	if err := c.SyncMeta(ctx); err != nil {
		t.Fatal(err)
	}
	if d, a := durable(); d < a {
		t.Fatalf("after SyncMeta durable %d < applied %d", d, a)
	}

	// sync, data written: the close's size commit is durable, and covers
	// the create it follows.
	time.Sleep(50 * time.Millisecond)
	f, err := c.CreateOpen(ctx, 1, "data", 0o644, 0, 0, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d, a := durable(); d < a {
		t.Fatalf("after close of a written file durable %d < applied %d", d, a)
	}

	// strict: the close of a new empty file is a barrier.
	time.Sleep(50 * time.Millisecond)
	f, err = strict.CreateOpen(ctx, 1, "strict", 0o644, 0, 0, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if d, a := durable(); d >= a {
		t.Fatalf("create answered with durable %d >= applied %d", d, a)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d, a := durable(); d < a {
		t.Fatalf("after a strict close of a new empty file durable %d < applied %d", d, a)
	}
}

// Under the sync policy the close of a new file that wrote nothing makes
// no metadata call at all, and the create still becomes durable by itself:
// within the log's sync delay (here the default, 5 ms), with nobody
// waiting. (TestMetaBarriers used to check this on a cluster whose delay
// is an hour, where only the log's eager start after a recent barrier
// synced the create: a barrier sync slower than the eager window left it
// for the hour, about 1 run in 15 on a loaded machine.)
func TestEmptyCloseDurableBySyncDelay(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1, syncDelay: 5 * time.Millisecond})
	c := tc.client(nil)
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		time.Sleep(50 * time.Millisecond) // past the eager window of any earlier wait
		f, err := c.CreateOpen(ctx, 1, name, 0o644, 0, 0, syscall.O_WRONLY)
		if err != nil {
			t.Fatal(err)
		}
		calls := metaCallCount(t, c)
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := metaCallCount(t, c) - calls; n != 0 {
			t.Fatalf("close of a new empty file under sync made %v metadata calls, want 0", n)
		}
		st, err := c.ClusterStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		applied := st.AppliedIndex
		deadline := time.Now().Add(10 * time.Second)
		for st.DurableIndex < applied {
			if time.Now().After(deadline) {
				t.Fatalf("log durable at %d, still below the create's %d after 10 s", st.DurableIndex, applied)
			}
			time.Sleep(time.Millisecond)
			if st, err = c.ClusterStatus(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Under the async policy a close commits the file's size deferred: the
// metadata log syncs on its timer only (here an hour, so: never), however
// many files are created, written and closed. The file's fsync, through a
// handle opened after the close, still makes the commit durable. Counted,
// not timed: the log's durable index must not move in 200 files (each of
// which used to wait for a log sync at close).
func TestAsyncCloseWaitsForNoLogSync(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2, metrics: true})
	c := tc.client(func(cfg *Config) { cfg.SyncPolicy = SyncPolicyAsync })
	ctx := context.Background()
	status := func() (d, a uint64) { return logIndexes(t, c) }
	time.Sleep(50 * time.Millisecond) // past the eager window of the session open's wait
	d0, a0 := status()
	data := bytes.Repeat([]byte("s"), 3901)
	const files = 200
	var last uint64
	for i := range files {
		f, err := c.CreateOpen(ctx, 1, fmt.Sprintf("f%d", i), 0o644, 0, 0, syscall.O_WRONLY)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, data, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		last = f.Ino()
	}
	d1, a1 := status()
	if a1 < a0+2*files {
		t.Fatalf("applied %d -> %d for %d creates and size commits", a0, a1, files)
	}
	if d1 != d0 {
		t.Fatalf("%d async creates+writes+closes moved the log's durable index %d -> %d (applied %d): a close waited for a log sync", files, d0, d1, a1)
	}

	// fsync through a new handle: the chunk written before the close is
	// synced, the deferred commit (the last entry) becomes durable, and
	// the file's size is what was written.
	f, err := c.Open(ctx, last, syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	syncs := storeRequests(t, tc, "sync") + storeRequests(t, tc, "sync_stat")
	if err := f.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := storeRequests(t, tc, "sync") + storeRequests(t, tc, "sync_stat") - syncs; n != 1 {
		t.Fatalf("fsync through a new handle of a file written and closed under async made %d chunk syncs, want 1", n)
	}
	if d2, _ := status(); d2 < a1 {
		t.Fatalf("after fsync of the last file through a new handle durable %d < its size commit's entry %d", d2, a1)
	}
	if got := f.Committed().Size; got != uint64(len(data)) {
		t.Fatalf("size %d, want %d", got, len(data))
	}
}

// What the fsync of a closed file still owes is kept for maxOwed files;
// beyond that the records fold into what every file opened later owes:
// a barrier of all the client's changes so far and a sync of each chunk.
// Records a durable answer covered are dropped first.
func TestOwedFoldsBeyondItsBound(t *testing.T) {
	c := &Client{}
	c.mu.owed = map[uint64]fsyncOwed{}
	open := func(ino uint64) *inode {
		in := newInode(c, &rpc.Attr{Ino: ino, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 2}}})
		c.takeOwedLocked(in)
		return in
	}
	c.keepOwedLocked(1, fsyncOwed{seq: 5})                             // covered below
	c.keepOwedLocked(2, fsyncOwed{seq: 3, idx: 9, term: 1, idxSeq: 2}) // covered below
	c.metaDurable.Store(5)
	c.keepOwedLocked(3, fsyncOwed{seq: 4}) // already covered: not kept
	if len(c.mu.owed) != 2 {
		t.Fatalf("%d records kept, want 2", len(c.mu.owed))
	}
	if in := open(2); in.mu.metaIndex != 9 || in.mu.metaSeq != 3 {
		t.Fatalf("reopened file owes seq %d index %d, want 3 and 9", in.mu.metaSeq, in.mu.metaIndex)
	}
	for i := range uint64(maxOwed) {
		c.keepOwedLocked(100+i, fsyncOwed{seq: 6 + i, unsynced: []bool{i%2 == 0, false}})
	}
	if len(c.mu.owed) != maxOwed || c.mu.owedOver != 0 {
		t.Fatalf("%d records, fold %d: the covered record was not dropped first", len(c.mu.owed), c.mu.owedOver)
	}
	c.keepOwedLocked(50, fsyncOwed{seq: 10000, unsynced: []bool{false, true}})
	if len(c.mu.owed) != 1 || c.mu.owedOver != 6+maxOwed-1 || !c.mu.owedOverData {
		t.Fatalf("after the bound: %d records, fold %d (data %v)", len(c.mu.owed), c.mu.owedOver, c.mu.owedOverData)
	}
	if in := open(50); in.mu.metaSeq != 10000 || !in.mu.unsynced[0] || !in.mu.unsynced[1] {
		t.Fatalf("kept file owes seq %d, slots %v", in.mu.metaSeq, in.mu.unsynced)
	}
	if in := open(7); in.mu.metaSeq != 6+maxOwed-1 || !in.mu.unsynced[0] || !in.mu.unsynced[1] {
		t.Fatalf("a file opened after the fold owes seq %d, slots %v; want everything", in.mu.metaSeq, in.mu.unsynced)
	}
}

// A directory's attributes answered with this client's own create or unlink
// in it serve GetAttr for DirAttrTTL without a metadata call; they are as
// fresh as the metadata service's; another client's change shows after the
// ttl; a chmod through this client shows at once.
func TestDirAttrCache(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	const ttl = 300 * time.Millisecond
	a := tc.client(func(c *Config) { c.DirAttrTTL = ttl })
	b := tc.client(func(c *Config) { c.DirAttrTTL = 0 })
	ctx := context.Background()
	d, err := a.Mkdir(ctx, 1, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	metaCalls := func() float64 { return metaCallCount(t, a) }

	if _, err := a.Create(ctx, d.Ino, "f", 0o644, 0, 0); err != nil {
		t.Fatal(err)
	}
	n := metaCalls()
	got, err := a.GetAttr(ctx, d.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if metaCalls() != n {
		t.Fatal("GetAttr of the directory just changed asked the metadata service")
	}
	fresh, err := b.GetAttr(ctx, d.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mtime != fresh.Mtime || got.Ctime != fresh.Ctime || got.Nlink != fresh.Nlink || got.Mode != fresh.Mode {
		t.Fatalf("cached %+v, metadata service says %+v", got, fresh)
	}

	// Another client's change: visible once the ttl has passed.
	time.Sleep(5 * time.Millisecond)
	if _, err := b.Create(ctx, d.Ino, "g", 0o644, 0, 0); err != nil {
		t.Fatal(err)
	}
	after, _ := b.GetAttr(ctx, d.Ino)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err = a.GetAttr(ctx, d.Ino)
		if err != nil {
			t.Fatal(err)
		}
		if got.Mtime == after.Mtime {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("another client's change not seen 10 s later (ttl %v)", ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A chmod through this client drops the cache at once.
	if _, err := a.Unlink(ctx, d.Ino, "f"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetAttr(ctx, d.Ino, rpc.SetAttrReq{Valid: rpc.SetMode, Mode: 0o700}); err != nil {
		t.Fatal(err)
	}
	got, err = a.GetAttr(ctx, d.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode&0o777 != 0o700 {
		t.Fatalf("mode %o after chmod 700 through the same client", got.Mode&0o777)
	}
}

// An answer of an earlier change (lower raft index) never replaces a later
// one's; a change known to alter a directory without saying how buries it
// until a later answer; an answer to a call sent before a reset is not
// stored; only directories are kept, a removed one is buried.
func TestDirCacheOrder(t *testing.T) {
	d := newDirCache(time.Hour)
	dir := func(ino uint64, ctime int64, nlink uint32) *rpc.Attr {
		return &rpc.Attr{Ino: ino, Mode: syscall.S_IFDIR | 0o755, Nlink: nlink, Ctime: ctime, Mtime: ctime}
	}
	gen, at := d.begin()
	d.note(dir(5, 20, 2), 20, gen, at)
	d.note(dir(5, 30, 2), 10, gen, at) // an earlier change, answered later (its clock ran ahead)
	if a, ok := d.get(5); !ok || a.Ctime != 20 {
		t.Fatalf("got %+v %v, want the answer of index 20", a, ok)
	}
	d.changed(5, 21) // an xattr of the directory: its ctime moved
	if _, ok := d.get(5); ok {
		t.Fatal("attributes served after a change that did not answer them")
	}
	d.note(dir(5, 20, 2), 20, gen, at) // late answer of an earlier change
	if _, ok := d.get(5); ok {
		t.Fatal("answer from before the change stored over its tombstone")
	}
	d.note(dir(5, 25, 3), 22, gen, at)
	if a, ok := d.get(5); !ok || a.Nlink != 3 {
		t.Fatalf("got %+v %v, want the answer of index 22", a, ok)
	}
	d.note(dir(5, 26, 0), 23, gen, at) // removed
	if _, ok := d.get(5); ok {
		t.Fatal("a removed directory's attributes served")
	}
	d.note(&rpc.Attr{Ino: 8, Mode: syscall.S_IFREG | 0o644, Nlink: 1}, 24, gen, at)
	if _, ok := d.get(8); ok {
		t.Fatal("a regular file's attributes kept")
	}
	d.reset()
	d.note(dir(6, 30, 2), 30, gen, at) // sent before the reset
	if _, ok := d.get(6); ok {
		t.Fatal("answer to a call sent before a reset stored")
	}
	gen, _ = d.begin()
	d.note(dir(7, 30, 2), 31, gen, time.Now().Add(-2*time.Hour))
	if _, ok := d.get(7); ok {
		t.Fatal("entry older than the ttl served")
	}
}

// TestDirAttrsFromChanges: after each kind of namespace change through a
// client — mkdir, mknod, symlink, create, link, rename within and across
// directories (a file, a directory, over an empty directory, an
// exchange), unlink, rmdir, chmod of the directory — GetAttr of every
// directory it changed is answered without a metadata call, with what the
// metadata service says (a client without the cache asks it).
func TestDirAttrsFromChanges(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a := tc.client(func(c *Config) { c.DirAttrTTL = time.Hour })
	b := tc.client(func(c *Config) { c.DirAttrTTL = 0 })
	d1 := mkdir(t, a, RootIno, "d1")
	d2 := mkdir(t, a, RootIno, "d2")
	check := func(what string, dirs ...uint64) {
		t.Helper()
		for _, ino := range dirs {
			n := metaCallCount(t, a)
			got, err := a.GetAttr(bg, ino)
			if err != nil {
				t.Fatalf("%s: getattr %d: %v", what, ino, err)
			}
			if metaCallCount(t, a) != n {
				t.Fatalf("%s: GetAttr of directory %d asked the metadata service", what, ino)
			}
			want, err := b.GetAttr(bg, ino)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: directory %d cached as %+v, the metadata service says %+v", what, ino, got, want)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	sub := mkdir(t, a, d1.Ino, "sub")
	check("mkdir", d1.Ino)
	_, err := a.Mknod(bg, d1.Ino, "fifo", syscall.S_IFIFO|0o644, 0, 0, 0)
	must(err)
	check("mknod", d1.Ino)
	_, err = a.Symlink(bg, d1.Ino, "sym", "target", 0, 0)
	must(err)
	check("symlink", d1.Ino)
	f, err := a.Create(bg, d1.Ino, "f", 0o644, 0, 0)
	must(err)
	check("create", d1.Ino)
	_, err = a.Link(bg, f.Ino, d2.Ino, "f2")
	must(err)
	check("link", d2.Ino)
	must(a.Rename(bg, d1.Ino, "f", d1.Ino, "g", 0))
	check("rename within a directory", d1.Ino)
	must(a.Rename(bg, d1.Ino, "g", d2.Ino, "g", 0))
	check("rename of a file across directories", d1.Ino, d2.Ino)
	must(a.Rename(bg, d1.Ino, "sub", d2.Ino, "sub", 0))
	check("rename of a directory", d1.Ino, d2.Ino, sub.Ino)
	mkdir(t, a, d1.Ino, "empty")
	must(a.Rename(bg, d2.Ino, "sub", d1.Ino, "empty", 0))
	check("rename over an empty directory", d1.Ino, d2.Ino, sub.Ino)
	must(a.Rename(bg, d1.Ino, "empty", RootIno, "d2", rpc.RenameExchange))
	check("exchange", d1.Ino, RootIno, sub.Ino, d2.Ino)
	_, err = a.Unlink(bg, d1.Ino, "fifo")
	must(err)
	check("unlink", d1.Ino)
	must(a.Rmdir(bg, RootIno, "d2")) // sub, exchanged with d2
	check("rmdir", RootIno)
	if _, err := a.GetAttr(bg, sub.Ino); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("getattr of the removed directory: %v, want ENOENT", err)
	}
	_, err = a.SetAttr(bg, d1.Ino, rpc.SetAttrReq{Valid: rpc.SetMode, Mode: 0o700})
	must(err)
	check("chmod", d1.Ino)
}

// An inode opened since the last open-file report counts as unreported
// until a heartbeat lists it or its last handle is released: a rename or
// unlink after the close (write to a temporary name, rename into place)
// then reports nothing (reportOpen).
func TestUnsentForgetsClosedFiles(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	unsent := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.mu.unsent)
	}
	f := create(t, c, RootIno, "f", syscall.O_RDWR)
	g, err := c.Open(bg, f.Ino(), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	if n := unsent(); n != 1 {
		t.Fatalf("%d unreported inodes after an open, want 1", n)
	}
	if err := f.Release(bg); err != nil {
		t.Fatal(err)
	}
	if n := unsent(); n != 1 {
		t.Fatalf("%d unreported inodes with a handle left open, want 1", n)
	}
	if err := g.Release(bg); err != nil {
		t.Fatal(err)
	}
	if n := unsent(); n != 0 {
		t.Fatalf("%d unreported inodes after the last release, want 0", n)
	}
	h := create(t, c, RootIno, "h", syscall.O_RDWR)
	defer h.Release(bg)
	if err := c.heartbeat(bg); err != nil {
		t.Fatal(err)
	}
	if n := unsent(); n != 0 {
		t.Fatalf("%d unreported inodes after a heartbeat, want 0", n)
	}
}

// TestLargeWriteThrough: beside another handle's large write, a buffered
// write of at least WriteThroughBytes is on the stores when WriteAt returns
// (no write-behind budget held, no flush needed), reads back, and a
// failure is reported by the write itself and again by the next fsync. A
// lone writer's large writes and small writes are still buffered.
func TestLargeWriteThrough(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 1})
	c := tc.client(func(cfg *Config) { cfg.IOTimeout = 2 * time.Second })
	d := mkdir(t, c, RootIno, "wt")
	if _, err := c.SetDirLayout(bg, d.Ino, 1<<20, 2); err != nil {
		t.Fatal(err)
	}
	f := create(t, c, d.Ino, "big", syscall.O_RDWR)
	other := create(t, c, d.Ino, "other", syscall.O_RDWR)
	defer other.Release(bg)
	data := pattern(7, 0, 2<<20)
	c.concurrentWriter(other, nowNs()) // another handle is writing large pieces
	if n, err := f.WriteAt(bg, data, 0); err != nil || n != len(data) {
		t.Fatalf("large write: %d %v", n, err)
	}
	if avail := c.budget.avail; avail != c.budget.max {
		t.Fatalf("large write holds %d bytes of write-behind budget", c.budget.max-avail)
	}
	// Both stripes are on their targets already: read them straight.
	lay := f.Attr().Layout
	for slot := 0; slot < 2; slot++ {
		var resp rpc.ReadResp
		req := &rpc.ReadReq{Chunk: rpc.ChunkID{Target: lay.Targets[slot], Ino: f.in.ino}, Off: 0, Len: 1 << 20}
		if err := c.storeCall(bg, "read", &req.Chunk, rpc.SRead, req, &resp); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(resp.Data, data[slot<<20:(slot+1)<<20]) {
			t.Fatalf("slot %d: %d bytes on the target before any flush, want the written MiB", slot, len(resp.Data))
		}
	}
	// With the write-behind budget all but used up, a large write beside
	// another writer does not wait for it; a small write, and a lone
	// handle's large write, are buffered and wait.
	c.budget.acquire(c.budget.max - 4096)
	c.concurrentWriter(other, nowNs())
	if _, err := f.WriteAt(bg, data[:1<<20], 0); err != nil {
		t.Fatalf("large write with the budget used up: %v", err)
	}
	lone := tc.client(nil)
	lf, err := lone.Open(bg, f.in.ino, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	lone.budget.acquire(lone.budget.max - 4096)
	for _, w := range []struct {
		name string
		f    *File
		n    int
	}{{"an 8 KiB write", f, 8192}, {"a lone handle's large write", lf, 1 << 20}} {
		done := make(chan error, 1)
		go func() { _, err := w.f.WriteAt(bg, data[:w.n], 0); done <- err }()
		select {
		case err := <-done:
			t.Fatalf("%s did not wait for write-behind budget: %v", w.name, err)
		case <-time.After(100 * time.Millisecond):
		}
		w.f.c.budget.release(w.f.c.budget.max - 4096)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := lf.Release(bg); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(bg); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c, f.in.ino, syscall.O_RDONLY); !bytes.Equal(got, data) {
		t.Fatal("large write reads back wrong")
	}
	// Dead stores: the write itself fails, within the bounded wait, and
	// the next fsync reports it again.
	for i := range tc.stores {
		tc.stopStore(i)
	}
	start := time.Now()
	c.concurrentWriter(other, nowNs())
	if _, err := f.WriteAt(bg, data, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("large write to dead stores: %v, want EIO", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("EIO took %v", el)
	}
	if err := f.Fsync(bg); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync after a failed large write: %v, want EIO", err)
	}
	f.Release(bg)
}

// TestConcurrentWriter: large writes count as concurrent only when another
// handle wrote within the window.
func TestConcurrentWriter(t *testing.T) {
	c := &Client{}
	f, g := &File{}, &File{}
	ms := int64(time.Millisecond)
	for _, s := range []struct {
		f    *File
		at   int64
		want bool
	}{
		{f, 0, false},      // first writer
		{f, 1 * ms, false}, // the same handle again
		{g, 2 * ms, true},  // another handle, 1 ms later
		{g, 2*ms + int64(concurrentWindow), false}, // f's writes are too old, g's own do not count
		{f, 3*ms + int64(concurrentWindow), true},  // g wrote 1 ms ago
	} {
		if got := c.concurrentWriter(s.f, s.at); got != s.want {
			t.Fatalf("write at %v by %p: concurrent %v, want %v", time.Duration(s.at), s.f, got, s.want)
		}
	}
}

// TestDurableIndexRecord: an MSync answer of a newer term replaces what
// the client knows is durable, one of the same term raises it, an older one
// is ignored; only a record of a create's own term lets its close skip the
// barrier call.
func TestDurableIndexRecord(t *testing.T) {
	c := &Client{}
	for _, s := range []struct {
		resp          rpc.SyncResp
		wantIdx, term uint64
	}{
		{rpc.SyncResp{Durable: 100, Term: 2}, 100, 2},
		{rpc.SyncResp{Durable: 90, Term: 2}, 100, 2}, // same term, lower: kept
		{rpc.SyncResp{Durable: 95, Term: 3}, 95, 3},  // newer term: replaces (a restart)
		{rpc.SyncResp{Durable: 200, Term: 2}, 95, 3}, // stale term: ignored
		{rpc.SyncResp{Durable: 120, Term: 3}, 120, 3},
	} {
		c.noteDurableIndex(s.resp)
		if c.durable.idx != s.wantIdx || c.durable.term != s.term {
			t.Fatalf("after %+v: durable %d term %d, want %d term %d", s.resp, c.durable.idx, c.durable.term, s.wantIdx, s.term)
		}
	}
	// A create of term 3 at index 100 is covered: no call (this client
	// has no connection; a call would fail).
	if err := c.syncMetaIndex(bg, 100, 3); err != nil {
		t.Fatalf("covered index of the same term made a call: %v", err)
	}
}

// The stamps of changes answered before durable, as a barrier sees them:
// the highest entry per term, an unstamped (failed) change forcing an
// unchecked barrier, a bound on the terms kept, and what a barrier drops.
func TestChangeStamps(t *testing.T) {
	c := &Client{}
	c.noteChange(nil, &rpc.Stamp{Index: 5, Term: 1})
	c.noteChange(nil, &rpc.ChangeResp{Index: 7, Term: 1})
	c.noteChange(nil, &rpc.AttrResp{Stamp: rpc.Stamp{Index: 3, Term: 2}})
	if got, want := c.changes.pend, []rpc.Stamp{{Index: 7, Term: 1}, {Index: 3, Term: 2}}; !slices.Equal(got, want) || c.changes.unstamped {
		t.Fatalf("pending %v unstamped %v, want %v", got, c.changes.unstamped, want)
	}
	if n := c.metaChanged.Load(); n != 3 {
		t.Fatalf("%d changes counted, want 3", n)
	}
	// A barrier that checked both, with no change since: nothing left.
	c.checkedUpTo(3, []rpc.Stamp{{Index: 7, Term: 1}, {Index: 3, Term: 2}})
	if len(c.changes.pend) != 0 {
		t.Fatalf("pending after the barrier: %v", c.changes.pend)
	}
	// A failed change (outcome unknown) has no stamp: unchecked barrier next.
	c.noteChange(nil, &rpc.Stamp{Index: 9, Term: 2})
	c.noteChange(syscall.EIO, &rpc.Stamp{})
	if !c.changes.unstamped {
		t.Fatal("a failed change left no mark")
	}
	// A change counted after the barrier's count keeps the marks.
	c.noteChange(nil, &rpc.Stamp{Index: 10, Term: 2})
	c.checkedUpTo(c.metaChanged.Load()-1, nil)
	if !c.changes.unstamped || len(c.changes.pend) != 1 {
		t.Fatalf("a later change's marks were dropped: %v %v", c.changes.pend, c.changes.unstamped)
	}
	c.checkedUpTo(c.metaChanged.Load(), nil)
	if c.changes.unstamped || len(c.changes.pend) != 0 {
		t.Fatalf("marks left after a barrier covering everything: %v %v", c.changes.pend, c.changes.unstamped)
	}
	// A stamp raised after the barrier looked is not dropped with the old one.
	c.noteChange(nil, &rpc.Stamp{Index: 20, Term: 3})
	seen := slices.Clone(c.changes.pend)
	c.noteChange(nil, &rpc.Stamp{Index: 21, Term: 3})
	c.checkedUpTo(0, seen)
	if got := c.changes.pend; len(got) != 1 || got[0].Index != 21 {
		t.Fatalf("pending %v, want the raised stamp 21", got)
	}
	// More terms than kept: unchecked barrier.
	c.checkedUpTo(c.metaChanged.Load(), nil)
	for term := uint64(10); term < 10+maxPendingStamps+1; term++ {
		c.noteChange(nil, &rpc.Stamp{Index: term * 10, Term: term})
	}
	if len(c.changes.pend) != maxPendingStamps || !c.changes.unstamped {
		t.Fatalf("%d stamps kept, unstamped %v; want %d and true", len(c.changes.pend), c.changes.unstamped, maxPendingStamps)
	}
}

// A durable answer (a size commit, an unchecked barrier) does not stand in
// for checking the stamps of earlier changes: after a metadata crash it
// vouches only for what the restarted service holds. SyncMeta with stamps
// pending therefore asks the service even when the durable count covers
// the changes; the check then empties the record.
func TestBarrierChecksStampsDespiteDurableAnswer(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	ctx := context.Background()
	if _, err := c.Mkdir(ctx, 1, "a", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, 1, "a", 1, "b", 0); err != nil {
		t.Fatal(err)
	}
	c.changes.Lock()
	pend := slices.Clone(c.changes.pend)
	c.changes.Unlock()
	if len(pend) != 1 || pend[0].Index == 0 {
		t.Fatalf("stamps after mkdir and rename: %v, want the rename's", pend)
	}
	c.noteDurable(c.metaChanged.Load()) // as a later size commit would
	if err := c.SyncMeta(ctx); err != nil {
		t.Fatal(err)
	}
	c.changes.Lock()
	left := len(c.changes.pend)
	c.changes.Unlock()
	if left != 0 {
		t.Fatalf("SyncMeta trusted the durable count and left %d stamp(s) unchecked", left)
	}
	// Nothing new: the next barrier needs no call and keeps nothing.
	if err := c.SyncMeta(ctx); err != nil {
		t.Fatal(err)
	}
}

// storeRequests sums, over every store of tc, the requests of one method
// (the store's method label) served so far.
func storeRequests(t *testing.T, tc *testCluster, method string) int {
	t.Helper()
	re := regexp.MustCompile(`(?m)^strata_store_request_seconds_count\{method="` + method + `"\} (\d+)$`)
	n := 0
	for _, body := range storesMetrics(t, tc) {
		if m := re.FindSubmatch(body); m != nil {
			k, _ := strconv.Atoi(string(m[1]))
			n += k
		}
	}
	return n
}

// A close (and an fsync) syncs the chunks it wrote and learns their space
// in one call per chunk (SSyncStat); against a server without it (ENOSYS
// remembered, as noSyncStat) the client makes the two calls. Either way
// the size commit reports the space: st_blocks of a sparse file counts its
// data, not its size.
func TestSyncReportsSpace(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 1, metrics: true})
	ctx := context.Background()
	for _, older := range []bool{false, true} {
		c := tc.client(nil)
		c.noSyncStat.Store(older)
		c.noWriteSpace.Store(older)
		name := fmt.Sprintf("sparse-%v", older)
		f, err := c.CreateOpen(ctx, 1, name, 0o644, 0, 0, syscall.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte{7}, 64<<10)
		for _, off := range []int64{0, 5 << 20, 40 << 20} { // 3 × 64 KiB over both targets
			if _, err := f.WriteAt(ctx, data, off); err != nil {
				t.Fatal(err)
			}
		}
		// Sent before the fsync, so that it syncs them (buffered writes
		// would go as synced writes: TestSyncCloseSyncsThroughTheWrite).
		if err := f.in.drain(ctx); err != nil {
			t.Fatal(err)
		}
		syncs, stats := storeRequests(t, tc, "sync_stat"), storeRequests(t, tc, "chunk_stat")
		if err := f.Fsync(ctx); err != nil {
			t.Fatal(err)
		}
		syncs, stats = storeRequests(t, tc, "sync_stat")-syncs, storeRequests(t, tc, "chunk_stat")-stats
		if older && (syncs != 0 || stats == 0) {
			t.Fatalf("older servers: fsync made %d SSyncStat and %d SChunkStat calls, want 0 and some", syncs, stats)
		}
		if !older && (syncs == 0 || stats != 0) {
			t.Fatalf("fsync made %d SSyncStat and %d SChunkStat calls, want some and 0", syncs, stats)
		}
		a, err := c.GetAttr(ctx, f.Ino())
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Blocks * 512; !a.BlocksKnown || got < 3*64<<10 || got >= 1<<20 {
			t.Fatalf("older %v: st_blocks says %d bytes (known %v) for 192 KiB of data in a %d-byte file", older, got, a.BlocksKnown, a.Size)
		}
		// A second write and the close: the space grows, reported by the close.
		if _, err := f.WriteAt(ctx, bytes.Repeat([]byte{8}, 1<<20), 20<<20); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if a, err = c.GetAttr(ctx, f.Ino()); err != nil {
			t.Fatal(err)
		}
		if got := a.Blocks * 512; got < 1<<20+3*64<<10 || got >= 2<<20 {
			t.Fatalf("older %v: after the close st_blocks says %d bytes for 1.19 MiB of data", older, got)
		}
	}
}

// A space answer a sync got is not committed once the chunk was written
// again and a newer answer was reported in between (two handles of one
// file closing at once): st_blocks keeps the newer figure.
func TestStaleSyncSpaceDropped(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 1})
	c := tc.client(nil)
	ctx := context.Background()
	f, err := c.CreateOpen(ctx, 1, "f", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if f.in.layout.StripeCount != 2 || f.in.layout.StripeSize != 1<<20 {
		t.Fatalf("layout %+v, want 2 stripes of 1 MiB", f.in.layout)
	}
	write := func(off int64, n int) {
		t.Helper()
		if _, err := f.WriteAt(ctx, bytes.Repeat([]byte{1}, n), off); err != nil {
			t.Fatal(err)
		}
		if err := f.in.drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 64<<10) // slot 0
	pre, err := f.in.syncTargets(ctx)
	if err != nil || len(pre) != 1 || pre[0].Slot != 0 {
		t.Fatalf("sync answered %+v, %v; want slot 0's space", pre, err)
	}
	write(2<<20, 1<<20) // slot 0 again, reported by another commit
	if err := f.in.commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	write(1<<20, 64<<10) // slot 1: the first commit has something to send
	if err := f.in.commit(ctx, pre); err != nil {
		t.Fatal(err)
	}
	a, err := c.GetAttr(ctx, f.Ino())
	if err != nil {
		t.Fatal(err)
	}
	if got := int64(a.Blocks) * 512; got < 1<<20+128<<10 {
		t.Fatalf("st_blocks says %d bytes, want at least 1.125 MiB: the stale answer replaced the newer one", got)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
