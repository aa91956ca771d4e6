package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"

	"github.com/stratafs/strata/internal/rpc"
)

// captureLog sends the package's log to a buffer until the test ends
// (registered before the server, so restored after it stopped).
func captureLog(t *testing.T) *testutil.SyncBuffer {
	var buf testutil.SyncBuffer
	old := log
	log = slog.New(slog.NewTextHandler(&buf, nil))
	t.Cleanup(func() { log = old })
	return &buf
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startTunedServer serves MGetAttr and SWrite (answering Empty) with cfg
// applied to the server.
func startTunedServer(t *testing.T, key []byte, cfg func(*Server)) (*countingListener, string) {
	t.Helper()
	s := NewServer(key)
	Handle(s, rpc.MGetAttr, func(ctx context.Context, r *rpc.GetAttrReq) (*rpc.AttrResp, error) {
		return &rpc.AttrResp{Attr: rpc.Attr{Ino: r.Ino}}, nil
	})
	Handle(s, rpc.SWrite, func(ctx context.Context, r *rpc.WriteReq) (*rpc.Empty, error) { return &rpc.Empty{}, nil })
	if cfg != nil {
		cfg(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	go s.Serve(cl)
	t.Cleanup(func() { s.Close() })
	return cl, ln.Addr().String()
}

// rawConn dials addr and authenticates with key, as a client would, and
// leaves the connection to the test to write frames on.
func rawConn(t *testing.T, addr string, key []byte) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if err := clientHandshake(nc, key, time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return nc
}

// frameHead is a request header announcing a body of bodyLen bytes.
func frameHead(m rpc.Method, id uint64, bodyLen int) []byte {
	h := make([]byte, frameHeaderBytes)
	binary.LittleEndian.PutUint32(h[0:], uint32(bodyLen+frameHeaderBytes-4))
	h[4] = kindRequest
	binary.LittleEndian.PutUint16(h[6:], uint16(m))
	binary.LittleEndian.PutUint64(h[8:], id)
	return h
}

// waitClosed waits (at most d) until the server closes nc, and reports
// whether it did.
func waitClosed(nc net.Conn, d time.Duration) bool {
	_ = nc.SetReadDeadline(time.Now().Add(d))
	var b [64]byte
	for {
		_, err := nc.Read(b[:])
		if err == nil {
			continue
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

func TestFrameOverItsMethodLimitClosesConnection(t *testing.T) {
	logs := captureLog(t)
	_, addr := startTunedServer(t, []byte("k"), nil)
	nc := rawConn(t, addr, []byte("k"))
	// A getattr request is a few bytes; announce 32 MiB (under the global
	// frame limit) and send none of it.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := nc.Write(frameHead(rpc.MGetAttr, 1, 32<<20)); err != nil {
		t.Fatal(err)
	}
	if !waitClosed(nc, 5*time.Second) {
		t.Fatal("the connection announcing an oversized getattr is still open after 5 s")
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Errorf("%d bytes allocated for a refused frame", grew)
	}
	if err := waitLogged(logs, "exceeds its limit"); err != nil {
		t.Error(err)
	}
}

// waitLogged waits (bounded) until the log holds want.
func waitLogged(logs *testutil.SyncBuffer, want string) error {
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(logs.String(), want) {
			return nil
		}
	}
	return errors.New("log lacks " + want + ":\n" + logs.String())
}

func TestSlowSenderIsDisconnected(t *testing.T) {
	logs := captureLog(t)
	_, addr := startTunedServer(t, nil, func(s *Server) {
		s.FrameTimeout = 300 * time.Millisecond
		s.IdleTimeout = 10 * time.Second
	})
	nc := rawConn(t, addr, nil)
	var e rpc.Enc
	(&rpc.GetAttrReq{Ino: 1}).Encode(&e)
	body := append(e.B, make([]byte, 100)...) // more than the sender will get out
	if _, err := nc.Write(frameHead(rpc.MGetAttr, 1, len(body))); err != nil {
		t.Fatal(err)
	}
	// One byte every 50 ms: a frame that never completes within 300 ms.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for _, b := range body {
			if _, err := nc.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if !waitClosed(nc, 4*time.Second) {
		t.Fatal("a sender trickling one byte every 50 ms is still connected after 4 s")
	}
	nc.Close()
	<-closed
	if err := waitLogged(logs, "i/o timeout"); err != nil {
		t.Error(err)
	}
}

func TestIdleConnectionClosedUnlessPinged(t *testing.T) {
	ln, addr := startTunedServer(t, nil, func(s *Server) {
		s.IdleTimeout = 300 * time.Millisecond
	})
	silent := rawConn(t, addr, nil)
	if !waitClosed(silent, 4*time.Second) {
		t.Fatal("a connection silent for 4 s is still open (idle timeout 300 ms)")
	}
	// A client pings its idle connections: the one it has stays up.
	c := NewClient(addr, ClientConfig{Conns: 1, NoLocal: true, PingInterval: 50 * time.Millisecond})
	defer c.Close()
	for i := 0; i < 2; i++ {
		if err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 3}, &rpc.AttrResp{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		time.Sleep(time.Second)
	}
	if n := ln.n.Load(); n != 2 {
		t.Fatalf("%d connections accepted, want 2 (the silent one, the client's one)", n)
	}
}

func TestAnnouncedFramesDoNotReserveMemory(t *testing.T) {
	_, addr := startTunedServer(t, []byte("k"), nil)
	const conns, announced = 20, 8 << 20
	ncs := make([]net.Conn, conns)
	for i := range ncs {
		ncs[i] = rawConn(t, addr, []byte("k"))
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, nc := range ncs {
		// A write of 8 MiB is within its method's limit; only its first
		// 4 KiB are sent.
		if _, err := nc.Write(frameHead(rpc.SWrite, 1, announced)); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	// Give the server time to read the headers, and keep the highest
	// heap in use seen meanwhile.
	var peak uint64
	for i := 0; i < 10; i++ {
		time.Sleep(50 * time.Millisecond)
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
	}
	if grew := int64(peak) - int64(before.HeapInuse); grew > 48<<20 {
		t.Fatalf("heap in use grew by %d MiB for %d connections that sent 4 KiB each", grew>>20, conns)
	}
}

func TestOversizedMessagesRefusedBeforeSending(t *testing.T) {
	s := NewServer(nil)
	Handle(s, rpc.MGetXattr, func(ctx context.Context, r *rpc.XattrReq) (*rpc.XattrResp, error) {
		return &rpc.XattrResp{Value: make([]byte, rpc.ResponseLimit(rpc.MGetXattr))}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	c := NewClient(ln.Addr().String(), ClientConfig{NoLocal: true})
	defer c.Close()
	// An answer over its method's limit is replaced by EIO by the server.
	err = c.Call(context.Background(), rpc.MGetXattr, &rpc.XattrReq{Name: "user.big"}, &rpc.XattrResp{})
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "exceeds its limit") {
		t.Fatalf("oversized answer: want EIO naming the limit, got %v", err)
	}
	// A request over its method's limit fails before it is sent, and the
	// connection stays usable.
	err = c.Call(context.Background(), rpc.MGetXattr, &rpc.XattrReq{Name: "user.big", Value: make([]byte, rpc.RequestLimit(rpc.MGetXattr))}, &rpc.XattrResp{})
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("oversized request: want EINVAL, got %v", err)
	}
	if err := c.Call(context.Background(), rpc.MGetXattr, &rpc.XattrReq{}, &rpc.XattrResp{}); !errors.Is(err, syscall.EIO) {
		t.Fatalf("call after a refused request: want the same EIO again, got %v", err)
	}
}
