package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrMalformed marks input that could not be decoded.
var ErrMalformed = errors.New("malformed encoding")

// MaxFieldBytes bounds any single length-prefixed field so that a corrupt
// length can never make a decoder allocate without bound.
const MaxFieldBytes = 64 << 20

// Enc appends primitive values to a byte slice. The zero value is ready.
type Enc struct {
	B []byte
}

func (e *Enc) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Enc) U32(v uint32) { e.B = binary.AppendUvarint(e.B, uint64(v)) }
func (e *Enc) U64(v uint64) { e.B = binary.AppendUvarint(e.B, v) }
func (e *Enc) I64(v int64)  { e.B = binary.AppendVarint(e.B, v) }
func (e *Enc) Bool(v bool) {
	if v {
		e.B = append(e.B, 1)
	} else {
		e.B = append(e.B, 0)
	}
}
func (e *Enc) Bytes(v []byte) {
	e.B = binary.AppendUvarint(e.B, uint64(len(v)))
	e.B = append(e.B, v...)
}
func (e *Enc) String(v string) {
	e.B = binary.AppendUvarint(e.B, uint64(len(v)))
	e.B = append(e.B, v...)
}
func (e *Enc) U64s(v []uint64) {
	e.U64(uint64(len(v)))
	for _, x := range v {
		e.U64(x)
	}
}
func (e *Enc) U32s(v []uint32) {
	e.U64(uint64(len(v)))
	for _, x := range v {
		e.U32(x)
	}
}
func (e *Enc) Strings(v []string) {
	e.U64(uint64(len(v)))
	for _, x := range v {
		e.String(x)
	}
}

// Dec reads primitive values from a byte slice. After the first error every
// further read returns a zero value; check Err once at the end.
type Dec struct {
	B   []byte
	err error
}

// NewDec returns a decoder over b. Byte slices returned by Bytes alias b.
func NewDec(b []byte) *Dec { return &Dec{B: b} }

// Len is the number of bytes not read yet.
func (d *Dec) Len() int { return len(d.B) }

// Err returns the first decoding error, if any.
func (d *Dec) Err() error { return d.err }

// Fail records err (the first one wins).
func (d *Dec) Fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *Dec) U8() uint8 {
	if d.err != nil || len(d.B) < 1 {
		d.Fail(fmt.Errorf("%w: short u8", ErrMalformed))
		return 0
	}
	v := d.B[0]
	d.B = d.B[1:]
	return v
}

func (d *Dec) U64() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.Fail(fmt.Errorf("%w: bad uvarint", ErrMalformed))
		return 0
	}
	d.B = d.B[n:]
	return v
}

func (d *Dec) U32() uint32 {
	v := d.U64()
	if v > math.MaxUint32 {
		d.Fail(fmt.Errorf("%w: u32 overflow", ErrMalformed))
		return 0
	}
	return uint32(v)
}

func (d *Dec) I64() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.B)
	if n <= 0 {
		d.Fail(fmt.Errorf("%w: bad varint", ErrMalformed))
		return 0
	}
	d.B = d.B[n:]
	return v
}

func (d *Dec) Bool() bool {
	switch d.U8() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.Fail(fmt.Errorf("%w: bad bool", ErrMalformed))
		return false
	}
}

// Bytes returns a slice aliasing the decoder's buffer (no copy).
func (d *Dec) Bytes() []byte {
	n := d.U64()
	if d.err != nil {
		return nil
	}
	return d.Take(n)
}

// Take returns the next n bytes (aliasing the buffer): the body of a
// length-prefixed field whose length was already read.
func (d *Dec) Take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > MaxFieldBytes || n > uint64(len(d.B)) {
		d.Fail(fmt.Errorf("%w: field length %d exceeds %d remaining", ErrMalformed, n, len(d.B)))
		return nil
	}
	v := d.B[:n:n]
	d.B = d.B[n:]
	return v
}

func (d *Dec) String() string { return string(d.Bytes()) }

// Count reads a slice length and checks it against the bytes left, assuming
// each element takes at least one byte.
func (d *Dec) Count() int {
	n := d.U64()
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.B)) {
		d.Fail(fmt.Errorf("%w: count %d exceeds %d remaining", ErrMalformed, n, len(d.B)))
		return 0
	}
	return int(n)
}

func (d *Dec) U64s() []uint64 {
	n := d.Count()
	if n == 0 {
		return nil
	}
	v := make([]uint64, n)
	for i := range v {
		v[i] = d.U64()
	}
	return v
}

func (d *Dec) U32s() []uint32 {
	n := d.Count()
	if n == 0 {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		v[i] = d.U32()
	}
	return v
}

func (d *Dec) Strings() []string {
	n := d.Count()
	if n == 0 {
		return nil
	}
	v := make([]string, n)
	for i := range v {
		v[i] = d.String()
	}
	return v
}

// Finish reports the first decoding error, or trailing bytes as one: the
// check at the end of every complete value.
func (d *Dec) Finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.B) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(d.B))
	}
	return nil
}
