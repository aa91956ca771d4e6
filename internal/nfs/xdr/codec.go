package xdr

import (
	"bytes"
	"fmt"
	"io"
)

// Decode unmarshals v from r. The generated unmarshalers panic on malformed
// input (XdrError, or the reader's error for a short read); Decode turns
// such a panic into an error, so that a peer's bytes can never crash the
// process. Any allocation is bounded by what r holds: vectors grow as
// their elements arrive and variable-length opaques are read by copying.
func Decode(r io.Reader, v XdrType) (err error) {
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
	v.XdrMarshal(&XdrIn{In: r}, "")
	return nil
}

// Encode appends v's encoding to b. A value out of its declared bounds (a
// string or vector longer than its bound) is an error.
func Encode(b *bytes.Buffer, v XdrType) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("xdr: encoding %s: %v", v.XdrTypeName(), p)
		}
	}()
	v.XdrMarshal(&XdrOut{Out: b}, "")
	return nil
}
