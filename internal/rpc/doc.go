// Package rpc owns Strata's internal transport: the frame format, the
// connection handshake (cluster key), pooled multiplexed connections, and
// the wire messages of the metadata service (meta_msgs.go) and of the
// storage servers (store_msgs.go).
//
// # Concepts
//
// A Client holds a few TCP connections to one peer; every call gets a fresh
// request id, so many calls share a connection at once (pipelining). A
// Server runs each request in its own goroutine. Messages are hand-encoded
// (codec.go): uvarints and length-prefixed bytes, no reflection. Large data
// (WriteReq.Data, ReadResp.Data) is written from the caller's memory with
// writev rather than copied into the frame.
//
// # Errors
//
// A handler's error reaches the caller as *Error with the errno the handler
// chose (ErrnoOf): callers test it with errors.Is(err, syscall.ENOENT).
// Transport trouble — dial failure, broken connection, timeout — is
// ErrUnavailable: the request may or may not have run, so only idempotent
// or deduplicated (ReqHeader) requests are retried.
//
// # Pitfalls
//
// A handler must not keep slices of its request after returning: the body
// lives in a pooled buffer. A response decoded by Client.Call aliases the
// received frame, which is not pooled, so callers may keep it.
//
// # Version history
//
// Frame and handshake version 1 (magic "STRATA\x00\x01"). Method numbers
// are never reused; fields are only appended, with decoders treating a
// missing trailing field as zero once a version 2 exists. Within version 1,
// answers of namespace changes gained trailing raft (index, term) stamps
// (ChangeResp, then AttrResp and Stamp); their decoders already read a
// missing stamp as zero, since answers recorded for retries (dedupe
// records) may predate them. LockReq gained Reclaim, then Handle and
// CloseHandle, and SessionHeartbeatReq LockEpoch (read as zero when absent); SetLk answers LockGrant and
// SessionHeartbeat answers SessionHeartbeatResp instead of Empty (an empty
// body reads as epoch 0, which clients ignore). MInodesKnown, MTmpfile,
// SSeek and SSyncStat were added at the end; an older service answers them as unknown
// methods (ENOSYS). Answers with attributes (AttrResp, ChangeResp,
// ReadDirResp) gained a trailing run with each Attr's Blocks, CommitSizeReq
// a trailing Alloc list and ChunkStatResp a trailing Alloc: absent, they
// read as unknown.
//
// Architecture Invariant: no other package opens sockets for Strata's
// internal traffic.
package rpc
