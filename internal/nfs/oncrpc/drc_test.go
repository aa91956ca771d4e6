package oncrpc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// drcFixture serves a test program whose procedure 1 (cached) and 2 (not)
// count their runs and answer {the argument's Low, the run number}, and
// whose procedure 3 (cached) waits for release before answering.
type drcFixture struct {
	addr    string
	runs    atomic.Uint32
	release chan struct{}
	srv     *Server
}

const drcTestProg, drcTestVers = 0x20000099, 1

func newDRCFixture(t *testing.T, entries int) *drcFixture {
	t.Helper()
	f := &drcFixture{release: make(chan struct{})}
	count := func(_ context.Context, _ *Call, args []byte, res *bytes.Buffer) error {
		var a xdr.Mismatch_info
		if _, err := xdr.Decode(args, &a); err != nil {
			return ErrGarbageArgs
		}
		n := f.runs.Add(1)
		return xdr.Encode(res, &xdr.Mismatch_info{Low: a.Low, High: n})
	}
	blocking := func(ctx context.Context, call *Call, args []byte, res *bytes.Buffer) error {
		select {
		case <-f.release:
		case <-time.After(20 * time.Second):
		}
		return count(ctx, call, args, res)
	}
	cfg := DefaultConfig()
	cfg.DRCEntries = entries
	f.srv = NewServer(cfg, &Program{Prog: drcTestProg, Vers: drcTestVers, Name: "drc-test",
		Procs: []Proc{1: count, 2: count, 3: blocking}, Cached: []uint32{1, 3}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	go f.srv.Serve(ln)
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func (f *drcFixture) dial(t *testing.T) *Client {
	t.Helper()
	conn, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(conn, nil)
	c.Timeout = 10 * time.Second
	t.Cleanup(func() { c.Close() })
	return c
}

// TestDRCReplaysNonIdempotent: a cached procedure's call sent again with
// the same xid and arguments — on the same connection or on a new one, as
// after a reconnect — gets the first reply and does not run again; a new
// xid, other arguments, or a procedure not cached run again.
func TestDRCReplaysNonIdempotent(t *testing.T) {
	f := newDRCFixture(t, 64)
	c := f.dial(t)
	var first xdr.Mismatch_info
	if err := c.Call(drcTestProg, drcTestVers, 1, &xdr.Mismatch_info{Low: 7}, &first); err != nil {
		t.Fatal(err)
	}
	xid := c.LastXid()
	for i, cl := range []*Client{c, f.dial(t)} {
		var again xdr.Mismatch_info
		if err := cl.Retransmit(xid, drcTestProg, drcTestVers, 1, &xdr.Mismatch_info{Low: 7}, &again); err != nil {
			t.Fatal(err)
		}
		if again != first {
			t.Fatalf("retransmission %d answered %+v, the first call %+v", i, again, first)
		}
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("the cached procedure ran %d times for one call and two retransmissions", n)
	}
	if replayed, _ := f.srv.DRCStats(); replayed != 2 {
		t.Fatalf("%d replies replayed, want 2", replayed)
	}
	// The same xid with other arguments is another call.
	var other xdr.Mismatch_info
	if err := c.Retransmit(xid, drcTestProg, drcTestVers, 1, &xdr.Mismatch_info{Low: 8}, &other); err != nil {
		t.Fatal(err)
	}
	if other.Low != 8 || other.High != 2 {
		t.Fatalf("same xid, other arguments: %+v, want a second run", other)
	}
	// A procedure not cached runs each time.
	var a, b xdr.Mismatch_info
	if err := c.Call(drcTestProg, drcTestVers, 2, &xdr.Mismatch_info{Low: 1}, &a); err != nil {
		t.Fatal(err)
	}
	if err := c.Retransmit(c.LastXid(), drcTestProg, drcTestVers, 2, &xdr.Mismatch_info{Low: 1}, &b); err != nil {
		t.Fatal(err)
	}
	if a.High == b.High {
		t.Fatalf("an uncached procedure's retransmission was answered from the cache: %+v %+v", a, b)
	}
}

// TestDRCDropsWhileRunning: a retransmission that arrives while the first
// call still runs gets no reply (the client will send it again); once the
// first is answered, a further retransmission gets its reply. The
// procedure runs once.
func TestDRCDropsWhileRunning(t *testing.T) {
	f := newDRCFixture(t, 64)
	c1 := f.dial(t)
	done := make(chan error, 1)
	var first xdr.Mismatch_info
	xid := c1.LastXid() + 1 // Call holds the client until its reply
	go func() { done <- c1.Call(drcTestProg, drcTestVers, 3, &xdr.Mismatch_info{Low: 5}, &first) }()
	// Wait until the first call runs (it is in the cache, in progress).
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.srv.drc.mu.Lock()
		n := len(f.srv.drc.m)
		f.srv.drc.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first call never reached the cache")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c2 := f.dial(t)
	c2.Timeout = 300 * time.Millisecond
	var dup xdr.Mismatch_info
	err := c2.Retransmit(xid, drcTestProg, drcTestVers, 3, &xdr.Mismatch_info{Low: 5}, &dup)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a retransmission while the call runs: %v (%+v), want no answer", err, dup)
	}
	if _, dropped := f.srv.DRCStats(); dropped != 1 {
		t.Fatalf("%d retransmissions dropped, want 1", dropped)
	}
	close(f.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c3 := f.dial(t)
	var later xdr.Mismatch_info
	if err := c3.Retransmit(xid, drcTestProg, drcTestVers, 3, &xdr.Mismatch_info{Low: 5}, &later); err != nil {
		t.Fatal(err)
	}
	if later != first || f.runs.Load() != 1 {
		t.Fatalf("after the call ended: %+v (first %+v), %d runs", later, first, f.runs.Load())
	}
}

// TestDRCBounded: the cache keeps at most its number of entries, the
// oldest dropped first (that call then runs again).
func TestDRCBounded(t *testing.T) {
	f := newDRCFixture(t, 4)
	c := f.dial(t)
	var xids []uint32
	for i := range 6 {
		if err := c.Call(drcTestProg, drcTestVers, 1, &xdr.Mismatch_info{Low: uint32(i)}, &xdr.Mismatch_info{}); err != nil {
			t.Fatal(err)
		}
		xids = append(xids, c.LastXid())
	}
	if n := len(f.srv.drc.m); n != 4 {
		t.Fatalf("%d entries kept, want 4", n)
	}
	var r xdr.Mismatch_info
	if err := c.Retransmit(xids[0], drcTestProg, drcTestVers, 1, &xdr.Mismatch_info{Low: 0}, &r); err != nil {
		t.Fatal(err)
	}
	if r.High != 7 {
		t.Fatalf("the evicted call's retransmission: %+v, want a 7th run", r)
	}
	if err := c.Retransmit(xids[5], drcTestProg, drcTestVers, 1, &xdr.Mismatch_info{Low: 5}, &r); err != nil {
		t.Fatal(err)
	}
	if r.High != 6 {
		t.Fatalf("a kept call's retransmission: %+v, want the 6th run's reply", r)
	}
}
