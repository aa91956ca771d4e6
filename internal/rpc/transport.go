package rpc

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
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
)

// Method identifies a remote procedure; see meta_msgs.go and store_msgs.go.
type Method uint16

// Frame format, version 1 (all integers little-endian):
//
//	offset size field
//	0      4    n: number of bytes that follow this field
//	4      1    kind: 1 request, 2 response
//	5      1    reserved, 0
//	6      2    method (responses: 0)
//	8      8    request id, chosen by the caller, echoed in the response
//	16     n-12 request: message body
//	            response: errno (uvarint, 0 = success), error text (string),
//	            then the message body when errno is 0
//
// Connection handshake: the server sends magic (8 bytes) and a 16-byte
// random nonce; the client answers magic and HMAC-SHA256(cluster key, nonce);
// the server answers one byte 0 and serves, or closes the connection.
//
// Version history: 1 — initial.
const (
	frameHeaderBytes = 16
	kindRequest      = 1
	kindResponse     = 2
	// MaxFrameBytes bounds a frame; larger lengths are a protocol error.
	MaxFrameBytes = 80 << 20
)

var magic = [8]byte{'S', 'T', 'R', 'A', 'T', 'A', 0, 1}

// ErrUnavailable marks a call that failed because the peer could not be
// reached, the connection broke, or the call timed out. The request may or
// may not have been executed. Callers retry or turn it into EIO.
var ErrUnavailable = errors.New("rpc: peer unavailable")

// ErrAuth marks a failed cluster-key handshake.
var ErrAuth = errors.New("rpc: authentication failed (cluster key mismatch)")

// Error is an errno answered by the peer, with the peer's explanation.
// errors.Is(err, syscall.ENOENT) works on it.
type Error struct {
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Errno.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Errno }

// Errorf builds an *Error carrying errno and a formatted explanation.
func Errorf(errno syscall.Errno, format string, args ...any) error {
	return &Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// ErrnoOf extracts the errno a handler error should be answered with:
// an *Error's, a wrapped syscall.Errno's, or EIO.
func ErrnoOf(err error) syscall.Errno {
	var re *Error
	if errors.As(err, &re) {
		return re.Errno
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return syscall.EIO
}

// tailer is implemented by messages whose last field is a large byte slice
// (WriteReq, ReadResp). EncodeHead encodes everything up to and including
// that field's length prefix and returns the field, which the transport then
// writes straight from the caller's memory (one copy less per MiB).
type tailer interface {
	EncodeHead(e *Enc) (tail []byte)
}

func (m *WriteReq) EncodeHead(e *Enc) []byte {
	m.Chunk.Encode(e)
	e.U64(m.Off)
	e.Bool(m.Sync)
	e.U64(uint64(len(m.Data)))
	return m.Data
}

func (m *ReadResp) EncodeHead(e *Enc) []byte {
	e.U64(uint64(len(m.Data)))
	return m.Data
}

// encodeFrame builds a frame's head; tail (possibly nil) follows it on the wire.
func encodeFrame(kind byte, method Method, id uint64, errno syscall.Errno, errText string, m Message) (head, tail []byte) {
	e := Enc{B: make([]byte, frameHeaderBytes, 256)}
	if kind == kindResponse {
		e.U64(uint64(errno))
		e.String(errText)
	}
	if m != nil && errno == 0 {
		if t, ok := m.(tailer); ok {
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
	method Method
	id     uint64
	body   []byte
	buf    []byte // to return to the pool when done
}

func readFrame(r *bufio.Reader) (*frame, error) {
	var h [frameHeaderBytes]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(h[0:])
	if n < frameHeaderBytes-4 || n > MaxFrameBytes {
		return nil, fmt.Errorf("%w: frame length %d", ErrMalformed, n)
	}
	f := &frame{kind: h[4], method: Method(binary.LittleEndian.Uint16(h[6:])), id: binary.LittleEndian.Uint64(h[8:])}
	if f.kind != kindRequest && f.kind != kindResponse {
		return nil, fmt.Errorf("%w: frame kind %d", ErrMalformed, f.kind)
	}
	bodyLen := int(n) - (frameHeaderBytes - 4)
	f.buf = getBuf(bodyLen)
	f.body = f.buf[:bodyLen]
	if _, err := io.ReadFull(r, f.body); err != nil {
		putBuf(f.buf)
		return nil, err
	}
	return f, nil
}

// Buffer pool for frame bodies: size classes of powers of two from 64 KiB,
// each with poolSlackBytes of headroom so that a 1 MiB payload plus its
// few bytes of header fits the 1 MiB class. Small bodies are left to the
// allocator.
const (
	poolMinBytes   = 64 << 10
	poolSlackBytes = 4 << 10
)

var bufPools [12]sync.Pool // 64 KiB .. 128 MiB

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

func authProof(key, nonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(nonce)
	return m.Sum(nil)
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
var log = slog.Default().With("pkg", "rpc")

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
