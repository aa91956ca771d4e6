package nfs_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// TestPermissions: AUTH_SYS identities reach every operation. uid 65534
// is refused what root may do; under root_squash root is 65534 too; with
// all_squash everybody is the export's anonymous user.
func TestPermissions(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1", "/sq=rw,root_squash,clients=127.0.0.1",
		"/all=rw,all_squash,anonuid=4242,anongid=4243,clients=127.0.0.1", "/ro=ro,no_root_squash,clients=127.0.0.1")
	root := fs{t, g.dial(t, "", 0, 0)}
	nobody := fs{t, g.dial(t, "", 65534, 65534)}
	rootFH := mount(t, root.c, "/")
	mount(t, nobody.c, "/")

	st, _ := nobody.create(rootFH, "by-nobody", xdr.GUARDED, 0o644, 0)
	want(t, "create as 65534 in root's 0755 directory", st, xdr.NFS3ERR_ACCES)
	st, _ = nobody.mkdir(rootFH, "by-nobody", 0o755)
	want(t, "mkdir as 65534 in root's 0755 directory", st, xdr.NFS3ERR_ACCES)
	st, file := root.create(rootFH, "secret", xdr.GUARDED, 0o600, 0)
	want(t, "create as root", st, xdr.NFS3_OK)
	if st, w := root.write(file, 0, []byte("root only"), xdr.FILE_SYNC); st != xdr.NFS3_OK || w.Count != 9 {
		t.Fatalf("write as root: %v", st)
	}
	st, _, _ = nobody.read(file, 0, 100)
	want(t, "read of a 0600 root file as 65534", st, xdr.NFS3ERR_ACCES)
	st, _ = nobody.write(file, 0, []byte("x"), xdr.FILE_SYNC)
	want(t, "write of a 0600 root file as 65534", st, xdr.NFS3ERR_ACCES)
	want(t, "remove as 65534 from root's directory", nobody.remove(rootFH, "secret"), xdr.NFS3ERR_ACCES)
	var chmod xdr.SETATTR3res
	nobody.call(nfstest.ProcSetattr, &xdr.SETATTR3args{Object: fh(file), New_attributes: withMode(0o666)}, &chmod)
	want(t, "chmod of root's file as 65534", chmod.Status, xdr.NFS3ERR_PERM)
	var acc xdr.ACCESS3res
	nobody.call(nfstest.ProcAccess, &xdr.ACCESS3args{Object: fh(file), Access: xdr.ACCESS3_READ | xdr.ACCESS3_MODIFY}, &acc)
	if acc.Status != xdr.NFS3_OK || acc.Resok().Access != 0 {
		t.Fatalf("access of root's 0600 file as 65534: %v %#x, want nothing", acc.Status, acc.Resok().Access)
	}
	st, _, _ = root.read(file, 0, 100)
	want(t, "read as root", st, xdr.NFS3_OK)

	// A world-writable sticky directory: 65534 may create there, and may
	// not remove root's file.
	st, tmp := root.mkdir(rootFH, "tmp", 0o1777)
	want(t, "mkdir tmp", st, xdr.NFS3_OK)
	st, mine := nobody.create(tmp, "mine", xdr.GUARDED, 0o644, 0)
	want(t, "create as 65534 in a 1777 directory", st, xdr.NFS3_OK)
	if _, a := nobody.getattr(mine); a.Uid != 65534 || a.Gid != 65534 {
		t.Fatalf("file created as 65534 has uid %d gid %d", a.Uid, a.Gid)
	}
	st, _ = root.create(tmp, "roots", xdr.GUARDED, 0o666, 0)
	want(t, "create as root in tmp", st, xdr.NFS3_OK)
	want(t, "remove of root's file from a sticky directory as 65534", nobody.remove(tmp, "roots"), xdr.NFS3ERR_ACCES)
	want(t, "remove of its own file from a sticky directory", nobody.remove(tmp, "mine"), xdr.NFS3_OK)

	// root_squash: root is 65534 on /sq (the same directory as /).
	sq := fs{t, g.dial(t, "", 0, 0)}
	if _, err := cl.c.Mkdir(context.Background(), 1, "sq", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	sqFH := mount(t, sq.c, "/sq")
	st, _ = sq.create(sqFH, "f", xdr.GUARDED, 0o644, 0)
	want(t, "create as squashed root in root's 0755 directory", st, xdr.NFS3ERR_ACCES)
	var chmodSq xdr.SETATTR3res
	sq.call(nfstest.ProcSetattr, &xdr.SETATTR3args{Object: fh(sqFH), New_attributes: withMode(0o777)}, &chmodSq)
	want(t, "chmod of root's directory as squashed root", chmodSq.Status, xdr.NFS3ERR_PERM)
	root.call(nfstest.ProcSetattr, &xdr.SETATTR3args{Object: fh(sqFH), New_attributes: withMode(0o777)}, &chmodSq)
	want(t, "chmod through a handle of /sq by root: squashed too", chmodSq.Status, xdr.NFS3ERR_PERM)
	st, sqRoot := root.lookup(rootFH, "sq")
	want(t, "lookup sq", st, xdr.NFS3_OK)
	root.call(nfstest.ProcSetattr, &xdr.SETATTR3args{Object: fh(sqRoot), New_attributes: withMode(0o777)}, &chmodSq)
	want(t, "chmod 0777 of sq as root", chmodSq.Status, xdr.NFS3_OK)
	st, made := sq.create(sqFH, "f", xdr.GUARDED, 0o644, 0)
	want(t, "create as squashed root in a 0777 directory", st, xdr.NFS3_OK)
	if _, a := sq.getattr(made); a.Uid != 65534 || a.Gid != 65534 {
		t.Fatalf("file of squashed root has uid %d gid %d, want 65534", a.Uid, a.Gid)
	}

	// all_squash with anonuid/anongid: a user is the anonymous one.
	if _, err := cl.c.Mkdir(context.Background(), 1, "all", 0o777, 0, 0); err != nil {
		t.Fatal(err)
	}
	user := fs{t, g.dial(t, "", 1000, 1000)}
	allFH := mount(t, user.c, "/all")
	st, af := user.create(allFH, "f", xdr.GUARDED, 0o644, 0)
	want(t, "create under all_squash", st, xdr.NFS3_OK)
	if _, a := user.getattr(af); a.Uid != 4242 || a.Gid != 4243 {
		t.Fatalf("all_squash file has uid %d gid %d, want 4242 4243", a.Uid, a.Gid)
	}

	// ro: every change is refused, reads work.
	st, roDir := root.mkdir(rootFH, "ro", 0o755)
	want(t, "mkdir ro", st, xdr.NFS3_OK)
	if st, _ := root.create(roDir, "secret", xdr.GUARDED, 0o644, 0); st != xdr.NFS3_OK {
		t.Fatalf("create ro/secret: %v", st)
	}
	roFH := mount(t, root.c, "/ro")
	st, _ = root.create(roFH, "nope", xdr.GUARDED, 0o644, 0)
	want(t, "create on a ro export", st, xdr.NFS3ERR_ROFS)
	st, roFile := root.lookup(roFH, "secret")
	want(t, "lookup on a ro export", st, xdr.NFS3_OK)
	st, _ = root.write(roFile, 0, []byte("x"), xdr.FILE_SYNC)
	want(t, "write on a ro export", st, xdr.NFS3ERR_ROFS)
	st, _, _ = root.read(roFile, 0, 10)
	want(t, "read on a ro export", st, xdr.NFS3_OK)
}

