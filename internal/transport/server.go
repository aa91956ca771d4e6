package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// HandlerFunc serves one request. d decodes the request body, which aliases
// a pooled buffer: the handler must not keep any slice of the request after
// it returns. The returned Message is encoded as the answer; an error is
// answered with ErrnoOf(err) and err's text.
type HandlerFunc func(ctx context.Context, d *rpc.Dec) (rpc.Message, error)

// Releaser is implemented by handler answers that hold memory to give
// back (a pooled read buffer): the transport calls Release once the answer
// was sent, or handed over and copied out in-process, or abandoned.
type Releaser interface {
	Release()
}

// Handle registers fn for method m with typed request and response.
func Handle[Req any, PReq interface {
	*Req
	rpc.Message
}, Resp rpc.Message](s *Server, m rpc.Method, fn func(context.Context, PReq) (Resp, error)) {
	s.handlers[m] = func(ctx context.Context, d *rpc.Dec) (rpc.Message, error) {
		req := PReq(new(Req))
		req.Decode(d)
		if err := d.Err(); err != nil {
			return nil, &rpc.Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("decode request %d: %v", m, err)}
		}
		if n := d.Unread(); n != 0 {
			return nil, &rpc.Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("decode request %d: %d trailing bytes", m, n)}
		}
		return fn(ctx, req)
	}
}

type peerKey struct{}

// Peer returns the remote address of the connection a handler serves.
func Peer(ctx context.Context) string {
	s, _ := ctx.Value(peerKey{}).(string)
	return s
}

// inProcessPeer is Peer for a call from this process (local.go).
const inProcessPeer = "in-process"

// InProcess reports whether a handler serves a caller in this process,
// which may have lent it its own buffers (a write's data).
func InProcess(ctx context.Context) bool { return Peer(ctx) == inProcessPeer }

// Server accepts connections and dispatches requests to handlers. Register
// all handlers before Serve. Each request runs in its own goroutine, at most
// MaxInflight per connection, so requests on one connection are pipelined.
type Server struct {
	Key         []byte                                         // cluster key; both sides must hold the same
	MaxInflight int                                            // per connection; default 256
	Observe     func(m rpc.Method, d time.Duration, err error) // optional metrics hook
	// TLS, when set, wraps every connection in mutual TLS (LoadTLS)
	// before the cluster-key handshake.
	TLS *tls.Config
	// IdleTimeout closes a connection on which no frame (clients ping
	// every PingInterval) started for this long; default 90 s.
	IdleTimeout time.Duration
	// FrameTimeout closes a connection whose frame, once its header is in,
	// does not arrive whole within it; default 30 s.
	FrameTimeout time.Duration
	// MaxBodyBytes bounds the request bodies of one connection read and
	// not yet answered: the connection is not read further until answers
	// free room (a body larger than it is read alone); default 64 MiB.
	MaxBodyBytes int
	handlers     map[rpc.Method]HandlerFunc
	inline       map[rpc.Method]bool
	streams      map[uint16]*StreamListener // stream.go
	quit         chan struct{}              // closed by Close

	mu struct {
		sync.Mutex
		ln     net.Listener
		conns  map[net.Conn]struct{}
		closed bool
	}
	wg sync.WaitGroup
}

// NewServer returns a server authenticating peers with key.
func NewServer(key []byte) *Server {
	s := &Server{Key: key, MaxInflight: 256, IdleTimeout: 90 * time.Second, FrameTimeout: 30 * time.Second,
		MaxBodyBytes: 64 << 20, handlers: map[rpc.Method]HandlerFunc{}, quit: make(chan struct{})}
	s.mu.conns = map[net.Conn]struct{}{}
	return s
}

// Register adds an untyped handler.
func (s *Server) Register(m rpc.Method, h HandlerFunc) { s.handlers[m] = h }

// Inline marks methods whose handlers only read the server's own memory or
// local store and return in microseconds, or wait no longer than their
// context allows: an in-process caller runs them on its own goroutine (see
// local.go), which saves two goroutine hand-overs per call. Call before
// Serve.
func (s *Server) Inline(ms ...rpc.Method) {
	if s.inline == nil {
		s.inline = map[rpc.Method]bool{}
	}
	for _, m := range ms {
		s.inline[m] = true
	}
}

