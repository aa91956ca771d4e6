package transport

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Frame format, version 2 (all integers little-endian):
//
//	offset size field
//	0      4    n: number of bytes that follow this field
//	4      1    kind: 1 request, 2 response, 3 ping (client to server, no body),
//	            4 stream (client to server, first frame only: stream.go)
//	5      1    reserved, 0
//	6      2    method (responses and pings: 0)
//	8      8    request id, chosen by the caller, echoed in the response
//	16     n-12 request: message body
//	            response: errno (uvarint, 0 = success), error text (string),
//	            then the message body when errno is 0
//
// A body is bounded by its method's limit (rpc.RequestLimit,
// rpc.ResponseLimit), checked on the header before any of it is read.
//
// Connection handshake, version 2 (cluster key K, each side proves it):
//
//	server → client  magic (8 bytes, "STRATA\x00\x02"), nonce Ns (16 bytes)
//	client → server  magic, nonce Nc (16 bytes),
//	                 HMAC-SHA256(K, "strata rpc client" || Ns || Nc)
//	server → client  0, HMAC-SHA256(K, "strata rpc server" || Ns || Nc)
//
// The server closes the connection when the client's proof is wrong; the
// client closes it when the server's is. The labels bind each proof to its
// direction, so a peer cannot answer with the other side's own proof. With
// TLS (auth.go) the handshake runs inside the TLS session.
//
// Version history: 1 — initial (only the client proved the key; no pings).
// 2 — mutual proof, ping frames, per-method frame limits; appended within
// 2: the stream frame (kind 4), which a server of an older build refuses
// by closing the connection.
const (
	frameHeaderBytes = 16
	kindRequest      = 1
	kindResponse     = 2
	kindPing         = 3
	kindStream       = 4 // stream.go
	// MaxFrameBytes bounds any frame; each method has its own, lower,
	// limit (rpc.RequestLimit, rpc.ResponseLimit). Larger lengths are a
	// protocol error.
	MaxFrameBytes = rpc.MaxMessageBytes
)

var magic = [8]byte{'S', 'T', 'R', 'A', 'T', 'A', 0, 2}

// magicV1 opened version 1 handshakes; recognised only to name the problem.
var magicV1 = [8]byte{'S', 'T', 'R', 'A', 'T', 'A', 0, 1}

// ErrUnavailable marks a call that failed because the peer could not be
// reached, the connection broke, or the call timed out. The request may or
// may not have been executed. Callers retry or turn it into EIO.
var ErrUnavailable = errors.New("transport: peer unavailable")

// ErrAuth marks a failed handshake: one side did not prove the cluster key
// (or, with TLS, did not present a certificate the other side trusts).
var ErrAuth = errors.New("transport: authentication failed")

// encodeFrame builds a frame's head; tail (possibly nil) follows it on the wire.
func encodeFrame(kind byte, method rpc.Method, id uint64, errno syscall.Errno, errText string, m rpc.Message) (head, tail []byte) {
	e := rpc.Enc{B: make([]byte, frameHeaderBytes, 256)}
	if kind == kindResponse {
		e.U64(uint64(errno))
		e.String(errText)
	}
	if m != nil && errno == 0 {
		if t, ok := m.(rpc.Tailer); ok {
			tail = t.EncodeHead(&e)
		} else {
			m.Encode(&e)
		}
	}
	b := e.B
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)-4+len(tail)))
	b[4] = kind
	b[5] = 0
	binary.LittleEndian.PutUint16(b[6:], uint16(method))
	binary.LittleEndian.PutUint64(b[8:], id)
	return b, tail
}

// frame is one received frame; body aliases a buffer owned by the frame.
type frame struct {
	kind   byte
	method rpc.Method
	id     uint64
	body   []byte
	buf    []byte // to return to the pool when done
}

// frameReader reads frames from one connection and keeps its read deadline:
// the wait for a frame's header is bounded by the caller's idle time (none
// on the client side, where calls have their own timeouts), and a body,
// once its header is in, must arrive within frameTimeout.
type frameReader struct {
	c            net.Conn
	r            *bufio.Reader
	frameTimeout time.Duration
	deadline     bool // a read deadline is set on c
}

func newFrameReader(c net.Conn, frameTimeout time.Duration) *frameReader {
	return &frameReader{c: c, r: bufio.NewReaderSize(c, 256<<10), frameTimeout: frameTimeout}
}

func (fr *frameReader) setDeadline(d time.Duration) {
	if d > 0 {
		_ = fr.c.SetReadDeadline(time.Now().Add(d))
		fr.deadline = true
	} else if fr.deadline {
		_ = fr.c.SetReadDeadline(time.Time{})
		fr.deadline = false
	}
}

