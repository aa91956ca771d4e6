package nfs_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/testutil"
)

// TestKillBeforeCommit kills a real `strata nfs` (kill -9) between
// UNSTABLE writes and their COMMIT. A client following RFC 1813 sees the
// verifier change at the COMMIT after the restart, sends its writes again
// and commits them: nothing is lost, and its handles still work.
func TestKillBeforeCommit(t *testing.T) {
	cl := startCluster(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, cl.key, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := testutil.Binary(t)
	addr := testutil.FreePort(t)
	start := func() (*testutil.Proc, fs) {
		p := testutil.StartProc(t, dir, "nfs", nil, bin, "nfs", "--meta", cl.metaAddr, "--key-file", keyFile,
			"--listen", addr, "--export", "/=rw,async,no_root_squash,clients=127.0.0.1")
		t.Cleanup(p.Kill)
		var c *nfstest.Client
		if err := testutil.WaitFor(20*time.Second, func() (err error) {
			c, err = nfstest.Dial(addr, "")
			return err
		}); err != nil {
			t.Fatalf("gateway not listening: %v\n%s", err, p.Tail(20))
		}
		t.Cleanup(func() { c.Close() })
		c.As(0, 0)
		return p, fs{t, c}
	}
	p, f := start()
	root := mount(t, f.c, "/")
	st, file := f.create(root, "f", xdr.GUARDED, 0o644, 0)
	want(t, "create", st, xdr.NFS3_OK)
	data := randomBytes(t, 5<<20+333)
	var verf xdr.Writeverf3
	writeAll := func() {
		t.Helper()
		for off := 0; off < len(data); off += 1 << 20 {
			end := min(off+1<<20, len(data))
			st, w := f.write(file, uint64(off), data[off:end], xdr.UNSTABLE)
			if st != xdr.NFS3_OK || w.Committed != xdr.UNSTABLE {
				t.Fatalf("write at %d: %v", off, st)
			}
			verf = w.Verf
		}
	}
	writeAll()
	p.Kill()

	_, f = start()
	st, cv := f.commit(file)
	want(t, "commit after the kill", st, xdr.NFS3_OK)
	if cv == verf {
		t.Fatal("the verifier is the same after a kill -9 and restart: the client would not resend")
	}
	writeAll() // what the client does on a verifier change
	if st, cv := f.commit(file); st != xdr.NFS3_OK || cv != verf {
		t.Fatalf("commit of the resent writes: %v (verifier %x, writes' %x)", st, cv, verf)
	}

	ctx := context.Background()
	other := cl.newClient()
	a, err := other.Lookup(ctx, 1, "f")
	if err != nil {
		t.Fatal(err)
	}
	fl, err := other.Open(ctx, a.Ino, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Release(ctx)
	got := make([]byte, len(data)+1)
	n, _ := fl.ReadAt(ctx, got, 0)
	if n != len(data) || !bytes.Equal(got[:n], data) {
		t.Fatalf("read %d bytes after the resend and commit, not the %d written", n, len(data))
	}
}

// TestNLMKillReclaim kills a real `strata nfs` (kill -9) while a client
// host holds a lock through it. The dead gateway's session keeps the lock
// in the metadata service (another client is refused); the gateway
// started again with the same state directory tells the host
// (SM_NOTIFY), refuses new locks in its grace period and grants the
// host's reclaim once the dead session's lease has ended — the lock is
// never free for another client in between.
func TestNLMKillReclaim(t *testing.T) {
	cl := startCluster(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, cl.key, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := nfstest.StartLockHost("hostK")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	bin := testutil.Binary(t)
	addr := testutil.FreePort(t)
	state := filepath.Join(dir, "nlm-state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	// The restarted gateway serves NLM on a port of its own (--nlm-port).
	nlmAddr := testutil.FreePort(t)
	_, nlmPort, _ := net.SplitHostPort(nlmAddr)
	start := func(grace, nlmAddr string) *testutil.Proc {
		args := []string{"nfs", "--meta", cl.metaAddr, "--key-file", keyFile,
			"--listen", addr, "--export", "/=rw,no_root_squash,clients=127.0.0.1", "--rpcbind=false",
			"--nlm-grace", grace, "--nlm-state-dir", state, "--nlm-name", "gw.test",
			"--nlm-portmap-port", strconv.Itoa(int(h.Port()))}
		if nlmAddr != addr {
			args = append(args, "--nlm-port", nlmPort)
		}
		p := testutil.StartProc(t, dir, "nfs", nil, bin, args...)
		t.Cleanup(p.Kill)
		if err := testutil.WaitFor(20*time.Second, func() error { return h.Dial(nlmAddr) }); err != nil {
			t.Fatalf("gateway not listening: %v\n%s", err, p.Tail(20))
		}
		return p
	}
	p := start("0s", addr)
	c, err := nfstest.Dial(addr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.As(0, 0)
	fh, ino := makeFile(t, c, "k")
	l := nfstest.Lock{FH: fh, Svid: 4, Exclusive: true}
	st, err := h.Lock(l, false, false)
	wantNLM(t, "NLM LOCK", st, err, xdr.NLM4_GRANTED)
	p.Kill()

	other := cl.newClient()
	wantEAGAIN(t, "another client after the gateway's kill -9", setLib(other, libLock(ino, 0, 0)))
	start("1m", nlmAddr)
	select {
	case n := <-h.Notified:
		if n.Mon_name != "gw.test" {
			t.Fatalf("SM_NOTIFY from %q, want gw.test", n.Mon_name)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no SM_NOTIFY 30 s after the gateway restarted")
	}
	st, err = h.Lock(nfstest.Lock{FH: fh, Svid: 5, Off: 100, Len: 1, Exclusive: true}, false, false)
	wantNLM(t, "a new lock in the grace period", st, err, xdr.NLM4_DENIED_GRACE_PERIOD)
	began := time.Now()
	st, err = h.Lock(l, false, true)
	wantNLM(t, "the reclaim", st, err, xdr.NLM4_GRANTED)
	t.Logf("reclaim granted after %v (the dead gateway's session lease)", time.Since(began).Round(time.Millisecond))
	wantEAGAIN(t, "another client under the reclaimed lock", setLib(other, libLock(ino, 0, 0)))
}
