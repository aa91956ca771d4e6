// Package rpc holds the wire messages of Strata's internal traffic: the
// requests and answers of the metadata service (meta_msgs.go, and
// member_msgs.go for its raft group's membership) and of the
// storage servers (store_msgs.go), their method numbers (Method), the
// per-method size limits (limits.go), the errno errors that answers carry
// (Error, Errorf, ErrnoOf) and the wire's version history (below,
// WireVersion). It knows nothing of connections: package transport frames
// these messages, authenticates peers and moves the bytes, and depends on
// this package, never the other way round (TestMessagesDoNotDependOnTheTransport).
//
// # Concepts
//
// Every request and answer is a Message: Encode appends it to an Enc,
// Decode reads it back from a Dec. Messages are hand-encoded with package
// codec's primitives (uvarints and length-prefixed bytes, no reflection).
// They are the wire's only: Raft commands (package meta) and stored values
// (meta/schema) have their own types and version histories, so a change
// here never changes what a log or a store holds
// (docs/design/0009-formats.md).
//
// The two messages that carry bulk data (WriteReq, ReadResp) keep it last
// and implement the transport's hooks (codec.go): Tailer, so that the data
// is written from the caller's memory with writev rather than copied into
// the frame, and lent to an in-process handler (NewDecTail); ReadResp also
// TailDecoder, CopyingDecoder and DirectDecoder, so that an in-process
// answer reaches the caller's buffer with one copy or none. None of them
// changes the bytes on the wire.
//
// # Errors
//
// A handler's error reaches the caller as *Error with the errno the handler
// chose (ErrnoOf): callers test it with errors.Is(err, syscall.ENOENT).
// A body that does not decode is ErrMalformed. (Transport trouble is
// transport.ErrUnavailable.)
//
// # Pitfalls
//
// Decode may alias the decoded bytes (Dec.Bytes does not copy): a handler
// must not keep slices of its request after returning, since the body lives
// in a pooled buffer; an answer decoded by transport.Client.Call aliases
// the received frame, which is not pooled unless the answer copies out
// (CopyingDecoder), so callers may keep it. Decode never panics on hostile
// input; it records the first error in the Dec.
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
// read as unknown. ClusterStatusResp gained trailing FreePendingFiles and
// FreePendingBytes (absent: zero), then it and ServerHeartbeatReq a
// trailing Unsynced list, one TargetUnsynced per target (absent: none,
// shown as zero). CommitSizeReq gained a trailing Deferred flag (absent:
// false, a commit answered once durable). MSetAtimes (SetAtimesReq) was
// added at the end; a client that gets ENOSYS from an older service sends
// its atimes one SetAttr each, as before. SWrite answers WriteResp
// instead of Empty: the chunk's space after the write, both fields
// appended to the empty answer (an Empty from an older store reads as
// unknown; an older client ignores them). MRmdir and MRename answer
// DirChangeResp (Stamp with the attributes of the directories and entries
// they changed appended) and MLink LinkResp (AttrResp with the new
// parent's attributes appended): absent — older services, answers
// replayed for a retry — they read as unknown, and older clients decode
// the new answers as Stamp and AttrResp, leaving the tail unread.
// MMetaInfo (Empty, MetaInfoResp), MAddVoter, MRemoveVoter and
// MTransferLeader (MembershipReq, MembershipResp; member_msgs.go) were
// added at the end for the metadata group's membership; an older service
// answers them as unknown methods (ENOSYS), and status then shows the one
// voter it reached.
// For mirror groups (mirror_msgs.go, docs/design/0014): MListGroups,
// MMirrorCreate, MMirrorFailOver, MMirrorReport and MMirrorReplace were
// added at the end (older services: ENOSYS); MServerHeartbeat answers
// ServerHeartbeatResp instead of Empty (an empty body reads as no groups);
// RegisterServerReq gained a trailing Domain (absent: none); ChunkID
// carries Epoch after Target only when Target has GroupBit, so every
// unmirrored request keeps its bytes (an older store never serves a
// group, and refuses its ids as unknown targets). Then, appended:
// ClusterStatusResp a trailing Groups list (absent: none), SetDirLayoutReq
// a trailing Mirror byte (absent: keep the directory's mark, so a layout
// set through an older client never clears it) and MirrorGroupReq a
// trailing Epoch (absent: 0, no check).
// SScrub (ScrubReq, ScrubResp) and SChunkSums (ChunkSumsReq,
// ChunkSumsResp) were added at the end of the store methods for
// self-healing and `strata scrub` (an older store: ENOSYS).
// MirrorReportReq gained event MirrorPrimaryFailed (5: the primary's own
// disk failed; an older service answers EINVAL, and the store answers its
// client EAGAIN as for any failed report), and ListGroupsResp and
// ServerHeartbeatResp a trailing FullResync list of group ids (absent:
// none; GroupInfo's own encoding is unchanged, since it sits inside lists).
// SMirrorSuspects (MirrorSuspectsReq, GroupInfo) was added at the end of
// the store methods: a secondary restarted after an unclean stop hands
// its suspect chunks to its primary (an older primary answers ENOSYS; the
// secondary then keeps refusing reads of those chunks and logs it).
// SessionHeartbeatReq gained a trailing Gateway (sent by NFS gateways
// only, so a mount's heartbeat keeps its bytes: a true byte, then a
// GatewayReport — the gateway's address, exports, clients and calls;
// absent: not a gateway; an older service refuses a gateway's heartbeat) and ClusterStatusResp a trailing Gateways list
// (absent: none), for strata status.
// MLookup of the name ".." answers the directory's parent (the NFS
// gateway's LOOKUP ".."); an older service refuses the name (EINVAL).
// MHALease (HALeaseReq, HALeaseResp) was added at the end of the metadata
// methods for the NFS gateway's HA pair (an older service: ENOSYS; the
// gateways then stay standby, logging each failed ask).
// MDirLayout (GetAttrReq, DirLayoutResp) was added after it, for `strata
// stripe get` of a directory's mirror mark (an older service: ENOSYS;
// the command then says the mark is unknown).
// Group map versions (docs/design/0014 § Group map versions):
// ListGroupsResp and ServerHeartbeatResp gained a trailing Version (the
// raft index the groups were read at; absent: 0, unknown, installed as
// before), and MMirrorReport, MMirrorFailOver, MMirrorReplace and
// SMirrorSuspects answer GroupResp — GroupInfo's bytes with a trailing
// Version — instead of GroupInfo (an older caller reads the GroupInfo and
// leaves the version unread; an older answer reads as version 0).
// Create delegations (deleg_msgs.go, docs/design/0016), one block:
// MReserveInos, MCreateBatch, MDelegate, MReturnDelegation and
// MWaitRecall were added at the end of the metadata methods (an older
// service: ENOSYS; a client then creates one MCreate at a time, without
// delegations); LookupReq, GetAttrReq and ReadDirReq gained a trailing
// Client (the asking session, sent only when set; absent: unknown, taken
// as another session's) and ClusterStatusResp a trailing Delegations list
// (absent: none).
// Inline data (docs/design/0017): the byte after an answer's Blocks
// (BlocksKnown) gained bit 1, Inline (an older client fails on the byte,
// a bad bool, rather than read a file's bytes from chunks it has none
// in), and in AttrResp bit 2, Data follows (the file's bytes,
// length-prefixed); GetAttrReq gained a trailing Flags after Client
// (GetAttrData, GetAttrWrite; an older service: EINVAL, trailing bytes);
// CreateBatchReq's Written byte may be 3, the create's bytes following its
// Alloc list (an older service: EINVAL, a bad bool).
// Moving the connection machinery out of this package
// into package transport changed no byte on the wire.
//
// Frame and handshake versions are the transport's (package transport,
// transport.go has the frame table); WireVersion, their number, is kept
// here with the messages' history, since a peer of another version is
// refused as a whole.
package rpc
