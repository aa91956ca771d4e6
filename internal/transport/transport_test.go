package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/layout"

	"github.com/stratafs/strata/internal/rpc"
)

func startServer(t *testing.T, key []byte) (*Server, string) {
	t.Helper()
	s := NewServer(key)
	// Writes are kept by offset (a copy: the request buffer is pooled) and
	// read back whole.
	var written sync.Map
	Handle(s, rpc.SWrite, func(ctx context.Context, r *rpc.WriteReq) (*rpc.Empty, error) {
		if r.Chunk.Ino == 0 {
			return nil, rpc.Errorf(syscall.ENOENT, "no inode 0 on target %d", r.Chunk.Target)
		}
		written.Store(r.Off, append([]byte(nil), r.Data...))
		return &rpc.Empty{}, nil
	})
	Handle(s, rpc.SRead, func(ctx context.Context, r *rpc.ReadReq) (*rpc.ReadResp, error) {
		b, _ := written.Load(r.Off)
		data, _ := b.([]byte)
		return &rpc.ReadResp{Data: data[:min(len(data), int(r.Len))]}, nil
	})
	Handle(s, rpc.MGetAttr, func(ctx context.Context, r *rpc.GetAttrReq) (*rpc.AttrResp, error) {
		if r.Ino == 42 {
			time.Sleep(2 * time.Second)
		}
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Ino, Mode: 0o100644, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 2}}}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().String()
}

func TestCallRoundTripAndPipelining(t *testing.T) {
	_, addr := startServer(t, []byte("k"))
	c := NewClient(addr, ClientConfig{Key: []byte("k"), NoLocal: true})
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			data := bytes.Repeat([]byte{byte(i)}, 1<<20+i)
			var resp rpc.ReadResp
			if i%2 == 0 {
				resp.Into = make([]byte, len(data)+10) // copy-out path
			}
			if err := c.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Off: uint64(i), Data: data}, &rpc.Empty{}); err != nil {
				errs <- err
				return
			}
			if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Off: uint64(i), Len: uint32(len(data))}, &resp); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(resp.Data, data) {
				errs <- errors.New("echo mismatch")
			}
			if resp.Into != nil && &resp.Data[0] != &resp.Into[0] {
				errs <- errors.New("Data does not alias Into")
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var ar rpc.AttrResp
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 9}, &ar); err != nil || ar.Attr.Ino != 9 || ar.Attr.Layout.Targets[1] != 2 {
		t.Fatalf("getattr: %v %+v", err, ar)
	}
}

func TestReadIntoTooSmall(t *testing.T) {
	_, addr := startServer(t, nil)
	c := NewClient(addr, ClientConfig{NoLocal: true})
	defer c.Close()
	if err := c.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Data: []byte("too long")}, &rpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	resp := rpc.ReadResp{Into: make([]byte, 3)}
	err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Len: 100}, &resp)
	if !errors.Is(err, rpc.ErrMalformed) {
		t.Fatalf("want ErrMalformed, got %v", err)
	}
}

func TestErrnoAndUnknownMethod(t *testing.T) {
	_, addr := startServer(t, nil)
	c := NewClient(addr, ClientConfig{NoLocal: true})
	defer c.Close()
	err := c.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 3, Ino: 0}}, &rpc.ReadResp{})
	if !errors.Is(err, syscall.ENOENT) || !bytes.Contains([]byte(err.Error()), []byte("target 3")) {
		t.Fatalf("want ENOENT naming target, got %v", err)
	}
	if err := c.Call(context.Background(), rpc.MRename, &rpc.RenameReq{}, &rpc.Empty{}); !errors.Is(err, syscall.ENOSYS) {
		t.Fatalf("unknown method: %v", err)
	}
}

func TestMalformedRequestGetsEINVAL(t *testing.T) {
	_, addr := startServer(t, nil)
	c := NewClient(addr, ClientConfig{NoLocal: true})
	defer c.Close()
	// A ChunkReq body is too short to be a GetAttrReq? No: send garbage as a raw message.
	err := c.Call(context.Background(), rpc.MGetAttr, rawMsg{0xff, 0xff}, &rpc.AttrResp{})
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("want EINVAL, got %v", err)
	}
	// The connection still serves after a bad request.
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{}); err != nil {
		t.Fatal(err)
	}
}

type rawMsg []byte

func (r rawMsg) Encode(e *rpc.Enc) { e.B = append(e.B, r...) }
func (r rawMsg) Decode(d *rpc.Dec) {}

