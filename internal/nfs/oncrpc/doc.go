// Package oncrpc serves ONC RPC programs (RFC 5531) over TCP: record
// marking with a bounded record size, call and reply headers (the types
// generated from rpc.x in internal/nfs/xdr), AUTH_NONE and AUTH_SYS
// credentials, and the PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL,
// GARBAGE_ARGS and SYSTEM_ERR replies. One Server serves several programs
// on one port (the NFS gateway: NFS v3 and MOUNT v3).
//
// # Errors
//
// A record over Config.MaxRecordBytes or whose call header does not decode
// closes its connection, with one log line; arguments that do not decode
// get GARBAGE_ARGS. A peer's bytes never panic the process: the generated
// decoders' panics are recovered by xdr.Decode.
//
// # Goroutines
//
// Serve's accept loop; a reader per connection; a goroutine per call (at
// most Config.MaxInFlight per connection, Config.MaxCalls in all: a reader
// reads its next record only with a slot of both), which writes its own
// reply under the connection's write lock. Close waits for all of them.
package oncrpc
