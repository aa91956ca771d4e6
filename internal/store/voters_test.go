package store

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
	"github.com/stratafs/strata/internal/transport"
)

// fakeFollower answers registrations and heartbeats as a metadata voter
// that is not the leader: rpc.NotLeader naming the leader it knows.
type fakeFollower struct {
	addr string
	mu   sync.Mutex
	hint string
}

func startFakeFollower(t *testing.T, hint string) *fakeFollower {
	t.Helper()
	f := &fakeFollower{hint: hint}
	srv := transport.NewServer(testKey)
	notLeader := func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		return rpc.NotLeader(f.hint, "test follower")
	}
	transport.Handle(srv, rpc.MRegisterServer, func(ctx context.Context, r *rpc.RegisterServerReq) (*rpc.RegisterServerResp, error) {
		return nil, notLeader()
	})
	transport.Handle(srv, rpc.MServerHeartbeat, func(ctx context.Context, r *rpc.ServerHeartbeatReq) (*rpc.Empty, error) {
		return nil, notLeader()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}

// TestRegistrationFindsTheLeader: a storage server given a dead address,
// a follower and the leader registers with the leader; when the leader
// goes away and the follower names another, which does not know the
// server (ESTALE), the server registers there and heartbeats go there.
func TestRegistrationFindsTheLeader(t *testing.T) {
	leader := startFakeMeta(t, "127.0.0.1:0")
	follower := startFakeFollower(t, leader.addr)
	dead := testutil.FreePort(t) // nobody listens there
	e := newEnv(t, 2, func(c *Config) {
		c.MetaAddrs = []string{dead, follower.addr, leader.addr}
		c.HeartbeatInterval = 20 * time.Millisecond
	})
	if ids := e.s.TargetIDs(); !slices.Equal(ids, []uint32{10, 11}) {
		t.Fatalf("target ids %v, want [10 11] from the leader", ids)
	}
	waitFor(t, "heartbeats at the leader", func() bool { return leader.beats.Load() >= 3 })

	next := startFakeMeta(t, "127.0.0.1:0")
	next.staleOnce.Store(true) // the new leader does not know this server yet
	follower.mu.Lock()
	follower.hint = next.addr // a voter outside the list given
	follower.mu.Unlock()
	leader.srv.Close()
	waitFor(t, "registration with the new leader", func() bool { return next.regs.Load() >= 1 })
	waitFor(t, "heartbeats at the new leader", func() bool { return next.beats.Load() >= 3 })
}