// Serve accepts on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return errors.New("transport: server closed")
	}
	s.mu.ln = ln
	s.mu.Unlock()
	registerLocal(ln.Addr().String(), s)
	defer unregisterLocal(ln.Addr().String(), s)
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.mu.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
		}
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.mu.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.mu.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every connection and waits for the
// connection goroutines (handlers still running finish on their own).
func (s *Server) Close() error {
	s.mu.Lock()
	if !s.mu.closed {
		close(s.quit)
	}
	s.mu.closed = true
	if s.mu.ln != nil {
		unregisterLocal(s.mu.ln.Addr().String(), s)
		s.mu.ln.Close()
	}
	for c := range s.mu.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// handshake authenticates a new connection (TLS first when configured,
// then the cluster key) and returns the connection to serve.
func (s *Server) handshake(c net.Conn) (net.Conn, error) {
	deadline := time.Now().Add(10 * time.Second)
	if s.TLS != nil {
		tc, err := serverTLS(c, s.TLS, deadline)
		if err != nil {
			return nil, err
		}
		c = tc
	}
	if err := serverHandshake(c, s.Key, deadline); err != nil {
		return nil, err
	}
	return c, nil
}

func (s *Server) serveConn(raw net.Conn) {
	handed := false // to a stream listener, which closes it
	defer func() {
		if !handed {
			raw.Close()
		}
	}()
	setNoDelay(raw)
	peer := raw.RemoteAddr().String()
	c, err := s.handshake(raw)
	if err != nil {
		log.Warn("rejected connection", "peer", peer, "err", err)
		return
	}
	defer func() {
		if !handed {
			c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), peerKey{}, peer))
	defer cancel()
	fr := newFrameReader(c, s.FrameTimeout)
	var wmu sync.Mutex
	sem := make(chan struct{}, s.MaxInflight)
	bodies := newByteSem(s.MaxBodyBytes)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for first := true; ; first = false {
		f, n, err := fr.header(s.IdleTimeout)
		if err == nil && f.kind == kindPing {
			continue
		}
		if err == nil && f.kind == kindStream {
			if !first || n > maxStreamHello+16 {
				err = fmt.Errorf("%w: stream frame of %d bytes, or not first", rpc.ErrMalformed, n)
			} else if err = fr.body(f, n); err == nil {
				handed = s.serveStream(c, fr, f, peer)
				return
			}
		}
		if err == nil && f.kind != kindRequest {
			err = fmt.Errorf("%w: response frame from a client", rpc.ErrMalformed)
		}
		if err == nil && n > rpc.RequestLimit(f.method) {
			err = fmt.Errorf("%w: request %d of %d bytes exceeds its limit of %d", rpc.ErrMalformed, f.method, n, rpc.RequestLimit(f.method))
		}
		if err == nil {
			bodies.acquire(n)
			if err = fr.body(f, n); err != nil {
				bodies.release(n)
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
			case errors.Is(err, rpc.ErrMalformed):
				log.Warn("closing connection", "peer", peer, "err", err)
			default:
				log.Info("closing connection", "peer", peer, "err", err)
			}
			return
		}
		sem <- struct{}{}
		inflight.Add(1)
		go func() {
			defer func() { <-sem; bodies.release(n); inflight.Done() }()
			s.dispatch(ctx, c, &wmu, f)
		}()
	}
}

// byteSem bounds a number of bytes held at once; a single acquisition
// larger than the bound waits until nothing is held.
type byteSem struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit int
	used  int
}

func newByteSem(limit int) *byteSem {
	b := &byteSem{limit: limit}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *byteSem) acquire(n int) {
	if b.limit <= 0 {
		return
	}
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.limit {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *byteSem) release(n int) {
	if b.limit <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (s *Server) dispatch(ctx context.Context, c net.Conn, wmu *sync.Mutex, f *frame) {
	start := time.Now()
	var resp rpc.Message
	var err error
	if h, ok := s.handlers[f.method]; ok {
		resp, err = h(ctx, rpc.NewDec(f.body))
	} else {
		err = &rpc.Error{Errno: syscall.ENOSYS, Msg: fmt.Sprintf("method %d not served here", f.method)}
	}
	putBuf(f.buf)
	var errno syscall.Errno
	var text string
	if err != nil {
		errno, text = rpc.ErrnoOf(err), err.Error()
		if errno == 0 {
			errno = syscall.EIO
		}
	}
	// Metrics first: once a caller has its answer, they count it (a
	// monitor that checks them after a call sees the call).
	if s.Observe != nil {
		s.Observe(f.method, time.Since(start), err)
	}
	head, tail := encodeFrame(kindResponse, 0, f.id, errno, text, resp)
	if n := len(head) - frameHeaderBytes + len(tail); n > rpc.ResponseLimit(f.method) {
		// The client would take it for a protocol error.
		log.Error("answer over its method's limit", "method", f.method, "bytes", n, "limit", rpc.ResponseLimit(f.method))
		head, tail = encodeFrame(kindResponse, 0, f.id, syscall.EIO, fmt.Sprintf("answer to method %d of %d bytes exceeds its limit", f.method, n), nil)
	}
	wmu.Lock()
	_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	werr := writeFrame(c, head, tail)
	wmu.Unlock()
	if werr != nil {
		c.Close() // the reader loop ends the connection
	}
	if r, ok := resp.(Releaser); ok {
		r.Release()
	}
}