func TestWrongKeyRejected(t *testing.T) {
	_, addr := startServer(t, []byte("right"))
	c := NewClient(addr, ClientConfig{Key: []byte("wrong"), NoLocal: true})
	defer c.Close()
	err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("want ErrAuth, got %v", err)
	}
}

func TestDeadPeerAndTimeoutAreUnavailable(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := NewClient(addr, ClientConfig{DialTimeout: time.Second, NoLocal: true})
	err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("dead peer: %v", err)
	}
	_, addr2 := startServer(t, nil)
	c2 := NewClient(addr2, ClientConfig{NoLocal: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c2.Call(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: 42}, &rpc.AttrResp{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("slow call: %v", err)
	}
}

func TestServerRestartRedials(t *testing.T) {
	s, addr := startServer(t, nil)
	c := NewClient(addr, ClientConfig{Conns: 1, NoLocal: true})
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after close: %v", err)
	}
	s2 := NewServer(nil)
	Handle(s2, rpc.MGetAttr, func(ctx context.Context, r *rpc.GetAttrReq) (*rpc.AttrResp, error) { return &rpc.AttrResp{}, nil })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port reuse: %v", err)
	}
	go s2.Serve(ln)
	defer s2.Close()
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// TestInProcessPath: a client whose peer serves in this process calls the
// handler directly, with the network path's semantics: encoded messages,
// errno answers, key check, deadlines, and dialling once the server closed.
func TestInProcessPath(t *testing.T) {
	s, addr := startServer(t, []byte("k"))
	if err := waitLocal(addr); err != nil {
		t.Fatal(err)
	}
	c := NewClient(addr, ClientConfig{Key: []byte("k")})
	defer c.Close()
	data := bytes.Repeat([]byte("x"), 1<<20)
	resp := rpc.ReadResp{Into: make([]byte, 1<<20)}
	if err := c.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Data: data}, &rpc.Empty{}); err != nil {
		t.Fatalf("local write: %v", err)
	}
	if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: rpc.ChunkID{Target: 1, Ino: 7}, Len: 1 << 20}, &resp); err != nil || !bytes.Equal(resp.Data, data) {
		t.Fatalf("local round trip: %v", err)
	}
	data[0] = 'y' // the handler got a copy, and so did we
	if resp.Data[0] != 'x' {
		t.Fatal("response aliases the request")
	}
	err := c.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 3, Ino: 0}}, &rpc.ReadResp{})
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("errno: %v", err)
	}
	if err := c.Call(context.Background(), rpc.MRename, &rpc.RenameReq{}, &rpc.Empty{}); !errors.Is(err, syscall.ENOSYS) {
		t.Fatalf("unknown method: %v", err)
	}
	bad := NewClient(addr, ClientConfig{Key: []byte("other")})
	if err := bad.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{}); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong key: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Call(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: 42}, &rpc.AttrResp{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("deadline: %v", err)
	}
	s.Close()
	if lookupLocal(addr) != nil {
		t.Fatal("closed server still registered")
	}
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after close: %v", err)
	}
}

func waitLocal(addr string) error {
	for i := 0; i < 200; i++ {
		if lookupLocal(addr) != nil {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("server never registered")
}

// releasingResp is a handler answer whose buffer is "returned to a pool"
// (scribbled over) by Release, as the store's read answers are.
type releasingResp struct {
	rpc.ReadResp
	released chan struct{}
}

func (r *releasingResp) Release() {
	for i := range r.Data {
		r.Data[i] = 0xEE
	}
	close(r.released)
}

// TestInProcessHandOver: a read answer's bytes are copied straight from the
// handler's buffer into ReadResp.Into, and the handler's answer is released
// only afterwards; a caller that gives up leaves the release to the
// handler's goroutine; without Into the answer is still a copy.
func TestInProcessHandOver(t *testing.T) {
	s := NewServer(nil)
	rels := make(chan chan struct{}, 4)
	var delay time.Duration
	Handle(s, rpc.SRead, func(ctx context.Context, r *rpc.ReadReq) (*releasingResp, error) {
		time.Sleep(delay)
		rr := &releasingResp{released: make(chan struct{})}
		rr.Data = bytes.Repeat([]byte{'d'}, int(r.Len))
		rels <- rr.released
		return rr, nil
	})
	c := serveInProcess(t, s, nil)
	want := bytes.Repeat([]byte{'d'}, 1<<20)

	resp := rpc.ReadResp{Into: make([]byte, 1<<20)}
	if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Len: 1 << 20}, &resp); err != nil {
		t.Fatal(err)
	}
	<-<-rels // released once the call returned
	if !bytes.Equal(resp.Data, want) || &resp.Data[0] != &resp.Into[0] {
		t.Fatal("handed-over answer not copied into Into before the release")
	}

	var plain rpc.ReadResp
	if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Len: 1 << 20}, &plain); err != nil {
		t.Fatal(err)
	}
	<-<-rels
	if !bytes.Equal(plain.Data, want) {
		t.Fatal("answer without Into aliases the released handler buffer")
	}

	delay = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.Call(ctx, rpc.SRead, &rpc.ReadReq{Len: 1 << 20}, &rpc.ReadResp{Into: make([]byte, 1<<20)}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("deadline: %v", err)
	}
	select {
	case rel := <-rels:
		select {
		case <-rel:
		case <-time.After(5 * time.Second):
			t.Fatal("abandoned answer never released")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler never ran")
	}
}

