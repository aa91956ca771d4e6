package oncrpc

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// The SUCCESS reply header copied from its template is the generated
// encoder's, for any xid, and decodes back to that xid.
func TestAcceptedTemplate(t *testing.T) {
	for _, xid := range []uint32{0, 1, 0x7fffffff, 0xdeadbeef, ^uint32(0)} {
		var got, want bytes.Buffer
		got.WriteString("prefix")
		writeAccepted(&got, xid, xdr.SUCCESS, nil)
		want.WriteString("prefix")
		writeAcceptedXDR(&want, xid, xdr.SUCCESS, nil)
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("xid %#x: template %x, encoder %x", xid, got.Bytes(), want.Bytes())
		}
		var m xdr.Rpc_msg
		rest, err := xdr.Decode(got.Bytes()[len("prefix"):], &m)
		if err != nil || len(rest) != 0 || m.Xid != xid || m.Body.Mtype != xdr.REPLY {
			t.Fatalf("xid %#x: decoded %+v, rest %d, err %v", xid, m, len(rest), err)
		}
		if ar := m.Body.Rbody().Areply(); ar.Reply_data.Stat != xdr.SUCCESS {
			t.Fatalf("xid %#x: stat %v", xid, ar.Reply_data.Stat)
		}
	}
}

// Workers run every call handed to them, all at once when the calls wait
// for each other (a worker busy with one call never holds up another),
// serve later calls on the same goroutines, and exit when the server
// closes.
func TestWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	done := make(chan struct{})
	w := newWorkers(done)
	const n = 32
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		var arrived atomic.Int32
		release := make(chan struct{})
		wg.Add(n)
		for i := 0; i < n; i++ {
			w.run(func() {
				defer wg.Done()
				if arrived.Add(1) == n {
					close(release) // the last of the round frees them all
				}
				select {
				case <-release:
				case <-time.After(10 * time.Second):
					t.Error("a call waited 10 s for the others: calls do not run at once")
				}
			})
		}
		wg.Wait()
		// The round's workers wait for calls; the next round reuses them.
		if g := runtime.NumGoroutine() - base; g > n+2 {
			t.Fatalf("round %d: %d goroutines beyond the test's, want at most %d workers", round, g, n)
		}
	}
	close(done)
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > base; {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left 10 s after close, %d before the workers", runtime.NumGoroutine(), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A reply's tail (SetTail) follows the results the procedure wrote, in the
// same record, and its memory is given back once the reply is sent; a
// procedure that fails after SetTail gets SYSTEM_ERR without the tail, and
// its memory is given back too.
func TestReplyTail(t *testing.T) {
	var released atomic.Int32
	tail := []byte("tail bytes")
	prog := &Program{Prog: 400001, Vers: 1, Name: "tail", Procs: []Proc{
		1: func(_ context.Context, call *Call, _ []byte, res *bytes.Buffer) error {
			// The results: a 4-byte count, then an opaque whose
			// bytes are the tail.
			res.Write([]byte{0, 0, 0, 7, 0, 0, 0, byte(len(tail))})
			call.SetTail(func() { released.Add(1) }, tail, []byte{0, 0})
			return nil
		},
		2: func(_ context.Context, call *Call, _ []byte, res *bytes.Buffer) error {
			call.SetTail(func() { released.Add(1) }, tail)
			return errors.New("failed after SetTail")
		},
	}}
	cfg := DefaultConfig()
	cfg.Log = slog.New(slog.DiscardHandler)
	s := NewServer(cfg, prog)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(conn, nil)
	defer c.Close()
	var got struct {
		N    uint32
		Data []byte
	}
	res := &tailResult{n: &got.N, data: &got.Data}
	if err := c.Call(400001, 1, 1, &xdr.XdrVoid{}, res); err != nil {
		t.Fatal(err)
	}
	if got.N != 7 || !bytes.Equal(got.Data, tail) {
		t.Fatalf("results %d %q, want 7 %q", got.N, got.Data, tail)
	}
	var ae *AcceptError
	if err := c.Call(400001, 1, 2, &xdr.XdrVoid{}, &xdr.XdrVoid{}); !errors.As(err, &ae) || ae.Stat != xdr.SYSTEM_ERR {
		t.Fatalf("a procedure failing after SetTail: %v, want SYSTEM_ERR", err)
	}
	for deadline := time.Now().Add(5 * time.Second); released.Load() != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 tails given back", released.Load())
		}
	}
}

// tailResult decodes TestReplyTail's results: a number and an opaque.
type tailResult struct {
	n    *uint32
	data *[]byte
}

func (r *tailResult) XdrTypeName() string { return "tailResult" }
func (r *tailResult) XdrValue() any       { return r }
func (r *tailResult) XdrPointer() any     { return r }
func (r *tailResult) XdrMarshal(x xdr.XDR, name string) {
	x.Marshal(name, xdr.XDR_uint32(r.n))
	x.Marshal(name, xdr.XdrVecOpaque{Bytes: r.data, Bound: 1 << 20})
}
