// Package client is the Strata client library: a session with one cluster
// through which the FUSE mount, the NFS gateway and the benchmark harness
// reach the namespace (metadata service) and the file data (storage
// servers). It talks only internal/rpc; it never imports meta or store.
//
// # Concepts
//
// A Client holds one session (SessionOpen at New, SessionClose at Close)
// and an inode-level API: Lookup, GetAttr, SetAttr, Create, Mkdir, Mknod,
// Symlink, Unlink, Rmdir, Rename, Link, Readlink, ReadDir (name cursor,
// paged), StatFS, xattrs, locks (GetLk/SetLk), SetDirLayout, and
// ResolvePath for admin tools. Open returns a *File (ReadAt, WriteAt,
// Flush, Fsync, Release, Punch, Allocate).
//
// Every file the client holds open has one inode record shared by all its
// handles: the write-behind buffers, the size and mtime written but not
// yet committed, the set of slots written since the last sync, and a
// generation bumped by every write, truncate and punch. Reads through any
// handle first push out and wait for buffered writes that overlap them, so
// a client always reads its own writes.
//
// Data path. A byte range is cut with layout.Split; the part of a
// contiguous range that falls on one slot is contiguous in that slot's
// chunk, so each slot gets one storage call, and the slots are called in
// parallel. Reads scatter the answer back; short chunks and holes read as
// zeros up to the file size.
//
// Write-behind. WriteAt copies into a per-slot coalescing buffer (≤ 1 MiB,
// contiguous in chunk space) and returns; a full buffer (or a
// non-contiguous write, a read of its bytes, a flush) submits it as one
// SWrite in the background. Memory is bounded by Config.WriteBehindBytes
// for the whole client: WriteAt blocks while the budget is used up. A
// submission waits for in-flight writes overlapping it, so overlapping
// writes reach the store in program order. O_DIRECT and O_SYNC handles
// write through (same machinery, the caller waits).
//
// Durability. Fsync = drain write-behind, SSync every target written since
// the last sync, then CommitSize (size = max(committed, ours), mtime).
// Flush (close) is Fsync under the "sync" policy; under "async" it drains
// and commits without SSync, the commit deferred (answered before it is
// durable). The file's fsync syncs the chunks and waits for the commit,
// also through a handle opened after the close (Client.keepOwedLocked).
//
// Read-ahead. A handle that reads sequentially keeps the next
// ReadAheadBytes prefetched in 1 MiB blocks read in parallel over the
// stripes. Blocks are tagged with the inode generation and dropped when it
// moves; blocks overlapping buffered writes are never prefetched. They
// draw on the same memory budget but never wait for it. ReadBuffers (used
// by the FUSE layer) answers a read that the window covers with slices of
// the blocks themselves instead of a copy; the blocks stay referenced, and
// so budgeted, until ReadData.Release. A storage read is copied once, by
// rpc, straight into its destination (ReadResp.Into).
//
// Sessions. A heartbeat every lease/3 reports the open inodes, so that a
// file unlinked elsewhere keeps its data while open here; opening a new
// inode triggers a report within 50 ms, and Unlink/Rename report
// synchronously first if an inode opened since the last report is still
// open (one closed since needs none). An ESTALE heartbeat (session
// expired) opens a new session.
//
// # Errors
//
// Errors satisfy errors.Is(err, syscall.Exxx). Errnos answered by a server
// pass through. Metadata calls go to the leader among the voters of
// Config.MetaAddrs (transport.Multi); calls that fail in transport
// (transport.ErrUnavailable) or with ENOTCONN (node not leader, e.g. during
// an election; its answer may name the leader, which is followed) are
// retried at the leader, or the next voter, with the same ReqHeader — so
// they are applied at most once, also across a leader change — with
// backoff until IOTimeout, then fail with EIO. Storage calls are all
// idempotent and retried likewise (refreshing the target map); the final
// error is a *TargetError naming target and server, logged once. A slot
// of a mirror group (layout id with rpc.GroupBit; groups.go) is sent to
// the group's primary (reads of an in-sync group: to either copy, by
// inode and group: a chunk from one copy) with the group's epoch; ESTALE, EAGAIN or an
// unreachable server make the client re-read the group map and send
// again within the same IOTimeout, and a read answered EIO by one in-sync
// copy goes to the other; the final error is EIO (never ESTALE or EAGAIN)
// in a *TargetError naming the group and the copy's server. ENOSPC
// from a store surfaces as ENOSPC. A write-behind failure is remembered
// per inode and returned by the next WriteAt, Flush or Fsync (then
// cleared). EFBIG comes from the client itself, before anything is
// buffered or sent: a write at or past the largest size of the file's
// layout (layout.MaxFileSize), a truncate or Allocate past it; a write
// across it is cut short at it.
//
// # Locking
//
// Lock order: inode.commitMu → Client.mu → inode.mu; readahead.mu →
// inode.mu. inode.commitMu is held across a size commit's (and a size
// SetAttr's) network calls; inode.mu is never held across a network call; its cond is broadcast whenever an
// in-flight write completes. Client.mu guards the open-inode map, inode
// refcounts and what closed inodes' fsyncs still owe (Client.keepOwedLocked).
//
// # Long-lived goroutines
//
//   - heartbeatLoop: renews the session, reports open inodes, reopens an
//     expired session. Ends at Close.
//   - targetMap.refreshLoop: reloads the target map every
//     TargetRefreshInterval. Ends at Close.
//   - atimeLoop: sends the access times reads noted (relatime) as one
//     MSetAtimes per second, or at once when 256 wait; SyncMeta and Close
//     send them too (atime.go). Ends at Close.
//   - the metrics HTTP server when MetricsAddr is set.
//
// Short-lived: one goroutine per in-flight storage write (bounded by the
// budget and maxInflight per inode), per prefetch block, per parallel
// slot call.
//
// # Pitfalls
//
//   - Release every File: the inode record (and its write-behind) lives
//     until the last handle of the inode is released; Close does not
//     flush files.
//   - Attribute caching belongs to the caller (the kernel, for FUSE);
//     GetAttr always asks the service, merging this client's uncommitted
//     size and mtime. An answer to a call begun before one of this
//     client's size commits or truncates of the file ended is older than
//     the client's own view and does not replace it (inode.merge): a
//     FUSE GETATTR computed so would reset the kernel's size behind an
//     acknowledged write.
//   - Size commits and size/mtime SetAttrs of a file are serialised per
//     inode (commitMu): the service takes the larger size of a commit, so
//     one landing after a truncate would undo it.
//   - Locks belong to the session: if the session expires (no heartbeat
//     for a lease) they are lost; the client logs it. A restart of the
//     service does not lose them: the client keeps what it holds
//     (locks.go) and reclaims it under the service's new lock epoch.
//   - SetAttr of mtime or size commits buffered writes first so that an
//     older write mtime cannot overwrite an explicit utimes (tar, cp -p).
package client