// TestAllowList: a client address not on the export's list gets
// MNT3ERR_ACCES at MNT, and NFS3ERR_ACCES with a handle it got elsewhere;
// EXPORT does not show it the export.
func TestAllowList(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,clients=127.0.0.1+10.0.0.0/8", "/missing=rw,clients=*")
	allowed := g.dial(t, "127.0.0.1:0", 1000, 1000)
	other := g.dial(t, "127.0.0.2:0", 1000, 1000)
	root := mount(t, allowed, "/")
	_, st, err := other.Mnt("/")
	if err != nil || st != xdr.MNT3ERR_ACCES {
		t.Fatalf("MNT from 127.0.0.2: %v %v, want MNT3ERR_ACCES", st, err)
	}
	var res xdr.GETATTR3res
	if err := other.NFS(nfstest.ProcGetattr, &xdr.GETATTR3args{Object: fh(root)}, &res); err != nil {
		t.Fatal(err)
	}
	want(t, "getattr from 127.0.0.2", res.Status, xdr.NFS3ERR_ACCES)
	_, st, _ = allowed.Mnt("/nonexistent")
	if st != xdr.MNT3ERR_NOENT {
		t.Fatalf("MNT of a path that does not exist: %v", st)
	}
	// A directory inside an export mounts too; a relative path does not.
	if _, err := cl.c.Mkdir(context.Background(), 1, "sub", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	f := fs{t, allowed}
	_, subFH := f.lookup(root, "sub")
	if h := mount(t, allowed, "/sub/"); !bytes.Equal(h, subFH) {
		t.Fatal("MNT /sub/ gave another handle than LOOKUP")
	}
	for _, p := range []string{"", "sub"} {
		if _, st, err := allowed.Mnt(p); err != nil || st != xdr.MNT3ERR_NOENT {
			t.Fatalf("MNT %q: %v %v, want MNT3ERR_NOENT", p, st, err)
		}
	}
	var ex xdr.Exports
	if err := other.Call(nfstest.Mount, 3, nfstest.MountProcExport, nil, xdr.XDR_Exports(&ex)); err != nil || ex != nil {
		t.Fatalf("EXPORT from 127.0.0.2: %v %v, want an empty list (/missing does not exist)", ex, err)
	}
	if err := allowed.Call(nfstest.Mount, 3, nfstest.MountProcExport, nil, xdr.XDR_Exports(&ex)); err != nil || ex == nil || ex.Ex_dir != "/" || ex.Ex_next != nil ||
		ex.Ex_groups == nil || ex.Ex_groups.Gr_name != "127.0.0.1" || ex.Ex_groups.Gr_next == nil || ex.Ex_groups.Gr_next.Gr_name != "10.0.0.0/8" {
		t.Fatalf("EXPORT from 127.0.0.1: %+v %v", ex, err)
	}
	var dump xdr.Mountlist
	if err := allowed.Call(nfstest.Mount, 3, nfstest.MountProcDump, nil, xdr.XDR_Mountlist(&dump)); err != nil || dump == nil ||
		dump.Ml_hostname != "127.0.0.1" || dump.Ml_directory != "/" || dump.Ml_next == nil || dump.Ml_next.Ml_directory != "/sub" {
		t.Fatalf("DUMP: %+v %v", dump, err)
	}
	p := xdr.Dirpath("/")
	if err := allowed.Call(nfstest.Mount, 3, nfstest.MountProcUmnt, xdr.XDR_Dirpath(&p), nil); err != nil {
		t.Fatal(err)
	}
	if err := allowed.Call(nfstest.Mount, 3, nfstest.MountProcDump, nil, xdr.XDR_Mountlist(&dump)); err != nil || dump == nil || dump.Ml_directory != "/sub" || dump.Ml_next != nil {
		t.Fatalf("DUMP after UMNT /: %+v %v", dump, err)
	}
	if err := allowed.Call(nfstest.Mount, 3, nfstest.MountProcUmntall, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := allowed.Call(nfstest.Mount, 3, nfstest.MountProcDump, nil, xdr.XDR_Mountlist(&dump)); err != nil || dump != nil {
		t.Fatalf("DUMP after UMNTALL: %+v %v", dump, err)
	}
}

// TestRPCReplies: the RPC layer's refusals.
func TestRPCReplies(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,clients=127.0.0.1")
	c := g.dial(t, "", 0, 0)
	check := func(what string, err error, stat xdr.Accept_stat) {
		t.Helper()
		var ae *nfstest.AcceptError
		if !errors.As(err, &ae) || ae.Stat != stat {
			t.Fatalf("%s: %v, want %v", what, err, stat)
		}
	}
	check("an unknown program", c.Call(100099, 1, 0, nil, nil), xdr.PROG_UNAVAIL)
	check("NFS version 2", c.Call(nfstest.NFS, 2, 0, nil, nil), xdr.PROG_MISMATCH)
	check("NFS procedure 22", c.NFS(22, nil, nil), xdr.PROC_UNAVAIL)
	check("GETATTR without arguments", c.NFS(nfstest.ProcGetattr, nil, nil), xdr.GARBAGE_ARGS)
	check("MOUNT v1", c.Call(nfstest.Mount, 1, 0, nil, nil), xdr.PROG_MISMATCH)
	// The connection still serves.
	if err := c.NFS(nfstest.ProcNull, nil, nil); err != nil {
		t.Fatalf("NULL after the refusals: %v", err)
	}
	c.Cred = nil // AUTH_NONE
	if err := c.NFS(nfstest.ProcNull, nil, nil); err != nil {
		t.Fatalf("NULL with AUTH_NONE: %v", err)
	}
}
