package meta

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

const (
	fileMode = modeReg | 0o644
	dirMode  = modeDir | 0o755
)

func newNamespace(t *testing.T) (*Service, *client) {
	s := openService(t, testConfig(t, ""))
	c := newClient(t, s.Addr())
	c.registerTargets("127.0.0.1:1", "u1", "u2", "u3")
	return s, c
}

func TestRootAndCreate(t *testing.T) {
	_, c := newNamespace(t)
	root := c.mustGetattr(rootIno)
	if root.Mode != dirMode || root.Uid != 0 || root.Gid != 0 || root.Nlink != 2 {
		t.Fatalf("root = %+v", root)
	}
	f := c.mustCreate(1, "f", fileMode)
	if f.Nlink != 1 || f.Mode != fileMode || f.Layout.StripeCount != 3 || f.Layout.StripeSize != 1<<20 || len(f.Layout.Targets) != 3 {
		t.Fatalf("file = %+v", f)
	}
	if err := f.Layout.Validate(); err != nil {
		t.Fatalf("layout: %v", err)
	}
	d := c.mustCreate(1, "d", dirMode)
	if d.Nlink != 2 {
		t.Fatalf("dir nlink = %d", d.Nlink)
	}
	if r := c.mustGetattr(1); r.Nlink != 3 || r.Mtime < d.Ctime {
		t.Fatalf("root after mkdir = %+v", r)
	}
	if got, err := c.lookup(1, "f"); err != nil || got.Ino != f.Ino {
		t.Fatalf("lookup f = %+v, %v", got, err)
	}
	// mode 0000 is stored as given; no umask applies
	z := c.mustCreate(1, "zero", modeReg)
	if z.Mode != modeReg {
		t.Fatalf("mode 0000 file has mode %o", z.Mode)
	}

	_, err := c.lookup(1, "nope")
	wantErrno(t, err, syscall.ENOENT, "lookup missing")
	_, err = c.create(1, "f", fileMode)
	wantErrno(t, err, syscall.EEXIST, "create existing")
	_, err = c.create(1, strings.Repeat("x", 256), fileMode)
	wantErrno(t, err, syscall.ENAMETOOLONG, "256-byte name")
	c.mustCreate(1, strings.Repeat("x", 255), fileMode)
	for _, bad := range []string{"", ".", "..", "a/b", "a\x00b"} {
		_, err = c.create(1, bad, fileMode)
		wantErrno(t, err, syscall.EINVAL, "create "+bad)
		if bad == ".." {
			continue // a lookup of ".." is the directory's parent (below)
		}
		_, err = c.lookup(1, bad)
		wantErrno(t, err, syscall.EINVAL, "lookup "+bad)
	}
	if p, err := c.lookup(1, ".."); err != nil || p.Ino != 1 {
		t.Fatalf("lookup .. of the root: %+v %v, want the root", p, err)
	}
	_, err = c.create(f.Ino, "x", fileMode)
	wantErrno(t, err, syscall.ENOTDIR, "create in file")
	_, err = c.lookup(f.Ino, "x")
	wantErrno(t, err, syscall.ENOTDIR, "lookup in file")
	_, err = c.lookup(f.Ino, "..")
	wantErrno(t, err, syscall.ENOTDIR, "lookup .. of a file")
	// Repeated misses: the service remembers which parents are directories
	// (knownDirs); the answers must not change.
	for i := 0; i < 3; i++ {
		_, err = c.lookup(f.Ino, "y")
		wantErrno(t, err, syscall.ENOTDIR, "lookup in file again")
		_, err = c.lookup(1, "missing")
		wantErrno(t, err, syscall.ENOENT, "lookup missing again")
		_, err = c.lookup(999, "x")
		wantErrno(t, err, syscall.ENOENT, "lookup in missing dir")
	}
	sub := c.mustCreate(1, "sub", dirMode)
	_, err = c.lookup(sub.Ino, "x")
	wantErrno(t, err, syscall.ENOENT, "lookup in new dir")
	if err := c.rmdir(1, "sub"); err != nil {
		t.Fatal(err)
	}
	_, err = c.lookup(sub.Ino, "x")
	wantErrno(t, err, syscall.ENOENT, "lookup in removed dir")
	_, err = c.create(999, "x", fileMode)
	wantErrno(t, err, syscall.ENOENT, "create in missing dir")
	_, err = c.getattr(999)
	wantErrno(t, err, syscall.ENOENT, "getattr missing")
}

func TestCreateWithoutTargets(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	c := newClient(t, s.Addr())
	_, err := c.create(1, "f", fileMode)
	wantErrno(t, err, syscall.ENOSPC, "create without targets")
	if !strings.Contains(err.Error(), "no storage target is registered") {
		t.Errorf("message %q does not explain", err)
	}
	c.mustCreate(1, "d", dirMode) // directories need no targets
}

// With every live target full, a create says so (not "start a server").
func TestCreateOnFullTargets(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	c := newClient(t, s.Addr())
	req := &rpc.RegisterServerReq{Addr: "127.0.0.1:1", Host: "h"}
	for _, u := range []string{"a", "b"} {
		req.Targets = append(req.Targets, rpc.TargetReg{UUID: u, Path: "/t/" + u, TotalBytes: 1 << 30})
	}
	var resp rpc.RegisterServerResp
	if err := c.call(rpc.MRegisterServer, req, &resp); err != nil {
		t.Fatal(err)
	}
	_, err := c.create(1, "f", fileMode)
	wantErrno(t, err, syscall.ENOSPC, "create with full targets")
	if !strings.Contains(err.Error(), "all 2 live storage targets are full") {
		t.Errorf("message %q does not say the targets are full", err)
	}
}

func TestSpecialFiles(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", fileMode)
	var sl rpc.AttrResp
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "l", Mode: modeLink | 0o777, SymlinkTarget: "f/../f"}, &sl); err != nil {
		t.Fatal(err)
	}
	if sl.Attr.Size != 6 || sl.Attr.Mode&modeType != modeLink || len(sl.Attr.Layout.Targets) != 0 {
		t.Fatalf("symlink = %+v", sl.Attr)
	}
	var rl rpc.ReadlinkResp
	if err := c.call(rpc.MReadlink, &rpc.GetAttrReq{Ino: sl.Attr.Ino}, &rl); err != nil || rl.Target != "f/../f" {
		t.Fatalf("readlink = %q, %v", rl.Target, err)
	}
	wantErrno(t, c.call(rpc.MReadlink, &rpc.GetAttrReq{Ino: f.Ino}, &rl), syscall.EINVAL, "readlink of file")
	var dev rpc.AttrResp
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "null", Mode: modeChr | 0o666, Rdev: 0x103}, &dev); err != nil || dev.Attr.Rdev != 0x103 {
		t.Fatalf("mknod = %+v, %v", dev.Attr, err)
	}
	fifo := c.mustCreate(1, "fifo", modeFifo|0o600)
	if fifo.Mode != modeFifo|0o600 {
		t.Fatalf("fifo mode %o", fifo.Mode)
	}
	// unlinking a non-file frees the inode at once
	if a, err := c.unlink(1, "fifo"); err != nil || a.Nlink != 0 {
		t.Fatalf("unlink fifo = %+v, %v", a, err)
	}
	_, err := c.getattr(fifo.Ino)
	wantErrno(t, err, syscall.ENOENT, "getattr unlinked fifo")
}

