package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// ClientConfig tunes a Client.
type ClientConfig struct {
	Key         []byte        // cluster key
	Conns       int           // connections per peer; default 2
	DialTimeout time.Duration // default 3 s
	CallTimeout time.Duration // used when the context has no deadline; default 30 s
	// NoLocal forces the network path even when the peer serves in this
	// process (see local.go); for tests of the transport itself.
	NoLocal bool
	// TLS, when set, wraps every connection in mutual TLS (LoadTLS)
	// before the cluster-key handshake.
	TLS *tls.Config
	// PingInterval: a connection on which nothing was sent for this long
	// sends a ping, which keeps it within the server's IdleTimeout;
	// default 20 s.
	PingInterval time.Duration
	// FrameTimeout bounds the arrival of an answer whose header is in;
	// default 30 s.
	FrameTimeout time.Duration
}

// Client calls one peer address over a small pool of multiplexed
// connections. Broken connections are redialled on the next call. Safe for
// concurrent use.
type Client struct {
	addr   string
	cfg    ClientConfig
	next   atomic.Uint32
	conns  []*clientConn // fixed length; entries replaced under mu
	dialMu []sync.Mutex  // one per slot: a single dial per broken slot
	mu     sync.Mutex
}

// NewClient returns a client for addr; it dials lazily.
func NewClient(addr string, cfg ClientConfig) *Client {
	if cfg.Conns <= 0 {
		cfg.Conns = 2
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 20 * time.Second
	}
	if cfg.FrameTimeout <= 0 {
		cfg.FrameTimeout = 30 * time.Second
	}
	return &Client{addr: addr, cfg: cfg, conns: make([]*clientConn, cfg.Conns), dialMu: make([]sync.Mutex, cfg.Conns)}
}

// Addr is the peer address.
func (c *Client) Addr() string { return c.addr }

// Close closes all connections; calls in flight fail with ErrUnavailable.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cc := range c.conns {
		if cc != nil {
			cc.fail(errors.New("client closed"))
			c.conns[i] = nil
		}
	}
	return nil
}

// Call sends req and decodes the answer into resp (which may alias the
// answer's buffer). Errors: *Error for an errno answered by the peer
// (errors.Is with syscall errnos works), ErrUnavailable for transport trouble
// (wrapped with the address and the cause).
func (c *Client) Call(ctx context.Context, m rpc.Method, req, resp rpc.Message) error {
	deadline := deadlineOf(ctx, c.cfg.CallTimeout)
	if s := lookupLocal(c.addr); s != nil && !c.cfg.NoLocal {
		return c.callLocal(ctx, s, deadline, m, req, resp)
	}
	cc, err := c.conn(ctx, deadline)
	if err != nil {
		return err
	}
	return cc.call(ctx, deadline, m, req, resp)
}

func (c *Client) conn(ctx context.Context, deadline time.Time) (*clientConn, error) {
	i := int(c.next.Add(1)) % len(c.conns)
	c.mu.Lock()
	cc := c.conns[i]
	if cc != nil && !cc.broken() {
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()
	c.dialMu[i].Lock()
	defer c.dialMu[i].Unlock()
	c.mu.Lock()
	cc = c.conns[i]
	c.mu.Unlock()
	if cc != nil && !cc.broken() {
		return cc, nil // another caller dialled while we waited
	}
	nc, err := dialAuthCtx(ctx, c.addr, c.cfg, minTime(deadline, time.Now().Add(c.cfg.DialTimeout)))
	if err != nil {
		return nil, err
	}
	ncc := newClientConn(nc, c.cfg.FrameTimeout, c.cfg.PingInterval)
	c.mu.Lock()
	old := c.conns[i]
	c.conns[i] = ncc
	c.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced"))
	}
	return ncc, nil
}

// dialAuth connects to addr and authenticates both sides (TLS first when
// cfg has it, then the cluster key), all by deadline.
func dialAuth(addr string, cfg ClientConfig, deadline time.Time) (net.Conn, error) {
	return dialAuthCtx(context.Background(), addr, cfg, deadline)
}

func dialAuthCtx(ctx context.Context, addr string, cfg ClientConfig, deadline time.Time) (net.Conn, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	nc, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrUnavailable, addr, err)
	}
	setNoDelay(nc)
	if cfg.TLS != nil {
		tc, err := clientTLS(nc, cfg.TLS, addr, deadline)
		if err != nil {
			nc.Close()
			if errors.Is(err, ErrAuth) {
				return nil, fmt.Errorf("connect %s: %w", addr, err)
			}
			return nil, fmt.Errorf("%w: handshake with %s: %v", ErrUnavailable, addr, err)
		}
		nc = tc
	}
	if err := clientHandshake(nc, cfg.Key, deadline); err != nil {
		nc.Close()
		if cfg.TLS != nil {
			// TLS 1.3: a server refusing our certificate says so
			// after our side of the TLS handshake completed.
			err = tlsError(err)
		}
		if errors.Is(err, ErrAuth) {
			return nil, fmt.Errorf("connect %s: %w", addr, err)
		}
		return nil, fmt.Errorf("%w: handshake with %s: %v", ErrUnavailable, addr, err)
	}
	return nc, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// clientConn is one multiplexed connection with a reader goroutine.
type clientConn struct {
	nc           net.Conn
	frameTimeout time.Duration
	wmu          sync.Mutex  // serialises frame writes
	sent         atomic.Bool // a frame was sent since the last ping check
	done         chan struct{}

	mu struct {
		sync.Mutex
		pending map[uint64]pendingCall
		err     error // set once the connection is dead
	}
}

