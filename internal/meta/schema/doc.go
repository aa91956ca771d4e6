// Package schema is the only code that encodes the metadata service's keys
// and values. The state machine (package meta) stores everything in one
// ordered key/value store (package kv); this package fixes the byte layout.
//
// # Keyspace
//
// All integers in keys are big-endian so that byte order is numeric order.
//
//	prefix  key                                    value          what
//	'c'     'c'                                    Counters       inode/client/server/target counters,
//	                                                              inode count, last applied raft index
//	'C'     'C'                                    raw bytes      cluster id: set with the root by the
//	                                                              first command (absent in namespaces
//	                                                              created before it existed)
//	'd'     'd' parent(8) name                     Dentry         directory entry (name → inode)
//	'i'     'i' ino(8)                             Inode          inode record
//	'i'     'i' ino(8) 'x' name                    raw bytes      extended attribute of ino
//	'o'     'o' ino(8)                             Orphan         inode without links (unlinked, or
//	                                                              O_TMPFILE) waiting for reaping
//	'r'     'r' client(8) seq(8)                   Result         dedupe record: answer to (client, seq)
//	's'     's' client(8)                          Session        open client session
//	'n'     'n' client(8) 'r' start(8)             SessionRange   inode numbers reserved for the
//	                                                              session: [start, End) (0016)
//	'n'     'n' client(8) 'd' dir(8)               DelegRef       index: the session holds the
//	                                                              delegation on dir
//	'D'     'D' dir(8)                             Delegation     create delegation on directory
//	                                                              dir: holder, epoch (0016)
//	'R'     'R' 'S' server(4)                      Server         registered storage server
//	'R'     'R' 'T' target(4)                      Target         registered storage target
//	'R'     'R' 'U' uuid                           TargetRef      target UUID → target id
//	'R'     'R' 'G' group(4)                       Group          mirror group (two targets, state,
//	                                                              epoch; docs/design/0014)
//	'R'     'R' 'H' name                           HALease        named lease: an NFS gateway HA
//	                                                              pair's election (docs/design/0015)
//
// Sharding: every directory entry lives under its parent's prefix
// ('d' parent …), so a future split of the namespace by directory hash moves
// whole prefixes. An inode's record and its xattrs share the prefix 'i' ino,
// so deleting an inode is one range deletion. Nothing here is global except
// the counters, which a sharded version keeps per group (an inode number's
// high bits can then name the group).
//
// # Values
//
// Every value except xattr payloads starts with a format version byte
// followed by fields in package codec's primitives (uvarints, zig-zag
// varints, length-prefixed bytes). The values are this package's own types:
// nothing here is a wire message, so a change to package rpc never changes
// what the store holds (the package does not import rpc). Decoders refuse a
// version newer than they know with ErrNewer (written by a newer Strata),
// and unknown older versions and trailing bytes with ErrCorrupt; fields are
// only ever appended, and a later version's decoder treats missing trailing
// fields as zero.
//
// # Version history
//
//	value     version  change
//	all       1        initial layout
//	Orphan    1        + optional trailing Tmpfile flag (absent: false;
//	                   written only when true)
//	Inode     1        + optional trailing Alloc list (absent: space unknown)
//	Result    2        the dedupe table's own record of the answer (Answer:
//	                   kind, raft stamp, attributes) instead of version 1's
//	                   encoded wire answer; version 1 records are still read
//	                   (AnswerWire) and answered with their bytes
//	Server    1        + optional trailing Domain (absent: none; written
//	                   only when set)
//	Inode     2        a directory marked mirrored: after Symlink a flags
//	                   byte (1: Alloc follows, 2: mirror) and the Alloc
//	                   list if flagged; written only for marked inodes, so
//	                   every other inode stays version 1
//	Group     1        initial (mirror groups)
//	Group     1        + optional trailing FullResync flag (absent: false;
//	                   written only when true)
//	HALease   1        initial (NFS gateway HA pair)
//	SessionRange, Delegation, DelegRef
//	          1        initial (create delegations, docs/design/0016);
//	                   all under keys an older build never reads
//	Result    2        + answer kind AnswerRange (5): Index, Term, Start,
//	                   Count, the answer of an inode range reservation
//	Inode     2        + flag 4: the file's inline data follows the Alloc
//	                   list (docs/design/0017); written for every file
//	                   with inline data. A flag this build does not know
//	                   is refused as written by a newer Strata
//	Result    2        Attr's BlocksKnown byte: bit 1 = Inline (an older
//	                   build refuses such a record as corrupt)
//
// # Pitfalls
//
// Decoded byte slices and strings are copies; keys returned by the Append*
// helpers alias the caller's buffer.
package schema