func TestUnlinkRmdir(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", dirMode)
	f := c.mustCreate(d.Ino, "f", fileMode)
	wantErrno(t, c.rmdir(1, "d"), syscall.ENOTEMPTY, "rmdir non-empty")
	wantErrno(t, c.rmdir(d.Ino, "f"), syscall.ENOTDIR, "rmdir file")
	_, err := c.unlink(1, "d")
	wantErrno(t, err, syscall.EISDIR, "unlink dir")
	_, err = c.unlink(1, "nope")
	wantErrno(t, err, syscall.ENOENT, "unlink missing")
	a, err := c.unlink(d.Ino, "f")
	if err != nil || a.Nlink != 0 || a.Ino != f.Ino {
		t.Fatalf("unlink = %+v, %v", a, err)
	}
	// open-but-unlinked: the inode stays readable until reaped
	if got := c.mustGetattr(f.Ino); got.Nlink != 0 {
		t.Fatalf("orphan nlink = %d", got.Nlink)
	}
	if err := c.rmdir(1, "d"); err != nil {
		t.Fatal(err)
	}
	if r := c.mustGetattr(1); r.Nlink != 2 {
		t.Fatalf("root nlink after rmdir = %d", r.Nlink)
	}
	_, err = c.getattr(d.Ino)
	wantErrno(t, err, syscall.ENOENT, "getattr removed dir")
	_, err = c.create(d.Ino, "x", fileMode)
	wantErrno(t, err, syscall.ENOENT, "create in removed dir")
}

func TestRename(t *testing.T) {
	_, c := newNamespace(t)
	a := c.mustCreate(1, "a", dirMode)
	b := c.mustCreate(1, "b", dirMode)
	sub := c.mustCreate(a.Ino, "sub", dirMode)
	f := c.mustCreate(a.Ino, "f", fileMode)

	// across directories: dir link counts follow
	if err := c.rename(a.Ino, "sub", b.Ino, "sub2", 0); err != nil {
		t.Fatal(err)
	}
	if got := c.mustGetattr(a.Ino); got.Nlink != 2 {
		t.Errorf("old parent nlink = %d, want 2", got.Nlink)
	}
	if got := c.mustGetattr(b.Ino); got.Nlink != 3 {
		t.Errorf("new parent nlink = %d, want 3", got.Nlink)
	}
	if got, err := c.lookup(b.Ino, "sub2"); err != nil || got.Ino != sub.Ino {
		t.Fatalf("lookup moved = %+v %v", got, err)
	}
	_, err := c.lookup(a.Ino, "sub")
	wantErrno(t, err, syscall.ENOENT, "old name after rename")

	// into own subtree
	wantErrno(t, c.rename(1, "b", sub.Ino, "x", 0), syscall.EINVAL, "move dir into own child")
	wantErrno(t, c.rename(1, "b", b.Ino, "x", 0), syscall.EINVAL, "move dir into itself")

	// replacing a file: the victim loses its link
	g := c.mustCreate(b.Ino, "g", fileMode)
	if err := c.rename(a.Ino, "f", b.Ino, "g", 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.lookup(b.Ino, "g"); got.Ino != f.Ino {
		t.Fatalf("replace: g is %d, want %d", got.Ino, f.Ino)
	}
	if got := c.mustGetattr(g.Ino); got.Nlink != 0 {
		t.Fatalf("replaced file nlink = %d", got.Nlink)
	}

	// NOREPLACE
	c.mustCreate(a.Ino, "h", fileMode)
	wantErrno(t, c.rename(a.Ino, "h", b.Ino, "g", rpc.RenameNoReplace), syscall.EEXIST, "noreplace")
	if err := c.rename(a.Ino, "h", b.Ino, "h", rpc.RenameNoReplace); err != nil {
		t.Fatal(err)
	}

	// EXCHANGE a file and a directory across parents
	e := c.mustCreate(a.Ino, "edir", dirMode)
	if err := c.rename(a.Ino, "edir", b.Ino, "g", rpc.RenameExchange); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.lookup(b.Ino, "g"); got.Ino != e.Ino {
		t.Fatalf("exchange: b/g = %d, want dir %d", got.Ino, e.Ino)
	}
	if got, _ := c.lookup(a.Ino, "edir"); got.Ino != f.Ino {
		t.Fatalf("exchange: a/edir = %d, want file %d", got.Ino, f.Ino)
	}
	if got := c.mustGetattr(a.Ino); got.Nlink != 2 {
		t.Errorf("exchange: a nlink = %d, want 2", got.Nlink)
	}
	if got := c.mustGetattr(b.Ino); got.Nlink != 4 {
		t.Errorf("exchange: b nlink = %d, want 4", got.Nlink)
	}
	wantErrno(t, c.rename(a.Ino, "edir", b.Ino, "absent", rpc.RenameExchange), syscall.ENOENT, "exchange with missing")
	wantErrno(t, c.rename(a.Ino, "edir", b.Ino, "x", rpc.RenameExchange|rpc.RenameNoReplace), syscall.EINVAL, "both flags")

	// type mismatches and non-empty targets
	c.mustCreate(e.Ino, "inner", fileMode)
	c.mustCreate(1, "emptydir", dirMode)
	c.mustCreate(1, "file2", fileMode)
	wantErrno(t, c.rename(1, "emptydir", b.Ino, "h", 0), syscall.ENOTDIR, "dir over file")
	wantErrno(t, c.rename(1, "file2", 1, "emptydir", 0), syscall.EISDIR, "file over dir")
	wantErrno(t, c.rename(1, "emptydir", b.Ino, "g", 0), syscall.ENOTEMPTY, "dir over non-empty dir")
	wantErrno(t, c.rename(1, "missing", 1, "x", 0), syscall.ENOENT, "rename missing")
	// replacing an empty directory
	c.mustCreate(1, "victim", dirMode)
	if err := c.rename(1, "emptydir", 1, "victim", 0); err != nil {
		t.Fatal(err)
	}
	// rename onto itself is a no-op
	if err := c.rename(1, "victim", 1, "victim", 0); err != nil {
		t.Fatal(err)
	}
	root := c.mustGetattr(1)
	ents, _ := c.readdirAll(1, 0, false)
	dirs := 0
	for _, e := range ents {
		if e.Mode&modeType == modeDir {
			dirs++
		}
	}
	if int(root.Nlink) != 2+dirs {
		t.Fatalf("root nlink %d with %d subdirectories", root.Nlink, dirs)
	}
}

func TestLink(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", dirMode)
	f := c.mustCreate(1, "f", fileMode)
	var r rpc.AttrResp
	wantErrno(t, c.call(rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: d.Ino, NewParent: 1, NewName: "d2"}, &r), syscall.EPERM, "link dir")
	wantErrno(t, c.call(rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: f.Ino, NewParent: 1, NewName: "d"}, &r), syscall.EEXIST, "link over existing")
	if err := c.call(rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: f.Ino, NewParent: d.Ino, NewName: "f2"}, &r); err != nil || r.Attr.Nlink != 2 {
		t.Fatalf("link = %+v, %v", r.Attr, err)
	}
	if a, err := c.unlink(1, "f"); err != nil || a.Nlink != 1 {
		t.Fatalf("unlink one link = %+v %v", a, err)
	}
	if got, err := c.lookup(d.Ino, "f2"); err != nil || got.Ino != f.Ino {
		t.Fatalf("other link = %+v %v", got, err)
	}
	// rename between two links of one inode does nothing
	c.call(rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: f.Ino, NewParent: 1, NewName: "f3"}, &r)
	if err := c.rename(1, "f3", d.Ino, "f2", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.lookup(1, "f3"); err != nil {
		t.Fatalf("rename of hard link onto itself removed the source: %v", err)
	}
}

