package nfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/fuse"
	"github.com/stratafs/strata/internal/nfs"
	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// lockGateway starts a cluster, a client host "hostA" and a gateway (NLM
// grace period as given) whose GRANTED callbacks reach the host (the
// gateway asks the host's port mapper, which the host serves itself), and
// creates a file over NFS: its handle and inode.
func lockGateway(t *testing.T, grace time.Duration) (*cluster, *gateway, *nfstest.LockHost, []byte, uint64) {
	return lockGatewayWith(t, func(c *nfs.Config) { c.NLMGrace = grace })
}

// lockGatewayWith is lockGateway with the gateway's configuration changed
// by mod.
func lockGatewayWith(t *testing.T, mod func(*nfs.Config)) (*cluster, *gateway, *nfstest.LockHost, []byte, uint64) {
	t.Helper()
	cl := startCluster(t)
	h, err := nfstest.StartLockHost("hostA")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	g := cl.startGatewayWith(func(c *nfs.Config) { mod(c); c.NLMPortmapPort = h.Port() },
		"/=rw,no_root_squash,clients=127.0.0.1")
	if err := h.Dial(g.addr); err != nil {
		t.Fatal(err)
	}
	fh, ino := makeFile(t, g.dial(t, "", 0, 0), "locked.dat")
	return cl, g, h, fh, ino
}

