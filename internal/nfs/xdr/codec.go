package xdr

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Decode unmarshals v from the front of b and returns the bytes after it.
// The generated traversal panics on malformed input (XdrError from a bound
// or an invalid enum or union tag); Decode turns that into an error, so
// that a peer's bytes can never crash the process.
//
// It drives the generated code with memIn rather than goxdr's XdrIn: the
// input is one record already in memory, so a variable-length opaque (a
// WRITE's data) is a slice of b — no copy, no buffer growing as XdrIn's
// io.CopyN does — and a length beyond what b holds fails before any
// allocation; an enum value the .x file does not declare is refused. The
// caller must not reuse b while v is in use.
func Decode(b []byte, v XdrType) (rest []byte, err error) {
	in := &memIn{b: b}
	defer func() {
		if p := recover(); p != nil {
			switch e := p.(type) {
			case XdrError:
				err = fmt.Errorf("xdr: %s: %w", v.XdrTypeName(), e)
			case error:
				err = fmt.Errorf("xdr: %s: %w", v.XdrTypeName(), e)
			default:
				err = fmt.Errorf("xdr: %s: %v", v.XdrTypeName(), p)
			}
		}
	}()
	v.XdrMarshal(in, "")
	return in.b, nil
}

// memIn is an XDR decoder over a byte slice (the generated code's XDR
// interface).
type memIn struct{ b []byte }

func (m *memIn) Sprintf(string, ...interface{}) string { return "" } // names are not used

func (m *memIn) take(n uint32) []byte {
	if uint64(n) > uint64(len(m.b)) {
		XdrPanic("%d bytes wanted, %d left", n, len(m.b))
	}
	p := m.b[:n:n]
	m.b = m.b[n:]
	return p
}

func (m *memIn) pad(n uint32) {
	if r := n & 3; r != 0 {
		for _, c := range m.take(4 - r) {
			if c != 0 {
				XdrPanic("padding contained non-zero bytes")
			}
		}
	}
}

func (m *memIn) Marshal(name string, i XdrType) {
	switch v := i.(type) {
	case XdrNum32:
		n := binary.BigEndian.Uint32(m.take(4))
		if e, ok := v.(XdrEnum); ok {
			// RFC 4506 4.3: only the enum's declared values. (The
			// generated setters take any value; union tags are checked
			// by the unions themselves.)
			if _, known := e.XdrEnumNames()[int32(n)]; !known {
				XdrPanic("%d is not a value of %s", int32(n), v.XdrTypeName())
			}
		}
		v.SetU32(n)
	case XdrNum64:
		v.SetU64(binary.BigEndian.Uint64(m.take(8)))
	case XdrVarBytes:
		n := binary.BigEndian.Uint32(m.take(4))
		v.SetByteSlice(m.take(n))
		m.pad(n)
	case XdrBytes:
		dst := v.GetByteSlice()
		copy(dst, m.take(uint32(len(dst))))
		m.pad(uint32(len(dst)))
	case XdrAggregate:
		v.XdrRecurse(m, name)
	default:
		XdrPanic("memIn: unhandled type %T", i)
	}
}

// Encode appends v's encoding to b. A value out of its declared bounds (a
// string or vector longer than its bound) is an error.
//
// It drives the generated code with memOut rather than goxdr's XdrOut,
// whose every 4-byte field is a slice allocated and written through an
// io.Writer: memOut writes each field straight into b.
func Encode(b *bytes.Buffer, v XdrType) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("xdr: encoding %s: %v", v.XdrTypeName(), p)
		}
	}()
	v.XdrMarshal(&memOut{b: b}, "")
	return nil
}

// memOut is an XDR encoder into a bytes.Buffer (the generated code's XDR
// interface). Variable-length values are checked against their bound.
type memOut struct {
	b   *bytes.Buffer
	num [8]byte
}

func (m *memOut) Sprintf(string, ...interface{}) string { return "" } // names are not used

func (m *memOut) put32(v uint32) {
	binary.BigEndian.PutUint32(m.num[:4], v)
	m.b.Write(m.num[:4])
}

// length writes the length n of v, a variable-length value, checked
// against v's bound when it has one.
func (m *memOut) length(v XdrType, n int) {
	if bd, ok := v.(interface{ XdrBound() uint32 }); ok && uint64(n) > uint64(bd.XdrBound()) {
		XdrPanic("%d bytes in %s<%d>", n, v.XdrTypeName(), bd.XdrBound())
	}
	m.put32(uint32(n))
}

var zeros [4]byte

// pad writes the zeros that follow n bytes of opaque data or a string.
func (m *memOut) pad(n int) { m.b.Write(zeros[:(4-n&3)&3]) }

func (m *memOut) Marshal(name string, i XdrType) {
	switch v := i.(type) {
	case XdrNum32:
		m.put32(v.GetU32())
	case XdrNum64:
		binary.BigEndian.PutUint64(m.num[:], v.GetU64())
		m.b.Write(m.num[:])
	case XdrString:
		s := v.GetString()
		m.length(v, len(s))
		m.b.WriteString(s)
		m.pad(len(s))
	case XdrVarBytes:
		p := v.GetByteSlice()
		m.length(v, len(p))
		m.b.Write(p)
		m.pad(len(p))
	case XdrBytes:
		p := v.GetByteSlice()
		m.b.Write(p)
		m.pad(len(p))
	case XdrAggregate:
		v.XdrRecurse(m, name)
	default:
		XdrPanic("memOut: unhandled type %T", i)
	}
}

// nameless marks the package's codecs, which drop the field names the
// generated traversal builds (their Sprintf answers "").
type nameless interface{ nameless() }

func (*memIn) nameless()  {}
func (*memOut) nameless() {}

// xdrField is the generated traversal's name of field within name (the
// third go:generate step puts it where goxdr calls x.Sprintf("%sfield",
// name)): for the package's codecs "" without the variadic call, which
// allocated its argument list for every field; for others (goxdr's
// XdrPrint, XdrOut) what Sprintf makes of it.
func xdrField(x XDR, name, field string) string {
	if _, ok := x.(nameless); ok {
		return ""
	}
	return x.Sprintf("%s%s", name, field)
}
