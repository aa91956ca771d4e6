package nfs_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// TestReadAhead: a sequential reader's READs are answered from the piece
// the previous READ read ahead, and a piece never answers what a READ at
// that moment would not: after a change made elsewhere and the NFS
// client's revalidation (GETATTR), and after a WRITE through the gateway,
// READs return the new bytes. The attribute cache is an hour, so only
// those two drop the pieces here.
func TestReadAhead(t *testing.T) {
	cl := startCluster(t)
	cl.cfg.ReadAheadBytes = 0 // as strata nfs and strata up --nfs
	cl.c = cl.newClient()
	g := cl.startGatewayWith(func(c *nfs.Config) { c.AttrTimeout = time.Hour }, "/=rw,sync,no_root_squash,clients=127.0.0.1")
	f := fs{t, g.dial(t, "", 0, 0)}
	root := mount(t, f.c, "/")
	st, file := f.create(root, "seq", xdr.GUARDED, 0o644, 0)
	want(t, "create", st, xdr.NFS3_OK)
	const piece = 1 << 20
	data := randomBytes(t, 5*piece)
	for off := 0; off < len(data); off += piece {
		if st, _ := f.write(file, uint64(off), data[off:off+piece], xdr.FILE_SYNC); st != xdr.NFS3_OK {
			t.Fatalf("write at %d: %v", off, st)
		}
	}
	read := func(i int, exp []byte, what string) {
		t.Helper()
		st, p, _ := f.read(file, uint64(i*piece), piece)
		want(t, what, st, xdr.NFS3_OK)
		if !bytes.Equal(p, exp) {
			t.Fatalf("%s: READ of piece %d returned other bytes (%d)", what, i, len(p))
		}
	}
	read(0, data[:piece], "first read")
	read(1, data[piece:2*piece], "second read")
	if h := counter(t, cl, "strata_nfs_read_ahead_hits_total"); h < 1 {
		t.Fatalf("%v READs answered from read-ahead, want the second", h)
	}
	time.Sleep(200 * time.Millisecond) // piece 2 is read ahead meanwhile

	// Another client rewrites piece 2 and closes it; the NFS client
	// revalidates (close-to-open) and must read the new bytes.
	other := cl.newClient()
	ctx := context.Background()
	a, err := other.Lookup(ctx, 1, "seq")
	if err != nil {
		t.Fatal(err)
	}
	of, err := other.Open(ctx, a.Ino, 2) // O_RDWR
	if err != nil {
		t.Fatal(err)
	}
	fresh := randomBytes(t, piece)
	if _, err := of.WriteAt(ctx, fresh, 2*piece); err != nil {
		t.Fatal(err)
	}
	if err := of.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := of.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.getattr(file); st != xdr.NFS3_OK {
		t.Fatal(st)
	}
	read(2, fresh, "read after a change elsewhere and GETATTR")

	// Piece 3 is read ahead now; a WRITE through the gateway changes it.
	time.Sleep(200 * time.Millisecond)
	mine := randomBytes(t, piece)
	if st, _ := f.write(file, 3*piece, mine, xdr.UNSTABLE); st != xdr.NFS3_OK {
		t.Fatal(st)
	}
	read(3, mine, "read after a WRITE")
	read(4, data[4*piece:], "read of the last piece")
}

// counter is the value of a counter without labels in the gateway's
// registry (-1: not there).
func counter(t *testing.T, cl *cluster, name string) float64 {
	t.Helper()
	mfs, err := cl.c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}
