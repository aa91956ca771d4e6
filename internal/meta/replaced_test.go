package meta

import (
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// TestRestartedMountClosesItsOldSession: a session opened by another
// process for the same host and mount point closes the older one at once
// (its heartbeat is refused, its lock is free for others); a session of
// another mount point, of the same process, or of an NFS gateway stays.
func TestRestartedMountClosesItsOldSession(t *testing.T) {
	s, c := newNamespace(t)
	open := func(host, mount string, pid uint32) *client {
		t.Helper()
		x := newClient(t, s.Addr())
		var resp rpc.SessionOpenResp
		if err := x.call(rpc.MSessionOpen, &rpc.SessionOpenReq{Host: host, MountPoint: mount, Pid: pid}, &resp); err != nil {
			t.Fatalf("session open: %v", err)
		}
		x.id = resp.ClientID
		return x
	}
	f := c.mustCreate(rootIno, "f", fileMode)
	old := open("node1", "/mnt/strata", 100)
	other := open("node1", "/mnt/other", 101)
	gw := open("node1", "nfs://10.0.0.1:2049", 102)
	gw2 := open("node1", "nfs://10.0.0.1:2049", 103)
	lock := func(x *client) error {
		return x.call(rpc.MSetLk, &rpc.LockReq{ClientID: x.id, Ino: f.Ino, Owner: 1, End: 10, Type: rpc.LockWrite, Pid: 1}, nil)
	}
	if err := lock(old); err != nil {
		t.Fatalf("lock of the first mount: %v", err)
	}
	if err := lock(other); err == nil {
		t.Fatal("a second writer got the lock the first mount holds")
	}
	restarted := open("node1", "/mnt/strata", 200)
	if err := old.heartbeat(); rpc.ErrnoOf(err) != syscall.ESTALE {
		t.Fatalf("heartbeat of the replaced session: %v, want ESTALE", err)
	}
	if err := lock(restarted); err != nil {
		t.Fatalf("the restarted mount cannot take the dead one's lock: %v", err)
	}
	open("node1", "/mnt/strata", 200) // another client of the restarted mount's process
	for name, x := range map[string]*client{"other mount point": other, "same process": restarted, "gateway": gw, "second gateway": gw2} {
		if err := x.heartbeat(); err != nil {
			t.Errorf("%s: heartbeat: %v (closed with the restarted mount's predecessor?)", name, err)
		}
	}
}
