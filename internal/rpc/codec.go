package rpc

import (
	"fmt"

	"github.com/stratafs/strata/internal/codec"
)

// ErrMalformed marks a frame or message body that could not be decoded.
var ErrMalformed = codec.ErrMalformed

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