// pendingCall is a call waiting for its answer.
type pendingCall struct {
	m  rpc.Method
	ch chan *frame
}

func newClientConn(nc net.Conn, frameTimeout, pingInterval time.Duration) *clientConn {
	cc := &clientConn{nc: nc, frameTimeout: frameTimeout, done: make(chan struct{})}
	cc.mu.pending = map[uint64]pendingCall{}
	go cc.readLoop()
	go cc.pingLoop(pingInterval)
	return cc
}

// pingLoop sends a ping whenever nothing was sent for an interval, so the
// server does not take a quiet connection (or one whose calls wait long,
// like a lock request) for a dead one.
func (cc *clientConn) pingLoop(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	head, _ := encodeFrame(kindPing, 0, 0, 0, "", nil)
	for {
		select {
		case <-cc.done:
			return
		case <-t.C:
		}
		if cc.sent.Swap(false) {
			continue
		}
		cc.wmu.Lock()
		_ = cc.nc.SetWriteDeadline(time.Now().Add(interval))
		err := writeFrame(cc.nc, head, nil)
		cc.wmu.Unlock()
		if err != nil {
			cc.fail(fmt.Errorf("ping: %w", err))
			return
		}
	}
}

func (cc *clientConn) broken() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.mu.err != nil
}

func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.mu.err == nil {
		cc.mu.err = err
		close(cc.done)
		for id, p := range cc.mu.pending {
			close(p.ch)
			delete(cc.mu.pending, id)
		}
	}
	cc.mu.Unlock()
	cc.nc.Close()
}

func (cc *clientConn) readLoop() {
	fr := newFrameReader(cc.nc, cc.frameTimeout)
	for {
		f, n, err := fr.header(0)
		if err == nil && f.kind != kindResponse {
			err = fmt.Errorf("%w: frame of kind %d from a server", rpc.ErrMalformed, f.kind)
		}
		var p pendingCall
		var ok bool
		if err == nil {
			cc.mu.Lock()
			p, ok = cc.mu.pending[f.id]
			delete(cc.mu.pending, f.id)
			cc.mu.Unlock()
			// The answer to a call given up is read and dropped; its
			// method is unknown, so only MaxFrameBytes bounds it.
			if ok && n > rpc.ResponseLimit(p.m) {
				err = fmt.Errorf("%w: answer to method %d of %d bytes exceeds its limit of %d", rpc.ErrMalformed, p.m, n, rpc.ResponseLimit(p.m))
			}
		}
		if err == nil {
			err = fr.body(f, n)
		}
		if err != nil {
			if errors.Is(err, rpc.ErrMalformed) {
				log.Warn("closing connection", "peer", cc.nc.RemoteAddr().String(), "err", err)
			}
			cc.fail(err)
			if ok {
				close(p.ch) // after fail: the caller reads why
			}
			return
		}
		if ok {
			p.ch <- f
		} else {
			putBuf(f.buf) // caller gave up
		}
	}
}

func (cc *clientConn) call(ctx context.Context, deadline time.Time, m rpc.Method, req, resp rpc.Message) error {
	id := nextID.Add(1)
	ch := make(chan *frame, 1)
	head, tail := encodeFrame(kindRequest, m, id, 0, "", req)
	if err := checkRequestSize(m, len(head)-frameHeaderBytes+len(tail)); err != nil {
		return err
	}
	cc.mu.Lock()
	if err := cc.mu.err; err != nil {
		cc.mu.Unlock()
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, cc.nc.RemoteAddr(), err)
	}
	cc.mu.pending[id] = pendingCall{m: m, ch: ch}
	cc.mu.Unlock()

	cc.wmu.Lock()
	_ = cc.nc.SetWriteDeadline(deadline)
	err := writeFrame(cc.nc, head, tail)
	cc.wmu.Unlock()
	cc.sent.Store(true)
	if err != nil {
		cc.fail(err)
		return fmt.Errorf("%w: send to %s: %v", ErrUnavailable, cc.nc.RemoteAddr(), err)
	}

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var f *frame
	select {
	case f = <-ch:
	case <-ctx.Done():
		cc.forget(id)
		return fmt.Errorf("%w: call %d to %s: %v", ErrUnavailable, m, cc.nc.RemoteAddr(), ctx.Err())
	case <-timer.C:
		cc.forget(id)
		return fmt.Errorf("%w: call %d to %s timed out", ErrUnavailable, m, cc.nc.RemoteAddr())
	}
	if f == nil {
		cc.mu.Lock()
		cerr := cc.mu.err
		cc.mu.Unlock()
		return fmt.Errorf("%w: connection to %s lost: %v", ErrUnavailable, cc.nc.RemoteAddr(), cerr)
	}
	// The body goes back to the pool only if resp copied out of it;
	// otherwise resp may alias it and the garbage collector frees it.
	if c, ok := resp.(rpc.CopyingDecoder); ok && c.CopiesOut() {
		defer putBuf(f.buf)
	}
	d := rpc.NewDec(f.body)
	errno := syscall.Errno(d.U64())
	text := d.String()
	if d.Err() != nil {
		return fmt.Errorf("response from %s: %w", cc.nc.RemoteAddr(), d.Err())
	}
	if errno != 0 {
		return &rpc.Error{Errno: errno, Msg: text}
	}
	if resp != nil {
		resp.Decode(d)
		if d.Err() != nil {
			return fmt.Errorf("response %d from %s: %w", m, cc.nc.RemoteAddr(), d.Err())
		}
	}
	return nil
}

func (cc *clientConn) forget(id uint64) {
	cc.mu.Lock()
	delete(cc.mu.pending, id)
	cc.mu.Unlock()
}
