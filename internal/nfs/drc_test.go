package nfs_test

import (
	"testing"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// TestRetransmittedChangesAnsweredOnce: a client that lost the replies of
// a GUARDED CREATE, a REMOVE and a RENAME sends them again with the same
// xids on a new connection (as after a reconnect); each gets the first
// call's NFS3_OK, not the EXIST or NOENT a second run would give.
func TestRetransmittedChangesAnsweredOnce(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1")
	f := fs{t, g.dial(t, "", 0, 0)}
	root := mount(t, f.c, "/")
	again := g.dial(t, "", 0, 0)
	// resend sends the last call of f again, same xid, on the other
	// connection.
	resend := func(proc uint32, args, res xdr.XdrType) {
		t.Helper()
		if err := again.Retransmit(f.c.LastXid(), nfstest.NFS, nfstest.Version, proc, args, res); err != nil {
			t.Fatal(err)
		}
	}

	create := xdr.CREATE3args{Where: xdr.Diropargs3{Dir: fh(root), Name: "c"}}
	create.How.Mode = xdr.GUARDED
	*create.How.Obj_attributes() = withMode(0o644)
	var cr xdr.CREATE3res
	f.call(nfstest.ProcCreate, &create, &cr)
	want(t, "create", cr.Status, xdr.NFS3_OK)
	var cr2 xdr.CREATE3res
	resend(nfstest.ProcCreate, &create, &cr2)
	want(t, "retransmitted guarded create", cr2.Status, xdr.NFS3_OK)

	if st, _ := f.create(root, "r", xdr.UNCHECKED, 0o644, 0); st != xdr.NFS3_OK {
		t.Fatalf("create r: %v", st)
	}
	rm := xdr.REMOVE3args{Object: xdr.Diropargs3{Dir: fh(root), Name: "r"}}
	var rr xdr.REMOVE3res
	f.call(nfstest.ProcRemove, &rm, &rr)
	want(t, "remove", rr.Status, xdr.NFS3_OK)
	var rr2 xdr.REMOVE3res
	resend(nfstest.ProcRemove, &rm, &rr2)
	want(t, "retransmitted remove", rr2.Status, xdr.NFS3_OK)

	mv := xdr.RENAME3args{From: xdr.Diropargs3{Dir: fh(root), Name: "c"}, To: xdr.Diropargs3{Dir: fh(root), Name: "d"}}
	var mr xdr.RENAME3res
	f.call(nfstest.ProcRename, &mv, &mr)
	want(t, "rename", mr.Status, xdr.NFS3_OK)
	var mr2 xdr.RENAME3res
	resend(nfstest.ProcRename, &mv, &mr2)
	want(t, "retransmitted rename", mr2.Status, xdr.NFS3_OK)

	// A new call (a new xid) of the same REMOVE runs: the name is gone.
	if st := f.remove(root, "r"); st != xdr.NFS3ERR_NOENT {
		t.Fatalf("a new remove of a removed name: %v, want NOENT", st)
	}
}
