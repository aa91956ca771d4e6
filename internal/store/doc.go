// Package store is Strata's storage server: it owns target directories,
// keeps one chunk per (inode, target) in each, verifies a checksum on every
// block it returns, reports capacity, and registers and heartbeats with the
// metadata service. Clients reach it over internal/rpc (the S* methods of
// rpc/store_msgs.go), never through the metadata service.
//
// # Concepts
//
//   - Target: a directory, ideally the root of one disk, identified by the
//     UUID in its identity file (target.go). The metadata service gives
//     each target a numeric id at registration; standalone servers (no
//     metadata address: tests, benchmarks) number targets 1..n.
//   - Chunk: the bytes of one inode on one target (layout decides which),
//     a sparse data file plus a sidecar with one CRC32C per 4 KiB block
//     (format.go; docs/design/0002-storage.md) — or, for a chunk of up to
//     48 KiB on a target of chunk_sums 2, the data file alone with the
//     sidecar's content in an extended attribute that the file system
//     keeps in the inode (inlinesums.go; docs/design/0011). An absent
//     chunk reads as length 0.
//   - Dirty flag: the sidecar header (or inline sums) bit that says "data and sums may
//     disagree on disk"; set before the first mutation after a sync,
//     cleared after a sync. What makes it durable is the chunk's record in
//     the target's intent log (dirty.log, dirtylog.go), which concurrent
//     first mutations on a target write with one shared fdatasync; a
//     target's open turns the log's records into dirty flags. A dirty
//     chunk is re-summed from its data when a fresh process opens it
//     (chunk.go has the essay).
//   - Chunk cache: a bounded LRU of open, reference-counted chunk handles
//     (cache.go), so a 4 KiB request costs two or three syscalls, not an
//     open and a close.
//
// # Errors
//
// Handlers answer *rpc.Error with an errno and a message that names the
// target directory and the chunk (inode in hex): ENOENT for a target id this
// server does not serve, EINVAL for offsets or sizes past 2^50 bytes or a
// read over 64 MiB, EFBIG for a write or truncate that would make a chunk
// longer than layout.MaxChunkBytes (16 TiB − 4 KiB; refused before the
// chunk is touched, and a target whose file system cannot hold a chunk
// that long is refused at open), ENOSPC when a write would leave less than the reserve
// free or the disk itself is full (the chunk's existing bytes and sums stay
// intact; nothing of the failed write is kept past the old end of file),
// EIO for a checksum mismatch (also logged at error level with target,
// inode, offset, stored and computed sums, and counted in
// strata_store_checksum_errors_total) and for disk errors, which keep their
// errno. Nothing here panics on request input.
//
// # Locking
//
// Per chunk, in this order: chunk.flag (RWMutex; mutations hold it shared
// for their duration, sync/remove exclusively), then the region stripes
// (32 RWMutexes over 1 MiB regions; writes exclusive, reads shared,
// truncate all stripes). A first mutation holds chunk.flag exclusively
// while it waits for its intent-log round, which takes dirtyLog.ioMu, then
// dirtyLog.mu (a leaf). chunkCache.mu, target.ours, target.unsynced,
// target.unsyncedDirs
// (except around the mkdirs of a chunk's fan-out directories) and
// rounds.mu (the group commit of internal/rounds, under groupSync and dirtyLog)
// are leaves, taken for map and list updates only, never across other
// I/O. Mirror groups (forward.go) add, above all of these: a group's gate
// (RWMutex; mutations shared from admission to answer, a starting resync
// exclusively once), then the per-chunk ordering locks (orderLocks:
// stripes over 1 MiB regions, taken in ascending order; on the primary
// held across the local apply AND the forward, or a resync's copy of the
// region; on the secondary across the local apply; by a repair from the
// other copy through lockRange; never by reads); groupMap.mu, mirrorLog.mu and the maps of gates, peers,
// degrade reports and resyncs are leaves. A chunk's sync waits for its target's next syncfs round
// (groupsync.go) holding no lock. No global lock sits on
// the data path: writers of disjoint ranges of one chunk run in parallel
// unless their regions share a stripe.
//
// One exception holds locks across a call to another server: a repair of
// a mirror group chunk (heal.go) holds the chunk's flag shared and its
// range's stripes exclusively while it fetches the good blocks from the
// other copy. The other copy answers that fetch (SChunkSums) taking its
// stripes with TryRLock only, and EAGAIN when busy, so two copies
// repairing one range from each other cannot wait on each other; the
// call is bounded (healCallTimeout).
//
// # Pitfalls
//
//   - A handler must not keep rpc request slices (WriteReq.Data) after it
//     returns: they live in a pooled buffer.
//   - Read answers (readResp) hold a pooled buffer; the rpc server calls
//     Release after sending. Never return a readResp twice or keep it.
//   - A chunk handle's descriptors are valid only while a reference is
//     held (chunkCache.get/release). Eviction closes unreferenced handles.
//   - Stored sums are CRC32C(block padded with zeros) XOR CRC32C(zero
//     block), so that a zero block (a hole) stores 0 and needs no sidecar
//     write; never compare a raw CRC with a stored sum.
//   - Sums are verified before a partial block is rewritten (edge blocks of
//     unaligned writes, truncate, punch): re-summing unverified data would
//     launder corruption into a valid sum.
//
// # Goroutines
//
// Long-lived, per Server: the rpc accept loop and one reader per client
// connection with one goroutine per request (internal/rpc); the
// registration loop (register.go: register, heartbeat every
// HeartbeatInterval, register again on ESTALE, back off while the metadata
// service is down), with a helper that cancels its calls on Close; the
// metrics HTTP server when MetricsAddr is set; per target, with a
// SyncInterval, the background sync loop (bgsync.go). Short-lived: a
// goroutine per sync round or intent-log round that starts when the round
// before it ends, and one per chunk a background round or Close syncs (at
// most syncBatch at a time); per mirror group whose primary is here and
// which is resyncing, a resync (resync.go), and a forward per mutation of
// an in-sync or resyncing group. Close stops them all, then syncs every chunk
// written since its last sync, marks it clean and logs one line with the
// count.
//
// Architecture Invariant: only this package reads or writes chunk files,
// target identity files, intent logs and mirror logs.
//
// Architecture Invariant: a mirror group's primary acknowledges a mutation
// only when the secondary applied it too (at the same epoch), or when the
// group is degraded in an epoch the metadata service answered and the
// change is durable in the target's mirror.log; and, under the ordering
// lock, two overlapping mutations reach both copies in the same order.
package store
