package rpc

import (
	"fmt"

	"github.com/stratafs/strata/internal/codec"
)

// ErrMalformed marks a frame or message body that could not be decoded.
var ErrMalformed = codec.ErrMalformed

// Method identifies a remote procedure; see meta_msgs.go and store_msgs.go.
// Numbers are never reused.
type Method uint16

// Message is implemented by every request and response type. Encode appends
// the message to e; Decode reads it back from d and must be the exact inverse.
// Decode never panics on hostile input: it records the first error in d.
type Message interface {
	Encode(e *Enc)
	Decode(d *Dec)
}

// Enc appends primitive values (package codec) to a byte slice. The zero
// value is ready.
type Enc = codec.Enc

// Dec reads primitive values (package codec) from a byte slice. After the
// first error every further read returns a zero value; check Err once at
// the end.
type Dec struct {
	codec.Dec
	// tail, when set, is the last field's bytes held apart from B (an
	// in-process request handed over without copying, local.go): Bytes
	// returns it for the field whose length prefix ends B.
	tail []byte
}

// NewDec returns a decoder over b. Byte slices returned by Bytes alias b.
func NewDec(b []byte) *Dec { return &Dec{Dec: codec.Dec{B: b}} }

// NewDecTail returns a decoder over a message encoded by a Tailer's
// EncodeHead: head, then the last field's bytes held apart in tail (nil
// when the message had none). Bytes returns tail itself, without a copy,
// for the field whose length prefix ends head.
func NewDecTail(head, tail []byte) *Dec { return &Dec{Dec: codec.Dec{B: head}, tail: tail} }

// Unread is the number of bytes not read yet, a handed-over tail included.
func (d *Dec) Unread() int { return len(d.B) + len(d.tail) }

// Bytes returns a slice aliasing the decoder's buffer (no copy), or the
// handed-over tail for the field whose length prefix ends B.
func (d *Dec) Bytes() []byte {
	n := d.U64()
	if d.Err() != nil {
		return nil
	}
	if len(d.B) == 0 && d.tail != nil {
		if n != uint64(len(d.tail)) {
			d.Fail(fmt.Errorf("%w: field length %d but %d bytes handed over", ErrMalformed, n, len(d.tail)))
			return nil
		}
		v := d.tail[:n:n]
		d.tail = nil
		return v
	}
	return d.Take(n)
}

// Marshal encodes m into a new byte slice.
func Marshal(m Message) []byte {
	var e Enc
	m.Encode(&e)
	return e.B
}

// Unmarshal decodes b into m and reports trailing garbage as an error.
func Unmarshal(b []byte, m Message) error {
	d := NewDec(b)
	m.Decode(d)
	return d.Finish()
}

// Hooks for the transport (package transport).
//
// The transport handles every Message alike, except for the few whose
// last field is bulk data (WriteReq.Data, ReadResp.Data): those implement
// the interfaces below, so that the data is sent from the caller's memory
// and, between roles in one process, handed over without encoding. None of
// them changes what goes on the wire: a Tailer's head followed by its tail
// is byte for byte its Encode.

// Tailer is implemented by messages whose last field is a large byte
// slice. EncodeHead encodes everything up to and including that field's
// length prefix and returns the field, which the transport then writes
// straight from the message's memory (one copy less per MiB) or lends to
// an in-process handler (NewDecTail).
type Tailer interface {
	EncodeHead(e *Enc) (tail []byte)
}

// TailDecoder is implemented by answers that can decode a body whose tail
// (the last field's bytes, after its length prefix, see Tailer) is held
// apart: an in-process handler's answer handed over without encoding.
// DecodeTail must copy the tail out: it is the handler's memory, released
// once the call returns.
type TailDecoder interface {
	DecodeTail(d *Dec, tail []byte)
}

// CopyingDecoder is implemented by answers that may copy their body out
// of the received bytes rather than alias them. CopiesOut reports whether
// this one will (it depends on the caller's settings, ReadResp.Into): then
// the transport may recycle the frame buffer once Decode returned, and
// hand over an in-process answer's tail (TailDecoder).
type CopyingDecoder interface {
	CopiesOut() bool
}

// DirectDecoder is implemented by answers whose caller may let an
// in-process handler write the answer's bytes straight into the caller's
// buffer (ReadResp.Direct). DirectDest returns that buffer, or nil.
type DirectDecoder interface {
	DirectDest() []byte
}

var (
	_ Tailer         = (*WriteReq)(nil)
	_ Tailer         = (*ReadResp)(nil)
	_ TailDecoder    = (*ReadResp)(nil)
	_ CopyingDecoder = (*ReadResp)(nil)
	_ DirectDecoder  = (*ReadResp)(nil)
)