// TestInProcessInline: a method the server marked Inline runs on the
// caller's goroutine (its stack holds the caller's frames); others run on
// a goroutine of their own, so that the caller's deadline still bounds them.
func TestInProcessInline(t *testing.T) {
	s := NewServer([]byte("k"))
	onCaller := func() bool {
		buf := make([]byte, 64<<10)
		return strings.Contains(string(buf[:runtime.Stack(buf, false)]), ".TestInProcessInline(") // the test function itself, not its closures
	}
	Handle(s, rpc.MLookup, func(ctx context.Context, r *rpc.LookupReq) (*rpc.AttrResp, error) {
		if !onCaller() {
			return nil, rpc.Errorf(syscall.EIO, "inline method ran on another goroutine")
		}
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Parent}}, nil
	})
	Handle(s, rpc.MGetAttr, func(ctx context.Context, r *rpc.GetAttrReq) (*rpc.AttrResp, error) {
		if onCaller() {
			return nil, rpc.Errorf(syscall.EIO, "non-inline method ran on the caller's goroutine")
		}
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Ino}}, nil
	})
	s.Inline(rpc.MLookup)
	c := serveInProcess(t, s, []byte("k"))
	var a rpc.AttrResp
	if err := c.Call(context.Background(), rpc.MLookup, &rpc.LookupReq{Parent: 7, Name: "x"}, &a); err != nil || a.Attr.Ino != 7 {
		t.Fatalf("inline call: %+v %v", a, err)
	}
	if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 9}, &a); err != nil || a.Attr.Ino != 9 {
		t.Fatalf("goroutine call: %+v %v", a, err)
	}
}

// TestInProcessInlineAnswers: an Inline method's errno reaches the caller,
// an answer-less handler answers an empty message, and a handler that waits
// on its context is bounded by the call's deadline although it runs on the
// caller's goroutine (the caller's own context has none).
func TestInProcessInlineAnswers(t *testing.T) {
	s := NewServer([]byte("k"))
	Handle(s, rpc.MLookup, func(ctx context.Context, r *rpc.LookupReq) (*rpc.AttrResp, error) {
		switch r.Name {
		case "absent":
			return nil, rpc.Errorf(syscall.ENOENT, "no %q", r.Name)
		case "wait":
			select {
			case <-ctx.Done():
				return nil, rpc.Errorf(syscall.ETIMEDOUT, "waited: %v", ctx.Err())
			case <-time.After(20 * time.Second):
				return &rpc.AttrResp{}, nil
			}
		}
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Parent}}, nil
	})
	s.Inline(rpc.MLookup)
	c := serveInProcessWith(t, s, ClientConfig{Key: []byte("k"), CallTimeout: 200 * time.Millisecond})
	var a rpc.AttrResp
	err := c.Call(context.Background(), rpc.MLookup, &rpc.LookupReq{Parent: 1, Name: "absent"}, &a)
	if rpc.ErrnoOf(err) != syscall.ENOENT {
		t.Fatalf("inline error: %v, want ENOENT", err)
	}
	for i := 0; i < 3; i++ { // the pooled request buffers are reused
		name := fmt.Sprintf("n%d", i)
		if err := c.Call(context.Background(), rpc.MLookup, &rpc.LookupReq{Parent: uint64(10 + i), Name: name}, &a); err != nil || a.Attr.Ino != uint64(10+i) {
			t.Fatalf("inline call %d: %+v %v", i, a, err)
		}
	}
	start := time.Now()
	err = c.Call(context.Background(), rpc.MLookup, &rpc.LookupReq{Parent: 1, Name: "wait"}, &a)
	if rpc.ErrnoOf(err) != syscall.ETIMEDOUT || time.Since(start) > 10*time.Second {
		t.Fatalf("waiting inline handler: %v after %v, want ETIMEDOUT at the call's deadline", err, time.Since(start))
	}
}

