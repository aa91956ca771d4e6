package meta

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// Every kind of change to a file is seen by the reads that follow it,
// although those reads are served from the record cache once a lookup or
// getattr has filled it.
func TestRecordCacheSeesEveryChange(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", fileMode)
	read := func(what string) rpc.Attr {
		t.Helper()
		a := c.mustGetattr(f.Ino)
		l, err := c.lookup(1, "g")
		if err == nil && l.Ino == f.Ino && (l.Size != a.Size || l.Mode != a.Mode || l.Nlink != a.Nlink || l.Mtime != a.Mtime) {
			t.Fatalf("%s: lookup %+v and getattr %+v disagree", what, l, a)
		}
		return a
	}
	read("warm") // cached now
	c.mustGetattr(f.Ino)

	var r rpc.AttrResp
	if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: f.Ino, Size: 3901, Mtime: 77,
		Alloc: []rpc.SlotAlloc{{Slot: 0, Bytes: 4096}}}, &r); err != nil {
		t.Fatal(err)
	}
	if a := read("commit"); a.Size != 3901 || a.Mtime != 77 || !a.BlocksKnown || a.Blocks != 8 {
		t.Fatalf("after a size commit: %+v", a)
	}
	if _, err := setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetMode, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	if a := read("chmod"); a.Mode != modeReg|0o600 {
		t.Fatalf("after chmod: mode %o", a.Mode)
	}
	if _, err := c.link(f.Ino, 1, "g"); err != nil {
		t.Fatal(err)
	}
	if a := read("link"); a.Nlink != 2 {
		t.Fatalf("after link: nlink %d", a.Nlink)
	}
	if err := c.call(rpc.MSetAtimes, &rpc.SetAtimesReq{Hdr: c.hdr(), Inos: []uint64{f.Ino}, Atimes: []int64{4e18}}, nil); err != nil {
		t.Fatal(err)
	}
	if a := read("atime"); a.Atime != 4e18 {
		t.Fatalf("after set atimes: atime %d", a.Atime)
	}
	if _, err := setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetSize, Size: 10}); err != nil {
		t.Fatal(err)
	}
	if a := read("truncate"); a.Size != 10 {
		t.Fatalf("after truncate: size %d", a.Size)
	}
	if _, err := c.unlink(1, "f"); err != nil {
		t.Fatal(err)
	}
	if a := read("unlink"); a.Nlink != 1 {
		t.Fatalf("after unlink of one name: nlink %d", a.Nlink)
	}
	if _, err := c.unlink(1, "g"); err != nil {
		t.Fatal(err)
	}
	// The last name gone and open nowhere: the inode goes (or waits as
	// an orphan with no links).
	if a, err := c.getattr(f.Ino); err == nil && a.Nlink != 0 {
		t.Fatalf("after the last unlink: %+v", a)
	} else if err != nil {
		wantErrno(t, err, syscall.ENOENT, "getattr of a removed file")
	}
}

// An apply that starts from a cached record changes its own copy: a
// record read before a commit keeps its values (the cache shares its
// slices with readers).
func TestRecordCacheApplyCopies(t *testing.T) {
	s, c := newNamespace(t)
	f := c.mustCreate(1, "f", fileMode)
	c.mustGetattr(f.Ino)
	before, err := s.fsm.readInode(f.Ino)
	if err != nil {
		t.Fatal(err)
	}
	alloc := append([]uint64(nil), before.Alloc...)
	targets := append([]uint32(nil), before.Layout.Targets...)
	var r rpc.AttrResp
	if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: f.Ino, Size: 5 << 20, Mtime: 5,
		Alloc: []rpc.SlotAlloc{{Slot: 0, Bytes: 1 << 20}, {Slot: 1, Bytes: 1 << 20}}}, &r); err != nil {
		t.Fatal(err)
	}
	if len(before.Alloc) != len(alloc) || len(before.Alloc) == 0 {
		t.Fatalf("alloc of a new file: %v", before.Alloc)
	}
	for i := range alloc {
		if before.Alloc[i] != alloc[i] {
			t.Fatalf("a record read before the commit changed: alloc %v, was %v", before.Alloc, alloc)
		}
	}
	for i := range targets {
		if before.Layout.Targets[i] != targets[i] {
			t.Fatalf("a record read before the commit changed: targets %v, was %v", before.Layout.Targets, targets)
		}
	}
	if a := c.mustGetattr(f.Ino); a.Size != 5<<20 || a.Blocks != 2<<20/512 {
		t.Fatalf("after the commit: %+v", a)
	}
}

// Readers racing a stream of size commits never see a size go back, and
// a read begun after a commit was answered sees at least that size.
func TestRecordCacheConcurrentCommits(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", fileMode)
	var answered atomic.Uint64 // the largest size whose commit was answered
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				floor := answered.Load()
				var a rpc.Attr
				var err error
				if i%2 == 0 {
					a, err = c.getattr(f.Ino)
				} else {
					a, err = c.lookup(1, "f")
				}
				if err != nil {
					errs <- err
					return
				}
				if a.Size < last || a.Size < floor {
					errs <- fmt.Errorf("size went back: read %d after %d (answered commit %d)", a.Size, last, floor)
					return
				}
				last = a.Size
			}
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	for size := uint64(1); size <= 400 && time.Now().Before(deadline); size++ {
		var r rpc.AttrResp
		if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: f.Ino, Size: size, Mtime: int64(size)}, &r); err != nil {
			t.Fatal(err)
		}
		answered.Store(size)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Lookups served from cached entries follow every change of a name:
// renames (also over another name and exchanges), removals, links and
// re-creations.
func TestRecordCacheEntries(t *testing.T) {
	_, c := newNamespace(t)
	ino := func(name string) uint64 {
		t.Helper()
		a, err := c.lookup(1, name)
		if err != nil {
			if errno, ok := err.(*rpc.Error); ok && errno.Errno == syscall.ENOENT {
				return 0
			}
			t.Fatalf("lookup %s: %v", name, err)
		}
		return a.Ino
	}
	a := c.mustCreate(1, "a", fileMode)
	if got := ino("a"); got != a.Ino {
		t.Fatalf("lookup a = %d, want %d", got, a.Ino)
	}
	if err := c.rename(1, "a", 1, "b", 0); err != nil {
		t.Fatal(err)
	}
	if ino("a") != 0 || ino("b") != a.Ino {
		t.Fatalf("after rename a→b: a=%d b=%d", ino("a"), ino("b"))
	}
	a2 := c.mustCreate(1, "a", fileMode)
	if ino("a") != a2.Ino {
		t.Fatalf("re-created a: %d, want %d", ino("a"), a2.Ino)
	}
	if err := c.rename(1, "b", 1, "a", 0); err != nil { // over a
		t.Fatal(err)
	}
	if ino("a") != a.Ino || ino("b") != 0 {
		t.Fatalf("after rename b over a: a=%d b=%d", ino("a"), ino("b"))
	}
	if _, err := c.link(a.Ino, 1, "c"); err != nil {
		t.Fatal(err)
	}
	d := c.mustCreate(1, "d", fileMode)
	ino("c")
	ino("d")
	if err := c.rename(1, "c", 1, "d", rpc.RenameExchange); err != nil {
		t.Fatal(err)
	}
	if ino("c") != d.Ino || ino("d") != a.Ino {
		t.Fatalf("after exchange c↔d: c=%d d=%d", ino("c"), ino("d"))
	}
	if _, err := c.unlink(1, "d"); err != nil {
		t.Fatal(err)
	}
	if ino("d") != 0 || ino("a") != a.Ino {
		t.Fatalf("after unlink d: d=%d a=%d", ino("d"), ino("a"))
	}
	if a := c.mustGetattr(a.Ino); a.Nlink != 1 {
		t.Fatalf("nlink after unlink of one of two names: %d", a.Nlink)
	}
}

// An apply reads the entries an earlier command of its own batch wrote,
// not the cached committed ones: in one batch, a cached name removed is
// absent for the next command, re-created is the new file, renamed is
// under its new name only. (FIFOs: no storage targets needed.)
func TestApplyEntriesWithinBatch(t *testing.T) {
	f := newTestFSM(t)
	cmd := func(c command) []byte { c.Now = 2; return c.encode(nil) }
	ino := func(what string, r *result) uint64 {
		t.Helper()
		if r.errno != 0 {
			t.Fatalf("%s: %v %s", what, r.errno, r.msg)
		}
		ch, ok := r.reply().(*rpc.ChangeResp)
		if !ok {
			t.Fatalf("%s answered %T", what, r.reply())
		}
		return ch.Attr.Ino
	}
	absent := func(what string, r *result) {
		t.Helper()
		if r.errno != syscall.ENOENT {
			t.Fatalf("%s: errno %v (%s), want ENOENT", what, r.errno, r.msg)
		}
	}
	f.applyLocal([][]byte{(&command{Op: opInit, Now: 1}).encode(nil)})
	first := ino("create", f.applyLocal([][]byte{cmd(command{Op: opCreate, Parent: 1, Name: "x", Mode: modeFifo | 0o644})})[0])
	if _, found, ok := f.entryForApply(schema.DentryKey(1, "x")); !ok || !found {
		t.Fatal("a committed create's entry is not cached")
	}
	r := f.applyLocal([][]byte{
		cmd(command{Op: opUnlink, Parent: 1, Name: "x"}),
		cmd(command{Op: opUnlink, Parent: 1, Name: "x"}),
		cmd(command{Op: opCreate, Parent: 1, Name: "x", Mode: modeFifo | 0o644}),
		cmd(command{Op: opRename, Parent: 1, Name: "x", NewParent: 1, NewName: "y"}),
		cmd(command{Op: opUnlink, Parent: 1, Name: "x"}),
		cmd(command{Op: opUnlink, Parent: 1, Name: "y"}),
	})
	if got := ino("unlink", r[0]); got != first {
		t.Fatalf("unlink removed inode %d, want %d", got, first)
	}
	absent("second unlink in the batch", r[1])
	second := ino("create again", r[2])
	if second == first {
		t.Fatalf("re-created x has the removed file's inode %d", first)
	}
	if r[3].errno != 0 {
		t.Fatalf("rename: %v %s", r[3].errno, r[3].msg)
	}
	absent("unlink of the renamed name", r[4])
	if got := ino("unlink of the new name", r[5]); got != second {
		t.Fatalf("unlink y removed inode %d, want %d", got, second)
	}
	r = f.applyLocal([][]byte{cmd(command{Op: opUnlink, Parent: 1, Name: "y"}), cmd(command{Op: opUnlink, Parent: 1, Name: "x"})})
	absent("unlink y in the next batch", r[0])
	absent("unlink x in the next batch", r[1])
}