// header reads the next frame's header and returns the frame without its
// body and the body's length, checked against MaxFrameBytes only.
func (fr *frameReader) header(idle time.Duration) (*frame, int, error) {
	if fr.r.Buffered() < frameHeaderBytes {
		fr.setDeadline(idle)
	}
	var h [frameHeaderBytes]byte
	if _, err := io.ReadFull(fr.r, h[:]); err != nil {
		return nil, 0, err
	}
	n := binary.LittleEndian.Uint32(h[0:])
	if n < frameHeaderBytes-4 || n > MaxFrameBytes {
		return nil, 0, fmt.Errorf("%w: frame length %d", rpc.ErrMalformed, n)
	}
	f := &frame{kind: h[4], method: rpc.Method(binary.LittleEndian.Uint16(h[6:])), id: binary.LittleEndian.Uint64(h[8:])}
	if f.kind < kindRequest || f.kind > kindStream {
		return nil, 0, fmt.Errorf("%w: frame kind %d", rpc.ErrMalformed, f.kind)
	}
	bodyLen := int(n) - (frameHeaderBytes - 4)
	if f.kind == kindPing && bodyLen != 0 {
		return nil, 0, fmt.Errorf("%w: ping with a %d-byte body", rpc.ErrMalformed, bodyLen)
	}
	return f, bodyLen, nil
}

// body reads f's n body bytes, within frameTimeout when they are not all
// buffered yet.
func (fr *frameReader) body(f *frame, n int) error {
	if n > fr.r.Buffered() && fr.frameTimeout > 0 {
		fr.setDeadline(fr.frameTimeout)
	}
	b, err := readBody(fr.r, n)
	if err != nil {
		return fmt.Errorf("read %d-byte body of a frame: %w", n, err)
	}
	f.buf, f.body = b, b
	return nil
}

// readBody reads an n-byte body. Up to preallocBytes (a 1 MiB write and its
// header) the buffer is taken at once; a larger body is read into a buffer
// that grows as its bytes arrive, so that a peer announcing a large frame
// makes this side hold no more than it actually sent (plus preallocBytes).
func readBody(r io.Reader, n int) ([]byte, error) {
	if n <= preallocBytes {
		b := getBuf(n)
		if _, err := io.ReadFull(r, b); err != nil {
			putBuf(b)
			return nil, err
		}
		return b, nil
	}
	b := getBuf(preallocBytes)[:0]
	for len(b) < n {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(2*cap(b), n))
			copy(nb, b)
			putBuf(b)
			b = nb
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			putBuf(b)
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return b, nil
}

// Buffer pool for frame bodies: size classes of powers of two from 64 KiB
// to 1 MiB, each with poolSlackBytes of headroom so that a 1 MiB payload
// plus its few bytes of header fits the 1 MiB class. Small bodies are left
// to the allocator, and so are larger ones: they are rare (lists, reads
// over 1 MiB) and a pool would keep them alive.
const (
	poolMinBytes   = 64 << 10
	poolSlackBytes = 4 << 10
	preallocBytes  = poolMinBytes<<(len(bufPools)-1) + poolSlackBytes
)

var bufPools [5]sync.Pool // 64 KiB .. 1 MiB

func poolClass(n int) int {
	c, size := 0, poolMinBytes+poolSlackBytes
	for size < n {
		size = (size-poolSlackBytes)<<1 + poolSlackBytes
		c++
	}
	return c
}

func classBytes(c int) int { return poolMinBytes<<c + poolSlackBytes }

func getBuf(n int) []byte {
	if n < poolMinBytes {
		return make([]byte, n)
	}
	c := poolClass(n)
	if c >= len(bufPools) {
		return make([]byte, n)
	}
	if b, ok := bufPools[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, classBytes(c))
}

func putBuf(b []byte) {
	if cap(b) < poolMinBytes {
		return
	}
	c := poolClass(cap(b))
	if c >= len(bufPools) || classBytes(c) != cap(b) {
		return
	}
	b = b[:cap(b)]
	bufPools[c].Put(&b)
}

// setNoDelay turns off Nagle for request/response latency.
func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		_ = tc.SetReadBuffer(4 << 20)
		_ = tc.SetWriteBuffer(4 << 20)
	}
}

// writeFrame writes head and tail with one writev.
func writeFrame(c net.Conn, head, tail []byte) error {
	if len(tail) == 0 {
		_, err := c.Write(head)
		return err
	}
	bufs := net.Buffers{head, tail}
	_, err := bufs.WriteTo(c)
	return err
}

var nextID atomic.Uint64

// logger used by the transport.
var log = slog.Default().With("pkg", "transport")

// deadlineOf returns ctx's deadline or now+def.
func deadlineOf(ctx context.Context, def time.Duration) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(def)
}

func newNonce() []byte {
	n := make([]byte, 16)
	if _, err := rand.Read(n); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // broken invariant: no entropy
	}
	return n
}

// checkRequestSize refuses, before sending, a request the peer would take
// for a protocol error (and close the connection on).
func checkRequestSize(m rpc.Method, n int) error {
	if limit := rpc.RequestLimit(m); n > limit {
		return rpc.Errorf(syscall.EINVAL, "request %d of %d bytes exceeds its limit of %d", m, n, limit)
	}
	return nil
}
