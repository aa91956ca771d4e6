package client

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
	"github.com/stratafs/strata/internal/transport"
)

// voterProxy stands for one voter of a metadata group in front of a real
// metadata service: as the leader it forwards each request unchanged to
// the service and its answer back; as a follower it answers
// rpc.NotLeader naming the leader. Voters in front of one service share
// its state, as the voters of a group share the replicated state: what a
// client sees across a "leader change" between them is what it sees
// across a real one (the same sessions, locks and duplicate-request table).
type voterProxy struct {
	addr string
	srv  *transport.Server
	up   *transport.Client
	mu   struct {
		sync.Mutex
		lead   bool
		hint   string
		onCall func(m rpc.Method, req []byte) (answer bool, err error) // once, then cleared
		beats  []time.Time                                             // forwarded heartbeats
		hdrs   map[rpc.Method][]rpc.ReqHeader                          // of forwarded creates, unlinks, renames
	}
}

// rawMsg is a message's encoded bytes, passed on as they are.
type rawMsg []byte

func (r *rawMsg) Encode(e *rpc.Enc) { e.B = append(e.B, *r...) }

func (r *rawMsg) Decode(d *rpc.Dec) {
	*r = append((*r)[:0], d.B...)
	d.B = d.B[len(d.B):]
}

func startVoterProxy(t *testing.T, tc *testCluster) *voterProxy {
	t.Helper()
	p := &voterProxy{srv: transport.NewServer(tc.key), up: transport.NewClient(tc.metaAddr, transport.ClientConfig{Key: tc.key})}
	p.mu.hdrs = map[rpc.Method][]rpc.ReqHeader{}
	for m := rpc.MSessionOpen; m <= rpc.MSetAtimes; m++ {
		p.srv.Register(m, func(ctx context.Context, d *rpc.Dec) (rpc.Message, error) { return p.serve(ctx, m, d) })
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	go p.srv.Serve(ln)
	t.Cleanup(func() { p.srv.Close(); p.up.Close() })
	return p
}

func (p *voterProxy) serve(ctx context.Context, m rpc.Method, d *rpc.Dec) (rpc.Message, error) {
	var req rawMsg
	req.Decode(d)
	p.mu.Lock()
	lead, hint, hook := p.mu.lead, p.mu.hint, p.mu.onCall
	p.mu.Unlock()
	if !lead {
		return nil, rpc.NotLeader(hint, "test voter %s is a follower", p.addr)
	}
	p.note(m, req)
	var resp rawMsg
	err := p.up.Call(ctx, m, &req, &resp)
	if errors.Is(err, transport.ErrUnavailable) {
		// The service behind is restarting: as a voter without a leader.
		return nil, rpc.NotLeader("", "test voter %s: no leader: %v", p.addr, err)
	}
	if hook != nil {
		if answer, herr := hook(m, req); !answer {
			return nil, herr
		}
	}
	return &resp, err
}

// note records what the leader forwards.
func (p *voterProxy) note(m rpc.Method, req []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch m {
	case rpc.MSessionHeartbeat:
		p.mu.beats = append(p.mu.beats, time.Now())
	case rpc.MCreate, rpc.MUnlink, rpc.MRename:
		var h rpc.ReqHeader
		h.Decode(rpc.NewDec(req)) // the header leads these requests
		p.mu.hdrs[m] = append(p.mu.hdrs[m], h)
	}
}

func (p *voterProxy) set(lead bool, hint string) {
	p.mu.Lock()
	p.mu.lead, p.mu.hint = lead, hint
	p.mu.Unlock()
}

// onNext makes the next forwarded call of method m end with fn, which says
// whether the answer goes back; fn runs after the service applied it.
func (p *voterProxy) onNext(m rpc.Method, fn func() error) {
	p.mu.Lock()
	p.mu.onCall = func(got rpc.Method, _ []byte) (bool, error) {
		if got != m {
			return true, nil
		}
		p.mu.Lock()
		p.mu.onCall = nil
		p.mu.Unlock()
		return false, fn()
	}
	p.mu.Unlock()
}

func (p *voterProxy) headers(m rpc.Method) []rpc.ReqHeader {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]rpc.ReqHeader(nil), p.mu.hdrs[m]...)
}

