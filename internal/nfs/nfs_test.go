package nfs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// fs wraps a test client with typed calls that fail the test on an RPC
// error and return the NFS status.
type fs struct {
	t testing.TB
	c *nfstest.Client
}

func (f fs) call(proc uint32, args, res xdr.XdrType) {
	f.t.Helper()
	if err := f.c.NFS(proc, args, res); err != nil {
		f.t.Fatalf("NFS proc %d: %v", proc, err)
	}
}

func fh(b []byte) xdr.Nfs_fh3 { return xdr.Nfs_fh3{Data: b} }

func (f fs) getattr(h []byte) (xdr.Nfsstat3, *xdr.Fattr3) {
	f.t.Helper()
	var res xdr.GETATTR3res
	f.call(nfstest.ProcGetattr, &xdr.GETATTR3args{Object: fh(h)}, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, nil
	}
	return res.Status, &res.Resok().Obj_attributes
}

func (f fs) lookup(dir []byte, name string) (xdr.Nfsstat3, []byte) {
	f.t.Helper()
	var res xdr.LOOKUP3res
	f.call(nfstest.ProcLookup, &xdr.LOOKUP3args{What: xdr.Diropargs3{Dir: fh(dir), Name: name}}, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, nil
	}
	return res.Status, res.Resok().Object.Data
}

func withMode(mode uint32) xdr.Sattr3 {
	var sa xdr.Sattr3
	sa.Mode.Set_it = true
	*sa.Mode.Mode() = mode
	return sa
}

// create makes a file (UNCHECKED or GUARDED with mode, or EXCLUSIVE with
// verf).
func (f fs) create(dir []byte, name string, how xdr.Createmode3, mode uint32, verf byte) (xdr.Nfsstat3, []byte) {
	f.t.Helper()
	args := xdr.CREATE3args{Where: xdr.Diropargs3{Dir: fh(dir), Name: name}}
	args.How.Mode = how
	if how == xdr.EXCLUSIVE {
		args.How.Verf()[0] = verf
	} else {
		*args.How.Obj_attributes() = withMode(mode)
	}
	var res xdr.CREATE3res
	f.call(nfstest.ProcCreate, &args, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, nil
	}
	return res.Status, res.Resok().Obj.Handle().Data
}

func (f fs) mkdir(dir []byte, name string, mode uint32) (xdr.Nfsstat3, []byte) {
	f.t.Helper()
	var res xdr.MKDIR3res
	f.call(nfstest.ProcMkdir, &xdr.MKDIR3args{Where: xdr.Diropargs3{Dir: fh(dir), Name: name}, Attributes: withMode(mode)}, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, nil
	}
	return res.Status, res.Resok().Obj.Handle().Data
}

func (f fs) write(h []byte, off uint64, data []byte, stable xdr.Stable_how) (xdr.Nfsstat3, *xdr.WRITE3resok) {
	f.t.Helper()
	var res xdr.WRITE3res
	f.call(nfstest.ProcWrite, &xdr.WRITE3args{File: fh(h), Offset: off, Count: uint32(len(data)), Stable: stable, Data: data}, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, nil
	}
	return res.Status, res.Resok()
}

func (f fs) read(h []byte, off uint64, n uint32) (xdr.Nfsstat3, []byte, bool) {
	f.t.Helper()
	var res xdr.READ3res
	f.call(nfstest.ProcRead, &xdr.READ3args{File: fh(h), Offset: off, Count: n}, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, nil, false
	}
	return res.Status, res.Resok().Data, res.Resok().Eof
}

func (f fs) commit(h []byte) (xdr.Nfsstat3, xdr.Writeverf3) {
	f.t.Helper()
	var res xdr.COMMIT3res
	f.call(nfstest.ProcCommit, &xdr.COMMIT3args{File: fh(h)}, &res)
	if res.Status != xdr.NFS3_OK {
		return res.Status, xdr.Writeverf3{}
	}
	return res.Status, res.Resok().Verf
}

func (f fs) remove(dir []byte, name string) xdr.Nfsstat3 {
	f.t.Helper()
	var res xdr.REMOVE3res
	f.call(nfstest.ProcRemove, &xdr.REMOVE3args{Object: xdr.Diropargs3{Dir: fh(dir), Name: name}}, &res)
	return res.Status
}