// O_TMPFILE: a file with no links that the directory does not list and
// whose change leaves the directory as it was; linkat names it once (and
// it is then an ordinary file), while an unlinked file can never be named
// again.
func TestTmpfile(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", modeDir|0o2775)
	if _, err := setattr(c, rpc.SetAttrReq{Ino: d.Ino, Valid: rpc.SetGid, Gid: 42}); err != nil {
		t.Fatal(err)
	}
	before := c.mustGetattr(d.Ino)
	tmp, err := c.tmpfile(d.Ino, fileMode)
	if err != nil {
		t.Fatal(err)
	}
	if tmp.Nlink != 0 || tmp.Mode != fileMode || tmp.Gid != 42 || len(tmp.Layout.Targets) != 3 {
		t.Fatalf("tmpfile = %+v, want nlink 0, mode %o, gid 42 (setgid directory), 3 targets", tmp, fileMode)
	}
	if after := c.mustGetattr(d.Ino); after.Mtime != before.Mtime || after.Ctime != before.Ctime || after.Nlink != before.Nlink {
		t.Fatalf("O_TMPFILE changed its directory: %+v, before %+v", after, before)
	}
	if ents, err := c.readdirAll(d.Ino, 0, false); err != nil || len(ents) != 0 {
		t.Fatalf("directory lists %v (%v), want nothing", ents, err)
	}
	if a := c.mustGetattr(tmp.Ino); a.Nlink != 0 {
		t.Fatalf("getattr of the open tmpfile = %+v", a)
	}

	named, err := c.link(tmp.Ino, d.Ino, "named")
	if err != nil || named.Nlink != 1 {
		t.Fatalf("linkat of the tmpfile = %+v, %v", named, err)
	}
	if got, err := c.lookup(d.Ino, "named"); err != nil || got.Ino != tmp.Ino {
		t.Fatalf("lookup of the named tmpfile = %+v, %v", got, err)
	}
	if a, err := c.link(tmp.Ino, 1, "second"); err != nil || a.Nlink != 2 {
		t.Fatalf("second link = %+v, %v", a, err)
	}
	// Unlinked again, it is an ordinary orphan: no name can bring it back.
	c.unlink(d.Ino, "named")
	if a, err := c.unlink(1, "second"); err != nil || a.Nlink != 0 {
		t.Fatalf("unlink last link = %+v, %v", a, err)
	}
	_, err = c.link(tmp.Ino, 1, "again")
	wantErrno(t, err, syscall.ENOENT, "link of a once-named tmpfile after its last unlink")
	f := c.mustCreate(1, "f", fileMode)
	c.unlink(1, "f")
	_, err = c.link(f.Ino, 1, "f2")
	wantErrno(t, err, syscall.ENOENT, "link of an unlinked file")

	_, err = c.tmpfile(d.Ino, dirMode)
	wantErrno(t, err, syscall.EINVAL, "tmpfile of directory type")
	var r rpc.ChangeResp
	err = c.call(rpc.MTmpfile, &rpc.CreateReq{Hdr: c.hdr(), Parent: d.Ino, Name: "x", Mode: fileMode}, &r)
	wantErrno(t, err, syscall.EINVAL, "tmpfile with a name")
	g := c.mustCreate(1, "g", fileMode)
	_, err = c.tmpfile(g.Ino, fileMode)
	wantErrno(t, err, syscall.ENOTDIR, "tmpfile in a file")
	gone := c.mustCreate(1, "gone", dirMode)
	if err := c.rmdir(1, "gone"); err != nil {
		t.Fatal(err)
	}
	_, err = c.tmpfile(gone.Ino, fileMode)
	wantErrno(t, err, syscall.ENOENT, "tmpfile in a removed directory")
	_, err = c.tmpfile(1<<40, fileMode)
	wantErrno(t, err, syscall.ENOENT, "tmpfile in a missing directory")
}

func setattr(c *client, req rpc.SetAttrReq) (rpc.Attr, error) {
	req.Hdr = c.hdr()
	var r rpc.AttrResp
	err := c.call(rpc.MSetAttr, &req, &r)
	return r.Attr, err
}

