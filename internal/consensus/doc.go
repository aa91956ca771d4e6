// Package consensus is the hashicorp/raft glue of the metadata service:
// the raft log and stable store over package kv, the TCP transport, file
// snapshots, bootstrap and the hooks for growing a group.
//
// # Concepts
//
// A Node is one raft member. Open binds the transport (Config.BindAddr),
// opens Dir/wal (the raft log: preallocated segment files, see wal.go),
// Dir/log (a pebble store with synced writes for raft's term and vote;
// log entries an older build kept there are migrated into the WAL) and
// Dir/snapshots, and on a node with no raft state and Bootstrap set writes
// the initial configuration: Peers, or this node alone. Later members start
// without Bootstrap and are added by the leader with AddVoter; nothing here
// assumes a single node.
//
// Group commit: raft gathers every Apply waiting on its channel (up to
// MaxAppendEntries) into one StoreLogs call, which is one write and one
// fdatasync of the WAL — one flush for many clients' operations, and an
// overwrite of preallocated blocks, so no file-size journal commit. The state machine implements
// raft.BatchingFSM, so the same group is applied in one kv batch.
//
// The state machine is persistent: it records the last applied index with
// each batch, raft runs with NoSnapshotRestoreOnStart, and after a restart
// raft replays the log from the last snapshot while the state machine skips
// what it already has. Only if the state machine is behind the newest
// snapshot (its store was lost) does Open restore that snapshot first.
//
// Membership (membership.go): Configuration lists the servers, AddMember
// and RemoveMember change them on the leader, and a LeaderWatch follows
// raft's observations to tell each leader change with its cause (a
// transfer — started here, seen in a vote request, or told to take over
// while the leader was still heard —, the leader silent past the heartbeat
// timeout, or this leader stepping down); its Transfer hands leadership
// to a named or the most caught-up voter.
//
// # Errors
//
// Apply and Barrier answer ErrNotLeader (wrapped) when this node is not, or
// stopped being, the leader; other failures are wrapped raft errors.
//
// # Locking
//
// Node methods are safe for concurrent use. The log store guards its cached
// first/last index with a mutex; raft calls it from several goroutines.
//
// # Goroutines
//
// Raft's own: the main loop (leader/follower/candidate), the FSM applier,
// the snapshot taker, one replication goroutine per peer, and the transport's
// listener and connection handlers. This package adds, per node, the WAL's
// preallocator and syncers, the read-lease renewal and the log-health watch
// (both idle unless leading) and a leader observer; Close ends them. LeaderWatch.Run (membership.go) runs on its
// caller's goroutine.
//
// # Several voters
//
// With Config.Streams raft runs over another service's port (the metadata
// voters' rpc port); the voters' ids and addresses are then their rpc
// addresses. Every voter of a fresh group bootstraps with the same Peers
// (raft's BootstrapCluster allows that: "an identical configuration listing
// all Voter servers"), at Open (Bootstrap) or later (BootstrapPeers, once
// its caller knows the group is fresh); CheckPeers refuses a restart with other Peers than
// the stored configuration's. A follower syncs each appended batch before
// acknowledging it, in raft's follower loop itself (the leader alone
// defers, with DeferSync). Reads are
// linearizable through VerifyRead (lease.go). A leader whose log fails
// hands leadership to another voter (quorum.go).
//
// # Pitfalls
//
//   - A port-0 BindAddr gets a new port at every start; the configuration
//     stored in the log keeps the old one. A single voter does not care (it
//     votes by id); a multi-voter group needs stable addresses.
//   - A voter that joins an existing group must start with an empty log and
//     no Bootstrap (the leader adds it): bootstrapping it with a larger
//     configuration would give it an index-1 entry that differs from the
//     group's.
//   - Leadership notifications (LeaderChanges) must be drained.
package consensus
