package meta

import (
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// TestHALease, on a fake clock: one holder at a time; the holder renews;
// another gets the lease only once the TTL has passed since the last
// renewal (and not before the TTL since the leader took office), with a new
// epoch; a release frees it at once; the lease survives a restart of the
// service, which then waits the TTL before handing it to another.
func TestHALease(t *testing.T) {
	cfg := testConfig(t, "")
	fc := fakeClock(t, &cfg)
	s := openService(t, cfg)
	waitLeaderLoop(t, fc)
	c := newClient(t, s.Addr())
	const ttl = 4000
	ask := func(c *client, holder string, release bool) rpc.HALeaseResp {
		t.Helper()
		var r rpc.HALeaseResp
		if err := c.call(rpc.MHALease, &rpc.HALeaseReq{Name: "pair", Holder: holder, TTLMs: ttl, Release: release}, &r); err != nil {
			t.Fatalf("%s: %v", holder, err)
		}
		return r
	}
	fc.Advance(5 * time.Second) // past the leader's own wait after taking office
	a := ask(c, "a", false)
	if !a.Granted || a.Holder != "a" || a.RemainingMs != ttl {
		t.Fatalf("first ask: %+v", a)
	}
	if b := ask(c, "b", false); b.Granted || b.Holder != "a" || b.Epoch != a.Epoch {
		t.Fatalf("b while a holds it: %+v", b)
	}
	fc.Advance(3 * time.Second)
	if r := ask(c, "a", false); !r.Granted || r.Epoch != a.Epoch {
		t.Fatalf("a's renewal: %+v", r)
	}
	fc.Advance(3 * time.Second) // 3 s after the renewal: a still holds it
	if b := ask(c, "b", false); b.Granted || b.RemainingMs == 0 || b.RemainingMs > 1000 {
		t.Fatalf("b 3 s after a's renewal: %+v", b)
	}
	fc.Advance(1100 * time.Millisecond)
	b := ask(c, "b", false)
	if !b.Granted || b.Holder != "b" || b.Epoch != a.Epoch+1 {
		t.Fatalf("b after a's lease ran out: %+v (a's epoch %d)", b, a.Epoch)
	}
	if r := ask(c, "a", false); r.Granted {
		t.Fatalf("a took the lease back from b: %+v", r)
	}
	if r := ask(c, "a", true); r.Holder != "b" {
		t.Fatalf("a's release changed b's lease: %+v", r)
	}
	if r := ask(c, "b", true); r.Granted || r.Holder != "" {
		t.Fatalf("b's release: %+v", r)
	}
	if r := ask(c, "a", false); !r.Granted || r.Epoch != b.Epoch+1 {
		t.Fatalf("a after b's release: %+v", r)
	}

	// A restarted service keeps the holder and makes another wait the TTL
	// from its taking office, whatever the stamped expiry says.
	s.Close()
	fc.Advance(5 * time.Second) // a's stamped expiry is past
	cfg.ListenAddr = s.Addr()
	s2 := openService(t, cfg)
	c2 := newClient(t, s2.Addr())
	if r := ask(c2, "b", false); r.Granted || r.Holder != "a" {
		t.Fatalf("b at once after the restart: %+v", r)
	}
	fc.Advance(4100 * time.Millisecond)
	if r := ask(c2, "b", false); !r.Granted {
		t.Fatalf("b a TTL after the restart: %+v", r)
	}
}

// TestHALeaseRefusesBadRequests: names, holders and TTLs out of range are
// EINVAL.
func TestHALeaseRefusesBadRequests(t *testing.T) {
	s := openService(t, testConfig(t, ""))
	c := newClient(t, s.Addr())
	for _, req := range []rpc.HALeaseReq{
		{Name: "", Holder: "a", TTLMs: 1000},
		{Name: "x", Holder: "", TTLMs: 1000},
		{Name: "x", Holder: "a", TTLMs: 10},
		{Name: "x", Holder: "a", TTLMs: 3_600_000},
	} {
		var r rpc.HALeaseResp
		if err := c.call(rpc.MHALease, &req, &r); rpc.ErrnoOf(err) != syscall.EINVAL {
			t.Errorf("%+v: %v, want EINVAL", req, err)
		}
	}
}