func TestSetAttr(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", modeReg|0o6755)
	a, err := setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetMode, Mode: 0o640})
	if err != nil || a.Mode != modeReg|0o640 || a.Ctime < f.Ctime {
		t.Fatalf("chmod = %+v %v", a, err)
	}
	setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetMode, Mode: 0o6755})
	a, err = setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetUid | rpc.SetGid, Uid: 1000, Gid: 100})
	if err != nil || a.Uid != 1000 || a.Gid != 100 || a.Mode != modeReg|0o755 {
		t.Fatalf("chown = mode %o %+v %v (want setuid and setgid cleared)", a.Mode, a, err)
	}
	// setgid without group-execute survives chown
	setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetMode, Mode: 0o2644})
	a, _ = setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetGid, Gid: 5})
	if a.Mode != modeReg|0o2644 {
		t.Fatalf("chown cleared setgid without g+x: %o", a.Mode)
	}
	// directories keep setgid on chown
	d := c.mustCreate(1, "d", modeDir|0o2775)
	if a, _ := setattr(c, rpc.SetAttrReq{Ino: d.Ino, Valid: rpc.SetUid, Uid: 7}); a.Mode != modeDir|0o2775 {
		t.Fatalf("dir chown mode %o", a.Mode)
	}
	a, err = setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetSize, Size: 12345})
	if err != nil || a.Size != 12345 || a.Mtime != a.Ctime {
		t.Fatalf("truncate = %+v %v", a, err)
	}
	_, err = setattr(c, rpc.SetAttrReq{Ino: d.Ino, Valid: rpc.SetSize, Size: 1})
	wantErrno(t, err, syscall.EISDIR, "truncate dir")
	a, err = setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetAtime | rpc.SetMtime, Atime: 111, Mtime: 222})
	if err != nil || a.Atime != 111 || a.Mtime != 222 || a.Ctime <= 222 {
		t.Fatalf("utimes = %+v %v", a, err)
	}
	a, _ = setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetAtimeNow | rpc.SetMtimeNow})
	if a.Atime != a.Ctime || a.Mtime != a.Ctime {
		t.Fatalf("utimes now = %+v", a)
	}
	a, _ = setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetCtime, Ctime: 5})
	if a.Ctime != 5 {
		t.Fatalf("explicit ctime = %d", a.Ctime)
	}
	_, err = setattr(c, rpc.SetAttrReq{Ino: 999, Valid: rpc.SetMode})
	wantErrno(t, err, syscall.ENOENT, "setattr missing")
}

func TestSetgidInheritance(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", modeDir|0o2775)
	setattr(c, rpc.SetAttrReq{Ino: d.Ino, Valid: rpc.SetGid | rpc.SetMode, Gid: 42, Mode: 0o2775})
	var r rpc.ChangeResp // MCreate's answer (an AttrResp reads its tail as inline data)
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: d.Ino, Name: "f", Mode: fileMode, Uid: 1, Gid: 1}, &r); err != nil {
		t.Fatal(err)
	}
	if r.Attr.Gid != 42 || r.Attr.Mode&modeSetgid != 0 {
		t.Fatalf("file in setgid dir: gid %d mode %o", r.Attr.Gid, r.Attr.Mode)
	}
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: d.Ino, Name: "sub", Mode: dirMode, Uid: 1, Gid: 1}, &r); err != nil {
		t.Fatal(err)
	}
	if r.Attr.Gid != 42 || r.Attr.Mode&modeSetgid == 0 {
		t.Fatalf("dir in setgid dir: gid %d mode %o", r.Attr.Gid, r.Attr.Mode)
	}
}

func TestXattr(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", fileMode)
	set := func(name, val string, flags uint32) error {
		return c.call(rpc.MSetXattr, &rpc.XattrReq{Hdr: c.hdr(), Ino: f.Ino, Name: name, Value: []byte(val), Flags: flags}, nil)
	}
	get := func(name string) (string, error) {
		var r rpc.XattrResp
		err := c.call(rpc.MGetXattr, &rpc.XattrReq{Ino: f.Ino, Name: name}, &r)
		return string(r.Value), err
	}
	_, err := get("user.a")
	wantErrno(t, err, syscall.ENODATA, "get missing")
	wantErrno(t, set("user.a", "1", rpc.XattrReplace), syscall.ENODATA, "replace missing")
	if err := set("user.a", "1", rpc.XattrCreate); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, set("user.a", "2", rpc.XattrCreate), syscall.EEXIST, "create existing")
	if err := set("user.a", "2", rpc.XattrReplace); err != nil {
		t.Fatal(err)
	}
	if err := set("user.b", "", 0); err != nil {
		t.Fatal(err)
	}
	if v, err := get("user.a"); err != nil || v != "2" {
		t.Fatalf("get = %q %v", v, err)
	}
	var l rpc.ListXattrResp
	if err := c.call(rpc.MListXattr, &rpc.GetAttrReq{Ino: f.Ino}, &l); err != nil || strings.Join(l.Names, ",") != "user.a,user.b" {
		t.Fatalf("list = %v %v", l.Names, err)
	}
	if err := c.call(rpc.MRemoveXattr, &rpc.XattrReq{Hdr: c.hdr(), Ino: f.Ino, Name: "user.a"}, nil); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, c.call(rpc.MRemoveXattr, &rpc.XattrReq{Hdr: c.hdr(), Ino: f.Ino, Name: "user.a"}, nil), syscall.ENODATA, "remove missing")
	var r rpc.XattrResp
	wantErrno(t, c.call(rpc.MGetXattr, &rpc.XattrReq{Ino: 999, Name: "user.a"}, &r), syscall.ENOENT, "get on missing inode")
	wantErrno(t, c.call(rpc.MListXattr, &rpc.GetAttrReq{Ino: 999}, &l), syscall.ENOENT, "list on missing inode")
	// xattrs go with the inode
	c.unlink(1, "f")
}

func TestCommitSize(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", modeReg|0o4755)
	commit := func(size uint64, mtime int64, clear bool) rpc.Attr {
		var r rpc.AttrResp
		if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: f.Ino, Size: size, Mtime: mtime, ClearSuid: clear}, &r); err != nil {
			t.Fatal(err)
		}
		return r.Attr
	}
	if a := commit(100, 10, false); a.Size != 100 || a.Mtime != 10 || a.Ctime != 10 {
		t.Fatalf("commit = %+v", a)
	}
	if a := commit(50, 20, false); a.Size != 100 || a.Mtime != 20 {
		t.Fatalf("smaller commit shrank: %+v", a)
	}
	if a := commit(5<<30, 30, true); a.Size != 5<<30 || a.Mode != modeReg|0o755 {
		t.Fatalf("commit with clear suid = %+v (mode %o)", a, a.Mode)
	}
}

