package client

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// TestReleaseDropsOnlyItsOpensLocks: closing an open drops the locks taken
// through it (its OFD locks and flocks) and nothing that the same owner
// took through another open — the kernel reuses owner names, and the close
// of an old open can arrive after a newer one with the same owner locked —
// also after the locks were reclaimed from a restarted service.
func TestReleaseDropsOnlyItsOpensLocks(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a := tc.client(nil)
	b := tc.client(nil)
	f1 := create(t, a, RootIno, "reused", syscall.O_RDWR)
	ino := f1.Ino()
	record := Lock{Ino: ino, Owner: 7, Start: 0, End: ^uint64(0), Type: rpc.LockWrite, Pid: 11}
	flock := Lock{Ino: ino, Owner: 9, Start: 0, End: ^uint64(0), Type: rpc.LockWrite, Pid: 11, Flock: true}
	f2 := openFile(t, a, ino)
	for _, f := range []*File{f1, f2} {
		for _, l := range []Lock{record, flock} {
			if err := f.SetLk(bg, l, false, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	others := []Lock{
		{Ino: ino, Owner: 2, Start: 5, End: 5, Type: rpc.LockRead, Pid: 22},
		{Ino: ino, Owner: 3, Start: 0, End: ^uint64(0), Type: rpc.LockRead, Pid: 22, Flock: true},
	}
	if err := f1.Release(bg); err != nil {
		t.Fatal(err)
	}
	for _, l := range others {
		if err := b.SetLk(bg, l, false, nil); !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("flock %v: after the close of the older open: %v, want EAGAIN (the newer open's lock holds)", l.Flock, err)
		}
	}
	tc.restartMeta()
	for _, l := range others {
		if err := b.SetLk(bg, l, false, nil); !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("flock %v: after the restart: %v, want EAGAIN (reclaimed)", l.Flock, err)
		}
	}
	if err := f2.Release(bg); err != nil {
		t.Fatal(err)
	}
	for _, l := range others {
		if err := b.SetLk(bg, l, false, nil); err != nil {
			t.Fatalf("flock %v: after the close of the open holding the lock: %v", l.Flock, err)
		}
	}
	if n := a.heldCount(); n != 0 {
		t.Fatalf("a still counts %d held locks", n)
	}
}