// TestInProcessWriteLendsData: an in-process write's data reaches the
// handler without a copy (the store reads the caller's bytes during the
// call); a request whose lent field does not match its length prefix is
// refused.
func TestInProcessWriteLendsData(t *testing.T) {
	s := NewServer([]byte("k"))
	var seen *byte
	Handle(s, rpc.SWrite, func(ctx context.Context, r *rpc.WriteReq) (*rpc.Empty, error) {
		if len(r.Data) > 0 {
			seen = &r.Data[0]
		}
		if string(r.Data) != "payload" || r.Off != 9 {
			return nil, rpc.Errorf(syscall.EINVAL, "got %q at %d", r.Data, r.Off)
		}
		return &rpc.Empty{}, nil
	})
	c := serveInProcess(t, s, []byte("k"))
	data := []byte("payload")
	if err := c.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 2}, Off: 9, Data: data}, &rpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	if seen != &data[0] {
		t.Fatal("the handler got a copy of the write's data")
	}
	var e rpc.Enc
	req := &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 2}, Data: data}
	req.EncodeHead(&e)
	d := rpc.NewDecTail(e.B, data[:3])
	var got rpc.WriteReq
	got.Decode(d)
	if d.Err() == nil {
		t.Fatal("a lent field shorter than its length prefix decoded")
	}
}

// TestInProcessDirectRead: with ReadResp.Direct the handler sees the
// caller's destination (LocalReadDest) and may answer bytes placed there;
// the caller gets them in Into without a copy. Without Direct the handler
// sees none, and an answer in the handler's own memory is still copied.
func TestInProcessDirectRead(t *testing.T) {
	s := NewServer(nil)
	Handle(s, rpc.SRead, func(ctx context.Context, r *rpc.ReadReq) (*rpc.ReadResp, error) {
		if dst := LocalReadDest(ctx); dst != nil {
			if len(dst) < int(r.Len) {
				return nil, rpc.Errorf(syscall.EINVAL, "destination of %d bytes for %d", len(dst), r.Len)
			}
			for i := range dst[:r.Len] {
				dst[i] = 'x'
			}
			return &rpc.ReadResp{Data: dst[:r.Len]}, nil
		}
		return &rpc.ReadResp{Data: bytes.Repeat([]byte{'c'}, int(r.Len))}, nil
	})
	c := serveInProcess(t, s, nil)
	into := make([]byte, 4096)
	resp := rpc.ReadResp{Into: into, Direct: true}
	if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Len: 4000}, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Data) != 4000 || &resp.Data[0] != &into[0] || !bytes.Equal(resp.Data, bytes.Repeat([]byte{'x'}, 4000)) {
		t.Fatalf("direct answer: %d bytes, aliasing Into: %v", len(resp.Data), len(resp.Data) > 0 && &resp.Data[0] == &into[0])
	}
	plain := rpc.ReadResp{Into: make([]byte, 4096)}
	if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Len: 4096}, &plain); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Data, bytes.Repeat([]byte{'c'}, 4096)) {
		t.Fatal("without Direct the handler was given the destination, or the copy failed")
	}
}