// The space of a file's chunks (st_blocks): known and zero for a new file,
// set per chunk by size commits (each chunk as its last reporter saw it),
// and cut by a truncate to what the new size can hold. (A record without
// the list, an older version's, reads as unknown: schema's round trip.)
func TestAllocBlocks(t *testing.T) {
	_, c := newNamespace(t) // 3 targets: stripe count 3
	f := c.mustCreate(1, "f", fileMode)
	if !f.BlocksKnown || f.Blocks != 0 {
		t.Fatalf("new file: blocks %d known %v, want 0 known", f.Blocks, f.BlocksKnown)
	}
	commit := func(alloc ...rpc.SlotAlloc) rpc.Attr {
		t.Helper()
		var r rpc.AttrResp
		if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: f.Ino, Size: 3 << 20, Mtime: 10, Alloc: alloc}, &r); err != nil {
			t.Fatal(err)
		}
		return r.Attr
	}
	if a := commit(rpc.SlotAlloc{Slot: 0, Bytes: 1 << 20}, rpc.SlotAlloc{Slot: 2, Bytes: 4096}); a.Blocks != (1<<20+4096)/512 || !a.BlocksKnown {
		t.Fatalf("after a commit of two chunks: blocks %d known %v", a.Blocks, a.BlocksKnown)
	}
	// Another client's commit of chunk 1, and of chunk 2 again (punched).
	commit(rpc.SlotAlloc{Slot: 1, Bytes: 8192}, rpc.SlotAlloc{Slot: 2, Bytes: 0}, rpc.SlotAlloc{Slot: 9, Bytes: 1 << 40})
	if a := c.mustGetattr(f.Ino); a.Blocks != (1<<20+8192)/512 {
		t.Fatalf("getattr after the second commit: blocks %d, want %d (slot 9 is not the file's)", a.Blocks, (1<<20+8192)/512)
	}
	if a := commit(); a.Blocks != (1<<20+8192)/512 {
		t.Fatalf("a commit without space reports changed it: %d", a.Blocks)
	}
	// Truncate to 100 KiB: chunk 0 keeps at most 100 KiB, the others none.
	a, err := setattr(c, rpc.SetAttrReq{Ino: f.Ino, Valid: rpc.SetSize, Size: 100 << 10})
	if err != nil || a.Blocks != (100<<10)/512 {
		t.Fatalf("after truncate to 100 KiB: blocks %d, %v", a.Blocks, err)
	}
	if ents, err := c.readdirAll(1, 0, true); err != nil || len(ents) != 1 || ents[0].Attr.Blocks != (100<<10)/512 || !ents[0].Attr.BlocksKnown {
		t.Fatalf("readdirplus: %+v %v", ents, err)
	}
}

func TestSetDirLayout(t *testing.T) {
	_, c := newNamespace(t) // 3 targets
	d := c.mustCreate(1, "d", dirMode)
	f := c.mustCreate(1, "f", fileMode)
	set := func(dir uint64, size, count uint32) (rpc.Attr, error) {
		var r rpc.AttrResp
		err := c.call(rpc.MSetDirLayout, &rpc.SetDirLayoutReq{Hdr: c.hdr(), Dir: dir, StripeSize: size, StripeCount: count}, &r)
		return r.Attr, err
	}
	_, err := set(d.Ino, 1<<20, 4)
	wantErrno(t, err, syscall.EINVAL, "count over targets")
	_, err = set(d.Ino, 1000, 1)
	wantErrno(t, err, syscall.EINVAL, "odd stripe size")
	_, err = set(f.Ino, 1<<20, 1)
	wantErrno(t, err, syscall.ENOTDIR, "layout on file")
	if a, err := set(d.Ino, 4<<20, 2); err != nil || a.Layout.StripeSize != 4<<20 || a.Layout.StripeCount != 2 {
		t.Fatalf("set layout = %+v %v", a.Layout, err)
	}
	g := c.mustCreate(d.Ino, "g", fileMode)
	if g.Layout.StripeSize != 4<<20 || g.Layout.StripeCount != 2 || len(g.Layout.Targets) != 2 {
		t.Fatalf("inherited layout = %+v", g.Layout)
	}
	sub := c.mustCreate(d.Ino, "sub", dirMode)
	h := c.mustCreate(sub.Ino, "h", fileMode)
	if h.Layout.StripeCount != 2 || h.Layout.StripeSize != 4<<20 {
		t.Fatalf("grandchild layout = %+v", h.Layout)
	}
	// defaults again
	set(d.Ino, 0, 0)
	if k := c.mustCreate(d.Ino, "k", fileMode); k.Layout.StripeCount != 3 || k.Layout.StripeSize != 1<<20 {
		t.Fatalf("default layout = %+v", k.Layout)
	}
	// round-robin spreads first targets
	firsts := map[uint32]bool{}
	for i := 0; i < 6; i++ {
		firsts[c.mustCreate(1, "rr"+string(rune('a'+i)), fileMode).Layout.Targets[0]] = true
	}
	if len(firsts) != 3 {
		t.Fatalf("round robin used first targets %v", firsts)
	}
}

func TestDedupe(t *testing.T) {
	_, c := newNamespace(t)
	req := &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "once", Mode: fileMode}
	var a, b rpc.AttrResp
	if err := c.call(rpc.MCreate, req, &a); err != nil {
		t.Fatal(err)
	}
	if err := c.call(rpc.MCreate, req, &b); err != nil {
		t.Fatalf("retried create: %v (want the original answer)", err)
	}
	if a.Attr.Ino != b.Attr.Ino || a.Attr.Ctime != b.Attr.Ctime {
		t.Fatalf("retry answered %+v, first %+v", b.Attr, a.Attr)
	}
	// a retried unlink answers like the first
	ureq := &rpc.EntryReq{Hdr: c.hdr(), Parent: 1, Name: "once"}
	if err := c.call(rpc.MUnlink, ureq, &a); err != nil {
		t.Fatal(err)
	}
	if err := c.call(rpc.MUnlink, ureq, &b); err != nil || b.Attr.Nlink != 0 {
		t.Fatalf("retried unlink: %+v %v", b.Attr, err)
	}
	// a failure is remembered too
	ereq := &rpc.EntryReq{Hdr: c.hdr(), Parent: 1, Name: "missing"}
	wantErrno(t, c.call(rpc.MUnlink, ereq, &a), syscall.ENOENT, "unlink missing")
	c.mustCreate(1, "missing", fileMode)
	wantErrno(t, c.call(rpc.MUnlink, ereq, &a), syscall.ENOENT, "retried unlink keeps its answer")
}

func TestStatusAndStatFS(t *testing.T) {
	s, c := newNamespace(t)
	c.mustCreate(1, "f", fileMode)
	var st rpc.StatFSResp
	if err := c.call(rpc.MStatFS, &rpc.Empty{}, &st); err != nil {
		t.Fatal(err)
	}
	if st.TotalBytes != 3<<40 || st.FreeBytes != 3<<39 || st.Inodes-st.FreeInodes != 2 {
		t.Fatalf("statfs = %+v", st)
	}
	var cs rpc.ClusterStatusResp
	if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
		t.Fatal(err)
	}
	if cs.RaftState != "Leader" || cs.MetaAddr != s.Addr() || cs.Inodes != 2 || cs.Sessions != 1 || len(cs.Servers) != 1 || len(cs.Targets) != 3 || !cs.Servers[0].Alive {
		t.Fatalf("status = %+v", cs)
	}
}

