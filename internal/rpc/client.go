package rpc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
func (c *Client) Call(ctx context.Context, m Method, req, resp Message) error {
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
	dctx, cancel := context.WithDeadline(ctx, minTime(deadline, time.Now().Add(c.cfg.DialTimeout)))
	defer cancel()
	nc, err := (&net.Dialer{}).DialContext(dctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrUnavailable, c.addr, err)
	}
	setNoDelay(nc)
	if err := clientHandshake(nc, c.cfg.Key, minTime(deadline, time.Now().Add(c.cfg.DialTimeout))); err != nil {
		nc.Close()
		if errors.Is(err, ErrAuth) {
			return nil, fmt.Errorf("connect %s: %w", c.addr, err)
		}
		return nil, fmt.Errorf("%w: handshake with %s: %v", ErrUnavailable, c.addr, err)
	}
	ncc := newClientConn(nc)
	c.mu.Lock()
	old := c.conns[i]
	c.conns[i] = ncc
	c.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced"))
	}
	return ncc, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func clientHandshake(nc net.Conn, key []byte, deadline time.Time) error {
	_ = nc.SetDeadline(deadline)
	defer nc.SetDeadline(time.Time{})
	var in [8 + 16]byte
	if _, err := io.ReadFull(nc, in[:]); err != nil {
		return err
	}
	if !bytes.Equal(in[:8], magic[:]) {
		return fmt.Errorf("%w: bad magic %q", ErrMalformed, in[:8])
	}
	if _, err := nc.Write(append(magic[:], authProof(key, in[8:])...)); err != nil {
		return err
	}
	var ok [1]byte
	if _, err := io.ReadFull(nc, ok[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return ErrAuth
		}
		return err
	}
	return nil
}

// clientConn is one multiplexed connection with a reader goroutine.
type clientConn struct {
	nc  net.Conn
	wmu sync.Mutex // serialises frame writes

	mu struct {
		sync.Mutex
		pending map[uint64]chan *frame
		err     error // set once the connection is dead
	}
}

func newClientConn(nc net.Conn) *clientConn {
	cc := &clientConn{nc: nc}
	cc.mu.pending = map[uint64]chan *frame{}
	go cc.readLoop()
	return cc
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
		for id, ch := range cc.mu.pending {
			close(ch)
			delete(cc.mu.pending, id)
		}
	}
	cc.mu.Unlock()
	cc.nc.Close()
}

func (cc *clientConn) readLoop() {
	r := bufio.NewReaderSize(cc.nc, 256<<10)
	for {
		f, err := readFrame(r)
		if err != nil {
			cc.fail(err)
			return
		}
		cc.mu.Lock()
		ch, ok := cc.mu.pending[f.id]
		delete(cc.mu.pending, f.id)
		cc.mu.Unlock()
		if ok {
			ch <- f
		} else {
			putBuf(f.buf) // caller gave up
		}
	}
}

func (cc *clientConn) call(ctx context.Context, deadline time.Time, m Method, req, resp Message) error {
	id := nextID.Add(1)
	ch := make(chan *frame, 1)
	cc.mu.Lock()
	if err := cc.mu.err; err != nil {
		cc.mu.Unlock()
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, cc.nc.RemoteAddr(), err)
	}
	cc.mu.pending[id] = ch
	cc.mu.Unlock()

	head, tail := encodeFrame(kindRequest, m, id, 0, "", req)
	cc.wmu.Lock()
	_ = cc.nc.SetWriteDeadline(deadline)
	err := writeFrame(cc.nc, head, tail)
	cc.wmu.Unlock()
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
	if c, ok := resp.(interface{ copiesOut() bool }); ok && c.copiesOut() {
		defer putBuf(f.buf)
	}
	d := NewDec(f.body)
	errno := syscall.Errno(d.U64())
	text := d.String()
	if d.Err() != nil {
		return fmt.Errorf("response from %s: %w", cc.nc.RemoteAddr(), d.Err())
	}
	if errno != 0 {
		return &Error{Errno: errno, Msg: text}
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
