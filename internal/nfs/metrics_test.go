package nfs_test

import (
	"testing"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// The gateway counts its calls per procedure and the client addresses
// it serves, in the client library's registry (--metrics-addr).
func TestMetrics(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1+127.0.0.2")
	f := fs{t, g.dial(t, "", 0, 0)}
	root := mount(t, f.c, "/")
	for i := 0; i < 3; i++ {
		var res xdr.GETATTR3res
		f.call(nfstest.ProcGetattr, &xdr.GETATTR3args{Object: fh(root)}, &res)
		want(t, "getattr", res.Status, xdr.NFS3_OK)
	}
	f.call(nfstest.ProcNull, nil, nil)
	reg := cl.c.Registry()
	expect := func(what string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	counts := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "strata_nfs_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	expect("ops getattr", counts["getattr"], 3)
	expect("ops null", counts["null"], 1)
	expect("ops mount_mnt", counts["mount_mnt"], 1)
	expect("ops read", counts["read"], 0)
	clients := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "strata_nfs_clients" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	expect("clients", clients(), 1)
	f2 := fs{t, g.dial(t, "127.0.0.2:0", 0, 0)}
	f2.call(nfstest.ProcNull, nil, nil)
	expect("clients after a second address", clients(), 2)

	// A gateway started again on the same client registers afresh.
	g.stop()
	g2 := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1")
	fs{t, g2.dial(t, "", 0, 0)}.call(nfstest.ProcNull, nil, nil)
	expect("clients of the new gateway", clients(), 1)
}
