// Package transport carries Strata's internal traffic: it frames the
// messages of package rpc, authenticates both ends of a connection (the
// cluster-key handshake, optionally inside mutual TLS: auth.go), enforces
// the messages' per-method size limits on every frame and read deadlines on
// every connection, multiplexes calls over a few pooled connections
// (Client), serves them (Server), and short-cuts calls between roles of one
// process (local.go). It depends on package rpc for the messages, method
// numbers, limits and errno errors; rpc never depends on it.
//
// # Security
//
// The cluster key authenticates both ends of a connection and nothing
// more: without TLS, frames are neither encrypted nor protected against
// change after the handshake. With TLS (Server.TLS, ClientConfig.TLS,
// LoadTLS) they are both. docs/design/0005-rpc.md says what each mode
// protects against.
//
// # Concepts
//
// A Client holds a few TCP connections to one peer address and dials them
// lazily; every call gets a fresh request id, so many calls share a
// connection at once (pipelining), and a broken connection is redialled by
// the next call. A Server runs each request in its own goroutine, at most
// MaxInflight per connection and MaxBodyBytes of request bodies read and
// not yet answered. Handlers are registered per method, typed with Handle.
// The frame format and the handshake are described, with their version
// history, in transport.go; rpc.WireVersion is their number.
//
// Bulk data (rpc.WriteReq.Data, rpc.ReadResp.Data) is written from the
// caller's memory with writev (rpc.Tailer). Between roles of one process
// (`strata up`), a Client whose peer address is served by a Server of this
// process calls the handler directly, with the network path's semantics;
// a write's data is then lent to the handler (UseLent, DoneLent) and a read
// may land in the caller's buffer (LocalReadDest). local.go has the essay.
//
// # Errors
//
// A handler's error reaches the caller as *rpc.Error with the errno the
// handler chose (rpc.ErrnoOf). Transport trouble — dial failure, broken
// connection, timeout, a server closed — is ErrUnavailable: the request
// may or may not have run, so only idempotent or deduplicated
// (rpc.ReqHeader) requests are retried (Multi retries every request it is
// given: the metadata requests are such, but for a session open, whose
// repeat at worst leaves an unused session to expire). A failed handshake (the peer did
// not prove the key, or TLS refused a certificate) is ErrAuth. A request
// over its method's limit fails with EINVAL before it is sent; a frame
// that breaks the protocol (rpc.ErrMalformed) closes its connection.
//
// # Locking
//
// Client: mu guards the slot table of connections; dialMu, one per slot,
// lets a single caller dial a broken slot while others wait. clientConn:
// wmu serialises frame writes; mu guards the pending calls and the
// connection's error. Server: mu guards the listener, the open connections
// and closed; per connection, a write mutex serialises answers. No lock is
// held while a handler runs or while a call waits for its answer.
//
// # Goroutines
//
// Server: one accept loop per Serve, one reader per connection, one
// goroutine per request (bounded by MaxInflight). Client: per pooled
// connection, a reader that routes answers to their callers and a pinger
// that keeps a quiet connection within the server's IdleTimeout; both end
// when the connection fails or the Client is closed. In-process calls run
// on up to 64 long-lived worker goroutines (more calls at once get one
// goroutine each), or on the caller's own for methods marked Inline.
//
// # Pitfalls
//
// A handler must not keep slices of its request after returning: the body
// lives in a pooled buffer (and in-process, a write's data is the caller's
// memory, readable only between UseLent and DoneLent). An answer decoded
// by Client.Call aliases the received frame, which is not pooled unless
// the answer copies out (rpc.CopyingDecoder), so callers may keep it. A
// handler's answer implementing Releaser is released by the transport once
// sent (or copied out in-process), never by the handler. Register every
// handler before Serve: the handler table is read without a lock.
//
// Streams (stream.go): a connection whose first frame after the handshake
// is a stream frame leaves the frame protocol and is handed, authenticated,
// to the StreamListener of its purpose (the metadata voters' raft traffic
// shares their rpc port this way); its hello and reply let the server
// refuse it with a reason the dialer receives.
//
// Architecture Invariant: no other package opens sockets for Strata's
// internal traffic (except the raft TCP transport of a single metadata
// node started without --peers, in internal/consensus).
package transport
