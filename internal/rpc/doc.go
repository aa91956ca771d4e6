// Package rpc owns Strata's internal transport: the frame format, the
// connection handshake (mutual proof of the cluster key, optionally inside
// mutual TLS: auth.go), per-method frame limits and read deadlines
// (limits.go), pooled multiplexed connections, and the wire messages of the
// metadata service (meta_msgs.go) and of the storage servers
// (store_msgs.go).
//
// # Security
//
// The cluster key authenticates both ends of a connection and nothing
// more: without TLS, frames are neither encrypted nor protected against
// change after the handshake. With TLS (Server.TLS, ClientConfig.TLS)
// they are both. docs/design/0005-rpc.md says what each mode protects
// against.
//
// # Concepts
//
// A Client holds a few TCP connections to one peer; every call gets a fresh
// request id, so many calls share a connection at once (pipelining). A
// Server runs each request in its own goroutine. Messages are hand-encoded
// with package codec's primitives (uvarints and length-prefixed bytes, no
// reflection; codec.go adds the in-process tail). They are the wire's
// only: Raft commands (package meta) and stored values (meta/schema) have
// their own types and version histories, so a change here never changes
// what a log or a store holds (docs/design/0009-formats.md). Large data
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
// Frame and handshake version 2 (magic "STRATA\x00\x02"): both sides
// prove the key, ping frames, per-method limits; a version 1 peer is
// refused by name. Version 1 (magic "STRATA\x00\x01") proved only the
// client. The messages did not change with it (they are also stored: raft
// commands, dedupe records). Method numbers are never reused; fields are
// only appended, with decoders treating a missing trailing field as zero.
// Within frame version 1,
// answers of namespace changes gained trailing raft (index, term) stamps
// (ChangeResp, then AttrResp and Stamp); their decoders already read a
// missing stamp as zero, since answers recorded for retries (dedupe
// records of format version 1, which hold these answers' bytes and are
// sent as they are) may predate them: keep those decoders reading them.
// LockReq gained Reclaim, then Handle and CloseHandle, and
// SessionHeartbeatReq LockEpoch (read as zero when absent); SetLk answers LockGrant and
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
