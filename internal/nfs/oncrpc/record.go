package oncrpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Record marking (RFC 5531 section 11): on a stream, each RPC message is a
// record sent as one or more fragments, each behind a 4-byte big-endian
// header whose top bit marks the record's last fragment and whose other 31
// bits are the fragment's length.
//
//	offset  size  field
//	0       4     last (bit 31) | length (bits 0-30)
//	4       len   fragment bytes
//
// A record is read whole into memory before it is decoded, so its size is
// bounded (MaxRecordBytes): a peer announcing more is refused before any of
// it is read, and its connection closed (a stream cannot skip a record
// without reading it, and reading 2 GiB of garbage is no service either).

const lastFragment = 1 << 31

// ErrRecordTooLarge: a record's fragments add up to more than the limit.
var ErrRecordTooLarge = errors.New("oncrpc: record too large")

// ErrEmptyRecord: a record without bytes (a zero-length last fragment
// alone), which holds no message.
var ErrEmptyRecord = errors.New("oncrpc: empty record")

// maxFragments bounds the number of fragments of one record, so that a peer
// sending empty fragments cannot keep a reader busy forever.
const maxFragments = 1024

// ReadRecord reads one record from r into buf (grown as needed, reused when
// large enough) and returns it. A record larger than max bytes is
// ErrRecordTooLarge; io.EOF only when the stream ends between records.
func ReadRecord(r io.Reader, buf []byte, max int) ([]byte, error) {
	rec := buf[:0]
	var hdr [4]byte
	for frag := 0; ; frag++ {
		if frag == maxFragments {
			return nil, fmt.Errorf("oncrpc: record of more than %d fragments: %w", maxFragments, ErrRecordTooLarge)
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if frag > 0 && err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		h := binary.BigEndian.Uint32(hdr[:])
		n := int(h &^ lastFragment)
		if len(rec)+n > max {
			return nil, fmt.Errorf("oncrpc: fragment of %d bytes after %d: %w (limit %d)", n, len(rec), ErrRecordTooLarge, max)
		}
		start := len(rec)
		if cap(rec) < start+n {
			grown := make([]byte, start, start+n)
			copy(grown, rec)
			rec = grown
		}
		rec = rec[:start+n]
		if _, err := io.ReadFull(r, rec[start:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("oncrpc: reading a fragment of %d bytes: %w", n, err)
		}
		if h&lastFragment != 0 {
			if len(rec) == 0 {
				return nil, ErrEmptyRecord
			}
			return rec, nil
		}
	}
}

// AppendRecordHeader reserves the 4-byte record mark at the start of a
// reply buffer; FinishRecord fills it in once the body is complete.
func AppendRecordHeader(b []byte) []byte { return append(b, 0, 0, 0, 0) }

// FinishRecord writes the record mark of b (which began with
// AppendRecordHeader) for a single last fragment.
func FinishRecord(b []byte) {
	binary.BigEndian.PutUint32(b[:4], uint32(len(b)-4)|lastFragment)
}