// readdir lists dir in pages of count bytes, following cookies.
func (f fs) readdir(dir []byte, count uint32) []string {
	f.t.Helper()
	var names []string
	args := xdr.READDIR3args{Dir: fh(dir), Count: count}
	for page := 0; page < 1000; page++ {
		var res xdr.READDIR3res
		f.call(nfstest.ProcReaddir, &args, &res)
		if res.Status != xdr.NFS3_OK {
			f.t.Fatalf("readdir: %v", res.Status)
		}
		ok := res.Resok()
		for e := ok.Reply.Entries; e != nil; e = e.Nextentry {
			names = append(names, e.Name)
			args.Cookie = e.Cookie
		}
		args.Cookieverf = ok.Cookieverf
		if ok.Reply.Eof {
			return names
		}
	}
	f.t.Fatal("readdir: no end after 1000 pages")
	return nil
}

func mount(t testing.TB, c *nfstest.Client, path string) []byte {
	t.Helper()
	h, st, err := c.Mnt(path)
	if err != nil || st != xdr.MNT3_OK {
		t.Fatalf("MNT %s: %v %v", path, st, err)
	}
	return h
}

func want(t testing.TB, what string, got, exp xdr.Nfsstat3) {
	t.Helper()
	if got != exp {
		t.Fatalf("%s: status %v, want %v", what, got, exp)
	}
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestProcedures drives each NFSv3 procedure through a real gateway on a
// real cluster.
func TestProcedures(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1")
	f := fs{t, g.dial(t, "", 0, 0)}
	root := mount(t, f.c, "/")

	f.call(nfstest.ProcNull, nil, nil)

	var info xdr.FSINFO3res
	f.call(nfstest.ProcFsinfo, &xdr.FSINFO3args{Fsroot: fh(root)}, &info)
	want(t, "fsinfo", info.Status, xdr.NFS3_OK)
	if r := info.Resok(); r.Rtmax != 1<<20 || r.Wtmax != 1<<20 {
		t.Fatalf("fsinfo rtmax %d wtmax %d, want 1 MiB", r.Rtmax, r.Wtmax)
	}
	var stat xdr.FSSTAT3res
	f.call(nfstest.ProcFsstat, &xdr.FSSTAT3args{Fsroot: fh(root)}, &stat)
	want(t, "fsstat", stat.Status, xdr.NFS3_OK)
	if stat.Resok().Tbytes == 0 {
		t.Fatal("fsstat: no total bytes")
	}
	var pc xdr.PATHCONF3res
	f.call(nfstest.ProcPathconf, &xdr.PATHCONF3args{Object: fh(root)}, &pc)
	want(t, "pathconf", pc.Status, xdr.NFS3_OK)
	if pc.Resok().Name_max != 255 {
		t.Fatalf("pathconf name_max %d", pc.Resok().Name_max)
	}

	st, dir := f.mkdir(root, "d", 0o755)
	want(t, "mkdir", st, xdr.NFS3_OK)
	st, _ = f.mkdir(root, "d", 0o755)
	want(t, "mkdir again", st, xdr.NFS3ERR_EXIST)

	// CREATE: UNCHECKED, GUARDED, EXCLUSIVE (a retransmission succeeds,
	// another verifier does not).
	st, file := f.create(dir, "f", xdr.GUARDED, 0o640, 0)
	want(t, "create guarded", st, xdr.NFS3_OK)
	st, _ = f.create(dir, "f", xdr.GUARDED, 0o640, 0)
	want(t, "create guarded again", st, xdr.NFS3ERR_EXIST)
	st, again := f.create(dir, "f", xdr.UNCHECKED, 0o640, 0)
	want(t, "create unchecked of an existing file", st, xdr.NFS3_OK)
	if !bytes.Equal(again, file) {
		t.Fatal("unchecked create of an existing file gave another handle")
	}
	st, ex := f.create(dir, "x", xdr.EXCLUSIVE, 0, 7)
	want(t, "create exclusive", st, xdr.NFS3_OK)
	st, ex2 := f.create(dir, "x", xdr.EXCLUSIVE, 0, 7)
	want(t, "create exclusive retransmitted", st, xdr.NFS3_OK)
	if !bytes.Equal(ex, ex2) {
		t.Fatal("retransmitted exclusive create gave another handle")
	}
	st, _ = f.create(dir, "x", xdr.EXCLUSIVE, 0, 8)
	want(t, "create exclusive, other verifier", st, xdr.NFS3ERR_EXIST)

	// WRITE, READ, GETATTR.
	data := randomBytes(t, 300<<10)
	st, w := f.write(file, 0, data, xdr.FILE_SYNC)
	want(t, "write", st, xdr.NFS3_OK)
	if w.Count != uint32(len(data)) || w.Committed != xdr.FILE_SYNC {
		t.Fatalf("write: count %d committed %v", w.Count, w.Committed)
	}
	if !w.File_wcc.After.Attributes_follow || w.File_wcc.After.Attributes().Size != uint64(len(data)) {
		t.Fatal("write: post-op attributes missing or without the new size")
	}
	st, got, eof := f.read(file, 0, 1<<20)
	want(t, "read", st, xdr.NFS3_OK)
	if !bytes.Equal(got, data) || !eof {
		t.Fatalf("read %d bytes eof %v, want the %d written and eof", len(got), eof, len(data))
	}
	st, got, eof = f.read(file, 1000, 10)
	if st != xdr.NFS3_OK || !bytes.Equal(got, data[1000:1010]) || eof {
		t.Fatalf("read at 1000: %v %d bytes eof %v", st, len(got), eof)
	}
	st, a := f.getattr(file)
	want(t, "getattr", st, xdr.NFS3_OK)
	if a.Type != xdr.NF3REG || a.Mode != 0o640 || a.Size != uint64(len(data)) || a.Nlink != 1 {
		t.Fatalf("getattr: %+v", a)
	}

	// SETATTR: truncate, and a guard that does not match.
	args := xdr.SETATTR3args{Object: fh(file)}
	args.New_attributes.Size.Set_it = true
	*args.New_attributes.Size.Size() = 1000
	var sres xdr.SETATTR3res
	f.call(nfstest.ProcSetattr, &args, &sres)
	want(t, "setattr size", sres.Status, xdr.NFS3_OK)
	if sz := sres.Resok().Obj_wcc.After.Attributes().Size; sz != 1000 {
		t.Fatalf("setattr: size %d after truncate to 1000", sz)
	}
	args.Guard.Check = true
	*args.Guard.Obj_ctime() = xdr.Nfstime3{Seconds: 1}
	f.call(nfstest.ProcSetattr, &args, &sres)
	want(t, "setattr with a stale guard", sres.Status, xdr.NFS3ERR_NOT_SYNC)

	// ACCESS, LOOKUP.
	var ares xdr.ACCESS3res
	f.call(nfstest.ProcAccess, &xdr.ACCESS3args{Object: fh(file), Access: xdr.ACCESS3_READ | xdr.ACCESS3_MODIFY | xdr.ACCESS3_EXECUTE}, &ares)
	want(t, "access", ares.Status, xdr.NFS3_OK)
	if got := ares.Resok().Access; got != xdr.ACCESS3_READ|xdr.ACCESS3_MODIFY {
		t.Fatalf("access as root on a 0640 file: %#x, want read|modify", got)
	}
	st, lh := f.lookup(dir, "f")
	want(t, "lookup", st, xdr.NFS3_OK)
	if !bytes.Equal(lh, file) {
		t.Fatal("lookup gave another handle than create")
	}
	st, _ = f.lookup(dir, "missing")
	want(t, "lookup of a missing name", st, xdr.NFS3ERR_NOENT)
	st, _ = f.lookup(file, "f")
	want(t, "lookup in a file", st, xdr.NFS3ERR_NOTDIR)

	// SYMLINK, READLINK.
	var slres xdr.SYMLINK3res
	f.call(nfstest.ProcSymlink, &xdr.SYMLINK3args{Where: xdr.Diropargs3{Dir: fh(dir), Name: "l"}, Symlink: xdr.Symlinkdata3{Symlink_data: "f"}}, &slres)
	want(t, "symlink", slres.Status, xdr.NFS3_OK)
	var rlres xdr.READLINK3res
	f.call(nfstest.ProcReadlink, &xdr.READLINK3args{Symlink: fh(slres.Resok().Obj.Handle().Data)}, &rlres)
	want(t, "readlink", rlres.Status, xdr.NFS3_OK)
	if rlres.Resok().Data != "f" {
		t.Fatalf("readlink %q", rlres.Resok().Data)
	}

	// LINK, MKNOD.
	var lres xdr.LINK3res
	f.call(nfstest.ProcLink, &xdr.LINK3args{File: fh(file), Link: xdr.Diropargs3{Dir: fh(root), Name: "hard"}}, &lres)
	want(t, "link", lres.Status, xdr.NFS3_OK)
	if n := lres.Resok().File_attributes.Attributes().Nlink; n != 2 {
		t.Fatalf("link: nlink %d", n)
	}
	var mk xdr.MKNOD3args
	mk.Where = xdr.Diropargs3{Dir: fh(dir), Name: "fifo"}
	mk.What.Type = xdr.NF3FIFO
	*mk.What.Pipe_attributes() = withMode(0o600)
	var mkres xdr.MKNOD3res
	f.call(nfstest.ProcMknod, &mk, &mkres)
	want(t, "mknod fifo", mkres.Status, xdr.NFS3_OK)
	if typ := mkres.Resok().Obj_attributes.Attributes().Type; typ != xdr.NF3FIFO {
		t.Fatalf("mknod: type %v", typ)
	}

	// READDIR in small pages (cookies), READDIRPLUS.
	for i := range 40 {
		if st, _ := f.create(dir, "many"+string(rune('a'+i%26))+string(rune('a'+i/26)), xdr.GUARDED, 0o644, 0); st != xdr.NFS3_OK {
			t.Fatalf("create many: %v", st)
		}
	}
	names := f.readdir(dir, 512)
	if len(names) != 44 { // f, x, l, fifo and 40
		t.Fatalf("readdir in pages: %d names: %v", len(names), names)
	}
	var rp xdr.READDIRPLUS3res
	f.call(nfstest.ProcReaddirplus, &xdr.READDIRPLUS3args{Dir: fh(dir), Dircount: 8192, Maxcount: 65536}, &rp)
	want(t, "readdirplus", rp.Status, xdr.NFS3_OK)
	n := 0
	for e := rp.Resok().Reply.Entries; e != nil; e = e.Nextentry {
		if !e.Name_attributes.Attributes_follow || !e.Name_handle.Handle_follows {
			t.Fatalf("readdirplus entry %s without attributes or handle", e.Name)
		}
		if e.Name == "f" && !bytes.Equal(e.Name_handle.Handle().Data, file) {
			t.Fatal("readdirplus: another handle for f")
		}
		n++
	}
	if n != 44 || !rp.Resok().Reply.Eof {
		t.Fatalf("readdirplus: %d entries, eof %v", n, rp.Resok().Reply.Eof)
	}
	var bad xdr.READDIR3res
	f.call(nfstest.ProcReaddir, &xdr.READDIR3args{Dir: fh(dir), Cookie: 12345, Count: 4096}, &bad)
	want(t, "readdir with an unknown cookie", bad.Status, xdr.NFS3ERR_BAD_COOKIE)
	f.call(nfstest.ProcReaddir, &xdr.READDIR3args{Dir: fh(dir), Count: 100}, &bad)
	want(t, "readdir with a count too small for one entry", bad.Status, xdr.NFS3ERR_TOOSMALL)

	// RENAME, COMMIT, REMOVE, RMDIR; a removed file's handle is stale.
	var rn xdr.RENAME3res
	f.call(nfstest.ProcRename, &xdr.RENAME3args{From: xdr.Diropargs3{Dir: fh(dir), Name: "f"}, To: xdr.Diropargs3{Dir: fh(root), Name: "moved"}}, &rn)
	want(t, "rename", rn.Status, xdr.NFS3_OK)
	st, lh = f.lookup(root, "moved")
	if st != xdr.NFS3_OK || !bytes.Equal(lh, file) {
		t.Fatalf("lookup after rename: %v", st)
	}
	st, _ = f.commit(file)
	want(t, "commit", st, xdr.NFS3_OK)
	var rd xdr.RMDIR3res
	f.call(nfstest.ProcRmdir, &xdr.RMDIR3args{Object: xdr.Diropargs3{Dir: fh(root), Name: "d"}}, &rd)
	want(t, "rmdir of a non-empty directory", rd.Status, xdr.NFS3ERR_NOTEMPTY)
	want(t, "remove", f.remove(root, "moved"), xdr.NFS3_OK)
	want(t, "remove the second link", f.remove(root, "hard"), xdr.NFS3_OK)
	st, _ = f.getattr(file)
	want(t, "getattr of a removed file", st, xdr.NFS3ERR_STALE)
	st, _, _ = f.read(file, 0, 10)
	want(t, "read of a removed file", st, xdr.NFS3ERR_STALE)
	st, _ = f.getattr([]byte("not a handle"))
	want(t, "getattr of garbage", st, xdr.NFS3ERR_BADHANDLE)
}

// TestCrossRead: what a client writes over NFS, another client of the
// cluster (the library a FUSE mount uses, in another session) reads
// byte-exact, and the other way round.
func TestCrossRead(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,sync,clients=127.0.0.1")
	f := fs{t, g.dial(t, "", 1000, 1000)}
	root := mount(t, f.c, "/")
	other := cl.newClient()
	ctx := context.Background()
	// A directory the NFS user may write in, made by root elsewhere.
	d, err := other.Mkdir(ctx, 1, "home", 0o755, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.SyncMeta(ctx); err != nil {
		t.Fatal(err)
	}
	st, home := f.lookup(root, "home")
	want(t, "lookup home", st, xdr.NFS3_OK)
	st, file := f.create(home, "data", xdr.GUARDED, 0o644, 0)
	want(t, "create", st, xdr.NFS3_OK)
	data := randomBytes(t, 3<<20+12345)
	for off := 0; off < len(data); off += 1 << 20 {
		end := min(off+1<<20, len(data))
		if st, w := f.write(file, uint64(off), data[off:end], xdr.FILE_SYNC); st != xdr.NFS3_OK || w.Count != uint32(end-off) {
			t.Fatalf("write at %d: %v", off, st)
		}
	}
	a, err := other.Lookup(ctx, d.Ino, "data")
	if err != nil {
		t.Fatal(err)
	}
	if a.Size != uint64(len(data)) || a.Uid != 1000 {
		t.Fatalf("the other client sees size %d uid %d, want %d and 1000", a.Size, a.Uid, len(data))
	}
	fl, err := other.Open(ctx, a.Ino, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	n, err := fl.ReadAt(ctx, got, 0)
	fl.Release(ctx)
	if n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("the other client read %d bytes (%v), not what NFS wrote", n, err)
	}

	// The other way: written by the library, read over NFS.
	back := randomBytes(t, 777777)
	wf, err := other.CreateOpen(ctx, d.Ino, "back", 0o644, 1000, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wf.WriteAt(ctx, back, 0); err != nil {
		t.Fatal(err)
	}
	if err := wf.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	wf.Release(ctx)
	st, bh := f.lookup(home, "back")
	want(t, "lookup back", st, xdr.NFS3_OK)
	var rd []byte
	for off := uint64(0); ; {
		st, p, eof := f.read(bh, off, 1<<20)
		want(t, "read back", st, xdr.NFS3_OK)
		rd = append(rd, p...)
		off += uint64(len(p))
		if eof || len(p) == 0 {
			break
		}
	}
	if !bytes.Equal(rd, back) {
		t.Fatalf("NFS read %d bytes, not the %d the library wrote", len(rd), len(back))
	}
}

// TestLookupDotDot: ".." of a directory below the export's root is its
// parent (also after the directory moved), of the root the root itself,
// and of a file NOTDIR.
func TestLookupDotDot(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1")
	f := fs{t, g.dial(t, "", 0, 0)}
	root := mount(t, f.c, "/")
	_, d := f.mkdir(root, "d", 0o755)
	_, e := f.mkdir(d, "e", 0o755)
	for _, c := range []struct {
		what      string
		dir, want []byte
	}{{"d/e/..", e, d}, {"d/..", d, root}, {"/..", root, root}} {
		st, got := f.lookup(c.dir, "..")
		want(t, "lookup "+c.what, st, xdr.NFS3_OK)
		if !bytes.Equal(got, c.want) {
			t.Fatalf("lookup %s: another handle than its parent's", c.what)
		}
	}
	var mv xdr.RENAME3res
	f.call(nfstest.ProcRename, &xdr.RENAME3args{From: xdr.Diropargs3{Dir: fh(d), Name: "e"}, To: xdr.Diropargs3{Dir: fh(root), Name: "e"}}, &mv)
	want(t, "rename d/e to e", mv.Status, xdr.NFS3_OK)
	if st, got := f.lookup(e, ".."); st != xdr.NFS3_OK || !bytes.Equal(got, root) {
		t.Fatalf("lookup .. of the moved directory: %v, root's handle %v", st, bytes.Equal(got, root))
	}
	_, file := f.create(d, "f", xdr.UNCHECKED, 0o644, 0)
	if st, _ := f.lookup(file, ".."); st != xdr.NFS3ERR_NOTDIR {
		t.Fatalf("lookup .. of a file: %v, want NOTDIR", st)
	}
}
