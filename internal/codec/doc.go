// Package codec holds the primitive binary encoding that Strata's three
// formats share: the wire messages (package rpc), the Raft log commands
// (package meta) and the values of the metadata store (package
// meta/schema). It knows nothing of any message, command or value: each
// format owns its types, their field order and its own version history, so
// that a change to one never changes the bytes of another.
//
// # Primitives
//
//	U8      one byte
//	U32     unsigned varint (encoding/binary.AppendUvarint); decoding
//	        refuses values above 2^32-1
//	U64     unsigned varint
//	I64     zig-zag varint (encoding/binary.AppendVarint)
//	Bool    one byte, 0 or 1 (anything else is malformed)
//	Bytes   uvarint length, then the bytes (at most MaxFieldBytes)
//	String  as Bytes
//	U64s,   uvarint count, then each element; a count larger than the
//	U32s,   bytes left is malformed (every element takes at least one
//	Strings byte), so hostile input never makes a decoder allocate more
//	        than its input's size
//
// These encodings are frozen: every stored Raft log and metadata store is
// written with them. A format that needs another primitive adds one; it
// never changes an existing one.
//
// # Errors
//
// A Dec records its first error (wrapping ErrMalformed) and returns zero
// values from then on; callers check Err once at the end. Decoding never
// panics on hostile input.
//
// # Pitfalls
//
// Byte slices returned by Dec.Bytes alias the decoder's input; strings are
// copies.
package codec
