// Package kv is Strata's ordered key/value store: a small interface over an
// embedded LSM engine and its one implementation over cockroachdb/pebble.
//
// # Concepts
//
// A Store holds byte keys in lexicographic order. Reads go through a Reader
// (the Store itself, a Batch, or a Snapshot); writes are gathered in a Batch
// and made visible atomically by Batch.Apply. Apply(sync=true) returns only
// after the batch is in the write-ahead log on stable storage; Apply(false)
// leaves it in the OS page cache (survives a process crash, not a power
// loss). Store.Sync makes every earlier non-synced write durable.
//
// A Batch is indexed: Get and NewIter on a batch see the batch's own pending
// writes on top of the store. The metadata state machine relies on this to
// apply many commands in one batch.
//
// # Errors
//
// Get answers ErrNotFound for an absent key. Everything else is an I/O or
// corruption error from the engine, wrapped with context.
//
// The engine retries a failed flush or compaction forever, and Flush would
// wait for it forever: with a dead or full disk, Flush (and so Sync, Close
// and a snapshot of the metadata store) returns the error once the flush
// has kept failing for 10 s, and the retries are logged once per 10 s and
// slowed to one per 20 ms after the first hundred.
//
// A failed write or sync of the engine's write-ahead log is fatal: pebble
// cannot continue its commit pipeline, so Apply panics in the caller (the
// process stops, fail-stop, rather than hang or acknowledge a write that
// is not durable).
//
// # Fault injection
//
// Options.FS is the file system under the engine (default the operating
// system's). Tests pass pebble's vfs/errorfs wrapper to make chosen
// operations fail (EIO on a write or sync, ENOSPC) and its crash-simulating
// memory file system (vfs.NewCrashableMem; CrashClone keeps what was
// synced and drops the rest) to simulate a power loss; see fs_test.go.
//
// # Locking
//
// A Store is safe for concurrent use. A Batch, an Iter and a Snapshot are
// not: each belongs to one goroutine at a time.
//
// # Pitfalls
//
//   - Get returns a copy; Iter.Key and Iter.Value alias engine memory that is
//     valid only until the iterator moves. Copy what you keep.
//   - An Iter and a Snapshot pin engine resources: close them promptly.
//   - Deleted ranges leave tombstones; iterating over a just-emptied range is
//     slower until compaction. Keep ranges narrow (prefixes).
//
// Architecture Invariant: only this package imports pebble (tests elsewhere
// may import pebble's vfs packages to build an Options.FS).
package kv