func TestReadDirPlus(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", dirMode)
	var names []string
	for i := 0; i < 25; i++ {
		n := string(rune('a'+i%26)) + strings.Repeat("z", i)
		names = append(names, n)
		c.mustCreate(d.Ino, n, fileMode)
	}
	sort.Strings(names)
	ents, err := c.readdirAll(d.Ino, 7, true)
	if err != nil || len(ents) != 25 {
		t.Fatalf("readdir = %d entries, %v", len(ents), err)
	}
	for i, e := range ents {
		if e.Name != names[i] || e.Attr.Ino != e.Ino || e.Attr.Mode != fileMode || e.Attr.Nlink != 1 {
			t.Fatalf("entry %d = %+v", i, e)
		}
	}
	f, _ := c.lookup(d.Ino, names[0])
	var r rpc.ReadDirResp
	wantErrno(t, c.call(rpc.MReadDir, &rpc.ReadDirReq{Dir: f.Ino}, &r), syscall.ENOTDIR, "readdir file")
	wantErrno(t, c.call(rpc.MReadDir, &rpc.ReadDirReq{Dir: 999}, &r), syscall.ENOENT, "readdir missing")
	if err := c.call(rpc.MReadDir, &rpc.ReadDirReq{Dir: d.Ino, After: names[24]}, &r); err != nil || len(r.Entries) != 0 || !r.EOF {
		t.Fatalf("readdir past end = %+v %v", r, err)
	}
}

func TestNotLeaderErrno(t *testing.T) {
	s, c := newNamespace(t)
	s.ready.Store(false)
	_, err := c.getattr(1)
	wantErrno(t, err, ErrNotLeader, "request to a node that is not ready")
	if !strings.Contains(err.Error(), "leader") {
		t.Errorf("message %q", err)
	}
	s.ready.Store(true)
}

var _ = bytes.Equal

// The registration already says which file system each target lives on:
// statfs is right before the first heartbeat (df right after start-up).
func TestStatFSRightAtRegistration(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	c := newClient(t, s.Addr())
	c.registerTargetsOn("127.0.0.1:1", 7, "a1", "a2")
	c.registerTargetsOn("127.0.0.1:2", 7, "b1", "b2")
	c.registerTargetsOn("127.0.0.1:3", 9, "c1")
	var st rpc.StatFSResp
	if err := c.call(rpc.MStatFS, &rpc.Empty{}, &st); err != nil {
		t.Fatal(err)
	}
	// Two file systems of 1 TiB, 512 GiB available, 513 GiB free each.
	if st.TotalBytes != 2<<40 || st.AvailBytes != 1<<40 || st.FreeBytes != 2*(1<<39+1<<30) {
		t.Fatalf("statfs before any heartbeat: total %d avail %d free %d GiB; want 2048, 1024, 1026",
			st.TotalBytes>>30, st.AvailBytes>>30, st.FreeBytes>>30)
	}
}

// Targets on one file system of one host (strata up: four targets, one
// disk) count once in statfs and the status total; another file system
// counts again.
func TestStatFSCountsSharedDiskOnce(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	c := newClient(t, s.Addr())
	a := c.registerTargets("127.0.0.1:1", "a1", "a2") // host "h"
	b := c.registerTargets("127.0.0.1:2", "b1", "b2") // host "h"
	beat := func(r rpc.RegisterServerResp, fsids ...uint64) {
		t.Helper()
		req := &rpc.ServerHeartbeatReq{ServerID: r.ServerID, FSIDs: fsids}
		for _, id := range r.TargetIDs {
			req.Targets = append(req.Targets, rpc.TargetUsage{ID: id, TotalBytes: 100 << 30, FreeBytes: 40 << 30})
		}
		if err := c.call(rpc.MServerHeartbeat, req, nil); err != nil {
			t.Fatal(err)
		}
	}
	statfs := func() (uint64, uint64) {
		t.Helper()
		var st rpc.StatFSResp
		if err := c.call(rpc.MStatFS, &rpc.Empty{}, &st); err != nil {
			t.Fatal(err)
		}
		var cs rpc.ClusterStatusResp
		if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
			t.Fatal(err)
		}
		if cs.TotalBytes != st.TotalBytes || cs.FreeBytes != st.FreeBytes {
			t.Fatalf("status total %d/%d differs from statfs %d/%d", cs.TotalBytes, cs.FreeBytes, st.TotalBytes, st.FreeBytes)
		}
		return st.TotalBytes, st.FreeBytes
	}
	// No file system ids (an older server): every target counts.
	beat(a)
	beat(b)
	if tot, free := statfs(); tot != 400<<30 || free != 160<<30 {
		t.Fatalf("without ids: %d/%d, want 400/160 GiB", tot>>30, free>>30)
	}
	// All four on one disk of host h.
	beat(a, 7, 7)
	beat(b, 7, 7)
	if tot, free := statfs(); tot != 100<<30 || free != 40<<30 {
		t.Fatalf("one shared disk: %d/%d GiB, want 100/40", tot>>30, free>>30)
	}
	// Server b's targets on a second disk.
	beat(b, 8, 8)
	if tot, _ := statfs(); tot != 200<<30 {
		t.Fatalf("two disks: %d GiB, want 200", tot>>30)
	}
	// Blocks reserved for root: free (df's Used) counts them, available
	// does not.
	req := &rpc.ServerHeartbeatReq{ServerID: a.ServerID, FSIDs: []uint64{7, 7}, RawFree: []uint64{50 << 30, 50 << 30}}
	for _, id := range a.TargetIDs {
		req.Targets = append(req.Targets, rpc.TargetUsage{ID: id, TotalBytes: 100 << 30, FreeBytes: 40 << 30})
	}
	if err := c.call(rpc.MServerHeartbeat, req, nil); err != nil {
		t.Fatal(err)
	}
	var st rpc.StatFSResp
	if err := c.call(rpc.MStatFS, &rpc.Empty{}, &st); err != nil {
		t.Fatal(err)
	}
	if st.FreeBytes != 90<<30 || st.AvailBytes != 80<<30 {
		t.Fatalf("free %d avail %d GiB, want 90 and 80", st.FreeBytes>>30, st.AvailBytes>>30)
	}
}

// A metadata store whose engine keeps failing (its directory vanished)
// shows in the cluster status, naming the store; a healthy one shows none.
func TestStatusReportsFailingStore(t *testing.T) {
	s, c := newNamespace(t)
	for i := 0; i < 50; i++ {
		c.mustCreate(1, fmt.Sprintf("f%d", i), fileMode)
	}
	var cs rpc.ClusterStatusResp
	if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs.Problems) != 0 {
		t.Fatalf("healthy service reports problems: %q", cs.Problems)
	}
	fsmDir := filepath.Join(s.cfg.DataDir, "fsm")
	if err := os.RemoveAll(fsmDir); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- s.db.Flush() }() // fails, and the engine retries in the background
	if err := testutil.WaitFor(10*time.Second, func() error {
		if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
			return err
		}
		for _, p := range cs.Problems {
			if strings.HasPrefix(p, "metadata store: ") && strings.Contains(p, fsmDir) && strings.Contains(p, "background errors") {
				return nil
			}
		}
		return fmt.Errorf("problems %q do not name the failing store %s", cs.Problems, fsmDir)
	}); err != nil {
		t.Fatal(err)
	}
	// The directory is back (the disk returned): the engine's retries
	// succeed, and so do the flush and the service's close.
	if err := os.MkdirAll(fsmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("flush once the directory is back: %v", err)
	}
}

