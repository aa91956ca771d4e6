package nfs_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/nfs"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// attrCluster is a cluster whose gateway keeps attributes for ttl, a
// client of it as uid 1000, and a file "f" (0644, uid 1000, 4 KiB) in
// directory "d" (uid 1000's)
// written and read over NFS (so that its attributes are cached), and
// another client of the cluster (a FUSE mount's library elsewhere).
type attrCluster struct {
	cl    *cluster
	f     fs
	dir   []byte
	file  []byte
	ino   uint64
	dino  uint64
	other *client.Client
}

func startAttrCluster(t *testing.T, ttl time.Duration) *attrCluster {
	cl := startCluster(t)
	cl.gatewayCfg = func(c *nfs.Config) { c.AttrTimeout = ttl }
	g := cl.startGateway("/=rw,sync,clients=127.0.0.1")
	ac := &attrCluster{cl: cl, f: fs{t, g.dial(t, "", 1000, 1000)}, other: cl.newClient()}
	root := mount(t, ac.f.c, "/")
	ctx := context.Background()
	d, err := ac.other.Mkdir(ctx, 1, "d", 0o755, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ac.other.Create(ctx, d.Ino, "f", 0o644, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := ac.other.SyncMeta(ctx); err != nil {
		t.Fatal(err)
	}
	ac.ino, ac.dino = a.Ino, d.Ino
	st, dh := ac.f.lookup(root, "d")
	want(t, "lookup d", st, xdr.NFS3_OK)
	ac.dir = dh
	st, h := ac.f.lookup(dh, "f")
	want(t, "lookup f", st, xdr.NFS3_OK)
	ac.file = h
	if st, _ := ac.f.write(h, 0, bytes.Repeat([]byte{1}, 4096), xdr.FILE_SYNC); st != xdr.NFS3_OK {
		t.Fatalf("write: %v", st)
	}
	if st, p, _ := ac.f.read(h, 0, 4096); st != xdr.NFS3_OK || len(p) != 4096 {
		t.Fatalf("read: %v %d bytes", st, len(p))
	}
	return ac
}

// appendElsewhere appends 4 KiB of 2s to the file through the other
// client, durably, as a FUSE mount's write and close would.
func (ac *attrCluster) appendElsewhere(t *testing.T) {
	ctx := context.Background()
	fl, err := ac.other.Open(ctx, ac.ino, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.WriteAt(ctx, bytes.Repeat([]byte{2}, 4096), 4096); err != nil {
		t.Fatal(err)
	}
	if err := fl.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fl.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// With attributes kept for an hour, a change made elsewhere is still seen
// by the NFS client's close-to-open revalidation: GETATTR asks the
// metadata service, and the READs after it read the new size. So is a
// permission change (ACCESS asks too, and READ is refused after the
// GETATTR).
func TestAttrCacheCloseToOpen(t *testing.T) {
	ac := startAttrCluster(t, time.Hour)
	f := ac.f
	ac.appendElsewhere(t)
	st, attr := f.getattr(ac.file)
	want(t, "getattr", st, xdr.NFS3_OK)
	if attr.Size != 8192 {
		t.Fatalf("GETATTR after a change elsewhere: size %d, want 8192", attr.Size)
	}
	st, p, eof := f.read(ac.file, 4096, 4096)
	if st != xdr.NFS3_OK || !bytes.Equal(p, bytes.Repeat([]byte{2}, 4096)) || !eof {
		t.Fatalf("READ past the old end after GETATTR: %v, %d bytes, eof %v; want the 4 KiB appended elsewhere", st, len(p), eof)
	}
	// chmod 0600 and chown to root elsewhere: uid 1000 may no longer read.
	ctx := context.Background()
	if _, err := ac.other.SetAttr(ctx, ac.ino, rpc.SetAttrReq{Valid: rpc.SetMode | rpc.SetUid, Mode: 0o600, Uid: 0}); err != nil {
		t.Fatal(err)
	}
	st, _ = f.getattr(ac.file)
	want(t, "getattr after chmod", st, xdr.NFS3_OK)
	st, _, _ = f.read(ac.file, 0, 4096)
	want(t, "READ of a file made 0600 root's elsewhere, after GETATTR", st, xdr.NFS3ERR_ACCES)
}

// Without a GETATTR, READ sees a change made elsewhere within the
// attribute timeout (and not before: the cache is used).
func TestAttrCacheTimeout(t *testing.T) {
	const ttl = 500 * time.Millisecond
	ac := startAttrCluster(t, ttl)
	f := ac.f
	changed := time.Now()
	ac.appendElsewhere(t)
	for {
		st, p, _ := f.read(ac.file, 0, 8192)
		want(t, "read", st, xdr.NFS3_OK)
		if len(p) == 8192 {
			break
		}
		if len(p) != 4096 {
			t.Fatalf("read %d bytes, want 4096 (cached size) or 8192", len(p))
		}
		if time.Since(changed) > ttl+5*time.Second {
			t.Fatalf("READ still bounded by the old size %v after the change elsewhere (attribute timeout %v)", time.Since(changed), ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(changed); d > ttl+5*time.Second {
		t.Fatalf("the change showed after %v, attribute timeout %v", d, ttl)
	}
}

// A file removed through the gateway is STALE at once even with
// attributes kept for an hour; one removed elsewhere once the attribute
// timeout has passed.
func TestAttrCacheRemoved(t *testing.T) {
	ac := startAttrCluster(t, time.Hour)
	want(t, "remove", ac.f.remove(ac.dir, "f"), xdr.NFS3_OK)
	st, _, _ := ac.f.read(ac.file, 0, 4096)
	want(t, "READ of a handle removed through the gateway", st, xdr.NFS3ERR_STALE)
	st, _ = ac.f.write(ac.file, 0, []byte("x"), xdr.UNSTABLE)
	want(t, "WRITE of a handle removed through the gateway", st, xdr.NFS3ERR_STALE)

	const ttl = 300 * time.Millisecond
	ac = startAttrCluster(t, ttl)
	ctx := context.Background()
	if _, err := ac.other.Unlink(ctx, ac.dino, "f"); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	for {
		st, _, _ := ac.f.read(ac.file, 0, 4096)
		if st == xdr.NFS3ERR_STALE {
			break
		}
		want(t, "READ before the timeout", st, xdr.NFS3_OK)
		if time.Since(removed) > ttl+5*time.Second {
			t.Fatalf("READ of a handle removed elsewhere still answered %v later (attribute timeout %v)", time.Since(removed), ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, _ = ac.f.getattr(ac.file)
	want(t, "GETATTR of a handle removed elsewhere", st, xdr.NFS3ERR_STALE)
}

// READ and WRITE use the cached attributes: they cost no metadata call
// until the timeout, and a WRITE's post-operation attributes show its
// size and mtime.
func TestAttrCacheCalls(t *testing.T) {
	ac := startAttrCluster(t, time.Hour)
	f, c := ac.f, ac.cl.c
	gets := func() uint64 { return c.Calls("meta", rpc.MGetAttr) + c.Calls("meta", rpc.MLookup) }
	before := gets()
	for i := 0; i < 10; i++ {
		if st, p, _ := f.read(ac.file, 0, 4096); st != xdr.NFS3_OK || len(p) != 4096 {
			t.Fatalf("read: %v %d", st, len(p))
		}
	}
	if n := gets() - before; n != 0 {
		t.Fatalf("10 READs made %d metadata calls, want 0", n)
	}
	before = gets()
	_, pre := f.getattr(ac.file)
	time.Sleep(10 * time.Millisecond) // a later mtime
	for i := 0; i < 10; i++ {
		st, ok := f.write(ac.file, 4096+uint64(i)*4, []byte("abcd"), xdr.UNSTABLE)
		if st != xdr.NFS3_OK {
			t.Fatalf("write: %v", st)
		}
		post := ok.File_wcc.After.Attributes()
		if !ok.File_wcc.After.Attributes_follow || post.Size != 4096+uint64(i+1)*4 || nsOf(post.Mtime) <= nsOf(pre.Mtime) {
			t.Fatalf("WRITE %d: post-operation attributes %v: size %d mtime %v, want size %d and an mtime after %v",
				i, ok.File_wcc.After.Attributes_follow, post.Size, post.Mtime, 4096+(i+1)*4, pre.Mtime)
		}
	}
	if n := gets() - before; n != 1 {
		t.Fatalf("a GETATTR and 10 WRITEs made %d metadata calls, want 1", n)
	}
	st, attr := f.getattr(ac.file)
	if want(t, "getattr", st, xdr.NFS3_OK); attr.Size != 4096+40 {
		t.Fatalf("GETATTR after the WRITEs: size %d, want %d", attr.Size, 4096+40)
	}
}

func nsOf(t xdr.Nfstime3) int64 { return int64(t.Seconds)*1e9 + int64(t.Nseconds) }