func (p *voterProxy) heartbeatsSince(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.mu.beats {
		if !b.Before(t) {
			n++
		}
	}
	return n
}

// TestClientFollowsTheLeaderAcrossVoters: a client given a dead address, a
// follower and the leader works; when the leader loses its leadership
// between applying a create, an unlink or a rename and answering it, the
// client repeats the request, with its header unchanged, at the new
// leader, which answers it from the duplicate-request table: no EEXIST, no
// ENOENT, nothing applied twice. The new leader hears from the client's
// session at once (a heartbeat), and locks keep working.
func TestClientFollowsTheLeaderAcrossVoters(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a, b := startVoterProxy(t, tc), startVoterProxy(t, tc)
	a.set(true, "")
	b.set(false, a.addr)
	dead := testutil.FreePort(t) // nobody listens there
	c := tc.client(func(cfg *Config) {
		cfg.MetaAddr = ""
		cfg.MetaAddrs = []string{dead, b.addr, a.addr}
	})
	ctx := context.Background()
	if _, err := c.Create(ctx, RootIno, "x", 0o644, 0, 0); err != nil {
		t.Fatalf("create through the voter list: %v", err)
	}
	f, err := c.CreateOpen(ctx, RootIno, "locked", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	lk := Lock{Ino: f.Ino(), Owner: 1, Start: 0, End: 99, Type: rpc.LockWrite, Pid: 1}
	if err := c.SetLk(ctx, lk, false, nil); err != nil {
		t.Fatalf("lock: %v", err)
	}

	// The open made the client report its open files soon: let that
	// heartbeat pass (the next is due a third of the lease, 2 s, later).
	if err := waitUntil(time.Second, func() bool { return a.heartbeatsSince(time.Time{}) > 0 }); err != nil {
		t.Fatal("no heartbeat after an open")
	}

	// The leader applies the create of "y" and loses its leadership before
	// it answers; b leads from then on.
	a.onNext(rpc.MCreate, func() error {
		a.set(false, b.addr)
		b.set(true, "")
		return rpc.NotLeader(b.addr, "leadership lost")
	})
	changed := time.Now()
	if _, err := c.Create(ctx, RootIno, "y", 0o644, 0, 0); err != nil {
		t.Fatalf("create across the leader change: %v (a retry with a new header would be EEXIST)", err)
	}
	ha, hb := a.headers(rpc.MCreate), b.headers(rpc.MCreate)
	if len(hb) != 1 || ha[len(ha)-1] != hb[0] {
		t.Fatalf("create headers at the old leader %v and the new %v: want the last one repeated unchanged", ha, hb)
	}
	// The session reaches the new leader at once (a new leader holds back
	// new locks until every session reclaimed its own), not a third of a
	// lease (2 s here) later.
	if err := waitUntil(500*time.Millisecond, func() bool { return b.heartbeatsSince(changed) > 0 }); err != nil {
		t.Fatal("no heartbeat reached the new leader within 500ms of the leader change")
	}
	// Back and forth, for an unlink and a rename.
	b.onNext(rpc.MUnlink, func() error {
		b.set(false, a.addr)
		a.set(true, "")
		return rpc.NotLeader(a.addr, "leadership lost")
	})
	if _, err := c.Unlink(ctx, RootIno, "x"); err != nil {
		t.Fatalf("unlink across the leader change: %v (a repeat applied twice would be ENOENT)", err)
	}
	a.onNext(rpc.MRename, func() error {
		a.set(false, "") // no leader known for a while
		go func() {
			time.Sleep(200 * time.Millisecond)
			b.set(true, "")
			a.set(false, b.addr)
		}()
		return rpc.NotLeader("", "leadership lost")
	})
	if err := c.Rename(ctx, RootIno, "y", RootIno, "z", 0); err != nil {
		t.Fatalf("rename across the leader change: %v", err)
	}
	if _, err := c.Lookup(ctx, RootIno, "z"); err != nil {
		t.Fatalf("renamed file: %v", err)
	}
	for _, gone := range []string{"x", "y"} {
		if _, err := c.Lookup(ctx, RootIno, gone); !errIs(err, syscall.ENOENT) {
			t.Fatalf("lookup %s after its unlink/rename: %v, want ENOENT", gone, err)
		}
	}
	ents, _, err := c.ReadDir(ctx, RootIno, "", 100, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		t.Fatalf("root holds %v, want locked and z", ents)
	}
	// The lock taken before the changes still excludes another owner.
	other := lk
	other.Owner, other.Pid = 2, 2
	if err := c.SetLk(ctx, other, false, nil); !errIs(err, syscall.EAGAIN) {
		t.Fatalf("conflicting lock after the leader changes: %v, want EAGAIN", err)
	}
}

// TestLocksReclaimedAtANewLeader: a leader change that starts a new lock
// epoch (the service restarts behind the voters, as a new leader starts
// its own): the holder's heartbeat, sent where the leader was, follows the
// hint to the new leader and reclaims the lock there, so the lock keeps
// excluding another client's — beyond the grace period, which would grant
// it had the holder not reclaimed.
func TestLocksReclaimedAtANewLeader(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	a, b := startVoterProxy(t, tc), startVoterProxy(t, tc)
	a.set(true, "")
	b.set(false, a.addr)
	voters := func(cfg *Config) {
		cfg.MetaAddr = ""
		cfg.MetaAddrs = []string{a.addr, b.addr}
	}
	holder, other := tc.client(voters), tc.client(voters)
	ctx := context.Background()
	f, err := holder.CreateOpen(ctx, RootIno, "locked", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	lk := Lock{Ino: f.Ino(), Owner: 1, Start: 0, End: 99, Type: rpc.LockWrite, Pid: 1}
	if err := holder.SetLk(ctx, lk, false, nil); err != nil {
		t.Fatal(err)
	}
	a.set(false, b.addr)
	b.set(true, "")
	tc.restartMeta()
	conflict := Lock{Ino: f.Ino(), Owner: 2, Start: 50, End: 60, Type: rpc.LockRead, Pid: 2}
	if err := other.SetLk(ctx, conflict, false, nil); !errIs(err, syscall.EAGAIN) {
		t.Fatalf("lock conflicting with one held across the leader change: %v, want EAGAIN", err)
	}
	// Past the grace period (a lease, 6 s) the lock still holds: it was
	// reclaimed, not merely waited for.
	time.Sleep(7 * time.Second)
	if err := other.SetLk(ctx, conflict, false, nil); !errIs(err, syscall.EAGAIN) {
		t.Fatalf("conflicting lock after the grace period: %v, want EAGAIN (the holder did not reclaim at the new leader)", err)
	}
}

// TestUnlinkWithoutLeaderFailsWithinIOTimeout: with no leader reachable,
// an unlink that first reports the open files (a heartbeat, which waits
// for a leader too) fails with EIO after one IOTimeout, not two.
func TestUnlinkWithoutLeaderFailsWithinIOTimeout(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 1})
	c := tc.client(func(cfg *Config) { cfg.IOTimeout = 2 * time.Second })
	ctx := context.Background()
	f, err := c.CreateOpen(ctx, RootIno, "open", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	tc.meta.Close()
	c.markUnsent() // as after a heartbeat that did not get through
	start := time.Now()
	_, err = c.Unlink(ctx, RootIno, "open")
	if took := time.Since(start); !errIs(err, syscall.EIO) || took > 3500*time.Millisecond {
		t.Fatalf("unlink without a leader: %v after %v, want EIO after the 2s IOTimeout", err, took)
	}
}

// waitUntil polls cond every 10 ms for up to d.
func waitUntil(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
