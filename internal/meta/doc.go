// Package meta is Strata's metadata service: the namespace (inodes,
// directory entries, layouts, xattrs), client sessions and locks, and the
// registry of storage servers and targets, kept as a deterministic state
// machine over package kv and replicated by package consensus (raft).
//
// # Concepts
//
// Every mutating rpc becomes a command (command.go): meta's own type and
// format, versioned apart from the wire messages, so a wire change never
// changes what the log holds (docs/design/0009-formats.md). The leader
// first fixes everything that is not a function of the state — the time,
// the live targets a new file may use and the round-robin start — then
// proposes the command; raft group-commits concurrent proposals (one
// fsync) and the FSM applies the group in one kv batch (fsm.go, ops.go).
// Apply is a pure function of (state, command), so replay and snapshots
// rebuild identical state on every node. Inode numbers come from a counter in the state and
// are never reused.
//
// Reads (lookup, getattr, readdir, readlink, statfs, xattr get/list,
// status) are served from the FSM's store on the leader without going
// through the log. With one voter that is linearizable: the leader is the
// only writer and an acknowledged write is applied before its answer. A
// multi-voter group must first confirm leadership per read (raft ReadIndex
// or a leader lease: VerifyLeader, or reads gated on a lease renewed by
// heartbeats) — the HA issue adds this in readFrom().
//
// Deduplication: a command with a ReqHeader from a client with a session
// stores its answer under (ClientID, Seq) in the same batch as its effects,
// as a schema.Result in the store's own terms (what the change answered,
// not the wire message: result.reply builds that); a retry returns the
// stored answer (also across restarts and leader changes). Records older than the client's last 512 are dropped, and all
// of a client's records go with its session.
//
// Orphans: unlinking the last link of a regular file leaves the inode with
// nlink 0 and an orphan record. The leader's reaper removes the chunks on
// every target of the layout (rpc.SRemove) and then the inode, through raft
// — only when no live session reports the inode in its heartbeat's
// OpenInodes, and not before OrphanGrace after gaining leadership (so
// clients of a restarted service can report first). A store that is down
// leaves the orphan for a later pass (one log line per failed round; when
// the leader loop ends, one line counts the orphans left — cluster status
// reports them as FreePendingFiles and FreePendingBytes). Reaping costs about as much as the
// removal did, so while clients keep the service busy the reaper waits for
// a pause, at most ReapDeferMax (reapPacer).
//
// Locks (locks.go) live in the leader's memory per (ClientID, Owner): POSIX
// record locks with range split/merge (package lockrange; OFD locks are the
// same at this level) and flock locks in a separate table. They are
// released on SessionClose and session expiry. They are not replicated:
// after a restart or leader change the table starts empty under a new lock
// epoch and the clients reclaim what they hold (see lockTable).
//
// Keyspace: see package schema.
//
// # Errors
//
// Handlers answer rpc.Errorf(errno, context). A node that is not the ready
// leader answers ENOTCONN (ErrNotLeader) with the leader's raft id/address
// in the message; clients retry there. Names: ENAMETOOLONG over 255 bytes,
// EINVAL for "", ".", ".." and names with '/' or NUL. Unknown sessions and
// servers get ESTALE (reopen / re-register). Creating a regular file with no
// live target with free space gives ENOSPC (under a directory marked
// mirrored: no mirror group, or none whose primary is alive). Mirror group
// changes naming an epoch older than the group's get ESTALE; a switch of
// a group that is not in sync, EBUSY (mirror.go).
//
// Answers per method: Create, Link, SetAttr, Unlink, CommitSize,
// SetDirLayout → AttrResp; Rmdir, Rename, SetXattr, RemoveXattr, SetLk,
// SessionClose → Empty; ServerHeartbeat → ServerHeartbeatResp (the
// server's mirror groups, its primary lease); ListGroups, MirrorCreate →
// ListGroupsResp; MirrorFailOver, MirrorReport, MirrorReplace → GroupInfo.
//
// # Locking
//
// No lock is held across a raft Apply. fsm.mu serialises applies, snapshots
// and restores (raft already does; tests' applyLocal relies on it). The
// lock table, session table and liveness table each have their own mutex
// and never call out while holding it.
//
// # Goroutines
//
//   - rpc server: accept loop plus one goroutine per connection and per
//     request (package rpc); handlers propose and wait.
//   - watchLeadership: owns the leader loop's lifetime; on gaining
//     leadership it runs a barrier, creates the root on the first start,
//     loads sessions and marks the service ready.
//   - leaderLoop (leader only): session expiry; once mirror groups exist,
//     the automatic switch of a silent primary (checkMirrors,
//     mirrorsvc.go). It never calls a storage server, so a hung one cannot
//     delay a switch.
//   - reapLoop (leader only, started and waited for by leaderLoop): the
//     orphan reaper; owns the rpc clients to storage servers.
//   - metrics HTTP server (if MetricsAddr is set).
//   - the leader watch (membership.go): logs and counts each leader
//     change with its cause, until Close.
//   - raft's goroutines (package consensus).
//
// # Pitfalls
//
//   - Apply must stay deterministic: no time.Now, no map iteration order,
//     no I/O besides the batch. Add new inputs to the command instead.
//   - The leader's times come from Config.Clock (s.now() for a command's
//     Now, s.cfg.Clock for timers and leases), not package time: tests
//     run the service on a clock.Fake. Durations that only pace work
//     (the reaper's pass budget, polls, log spacing) stay on real time.
//   - An apply function checks everything before it writes anything: the
//     batch is shared by the whole raft group of commands.
//   - Heartbeat state (server liveness, capacity, session leases, open
//     inodes) is leader memory and is rebuilt from heartbeats after a
//     leader change.
package meta
