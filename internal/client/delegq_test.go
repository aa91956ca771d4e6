package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// delegHeld lists the directories the service says client id holds.
func delegHeld(t *testing.T, c *Client, id uint64) []uint64 {
	t.Helper()
	st, err := c.ClusterStatus(context.Background())
	if err != nil {
		t.Fatalf("cluster status: %v", err)
	}
	var out []uint64
	for _, d := range st.Delegations {
		if d.Client == id {
			out = append(out, d.Dir)
		}
	}
	return out
}

// waitHolding waits (bounded) until c holds dir's delegation.
func waitHolding(t *testing.T, c *Client, dir uint64) {
	t.Helper()
	if err := testutil.WaitFor(10*time.Second, func() error {
		if !c.Holding(dir) {
			return fmt.Errorf("client %d does not hold the delegation on %d", c.ClientID(), dir)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func createN(t *testing.T, c *Client, dir uint64, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := c.Create(context.Background(), dir, fmt.Sprintf("%s%d", prefix, i), 0o644, 0, 0); err != nil {
			t.Fatalf("create %s%d: %v", prefix, i, err)
		}
	}
}

// With the option on, a run of creates in a directory gets its
// delegation; another client's lookup there recalls it, the holder gives
// it back, and names made by the other client afterwards are seen by the
// holder; unmount gives back what is held.
func TestCreateDelegationGrantRecallReturn(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := tc.client(func(c *Config) { c.CreateDelegation = true; c.SyncPolicy = SyncPolicyAsync })
	b := tc.client(nil)
	d, err := a.Mkdir(bg, RootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	createN(t, a, d.Ino, "f", 2*delegAfterCreates)
	waitHolding(t, a, d.Ino)
	if got := delegHeld(t, b, a.ClientID()); len(got) != 1 || got[0] != d.Ino {
		t.Fatalf("service lists delegations %v of client A, want [%d]", got, d.Ino)
	}
	// The holder's own creates go on under the delegation.
	createN(t, a, d.Ino, "g", 4)

	// B's lookup recalls; A gives it back and B's lookup is answered.
	if _, err := b.Lookup(bg, d.Ino, "f0"); err != nil {
		t.Fatalf("lookup by B under A's delegation: %v", err)
	}
	if a.Holding(d.Ino) {
		t.Fatal("A still holds the delegation after B's lookup was answered")
	}
	if _, err := b.Create(bg, d.Ino, "fromB", 0o644, 0, 0); err != nil {
		t.Fatalf("create by B: %v", err)
	}
	if _, err := a.Lookup(bg, d.Ino, "fromB"); err != nil {
		t.Fatalf("A does not see B's create after the recall: %v", err)
	}
	// The service applied A's return before answering B; A counts the
	// call once its answer is back, which may come a moment later.
	if err := testutil.WaitFor(5*time.Second, func() error {
		if n := a.Calls("meta", rpc.MReturnDelegation); n < 1 {
			return fmt.Errorf("A made %d MReturnDelegation calls, want at least 1", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Recalled lately: not asked again at once, so a fresh directory
	// shows the return at unmount.
	e, err := a.Mkdir(bg, RootIno, "e", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	createN(t, a, e.Ino, "f", 2*delegAfterCreates)
	waitHolding(t, a, e.Ino)
	id := a.ClientID()
	returns := a.Calls("meta", rpc.MReturnDelegation)
	a.Close()
	if n := a.Calls("meta", rpc.MReturnDelegation); n != returns+1 {
		t.Fatalf("unmount made %d MReturnDelegation calls, want 1", n-returns)
	}
	if got := delegHeld(t, b, id); len(got) != 0 {
		t.Fatalf("after unmount the service lists delegations %v of the closed client", got)
	}
}

// A delegation this mount stops using is given back when idle.
func TestCreateDelegationIdleReturn(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := tc.client(func(c *Config) { c.CreateDelegation = true })
	a.deleg.mu.Lock()
	a.deleg.idle = 300 * time.Millisecond
	a.deleg.mu.Unlock()
	d, err := a.Mkdir(bg, RootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	createN(t, a, d.Ino, "f", delegAfterCreates)
	if err := testutil.WaitFor(10*time.Second, func() error {
		if n := a.Calls("meta", rpc.MReturnDelegation); n != 1 {
			return fmt.Errorf("%d returns", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("idle delegation not given back: %v", err)
	}
	if a.Holding(d.Ino) || len(delegHeld(t, a, a.ClientID())) != 0 {
		t.Fatal("delegation still held after its idle return")
	}
}

// A directory another session holds: the ask is refused (EBUSY) and
// not made again within the back-off, whatever the creates.
func TestCreateDelegationBackoff(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := tc.client(func(c *Config) { c.CreateDelegation = true })
	b := tc.client(func(c *Config) { c.CreateDelegation = true })
	b.deleg.mu.Lock()
	b.deleg.idle = time.Minute
	b.deleg.mu.Unlock()
	d, err := a.Mkdir(bg, RootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	createN(t, b, d.Ino, "b", delegAfterCreates)
	waitHolding(t, b, d.Ino)
	// A's run of creates, noted without sending them (a create of A's
	// would recall B's delegation).
	for i := 0; i < delegAfterCreates; i++ {
		a.deleg.noteCreate(d.Ino, fmt.Sprint("a", i), 0)
	}
	if err := testutil.WaitFor(10*time.Second, func() error {
		a.deleg.mu.Lock()
		defer a.deleg.mu.Unlock()
		if s := a.deleg.dirs[d.Ino]; s == nil || s.asking || s.until.IsZero() {
			return errors.New("A's ask not refused yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := a.Calls("meta", rpc.MDelegate); n != 1 || a.Holding(d.Ino) {
		t.Fatalf("A asked %d times (holding: %v), want 1 refused ask", n, a.Holding(d.Ino))
	}
	for i := 0; i < 3*delegAfterCreates; i++ {
		a.deleg.noteCreate(d.Ino, fmt.Sprint("x", i), 0)
	}
	if n := a.Calls("meta", rpc.MDelegate); n != 1 {
		t.Fatalf("A asked %d more times within its back-off", n-1)
	}
	if !b.Holding(d.Ino) {
		t.Fatal("B lost its delegation to a refused ask")
	}
}

// Option off: no MDelegate call, whatever the run of creates.
func TestCreateDelegationOff(t *testing.T) {
	tc := startCluster(t, clusterOpts{})
	bg := context.Background()
	a := tc.client(nil)
	d, err := a.Mkdir(bg, RootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	createN(t, a, d.Ino, "f", 4*delegAfterCreates)
	if n := a.Calls("meta", rpc.MDelegate); n != 0 {
		t.Fatalf("%d MDelegate calls with the option off", n)
	}
	cfg := tc.config()
	cfg.CreateDelegation, cfg.SyncPolicy = true, SyncPolicyStrict
	if err := cfg.Validate(); err == nil {
		t.Fatal("create delegation under the strict policy validated")
	}
}
