package nfs_test

import (
	"testing"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// TestWriteClearsSetuid: a WRITE by anybody but root clears setuid, and
// setgid with group execute, as a local write does (knfsd); root's write
// keeps them. Linux's client leaves this to the server.
func TestWriteClearsSetuid(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1")
	root := fs{t, g.dial(t, "", 0, 0)}
	nobody := fs{t, g.dial(t, "", 65534, 65534)}
	rootFH := mount(t, root.c, "/")
	mount(t, nobody.c, "/")
	for _, c := range []struct {
		name       string
		mode, want uint32
		w          fs
	}{
		{"suid-by-root", 0o4777, 0o4777, root},
		{"suid", 0o4777, 0o777, nobody},
		{"sgid-x", 0o2777, 0o777, nobody},
		{"sgid-nox", 0o2767, 0o2767, nobody}, // mandatory-locking mark, not a privilege
		{"both", 0o6777, 0o777, nobody},
	} {
		st, file := root.create(rootFH, c.name, xdr.GUARDED, c.mode, 0)
		want(t, "create "+c.name, st, xdr.NFS3_OK)
		if _, a := root.getattr(file); a.Mode != c.mode {
			t.Fatalf("%s: created with mode %o, want %o", c.name, a.Mode, c.mode)
		}
		if st, _ := c.w.write(file, 0, []byte("data"), xdr.UNSTABLE); st != xdr.NFS3_OK {
			t.Fatalf("%s: write: %v", c.name, st)
		}
		if _, a := root.getattr(file); a.Mode != c.want {
			t.Errorf("%s: mode %o after the write, want %o", c.name, a.Mode, c.want)
		}
	}
}