// makeFile mounts "/" and creates name in it over NFS: its handle and
// inode number.
func makeFile(t *testing.T, c *nfstest.Client, name string) ([]byte, uint64) {
	t.Helper()
	root, err := c.MountRoot("/")
	if err != nil {
		t.Fatal(err)
	}
	fh, err := c.Create(root, name, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	attr, err := c.Getattr(fh)
	if err != nil {
		t.Fatal(err)
	}
	return fh, attr.Fileid
}

// otherHost is a second client host on g (its callbacks are not served).
func otherHost(t *testing.T, g *gateway, name string) *nfstest.LockHost {
	t.Helper()
	h, err := nfstest.StartLockHost(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Dial(g.addr); err != nil {
		t.Fatal(err)
	}
	return h
}

func wantNLM(t *testing.T, what string, got xdr.Nlm4_stats, err error, exp xdr.Nlm4_stats) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got != exp {
		t.Fatalf("%s: %v, want %v", what, got, exp)
	}
}

// mountFUSE mounts the cluster with another client (another machine).
func mountFUSE(t *testing.T, cl *cluster) string {
	t.Helper()
	testutil.RequireFUSE(t)
	c := cl.newClient()
	dir := t.TempDir()
	m, err := fuse.Mount(c, dir, fuse.Options{})
	if err != nil {
		t.Skipf("cannot mount FUSE: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return dir
}

// setlk is fcntl(F_SETLK) on [start, start+n) of f.
func setlk(f *os.File, typ int16, start, n int64) error {
	return syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &syscall.Flock_t{Type: typ, Start: start, Len: n})
}

func wantEAGAIN(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EACCES) {
		t.Fatalf("%s: %v, want EAGAIN (a conflicting lock)", what, err)
	}
}

// TestNLMAgainstFUSE: locks taken over NFS (NLM) and on a FUSE mount of
// the same cluster exclude each other both ways; TEST names a FUSE
// holder; a blocked NLM lock is granted through the GRANTED callback once
// the FUSE holder unlocks; a cancelled one is not.
func TestNLMAgainstFUSE(t *testing.T) {
	cl, _, h, fh, _ := lockGateway(t, 0)
	dir := mountFUSE(t, cl)
	f, err := os.OpenFile(filepath.Join(dir, "locked.dat"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	whole := nfstest.Lock{FH: fh, Svid: 11, Exclusive: true}

	// NLM holds: FUSE is refused, and sees the holder.
	st, err := h.Lock(whole, false, false)
	wantNLM(t, "NLM LOCK of a free file", st, err, xdr.NLM4_GRANTED)
	wantEAGAIN(t, "FUSE F_SETLK under an NLM lock", setlk(f, syscall.F_WRLCK, 0, 10))
	wantEAGAIN(t, "FUSE F_SETLK F_RDLCK under an NLM write lock", setlk(f, syscall.F_RDLCK, 1000, 10))
	gl := syscall.Flock_t{Type: syscall.F_WRLCK, Start: 5, Len: 1}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &gl); err != nil || gl.Type != syscall.F_WRLCK {
		t.Fatalf("FUSE F_GETLK under an NLM lock: %v, type %d", err, gl.Type)
	}
	st, err = h.Unlock(whole)
	wantNLM(t, "NLM UNLOCK", st, err, xdr.NLM4_GRANTED)
	if err := setlk(f, syscall.F_WRLCK, 0, 100); err != nil {
		t.Fatalf("FUSE F_SETLK after the NLM unlock: %v", err)
	}

	// FUSE holds [0, 100): TEST names it, LOCK is denied, a lock beside
	// it is free.
	st, holder, err := h.Test(nfstest.Lock{FH: fh, Svid: 12, Off: 50, Len: 10, Exclusive: true})
	wantNLM(t, "NLM TEST under a FUSE lock", st, err, xdr.NLM4_DENIED)
	if !holder.Exclusive || holder.L_offset != 0 || holder.L_len != 100 {
		t.Fatalf("NLM TEST holder %+v, want exclusive [0, 100)", holder)
	}
	st, _, err = h.Test(nfstest.Lock{FH: fh, Svid: 12, Off: 0, Len: 1})
	wantNLM(t, "NLM TEST of a shared lock under a FUSE write lock", st, err, xdr.NLM4_DENIED)
	st, _, err = h.Test(nfstest.Lock{FH: fh, Svid: 12, Off: 100, Len: 10, Exclusive: true})
	wantNLM(t, "NLM TEST beside the FUSE lock", st, err, xdr.NLM4_GRANTED)
	part := nfstest.Lock{FH: fh, Svid: 12, Off: 40, Len: 20, Exclusive: true}
	st, err = h.Lock(part, false, false)
	wantNLM(t, "NLM LOCK (not blocking) under a FUSE lock", st, err, xdr.NLM4_DENIED)

	// A blocking request waits; the client polls; the FUSE unlock lets
	// it in and the gateway calls back.
	st, err = h.Lock(part, true, false)
	wantNLM(t, "NLM LOCK (blocking) under a FUSE lock", st, err, xdr.NLM4_BLOCKED)
	st, err = h.Lock(part, true, false)
	wantNLM(t, "NLM LOCK (blocking) asked again", st, err, xdr.NLM4_BLOCKED)
	select {
	case g := <-h.Granted:
		t.Fatalf("GRANTED while the FUSE lock is held: %+v", g)
	default:
	}
	if err := setlk(f, syscall.F_UNLCK, 0, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-h.Granted:
		if g.Alock.Svid != part.Svid || g.Alock.L_offset != part.Off || g.Alock.L_len != part.Len || !g.Exclusive ||
			string(g.Alock.Fh) != string(fh) || g.Alock.Caller_name != "hostA" {
			t.Fatalf("GRANTED for %+v, want the blocked lock %+v", g, part)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no GRANTED callback 30 s after the FUSE holder unlocked")
	}
	wantEAGAIN(t, "FUSE F_SETLK under the granted NLM lock", setlk(f, syscall.F_WRLCK, 45, 1))
	if err := setlk(f, syscall.F_WRLCK, 60, 10); err != nil {
		t.Fatalf("FUSE F_SETLK beside the NLM lock: %v", err)
	}
	st, err = h.Unlock(part)
	wantNLM(t, "NLM UNLOCK of the granted lock", st, err, xdr.NLM4_GRANTED)
	if err := setlk(f, syscall.F_WRLCK, 0, 100); err != nil {
		t.Fatalf("FUSE F_SETLK after the NLM unlock: %v", err)
	}

	// A cancelled blocking request takes nothing: once CANCEL is
	// answered, the FUSE holder can let go and lock again.
	st, err = h.Lock(part, true, false)
	wantNLM(t, "NLM LOCK (blocking) again", st, err, xdr.NLM4_BLOCKED)
	st, err = h.Cancel(part)
	wantNLM(t, "NLM CANCEL", st, err, xdr.NLM4_GRANTED)
	if err := setlk(f, syscall.F_UNLCK, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := setlk(f, syscall.F_WRLCK, 0, 100); err != nil {
		t.Fatalf("FUSE F_SETLK after a cancelled NLM request: %v", err)
	}
	select {
	case g := <-h.Granted:
		t.Fatalf("GRANTED after CANCEL: %+v", g)
	default:
	}
}

// TestNLMRestartNotifies: a gateway with a state directory records the
// hosts that lock; started again, it tells them (SM_NOTIFY, from the name
// it is given) and grants their reclaims in its grace period.
func TestNLMRestartNotifies(t *testing.T) {
	state := t.TempDir()
	cfg := func(grace time.Duration) func(*nfs.Config) {
		return func(c *nfs.Config) { c.NLMGrace, c.NLMStateDir, c.NLMName = grace, state, "gw.example" }
	}
	cl, g, h, fh, _ := lockGatewayWith(t, cfg(0))
	l := nfstest.Lock{FH: fh, Svid: 9, Len: 10, Exclusive: true}
	st, err := h.Lock(l, false, false)
	wantNLM(t, "NLM LOCK", st, err, xdr.NLM4_GRANTED)
	list, err := os.ReadFile(filepath.Join(state, "nlm-hosts"))
	if err != nil || string(list) != "hostA 127.0.0.1 127.0.0.1\n" {
		t.Fatalf("monitored hosts after a lock: %q, %v", list, err)
	}
	g.stop()
	select {
	case n := <-h.Notified:
		t.Fatalf("SM_NOTIFY before the restart: %+v", n)
	default:
	}
	g2 := cl.startGatewayWith(func(c *nfs.Config) { cfg(time.Hour)(c); c.NLMPortmapPort = h.Port() },
		"/=rw,no_root_squash,clients=127.0.0.1")
	select {
	case n := <-h.Notified:
		if n.Mon_name != "gw.example" || n.State%2 != 1 {
			t.Fatalf("SM_NOTIFY %+v, want from gw.example with an odd state", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no SM_NOTIFY 30 s after the gateway restarted")
	}
	if err := h.Dial(g2.addr); err != nil {
		t.Fatal(err)
	}
	st, err = h.Lock(l, false, true)
	wantNLM(t, "NLM LOCK reclaim after the restart", st, err, xdr.NLM4_GRANTED)
	st, err = h.Lock(nfstest.Lock{FH: fh, Svid: 10, Off: 100, Len: 10, Exclusive: true}, false, false)
	wantNLM(t, "a new NLM LOCK after the restart", st, err, xdr.NLM4_DENIED_GRACE_PERIOD)
	if list, err := os.ReadFile(filepath.Join(state, "nlm-hosts")); err != nil || !strings.HasPrefix(string(list), "hostA ") {
		t.Fatalf("monitored hosts after the reclaim: %q, %v", list, err)
	}
}

// libLock is a lock of another client library session (another machine's
// mount) on ino.
func libLock(ino, start, end uint64) client.Lock {
	return client.Lock{Ino: ino, Owner: 77, Start: start, End: end, Type: rpc.LockWrite, Pid: 77}
}

func setLib(c *client.Client, l client.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.SetLk(ctx, l, false, nil)
}

// TestNLMGrace: in the grace period after a start only reclaims are
// granted (and they exclude other clients); TEST and new locks are told
// to come back later, unlocks work.
func TestNLMGrace(t *testing.T) {
	cl, _, h, fh, ino := lockGateway(t, time.Hour)
	other := cl.newClient()
	l := nfstest.Lock{FH: fh, Svid: 5, Len: 10, Exclusive: true}
	st, err := h.Lock(l, false, false)
	wantNLM(t, "NLM LOCK in the grace period", st, err, xdr.NLM4_DENIED_GRACE_PERIOD)
	st, err = h.Lock(l, true, false)
	wantNLM(t, "NLM LOCK (blocking) in the grace period", st, err, xdr.NLM4_DENIED_GRACE_PERIOD)
	st, _, err = h.Test(l)
	wantNLM(t, "NLM TEST in the grace period", st, err, xdr.NLM4_DENIED_GRACE_PERIOD)
	if err := setLib(other, libLock(ino, 0, 9)); err != nil {
		t.Fatalf("another client's lock while nothing is reclaimed: %v", err)
	}
	if err := setLib(other, client.Lock{Ino: ino, Owner: 77, End: 9, Type: rpc.LockUnlock}); err != nil {
		t.Fatal(err)
	}
	st, err = h.Lock(l, false, true)
	wantNLM(t, "NLM LOCK reclaim in the grace period", st, err, xdr.NLM4_GRANTED)
	wantEAGAIN(t, "another client under a reclaimed lock", setLib(other, libLock(ino, 5, 5)))
	st, err = h.Unlock(l)
	wantNLM(t, "NLM UNLOCK in the grace period", st, err, xdr.NLM4_GRANTED)
	if err := setLib(other, libLock(ino, 5, 5)); err != nil {
		t.Fatalf("another client after the reclaimed lock's unlock: %v", err)
	}
}

// TestNLMHostRestart: SM_NOTIFY (a client host's status monitor after its
// restart) and FREE_ALL release that host's locks, not another's; a
// blocked lock whose GRANTED callback the client refuses is released.
func TestNLMHostRestart(t *testing.T) {
	cl, g, a, fh, ino := lockGateway(t, 0)
	b := otherHost(t, g, "hostB")
	other := cl.newClient()
	st, err := a.Lock(nfstest.Lock{FH: fh, Svid: 1, Off: 0, Len: 10, Exclusive: true}, false, false)
	wantNLM(t, "hostA LOCK", st, err, xdr.NLM4_GRANTED)
	st, err = b.Lock(nfstest.Lock{FH: fh, Svid: 1, Off: 100, Len: 10, Exclusive: true}, false, false)
	wantNLM(t, "hostB LOCK", st, err, xdr.NLM4_GRANTED)
	wantEAGAIN(t, "under hostA's lock", setLib(other, libLock(ino, 0, 0)))
	wantEAGAIN(t, "under hostB's lock", setLib(other, libLock(ino, 100, 100)))

	if err := b.Notify("hostA", 3); err != nil {
		t.Fatalf("SM_NOTIFY: %v", err)
	}
	if err := setLib(other, libLock(ino, 0, 0)); err != nil {
		t.Fatalf("hostA's lock after its SM_NOTIFY: %v", err)
	}
	wantEAGAIN(t, "hostB's lock after hostA's SM_NOTIFY", setLib(other, libLock(ino, 100, 100)))
	if err := a.FreeAll("hostB", 5); err != nil {
		t.Fatalf("FREE_ALL: %v", err)
	}
	if err := setLib(other, libLock(ino, 100, 100)); err != nil {
		t.Fatalf("hostB's lock after FREE_ALL: %v", err)
	}

	// other holds [0, 0] and [100, 100]: hostA blocks on [0, 10), then
	// refuses the callback.
	blocked := nfstest.Lock{FH: fh, Svid: 2, Len: 10, Exclusive: true}
	st, err = a.Lock(blocked, true, false)
	wantNLM(t, "hostA LOCK (blocking)", st, err, xdr.NLM4_BLOCKED)
	a.Refuse.Store(true)
	if err := setLib(other, client.Lock{Ino: ino, Owner: 77, End: ^uint64(0), Type: rpc.LockUnlock}); err != nil {
		t.Fatal(err)
	}
	// The gateway takes the lock, calls back, is refused, releases it.
	if err := testutil.WaitFor(30*time.Second, func() error { return setLib(other, libLock(ino, 0, 0)) }); err != nil {
		t.Fatalf("the lock whose GRANTED callback was refused stays held: %v", err)
	}
}

// TestNLMAsync: the _MSG procedures are answered by _RES calls to the
// client's NLM service, with the call's cookie.
func TestNLMAsync(t *testing.T) {
	cl, _, h, fh, ino := lockGateway(t, 0)
	other := cl.newClient()
	if err := setLib(other, libLock(ino, 0, 9)); err != nil {
		t.Fatal(err)
	}
	result := func(what string, proc uint32, cookie []byte, err error, want xdr.Nlm4_stats) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case r := <-h.Results:
			if r.Proc != proc || string(r.Cookie) != string(cookie) || r.Stat != want {
				t.Fatalf("%s: result %+v, want proc %d, cookie %q, %v", what, r, proc, cookie, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no result in 30 s", what)
		}
	}
	l := nfstest.Lock{FH: fh, Svid: 3, Len: 10, Exclusive: true}
	cookie, err := h.Msg(nfstest.NLMProcTestMsg, l)
	result("TEST_MSG under another client's lock", nfstest.NLMProcTestRes, cookie, err, xdr.NLM4_DENIED)
	cookie, err = h.Msg(nfstest.NLMProcLockMsg, l)
	result("LOCK_MSG under another client's lock", nfstest.NLMProcLockRes, cookie, err, xdr.NLM4_DENIED)
	if err := setLib(other, client.Lock{Ino: ino, Owner: 77, End: ^uint64(0), Type: rpc.LockUnlock}); err != nil {
		t.Fatal(err)
	}
	cookie, err = h.Msg(nfstest.NLMProcLockMsg, l)
	result("LOCK_MSG", nfstest.NLMProcLockRes, cookie, err, xdr.NLM4_GRANTED)
	wantEAGAIN(t, "another client under the LOCK_MSG lock", setLib(other, libLock(ino, 0, 0)))
	cookie, err = h.Msg(nfstest.NLMProcUnlockMsg, l)
	result("UNLOCK_MSG", nfstest.NLMProcUnlockRes, cookie, err, xdr.NLM4_GRANTED)
	if err := setLib(other, libLock(ino, 0, 0)); err != nil {
		t.Fatalf("another client after UNLOCK_MSG: %v", err)
	}
}

// grantAtPoll has h block on a lock of fh (owner svid) that another
// client of cl holds, with h's GRANTED callbacks dropped, then has the
// other client let go and polls (LOCK again) within bound until the lock
// is GRANTED. It answers the other client and h's lock.
func grantAtPoll(t *testing.T, cl *cluster, h *nfstest.LockHost, fh []byte, ino uint64, svid int32, bound time.Duration) (*client.Client, nfstest.Lock) {
	t.Helper()
	other := cl.newClient()
	if err := setLib(other, libLock(ino, 0, 0)); err != nil {
		t.Fatal(err)
	}
	h.Drop.Store(true)
	l := nfstest.Lock{FH: fh, Svid: svid, Len: 10, Exclusive: true}
	st, err := h.Lock(l, true, false)
	wantNLM(t, "NLM LOCK (blocking)", st, err, xdr.NLM4_BLOCKED)
	if err := setLib(other, client.Lock{Ino: ino, Owner: 77, End: ^uint64(0), Type: rpc.LockUnlock}); err != nil {
		t.Fatal(err)
	}
	if err := testutil.WaitFor(bound, func() error {
		st, err := h.Lock(l, true, false)
		if err == nil && st != xdr.NLM4_GRANTED {
			err = errors.New(st.String())
		}
		return err
	}); err != nil {
		t.Fatalf("polling for the blocked lock: %v", err)
	}
	return other, l
}

// TestNLMPollGranted: a client whose GRANTED callbacks fail (a firewall)
// learns of its blocked lock at its next poll (LOCK asked again), and the
// gateway keeps the lock for it when its callbacks give up.
func TestNLMPollGranted(t *testing.T) {
	cl, g, h, fh, ino := lockGateway(t, 0)
	// Within 12 s: the callbacks give up (and, before the fix, released
	// the lock for a later poll to take anew) only after 1+2+4+8 s.
	other, _ := grantAtPoll(t, cl, h, fh, ino, 8, 12*time.Second)
	wantEAGAIN(t, "another client under the polled lock", setLib(other, libLock(ino, 0, 0)))
	g.stop() // ends the callback's retries
	wantEAGAIN(t, "another client once the callbacks gave up", setLib(other, libLock(ino, 0, 0)))
}

// TestNLMGarbage: malformed NLM and NSM arguments get GARBAGE_ARGS, and
// the connection goes on serving.
func TestNLMGarbage(t *testing.T) {
	_, _, h, fh, _ := lockGateway(t, 0)
	c := h.Conn()
	check := func(what string, err error) {
		t.Helper()
		var ae *nfstest.AcceptError
		if !errors.As(err, &ae) || ae.Stat != xdr.GARBAGE_ARGS {
			t.Fatalf("%s: %v, want GARBAGE_ARGS", what, err)
		}
	}
	check("LOCK without arguments", c.Call(nfstest.NLM, nfstest.NLMVersion, nfstest.NLMProcLock, nil, nil))
	check("TEST cut short", c.Call(nfstest.NLM, nfstest.NLMVersion, nfstest.NLMProcTest, &xdr.Mapping{Vers: 7, Prot: 6}, nil))
	// A cookie of none, then a caller name beyond LM_MAXSTRLEN.
	long := xdr.Diropargs3{Name: strings.Repeat("h", 2000)}
	check("UNLOCK with a 2000-byte caller name", c.Call(nfstest.NLM, nfstest.NLMVersion, nfstest.NLMProcUnlock, &long, nil))
	longName := xdr.Filename3(strings.Repeat("h", 2000))
	check("SM_NOTIFY with a 2000-byte host name", c.Call(nfstest.NSM, nfstest.NSMVersion, nfstest.NSMProcNotify, xdr.XDR_Filename3(&longName), nil))
	st, _, err := h.Test(nfstest.Lock{FH: fh, Svid: 1, Len: 1})
	wantNLM(t, "TEST after garbage", st, err, xdr.NLM4_GRANTED)
	st, err = h.Lock(nfstest.Lock{FH: []byte("not a handle"), Svid: 1, Len: 1}, false, false)
	wantNLM(t, "LOCK of a bad handle", st, err, xdr.NLM4_STALE_FH)
}

// TestNLMUnlockEndsGrant: a blocked lock granted while its GRANTED
// callbacks are lost (the client took it at its next poll) and then
// unlocked is forgotten at the UNLOCK: once another client holds the range,
// a new LOCK of it is DENIED — not answered GRANTED from the old grant,
// which the callback retries (1+2+4+8 s) would keep around — and the
// retries ending later release nothing of the other client's.
func TestNLMUnlockEndsGrant(t *testing.T) {
	cl, _, h, fh, ino := lockGateway(t, 0)
	other, l := grantAtPoll(t, cl, h, fh, ino, 9, 10*time.Second)
	st, err := h.Unlock(l)
	wantNLM(t, "NLM UNLOCK", st, err, xdr.NLM4_GRANTED)
	if err := setLib(other, libLock(ino, 0, 0)); err != nil {
		t.Fatalf("another client after the UNLOCK: %v", err)
	}
	st, err = h.Lock(l, false, false)
	wantNLM(t, "NLM LOCK (non-blocking) under another client's lock", st, err, xdr.NLM4_DENIED)
	st, err = h.Lock(l, true, false)
	if err != nil || st == xdr.NLM4_GRANTED {
		t.Fatalf("NLM LOCK (blocking) under another client's lock: %v %v", st, err)
	}
	if _, err := h.Cancel(l); err != nil {
		t.Fatal(err)
	}
}
