package transport

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Streams: a connection that, once authenticated, leaves the frame protocol
// and is handed whole to another protocol served on the same port (the
// metadata voters' raft traffic shares their rpc --listen port this way).
//
// After the handshake the client sends one stream frame instead of a
// request (kind 4, the method field holding the stream's purpose, request
// id 0, the body a hello of the purpose's own: the raft stream's is the
// dialer's cluster id). The server answers with a response frame (id 0):
// errno 0 and a reply body (uvarint length and bytes), after which both
// sides own the raw connection; or an errno and a text saying why the
// stream was refused, after which it closes the connection. A stream frame
// is valid only as the first frame of a connection; servers before it
// (frame kinds 1-3) close a connection that sends one.

// Stream purposes (the stream frame's method field).
const (
	// StreamRaft carries hashicorp/raft's network transport between
	// metadata voters.
	StreamRaft uint16 = 1
)

// maxStreamHello bounds a stream frame's body and its answer's.
const maxStreamHello = 4 << 10

// StreamCheck decides whether to accept a stream from peer (the remote
// address) whose hello is hello: it returns the reply for the dialer, or an
// error whose text the dialer receives as the reason of the refusal.
type StreamCheck func(peer string, hello []byte) (reply []byte, err error)

// StreamListener is a net.Listener of the streams of one purpose that a
// Server accepts, and the dialer of such streams to other servers: what
// raft needs of a stream layer (consensus adapts it to raft.StreamLayer).
type StreamListener struct {
	purpose uint16
	addr    streamAddr
	cfg     ClientConfig
	check   StreamCheck
	// Hello, when set, gives the hello sent with each dial.
	Hello func() []byte
	// Reply, when set, is told of each reply to a dial that was accepted.
	Reply func(addr string, reply []byte)

	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

// streamAddr is the listener's address exactly as configured (a voter's
// raft identity is its --listen address as written, not as resolved).
type streamAddr string

func (streamAddr) Network() string  { return "tcp" }
func (a streamAddr) String() string { return string(a) }

// ListenStream registers the streams of purpose: s hands each one that
// check accepts to the returned listener. addr is what the listener's Addr
// reports; cfg (key, TLS, DialTimeout) serves its dials. Call before Serve.
func (s *Server) ListenStream(purpose uint16, addr string, cfg ClientConfig, check StreamCheck) *StreamListener {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	l := &StreamListener{purpose: purpose, addr: streamAddr(addr), cfg: cfg, check: check,
		conns: make(chan net.Conn), done: make(chan struct{})}
	if s.streams == nil {
		s.streams = map[uint16]*StreamListener{}
	}
	s.streams[purpose] = l
	return l
}

// Accept returns the next accepted stream.
func (l *StreamListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting: streams arriving later are closed.
func (l *StreamListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

// Addr is the address given to ListenStream.
func (l *StreamListener) Addr() net.Addr { return l.addr }

// DialStream opens a stream of the listener's purpose to the server at
// addr, sending Hello's hello.
func (l *StreamListener) DialStream(addr string, timeout time.Duration) (net.Conn, error) {
	var hello []byte
	if l.Hello != nil {
		hello = l.Hello()
	}
	if timeout <= 0 || timeout > l.cfg.DialTimeout {
		timeout = l.cfg.DialTimeout
	}
	c, reply, err := DialStream(addr, l.purpose, hello, l.cfg, timeout)
	if err != nil {
		return nil, err
	}
	if l.Reply != nil {
		l.Reply(addr, reply)
	}
	return c, nil
}

// ErrStreamRefused marks a stream the server refused (its check said no,
// or it serves no stream of that purpose); the error's text says why.
var ErrStreamRefused = errors.New("transport: stream refused")

// DialStream connects to addr, authenticates (cfg's key and TLS), opens a
// stream of purpose with hello and returns the raw connection and the
// server's reply. Errors: ErrAuth for a failed handshake (a wrong key),
// ErrStreamRefused (with the server's reason) for a refusal, else
// ErrUnavailable.
func DialStream(addr string, purpose uint16, hello []byte, cfg ClientConfig, timeout time.Duration) (net.Conn, []byte, error) {
	deadline := time.Now().Add(timeout)
	nc, err := dialAuth(addr, cfg, deadline)
	if err != nil {
		return nil, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	_ = nc.SetDeadline(deadline)
	head, _ := encodeFrame(kindStream, rpc.Method(purpose), 0, 0, "", rawBody(hello))
	if err := writeFrame(nc, head, nil); err != nil {
		return nil, nil, fmt.Errorf("%w: open stream to %s: %v", ErrUnavailable, addr, err)
	}
	fr := newFrameReader(nc, 0)
	f, n, err := fr.header(0)
	if err == nil && (f.kind != kindResponse || n > maxStreamHello+64) {
		err = fmt.Errorf("%w: unexpected answer to a stream frame (kind %d, %d bytes)", rpc.ErrMalformed, f.kind, n)
	}
	if err == nil {
		err = fr.body(f, n)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: open stream to %s: %v", ErrUnavailable, addr, err)
	}
	d := rpc.NewDec(f.body)
	errno, text := syscall.Errno(d.U64()), d.String()
	if errno != 0 {
		return nil, nil, fmt.Errorf("%w by %s: %s", ErrStreamRefused, addr, text)
	}
	reply := append([]byte(nil), d.Bytes()...)
	if err := d.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: open stream to %s: %v", ErrUnavailable, addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	ok = true
	return &bufConn{Conn: nc, r: fr.r}, reply, nil
}

// rawBody encodes a byte string as a message body.
type rawBody []byte

func (b rawBody) Encode(e *rpc.Enc) { e.Bytes(b) }
func (rawBody) Decode(*rpc.Dec)     {}

// bufConn is a connection whose first bytes may already sit in a reader's
// buffer.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// serveStream answers a connection's stream frame f: it hands the
// connection to the purpose's listener (true: the caller must not close
// it), or refuses it.
func (s *Server) serveStream(c net.Conn, fr *frameReader, f *frame, peer string) bool {
	l := s.streams[uint16(f.method)]
	refuse := func(errno syscall.Errno, why string) bool {
		log.Warn("refused stream", "peer", peer, "purpose", f.method, "why", why)
		head, _ := encodeFrame(kindResponse, 0, 0, errno, why, nil)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = writeFrame(c, head, nil)
		return false
	}
	if l == nil {
		return refuse(syscall.ENOSYS, fmt.Sprintf("no stream of purpose %d served here", f.method))
	}
	d := rpc.NewDec(f.body)
	hello := d.Bytes()
	if d.Err() != nil {
		return refuse(syscall.EINVAL, "malformed stream hello")
	}
	var reply []byte
	if l.check != nil {
		var err error
		if reply, err = l.check(peer, hello); err != nil {
			return refuse(syscall.EPERM, err.Error())
		}
	}
	head, _ := encodeFrame(kindResponse, 0, 0, 0, "", rawBody(reply))
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := writeFrame(c, head, nil); err != nil {
		return false
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case l.conns <- &bufConn{Conn: c, r: fr.r}:
		return true
	case <-l.done:
		return false
	case <-s.quit:
		return false
	}
}