// TestInProcessOnCaller: a caller marked OnCaller runs any method's
// handler on its own goroutine, and a read answer still reaches it as on
// the hand-over path: straight into Into when Direct, copied into Into
// otherwise, the handler's buffer released after the copy. Unmarked
// callers keep the hand-over to a worker.
func TestInProcessOnCaller(t *testing.T) {
	s := NewServer(nil)
	onCaller := func() bool {
		buf := make([]byte, 64<<10)
		return strings.Contains(string(buf[:runtime.Stack(buf, false)]), ".TestInProcessOnCaller(")
	}
	var released atomic.Int32
	Handle(s, rpc.SRead, func(ctx context.Context, r *rpc.ReadReq) (*releasingRead, error) {
		if want := r.Off == 1; onCaller() != want {
			return nil, rpc.Errorf(syscall.EIO, "handler on the caller's goroutine: %v, want %v", !want, want)
		}
		if dst := LocalReadDest(ctx); dst != nil {
			for i := range dst[:r.Len] {
				dst[i] = 'x'
			}
			return &releasingRead{ReadResp: rpc.ReadResp{Data: dst[:r.Len]}, n: &released}, nil
		}
		return &releasingRead{ReadResp: rpc.ReadResp{Data: bytes.Repeat([]byte{'c'}, int(r.Len))}, n: &released}, nil
	})
	c := serveInProcess(t, s, nil)
	here := OnCaller(context.Background())
	into := make([]byte, 4096)
	direct := rpc.ReadResp{Into: into, Direct: true}
	if err := c.Call(here, rpc.SRead, &rpc.ReadReq{Off: 1, Len: 4000}, &direct); err != nil {
		t.Fatal(err)
	}
	if len(direct.Data) != 4000 || &direct.Data[0] != &into[0] || !bytes.Equal(direct.Data, bytes.Repeat([]byte{'x'}, 4000)) {
		t.Fatalf("direct answer on the caller: %d bytes, aliasing Into: %v", len(direct.Data), len(direct.Data) > 0 && &direct.Data[0] == &into[0])
	}
	copied := rpc.ReadResp{Into: make([]byte, 4096)}
	if err := c.Call(here, rpc.SRead, &rpc.ReadReq{Off: 1, Len: 4096}, &copied); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copied.Data, bytes.Repeat([]byte{'c'}, 4096)) {
		t.Fatal("copied answer on the caller wrong")
	}
	if err := c.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Off: 0, Len: 10}, &rpc.ReadResp{Into: make([]byte, 10)}); err != nil {
		t.Fatalf("unmarked caller: %v", err)
	}
	if n := released.Load(); n != 3 {
		t.Fatalf("%d answers released, want 3", n)
	}
}

// releasingRead is a read answer that counts its releases.
type releasingRead struct {
	rpc.ReadResp
	n *atomic.Int32
}

func (r *releasingRead) Release() { r.n.Add(1) }

// serveInProcess serves s on a loopback listener and returns a client that
// reaches it in-process (the local path), both closed with the test.
func serveInProcess(t *testing.T, s *Server, key []byte) *Client {
	t.Helper()
	return serveInProcessWith(t, s, ClientConfig{Key: key})
}

// serveInProcessWith is serveInProcess with the client configured by cfg.
func serveInProcessWith(t *testing.T, s *Server, cfg ClientConfig) *Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	if err := waitLocal(ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	c := NewClient(ln.Addr().String(), cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

// BenchmarkInProcessCall measures small calls on the in-process path
// (`strata up`): a getattr run inline and on a worker goroutine, and a
// 4 KiB read handed over into the caller's buffer.
//
//	go test -run '^$' -bench InProcessCall -benchtime 2s ./internal/transport/
func BenchmarkInProcessCall(b *testing.B) {
	s := NewServer([]byte("k"))
	Handle(s, rpc.MLookup, func(ctx context.Context, r *rpc.LookupReq) (*rpc.AttrResp, error) {
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Parent}}, nil
	})
	Handle(s, rpc.MGetAttr, func(ctx context.Context, r *rpc.GetAttrReq) (*rpc.AttrResp, error) {
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Ino}}, nil
	})
	data := bytes.Repeat([]byte{'d'}, 4096)
	Handle(s, rpc.SRead, func(ctx context.Context, r *rpc.ReadReq) (*rpc.ReadResp, error) {
		return &rpc.ReadResp{Data: data[:r.Len]}, nil
	})
	s.Inline(rpc.MLookup)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	if err := waitLocal(ln.Addr().String()); err != nil {
		b.Fatal(err)
	}
	c := NewClient(ln.Addr().String(), ClientConfig{Key: []byte("k")})
	defer c.Close()
	ctx := context.Background()
	b.Run("inline", func(b *testing.B) {
		b.ReportAllocs()
		var a rpc.AttrResp
		for i := 0; i < b.N; i++ {
			if err := c.Call(ctx, rpc.MLookup, &rpc.LookupReq{Parent: 7, Name: "x"}, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("worker", func(b *testing.B) {
		b.ReportAllocs()
		var a rpc.AttrResp
		for i := 0; i < b.N; i++ {
			if err := c.Call(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: 9}, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read4k", func(b *testing.B) {
		b.ReportAllocs()
		into := make([]byte, 4096)
		for i := 0; i < b.N; i++ {
			resp := rpc.ReadResp{Into: into}
			if err := c.Call(ctx, rpc.SRead, &rpc.ReadReq{Len: 4096}, &resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