// A target that was registered before (its identity records an id) but is
// unknown to this service holds another file system's chunks: refused with
// EXDEV, and nothing is registered. Known targets re-register with their id.
func TestRegisterRefusesForeignTarget(t *testing.T) {
	_, c := newNamespace(t) // registers u1, u2, u3 as targets 1..3
	reg := func(ts ...rpc.TargetReg) (rpc.RegisterServerResp, error) {
		var resp rpc.RegisterServerResp
		err := c.call(rpc.MRegisterServer, &rpc.RegisterServerReq{Addr: "127.0.0.1:2", Host: "h2", Targets: ts}, &resp)
		return resp, err
	}
	_, err := reg(rpc.TargetReg{UUID: "fresh", Path: "/t/fresh"}, rpc.TargetReg{UUID: "old", Path: "/t/old", PrevID: 7})
	wantErrno(t, err, syscall.EXDEV, "register a target that was target 7 elsewhere")
	if !strings.Contains(err.Error(), "/t/old") || !strings.Contains(err.Error(), "another Strata file system") {
		t.Fatalf("refusal does not say which target and why: %v", err)
	}
	var lt rpc.ListTargetsResp
	if err := c.call(rpc.MListTargets, &rpc.Empty{}, &lt); err != nil {
		t.Fatal(err)
	}
	if len(lt.Targets) != 3 {
		t.Fatalf("a refused registration registered targets: %+v", lt.Targets)
	}
	// A known target with its id, and a new one, register.
	resp, err := reg(rpc.TargetReg{UUID: "u2", Path: "/t/u2", PrevID: 2}, rpc.TargetReg{UUID: "fresh", Path: "/t/fresh"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.TargetIDs[0] != 2 || resp.TargetIDs[1] != 4 {
		t.Fatalf("target ids %v, want [2 4]", resp.TargetIDs)
	}
}

// Below the metadata disk's reserve, operations that grow the namespace
// fail with ENOSPC naming the disk; removals still work, status says so,
// and all is back once there is room.
func TestMetadataDiskReserve(t *testing.T) {
	s, c := newNamespace(t)
	c.mustCreate(1, "kept", fileMode)
	c.mustCreate(1, "gone", fileMode)
	s.disk.reserve.Store(1 << 62) // more than any disk has
	_, err := c.create(1, "new", fileMode)
	wantErrno(t, err, syscall.ENOSPC, "create on a full metadata disk")
	if !strings.Contains(err.Error(), "metadata disk of "+s.cfg.DataDir) {
		t.Fatalf("the error does not name the metadata disk: %v", err)
	}
	_, err = c.create(1, "newdir", dirMode)
	wantErrno(t, err, syscall.ENOSPC, "mkdir on a full metadata disk")
	_, err = c.tmpfile(1, fileMode)
	wantErrno(t, err, syscall.ENOSPC, "O_TMPFILE on a full metadata disk")
	if _, err := c.unlink(1, "gone"); err != nil {
		t.Fatalf("unlink on a full metadata disk: %v", err)
	}
	var cs rpc.ClusterStatusResp
	if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs.Problems) != 1 || !strings.Contains(cs.Problems[0], "below its reserve") {
		t.Fatalf("status problems %q, want the metadata disk", cs.Problems)
	}
	s.disk.reserve.Store(1 << 20)
	c.mustCreate(1, "new", fileMode)
}

// A target's inode ceiling, from its registration or its server's
// heartbeats, is never handed out below again: a metadata store restored
// from an older copy skips the numbers whose chunks the targets hold.
// Ceilings at or below the next number change nothing.
func TestInoCeilingRaisesNextIno(t *testing.T) {
	s, c := newNamespace(t)
	a := c.mustCreate(1, "a", fileMode)
	reg := func(ceiling uint64) rpc.RegisterServerResp {
		t.Helper()
		var resp rpc.RegisterServerResp
		req := &rpc.RegisterServerReq{Addr: "127.0.0.1:1", Host: "h", Targets: []rpc.TargetReg{
			{UUID: "u1", Path: "/t/u1", TotalBytes: 1 << 40, FreeBytes: 1 << 39, PrevID: 1, InoCeiling: ceiling}}}
		if err := c.call(rpc.MRegisterServer, req, &resp); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	reg(a.Ino) // below the next number: nothing changes
	if b := c.mustCreate(1, "b", fileMode); b.Ino != a.Ino+1 {
		t.Fatalf("a ceiling below the next inode moved it: b is %d after a %d", b.Ino, a.Ino)
	}
	const regCeiling = 5 * rpc.InoCeilingStep
	resp := reg(regCeiling)
	if f := c.mustCreate(1, "c", fileMode); f.Ino != regCeiling {
		t.Fatalf("after a registration with ceiling %d the next file is %d", regCeiling, f.Ino)
	}
	const beatCeiling = regCeiling + 12345
	beat := &rpc.ServerHeartbeatReq{ServerID: resp.ServerID, Targets: []rpc.TargetUsage{{ID: resp.TargetIDs[0], TotalBytes: 1 << 40, FreeBytes: 1 << 39}}, InoCeiling: beatCeiling}
	if err := c.call(rpc.MServerHeartbeat, beat, nil); err != nil {
		t.Fatal(err)
	}
	if f := c.mustCreate(1, "d", fileMode); f.Ino != beatCeiling {
		t.Fatalf("after a heartbeat with ceiling %d the next file is %d", beatCeiling, f.Ino)
	}
	// Durable: the raised counter survives a restart.
	cfg := s.cfg
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openService(t, cfg)
	c2 := newClient(t, s2.Addr())
	c2.registerTargets("127.0.0.1:1", "u1", "u2", "u3")
	if f := c2.mustCreate(1, "e", fileMode); f.Ino != beatCeiling+1 {
		t.Fatalf("after a restart the next file is %d, want %d", f.Ino, beatCeiling+1)
	}
}

// Registration entries written before inode ceilings existed (no
// trailing section) still decode, with no ceilings.
func TestRegisterCommandWithoutCeilings(t *testing.T) {
	c := command{Op: opRegister, Now: 1, Addr: "a:1", Host: "h", Targets: []targetReg{
		{UUID: "u1", Path: "/p1", InoCeiling: 7}, {UUID: "u2", Path: "/p2", InoCeiling: 9}}}
	b := c.encode(nil)
	var got command
	if err := decodeCommand(b, &got); err != nil || got.Targets[0].InoCeiling != 7 || got.Targets[1].InoCeiling != 9 {
		t.Fatalf("decode: %v %+v", err, got.Targets)
	}
	section := &rpc.Enc{}
	for _, t := range c.Targets {
		section.U64(t.InoCeiling)
	}
	old := b[:len(b)-len(section.B)]
	if err := decodeCommand(old, &got); err != nil || len(got.Targets) != 2 || got.Targets[1].UUID != "u2" ||
		got.Targets[0].InoCeiling != 0 || got.Targets[1].InoCeiling != 0 {
		t.Fatalf("decode of the old format: %v %+v", err, got.Targets)
	}
	if err := decodeCommand(b[:len(b)-1], &got); err == nil {
		t.Fatal("a cut ceiling section decoded")
	}
}

// MInodesKnown tells existing inodes (files, directories, unlinked ones
// whose chunks the reaper has yet to remove) from numbers the namespace
// does not know, with the next number.
func TestInodesKnown(t *testing.T) {
	_, c := newNamespace(t)
	f := c.mustCreate(1, "f", fileMode)
	d := c.mustCreate(1, "d", dirMode)
	gone := c.mustCreate(1, "gone", fileMode)
	if _, err := c.unlink(1, "gone"); err != nil {
		t.Fatal(err)
	}
	var r rpc.InodesKnownResp
	inos := []uint64{rootIno, f.Ino, d.Ino, gone.Ino, d.Ino + 1000}
	if err := c.call(rpc.MInodesKnown, &rpc.InodesKnownReq{Inos: inos}, &r); err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, true, true, false}; !slices.Equal(r.Known, want) {
		t.Fatalf("known %v for %v, want %v", r.Known, inos, want)
	}
	if r.NextIno != gone.Ino+1 {
		t.Fatalf("next inode %d, want %d", r.NextIno, gone.Ino+1)
	}
	err := c.call(rpc.MInodesKnown, &rpc.InodesKnownReq{Inos: make([]uint64, rpc.MaxInodesKnown+1)}, &r)
	wantErrno(t, err, syscall.EINVAL, "too many inode numbers")
}

// TestChangesAnswerTheirDirectories: rmdir, rename and link answer the
// attributes they left on the directories (and entries) they changed,
// exactly what a getattr says right after, so a client can serve the
// kernel's next GETATTR of them without asking; a retry's answer, replayed
// from the dedupe table, goes without them.
func TestChangesAnswerTheirDirectories(t *testing.T) {
	_, c := newNamespace(t)
	same := func(what string, got rpc.Attr, ino uint64) {
		t.Helper()
		want := c.mustGetattr(ino)
		want.Blocks, want.BlocksKnown = 0, false // not in these answers
		if got.Ino != ino || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: answered %+v, getattr says %+v", what, got, want)
		}
	}
	d1 := c.mustCreate(1, "d1", dirMode)
	d2 := c.mustCreate(1, "d2", dirMode)
	f := c.mustCreate(d1.Ino, "f", fileMode)
	sub := c.mustCreate(d1.Ino, "sub", dirMode)
	empty := c.mustCreate(d2.Ino, "empty", dirMode)

	rename := func(hdr rpc.ReqHeader, op uint64, on string, np uint64, nn string, flags uint32) rpc.DirChangeResp {
		t.Helper()
		var r rpc.DirChangeResp
		if err := c.call(rpc.MRename, &rpc.RenameReq{Hdr: hdr, OldParent: op, OldName: on, NewParent: np, NewName: nn, Flags: flags}, &r); err != nil {
			t.Fatalf("rename %q → %q: %v", on, nn, err)
		}
		return r
	}
	// A file from d1 to d2.
	r := rename(c.hdr(), d1.Ino, "f", d2.Ino, "g", 0)
	same("rename: old parent", r.Dir, d1.Ino)
	same("rename: new parent", r.NewDir, d2.Ino)
	same("rename: moved file", r.Entry, f.Ino)
	if r.Other.Ino != 0 || r.Index == 0 {
		t.Fatalf("rename without a victim: other %+v, stamp %+v", r.Other, r.Stamp)
	}
	// A directory over an empty one: the link counts move.
	hdr := c.hdr()
	r = rename(hdr, d1.Ino, "sub", d2.Ino, "empty", 0)
	same("rename dir: old parent", r.Dir, d1.Ino)
	same("rename dir: new parent", r.NewDir, d2.Ino)
	same("rename dir: moved dir", r.Entry, sub.Ino)
	if r.Dir.Nlink != 2 || r.NewDir.Nlink != 3 || r.Other.Ino != empty.Ino || r.Other.Nlink != 0 {
		t.Fatalf("rename over an empty dir: old parent nlink %d (want 2), new parent %d (want 3), replaced %+v (want inode %d, nlink 0)",
			r.Dir.Nlink, r.NewDir.Nlink, r.Other, empty.Ino)
	}
	// The retry of that rename is answered from the dedupe table: the
	// same stamp, no attributes.
	again := rename(hdr, d1.Ino, "sub", d2.Ino, "empty", 0)
	if again.Stamp != r.Stamp || again.Dir.Ino != 0 || again.NewDir.Ino != 0 || again.Entry.Ino != 0 {
		t.Fatalf("retried rename answered %+v, first %+v", again, r)
	}
	// An exchange within one directory.
	c.mustCreate(d2.Ino, "h", fileMode)
	r = rename(c.hdr(), d2.Ino, "g", d2.Ino, "h", rpc.RenameExchange)
	same("exchange: directory", r.Dir, d2.Ino)
	same("exchange: directory (new)", r.NewDir, d2.Ino)
	same("exchange: moved", r.Entry, f.Ino)
	if r.Other.Ino == 0 || r.Other.Ino == f.Ino {
		t.Fatalf("exchange: other %+v", r.Other)
	}
	// A link into d1.
	var la rpc.LinkResp
	if err := c.call(rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: f.Ino, NewParent: d1.Ino, NewName: "f2"}, &la); err != nil {
		t.Fatal(err)
	}
	same("link: new parent", la.Dir, d1.Ino)
	// Rmdir: the parent, and the removed directory with no links.
	var rr rpc.DirChangeResp
	if err := c.call(rpc.MRmdir, &rpc.EntryReq{Hdr: c.hdr(), Parent: d2.Ino, Name: "empty"}, &rr); err != nil {
		t.Fatal(err)
	}
	same("rmdir: parent", rr.Dir, d2.Ino)
	if rr.Dir.Nlink != 2 || rr.Entry.Ino != sub.Ino || rr.Entry.Nlink != 0 || rr.Index == 0 {
		t.Fatalf("rmdir answered parent nlink %d (want 2), removed %+v (want inode %d, nlink 0), stamp %+v", rr.Dir.Nlink, rr.Entry, sub.Ino, rr.Stamp)
	}
}
