package rpc

import "github.com/stratafs/strata/internal/layout"

// Metadata-service methods. Numbers are part of the wire format: never reuse
// or renumber one; add new ones at the end (see doc.go, version history).
const (
	MSessionOpen Method = iota + 1
	MSessionHeartbeat
	MSessionClose
	MLookup
	MGetAttr
	MSetAttr
	MCreate
	MUnlink
	MRmdir
	MRename
	MLink
	MReadlink
	MReadDir
	MStatFS
	MGetXattr
	MSetXattr
	MListXattr
	MRemoveXattr
	MCommitSize
	MGetLk
	MSetLk
	MSetDirLayout
	MRegisterServer
	MServerHeartbeat
	MClusterStatus
	MListTargets
	// MSync (SyncReq, SyncResp) returns once the namespace changes the
	// service has applied (or those up to a given raft index) are on stable
	// storage: the barrier behind a client's fsync, fsyncdir and close
	// under the sync policy.
	MSync
	// MInodesKnown (InodesKnownReq, InodesKnownResp) tells which inode
	// numbers the namespace knows: `strata fsck` finds chunk files no
	// file owns.
	MInodesKnown
	// MTmpfile (CreateReq with an empty Name, ChangeResp) makes a regular
	// file that no directory names, for open(2) with O_TMPFILE: an orphan
	// from the start, reaped once no client holds it open unless MLink
	// gives it a name first.
	MTmpfile
	// MSetAtimes (SetAtimesReq, Stamp) sets the access times of many
	// files at once, each only forward: a client's batch of relatime
	// updates, applied as one raft entry. ctime does not change.
	MSetAtimes
	// MMetaInfo (Empty, MetaInfoResp) describes the answering voter's
	// raft state; any voter answers, leader or not.
	MMetaInfo
	// MAddVoter, MRemoveVoter, MTransferLeader (MembershipReq,
	// MembershipResp) change the raft group's membership or leader; only
	// the leader answers them (others: ENOTCONN naming the leader).
	MAddVoter
	MRemoveVoter
	MTransferLeader
	// Mirror groups (mirror_msgs.go; docs/design/0014). MListGroups
	// (Empty, ListGroupsResp): every mirror group with its epoch, for
	// clients' and stores' routing; any voter that is the leader answers.
	MListGroups
	// MMirrorCreate (MirrorCreateReq, ListGroupsResp: the groups made)
	// pairs targets into mirror groups (strata mirror create).
	MMirrorCreate
	// MMirrorFailOver (MirrorGroupReq, GroupResp) makes the secondary of
	// an in-sync group its primary, bumping the epoch (strata mirror
	// fail-over: a planned switch).
	MMirrorFailOver
	// MMirrorReport (MirrorReportReq, GroupResp) is a store telling the
	// service what it saw of a group it serves: a secondary it cannot
	// reach (the group degrades and its epoch is bumped before the
	// primary acknowledges anything the secondary lacks), resync
	// progress, resync done (the group is in sync again).
	MMirrorReport
	// MMirrorReplace (MirrorReplaceReq, GroupResp) replaces the group's
	// out-of-sync copy with another (empty) target, which is filled by a
	// full resync (strata mirror replace GROUP --target ID).
	MMirrorReplace
	// MHALease (HALeaseReq, HALeaseResp) asks for, renews or gives up a
	// named lease kept in the replicated state: the election of an NFS
	// gateway HA pair (docs/design/0015 § HA pair). Only the leader
	// answers (others: ENOTCONN naming it).
	MHALease
	// MDirLayout (GetAttrReq, DirLayoutResp) answers a directory's
	// default layout for new files with its mirror mark (strata stripe
	// get). ENOTDIR for anything else.
	MDirLayout

	// Create delegations (deleg_msgs.go, docs/design/0016), appended in
	// one block:
	//
	// MReserveInos (ReserveInosReq, ReserveInosResp) reserves a range of
	// inode numbers for the caller's session (answered once durable).
	MReserveInos
	// MCreateBatch (CreateBatchReq, CreateBatchResp) makes up to
	// MaxCreateBatch empty regular files with inode numbers from the
	// session's ranges, in order, in one raft entry; each create has its
	// own dedupe seq and its own status.
	MCreateBatch
	// MDelegate (DelegateReq, DelegateResp) asks for the create delegation
	// on a directory: EBUSY while another session holds one or has an
	// operation on it under way, E2BIG above MaxDelegEntries entries.
	MDelegate
	// MReturnDelegation (ReturnDelegationReq, Stamp) gives a delegation
	// back (after the holder flushed its queued creates).
	MReturnDelegation
	// MWaitRecall (WaitRecallReq, WaitRecallResp) is the holder's
	// long-poll: answered with the directories whose delegation the
	// service recalls, or empty after the wait asked for.
	MWaitRecall
)

// InodesKnownReq asks which of Inos exist (as files, directories, or
// unlinked files still open). At most MaxInodesKnown a call.
type InodesKnownReq struct{ Inos []uint64 }

// MaxInodesKnown bounds InodesKnownReq.Inos.
const MaxInodesKnown = 65536

func (m *InodesKnownReq) Encode(e *Enc) { e.U64s(m.Inos) }
func (m *InodesKnownReq) Decode(d *Dec) { m.Inos = d.U64s() }

// InodesKnownResp: Known[i] answers Inos[i]. NextIno is the number the
// next new inode gets, read before the lookups: a chunk of an inode at or
// above it may belong to a file created since.
type InodesKnownResp struct {
	NextIno uint64
	Known   []bool
}

func (m *InodesKnownResp) Encode(e *Enc) {
	e.U64(m.NextIno)
	b := make([]byte, len(m.Known))
	for i, k := range m.Known {
		if k {
			b[i] = 1
		}
	}
	e.Bytes(b)
}

func (m *InodesKnownResp) Decode(d *Dec) {
	m.NextIno = d.U64()
	b := d.Bytes()
	m.Known = make([]bool, len(b))
	for i, v := range b {
		m.Known[i] = v != 0
	}
}

// Empty is the request or response of a method that carries nothing.
type Empty struct{}

func (*Empty) Encode(*Enc) {}
func (*Empty) Decode(*Dec) {}

// ReqHeader is carried by every mutating metadata request. (ClientID, Seq)
// identifies the request so that a retry after a lost reply or a leader
// change is applied at most once. Seq grows per client.
type ReqHeader struct {
	ClientID uint64
	Seq      uint64
}

func (h *ReqHeader) Encode(e *Enc) { e.U64(h.ClientID); e.U64(h.Seq) }
func (h *ReqHeader) Decode(d *Dec) { h.ClientID = d.U64(); h.Seq = d.U64() }

// Attr is an inode's attributes as the metadata service stores them.
// Times are nanoseconds since the Unix epoch. Mode holds the S_IF* type bits
// and the permission bits (including setuid, setgid, sticky).
type Attr struct {
	Ino    uint64
	Mode   uint32
	Nlink  uint32
	Uid    uint32
	Gid    uint32
	Rdev   uint32
	Size   uint64
	Atime  int64
	Mtime  int64
	Ctime  int64
	Layout layout.Layout // file: its layout; directory: default for new children
	// Blocks is the space a regular file's chunks take on the targets, in
	// 512-byte units, as last reported by a client's size commit; valid
	// when BlocksKnown (files last written before it was kept are not).
	// Not part of Attr's own encoding: the answers that carry attributes
	// append it at their end (encodeBlocks), so that older answers (dedupe
	// records) still decode, as unknown.
	Blocks      uint64
	BlocksKnown bool
	// Inline: a regular file whose data the metadata service keeps with
	// its inode (docs/design/0017): it has no chunks on its targets, and
	// GetAttr with GetAttrData answers its bytes. Carried in the blocks
	// tail's flag byte.
	Inline bool
}

// encodeBlocks and decodeBlocks are the appended tail of an answer with
// attributes: decodeBlocks reads an absent tail as unknown. The byte after
// Blocks is BlocksKnown (0, 1) with bit 1 for Inline: a reader before
// inline data fails on it (a bad bool) rather than read the file's data
// from chunks that do not hold it.
func encodeBlocks(e *Enc, a *Attr) {
	e.U64(a.Blocks)
	var b uint8
	if a.BlocksKnown {
		b |= 1
	}
	if a.Inline {
		b |= 2
	}
	e.U8(b)
}

func decodeBlocks(d *Dec, a *Attr) {
	if d.Len() == 0 {
		a.Blocks, a.BlocksKnown, a.Inline = 0, false, false
		return
	}
	a.Blocks = d.U64()
	b := d.U8()
	if b&^3 != 0 {
		d.Fail(ErrMalformed)
		return
	}
	a.BlocksKnown = b&1 != 0
	a.Inline = b&2 != 0
}

func (a *Attr) Encode(e *Enc) {
	e.U64(a.Ino)
	e.U32(a.Mode)
	e.U32(a.Nlink)
	e.U32(a.Uid)
	e.U32(a.Gid)
	e.U32(a.Rdev)
	e.U64(a.Size)
	e.I64(a.Atime)
	e.I64(a.Mtime)
	e.I64(a.Ctime)
	EncodeLayout(e, &a.Layout)
}

func (a *Attr) Decode(d *Dec) {
	a.Ino = d.U64()
	a.Mode = d.U32()
	a.Nlink = d.U32()
	a.Uid = d.U32()
	a.Gid = d.U32()
	a.Rdev = d.U32()
	a.Size = d.U64()
	a.Atime = d.I64()
	a.Mtime = d.I64()
	a.Ctime = d.I64()
	DecodeLayout(d, &a.Layout)
}

// EncodeLayout and DecodeLayout are the wire form of a layout.Layout.
func EncodeLayout(e *Enc, l *layout.Layout) {
	e.U32(l.StripeSize)
	e.U32(l.StripeCount)
	e.U32s(l.Targets)
}

func DecodeLayout(d *Dec, l *layout.Layout) {
	l.StripeSize = d.U32()
	l.StripeCount = d.U32()
	l.Targets = d.U32s()
}

// AttrResp answers every method that returns one inode's attributes.
// AttrResp answers reads (lookup, getattr) and the changes that answer
// an inode's attributes (setattr, link, set layout). A change also carries
// the raft index and term of its entry (Stamp), for a later barrier to
// check; a read carries zeros.
//
// Data (appended, only when not nil): an inline file's bytes, answered to
// a GetAttr with GetAttrData (absent: nil).
type AttrResp struct {
	Attr Attr
	Stamp
	Data []byte
}

func (m *AttrResp) Encode(e *Enc) {
	m.encodeAttrs(e)
	if m.Data != nil {
		e.Bytes(m.Data)
	}
}

// encodeAttrs and decodeAttrs are AttrResp without Data: LinkResp, which
// appends its Dir after them, carries no data.
func (m *AttrResp) encodeAttrs(e *Enc) { m.Attr.Encode(e); m.Stamp.Encode(e); encodeBlocks(e, &m.Attr) }

func (m *AttrResp) decodeAttrs(d *Dec) { m.Attr.Decode(d); m.Stamp.Decode(d); decodeBlocks(d, &m.Attr) }

func (m *AttrResp) Decode(d *Dec) {
	m.decodeAttrs(d)
	m.Data = nil
	if d.Len() > 0 {
		if m.Data = d.Bytes(); m.Data == nil {
			m.Data = []byte{}
		}
	}
}

// Stamp is the raft index and term of the log entry a namespace change was
// answered from, before that entry was durable. A client's barrier (MSync
// with Index and Term) then both waits for it and checks that the log
// still holds it: a metadata machine crash may lose it. It is the whole
// answer of changes with nothing else to say (rename, rmdir, xattrs).
type Stamp struct{ Index, Term uint64 }

func (m *Stamp) Encode(e *Enc) { e.U64(m.Index); e.U64(m.Term) }
func (m *Stamp) Decode(d *Dec) {
	if d.Len() == 0 { // an answer recorded before stamps (dedupe records): none
		*m = Stamp{}
		return
	}
	m.Index = d.U64()
	m.Term = d.U64()
}

// ChangeStamp returns the stamp (Index 0: none).
func (m *Stamp) ChangeStamp() Stamp { return *m }

// ChangeResp answers MCreate and MUnlink: the entry's attributes after the
// change, and its directory's. A client serves the directory's attributes
// from them for a short while instead of asking again (the kernel asks for
// them after every change in the directory, to check permissions).
//
// Index is the change's raft index: a client that must make the change
// durable (close of a file it created) asks MSync for exactly that index.
type ChangeResp struct {
	Attr  Attr
	Dir   Attr
	Index uint64
	Term  uint64 // the raft term of the entry at Index
}

// ChangeStamp returns the change's entry.
func (m *ChangeResp) ChangeStamp() Stamp { return Stamp{m.Index, m.Term} }

func (m *ChangeResp) Encode(e *Enc) {
	m.Attr.Encode(e)
	m.Dir.Encode(e)
	e.U64(m.Index)
	e.U64(m.Term)
	encodeBlocks(e, &m.Attr)
}

func (m *ChangeResp) Decode(d *Dec) {
	m.Attr.Decode(d)
	m.Dir.Decode(d)
	m.Index = d.U64()
	m.Term = d.U64()
	decodeBlocks(d, &m.Attr)
}

// SyncReq asks MSync to return once the raft log is on stable storage up
// to Index (0: everything applied so far). With Term (the term a change
// was answered with, ChangeResp), MSync also checks that the log still
// holds that entry: if the metadata machine crashed before the entry was
// durable, the entry is gone (or another one took its index) and MSync
// fails with EIO instead of vouching for a change that was lost.
type SyncReq struct{ Index, Term uint64 }

func (m *SyncReq) Encode(e *Enc) { e.U64(m.Index); e.U64(m.Term) }
func (m *SyncReq) Decode(d *Dec) { m.Index = d.U64(); m.Term = d.U64() }

// SyncResp answers MSync: the log is durable up to Durable (≥ the index
// asked for); Term is the service's raft term when it said so.
type SyncResp struct{ Durable, Term uint64 }

func (m *SyncResp) Encode(e *Enc) { e.U64(m.Durable); e.U64(m.Term) }
func (m *SyncResp) Decode(d *Dec) { m.Durable = d.U64(); m.Term = d.U64() }

// SessionOpenReq starts a client session (one per mount or library user).
// Sessions own locks and the set of open inodes; a session whose heartbeats
// stop for longer than its lease is expired and its locks released.
type SessionOpenReq struct {
	Host       string
	MountPoint string
	Pid        uint32
}

func (m *SessionOpenReq) Encode(e *Enc) { e.String(m.Host); e.String(m.MountPoint); e.U32(m.Pid) }
func (m *SessionOpenReq) Decode(d *Dec) {
	m.Host = d.String()
	m.MountPoint = d.String()
	m.Pid = d.U32()
}

type SessionOpenResp struct {
	ClientID uint64
	LeaseMs  uint32 // heartbeat at least every LeaseMs/3
}

func (m *SessionOpenResp) Encode(e *Enc) { e.U64(m.ClientID); e.U32(m.LeaseMs) }
func (m *SessionOpenResp) Decode(d *Dec) { m.ClientID = d.U64(); m.LeaseMs = d.U32() }

// SessionHeartbeatReq renews a session's lease and reports which inodes the
// client holds open, so that unlinked-but-open files keep their data.
// An unknown session is answered with ESTALE: the client opens a new one.
//
// LockEpoch is the lock epoch under which every lock the client holds is
// registered (see SessionHeartbeatResp); a client that reports the current
// epoch has finished reclaiming after a service restart. Answers
// SessionHeartbeatResp.
type SessionHeartbeatReq struct {
	ClientID   uint64
	OpenInodes []uint64
	LockEpoch  uint64
	// ListedAfter is SessionHeartbeatResp.Now of the last answer the
	// client got before it listed OpenInodes (0: none yet): the service
	// knows from it how recent the list is, which the time it receives
	// the heartbeat does not tell.
	ListedAfter int64
	// Gateway is what an NFS gateway's session reports of its service
	// (nil: not a gateway), for strata status.
	Gateway *GatewayReport
}

func (m *SessionHeartbeatReq) Encode(e *Enc) {
	e.U64(m.ClientID)
	e.U64s(m.OpenInodes)
	e.U64(m.LockEpoch)
	e.I64(m.ListedAfter)
	if m.Gateway != nil { // a mount's heartbeat keeps its older bytes
		e.Bool(true)
		m.Gateway.Encode(e)
	}
}
func (m *SessionHeartbeatReq) Decode(d *Dec) {
	m.ClientID = d.U64()
	m.OpenInodes = d.U64s()
	m.LockEpoch = optionalU64(d)
	if d.Len() > 0 {
		m.ListedAfter = d.I64()
	}
	m.Gateway = nil
	if d.Len() > 0 && d.Bool() {
		m.Gateway = &GatewayReport{}
		m.Gateway.Decode(d)
	}
}

// GatewayReport is an NFS gateway's service as its session's heartbeat
// reports it (SessionHeartbeatReq.Gateway) and strata status shows it
// (ClusterStatusResp.Gateways).
type GatewayReport struct {
	Address   string   // where it serves NFS (strata nfs --listen)
	Exports   []string // PATH=OPTIONS, as configured
	Clients   uint32   // NFS client addresses with a call in the last 5 minutes
	Ops       uint64   // NFS and MOUNT calls answered since it started
	OpsPerSec uint32   // calls a second over its last heartbeat period
}

// MaxGatewayExports bounds GatewayReport.Exports on the wire.
const MaxGatewayExports = 256

func (g *GatewayReport) Encode(e *Enc) {
	e.String(g.Address)
	e.Strings(g.Exports[:min(len(g.Exports), MaxGatewayExports)])
	e.U32(g.Clients)
	e.U64(g.Ops)
	e.U32(g.OpsPerSec)
}

func (g *GatewayReport) Decode(d *Dec) {
	g.Address = d.String()
	g.Exports = d.Strings()
	g.Clients = d.U32()
	g.Ops = d.U64()
	g.OpsPerSec = d.U32()
}

// GatewayStatus is one NFS gateway in ClusterStatusResp: its session and
// its last report.
type GatewayStatus struct {
	Client uint64 // session id (ClientInfo.ID)
	Report GatewayReport
}

// SessionHeartbeatResp carries the service's lock epoch: a number that
// changes whenever the lock table starts empty (a restarted service, a new
// leader). A client whose locks were granted under another epoch reclaims
// them (LockReq.Reclaim) and then reports the epoch in its next heartbeat.
type SessionHeartbeatResp struct {
	LockEpoch uint64
	// Now is the service's time of the answer (unix ns), for the next
	// SessionHeartbeatReq.ListedAfter.
	Now int64
}

func (m *SessionHeartbeatResp) Encode(e *Enc) { e.U64(m.LockEpoch); e.I64(m.Now) }
func (m *SessionHeartbeatResp) Decode(d *Dec) {
	m.LockEpoch = optionalU64(d)
	if d.Len() > 0 {
		m.Now = d.I64()
	}
}

// optionalU64 reads a trailing field added within version 1: absent (an
// older peer) reads as zero.
func optionalU64(d *Dec) uint64 {
	if d.Len() == 0 {
		return 0
	}
	return d.U64()
}

// SessionCloseReq ends a session, releasing its locks.
type SessionCloseReq struct{ ClientID uint64 }

func (m *SessionCloseReq) Encode(e *Enc) { e.U64(m.ClientID) }
func (m *SessionCloseReq) Decode(d *Dec) { m.ClientID = d.U64() }

// LookupReq finds Name in directory Parent. ENOENT if absent.
type LookupReq struct {
	Parent uint64
	Name   string
	// Client is the asking session (appended; absent or 0: unknown), so
	// that a delegation holder's own reads of its directory do not recall
	// the delegation (docs/design/0016).
	Client uint64
}

func (m *LookupReq) Encode(e *Enc) {
	e.U64(m.Parent)
	e.String(m.Name)
	encodeTrailingClient(e, m.Client)
}

func (m *LookupReq) Decode(d *Dec) {
	m.Parent = d.U64()
	m.Name = d.String()
	m.Client = decodeTrailingClient(d)
}

// GetAttrReq reads an inode's attributes. ENOENT if it does not exist.
// Client: as LookupReq.Client (appended, only when set). Flags (appended
// after Client, which is then sent even when 0; only when set):
// GetAttrData asks for an inline file's bytes (AttrResp.Data),
// GetAttrWrite asks that an inline file's data be moved to its targets
// first (an open for writing; the answer is then not Inline). A service
// before inline data answers a request with Flags EINVAL (trailing
// bytes) — it keeps no inline data either.
type GetAttrReq struct {
	Ino    uint64
	Client uint64
	Flags  uint32
}

// GetAttrReq.Flags bits.
const (
	GetAttrData  = 1 << 0
	GetAttrWrite = 1 << 1
)

func (m *GetAttrReq) Encode(e *Enc) {
	e.U64(m.Ino)
	if m.Flags != 0 {
		e.U64(m.Client)
		e.U32(m.Flags)
		return
	}
	encodeTrailingClient(e, m.Client)
}

func (m *GetAttrReq) Decode(d *Dec) {
	m.Ino = d.U64()
	m.Client = decodeTrailingClient(d)
	m.Flags = 0
	if d.Len() > 0 {
		m.Flags = d.U32()
	}
}

// encodeTrailingClient appends a session id, only when set.
func encodeTrailingClient(e *Enc, client uint64) {
	if client != 0 {
		e.U64(client)
	}
}

// decodeTrailingClient reads an appended session id (absent: 0).
func decodeTrailingClient(d *Dec) uint64 {
	if d.Len() == 0 {
		return 0
	}
	return d.U64()
}

// SetAttr Valid bits.
const (
	SetMode uint32 = 1 << iota
	SetUid
	SetGid
	SetSize
	SetAtime
	SetMtime
	SetAtimeNow
	SetMtimeNow
	SetCtime
)

// SetAttrReq changes the attributes named by Valid. Ctime is set to the
// request's time on every change. A change of uid or gid on a non-directory
// clears setuid, and setgid when group-execute is set (POSIX chown). SetSize
// only changes the metadata size; the client truncates chunks on the stores.
type SetAttrReq struct {
	Hdr   ReqHeader
	Ino   uint64
	Valid uint32
	Mode  uint32 // permission bits only (07777)
	Uid   uint32
	Gid   uint32
	Size  uint64
	Atime int64
	Mtime int64
	Ctime int64
}

func (m *SetAttrReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.Ino)
	e.U32(m.Valid)
	e.U32(m.Mode)
	e.U32(m.Uid)
	e.U32(m.Gid)
	e.U64(m.Size)
	e.I64(m.Atime)
	e.I64(m.Mtime)
	e.I64(m.Ctime)
}

func (m *SetAttrReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Ino = d.U64()
	m.Valid = d.U32()
	m.Mode = d.U32()
	m.Uid = d.U32()
	m.Gid = d.U32()
	m.Size = d.U64()
	m.Atime = d.I64()
	m.Mtime = d.I64()
	m.Ctime = d.I64()
}

// CreateReq makes a regular file, directory, device node, FIFO, socket or
// symlink (the type is in Mode's S_IF* bits; SymlinkTarget for S_IFLNK).
// The new inode inherits the parent's default layout (files) or default
// layout setting (directories), and the parent's gid when the parent has
// setgid (directories then also get setgid). EEXIST if Name exists.
// ENAMETOOLONG if Name is over 255 bytes.
type CreateReq struct {
	Hdr           ReqHeader
	Parent        uint64
	Name          string
	Mode          uint32
	Uid           uint32
	Gid           uint32
	Rdev          uint32
	SymlinkTarget string
}

func (m *CreateReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.Parent)
	e.String(m.Name)
	e.U32(m.Mode)
	e.U32(m.Uid)
	e.U32(m.Gid)
	e.U32(m.Rdev)
	e.String(m.SymlinkTarget)
}

func (m *CreateReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Parent = d.U64()
	m.Name = d.String()
	m.Mode = d.U32()
	m.Uid = d.U32()
	m.Gid = d.U32()
	m.Rdev = d.U32()
	m.SymlinkTarget = d.String()
}

// EntryReq names one directory entry; used by Unlink and Rmdir.
// Unlink answers AttrResp with the victim's attributes after the unlink
// (Nlink 0 means the inode became an orphan). Rmdir answers Empty;
// ENOTEMPTY if the directory has entries, ENOTDIR/EISDIR on type mismatch.
type EntryReq struct {
	Hdr    ReqHeader
	Parent uint64
	Name   string
}

func (m *EntryReq) Encode(e *Enc) { m.Hdr.Encode(e); e.U64(m.Parent); e.String(m.Name) }
func (m *EntryReq) Decode(d *Dec) { m.Hdr.Decode(d); m.Parent = d.U64(); m.Name = d.String() }

// Rename flags (as renameat2).
const (
	RenameNoReplace uint32 = 1
	RenameExchange  uint32 = 2
)

// RenameReq moves OldParent/OldName to NewParent/NewName atomically,
// replacing a compatible target (ENOTEMPTY for a non-empty directory,
// EISDIR/ENOTDIR on type mismatch, EINVAL when moving a directory into its
// own subtree). Answers Empty.
type RenameReq struct {
	Hdr       ReqHeader
	OldParent uint64
	OldName   string
	NewParent uint64
	NewName   string
	Flags     uint32
}

func (m *RenameReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.OldParent)
	e.String(m.OldName)
	e.U64(m.NewParent)
	e.String(m.NewName)
	e.U32(m.Flags)
}

func (m *RenameReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.OldParent = d.U64()
	m.OldName = d.String()
	m.NewParent = d.U64()
	m.NewName = d.String()
	m.Flags = d.U32()
}

// LinkReq adds a hard link NewParent/NewName to Ino (EPERM for directories).
type LinkReq struct {
	Hdr       ReqHeader
	Ino       uint64
	NewParent uint64
	NewName   string
}

func (m *LinkReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.Ino)
	e.U64(m.NewParent)
	e.String(m.NewName)
}
func (m *LinkReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Ino = d.U64()
	m.NewParent = d.U64()
	m.NewName = d.String()
}

// ReadlinkResp carries a symlink's target (request: GetAttrReq).
type ReadlinkResp struct{ Target string }

func (m *ReadlinkResp) Encode(e *Enc) { e.String(m.Target) }
func (m *ReadlinkResp) Decode(d *Dec) { m.Target = d.String() }

// ReadDirReq lists directory Dir in name order, starting after the name
// After ("" = from the start), at most Limit entries. Because the cursor is
// a name, not a position, a listing under concurrent change never repeats or
// skips an entry that exists throughout. With Plus, each entry carries Attr.
type ReadDirReq struct {
	Dir   uint64
	After string
	Limit uint32
	Plus  bool
	// Client: as LookupReq.Client (appended, only when set).
	Client uint64
}

func (m *ReadDirReq) Encode(e *Enc) {
	e.U64(m.Dir)
	e.String(m.After)
	e.U32(m.Limit)
	e.Bool(m.Plus)
	encodeTrailingClient(e, m.Client)
}

func (m *ReadDirReq) Decode(d *Dec) {
	m.Dir = d.U64()
	m.After = d.String()
	m.Limit = d.U32()
	m.Plus = d.Bool()
	m.Client = decodeTrailingClient(d)
}

// DirEntry is one listed name. Mode has the type bits (and, with Plus, the
// whole Attr is filled in).
type DirEntry struct {
	Name string
	Ino  uint64
	Mode uint32
	Attr Attr
}

type ReadDirResp struct {
	Entries []DirEntry
	EOF     bool
}

func (m *ReadDirResp) Encode(e *Enc) {
	e.U64(uint64(len(m.Entries)))
	for i := range m.Entries {
		x := &m.Entries[i]
		e.String(x.Name)
		e.U64(x.Ino)
		e.U32(x.Mode)
		x.Attr.Encode(e)
	}
	e.Bool(m.EOF)
	for i := range m.Entries {
		encodeBlocks(e, &m.Entries[i].Attr)
	}
}

func (m *ReadDirResp) Decode(d *Dec) {
	n := d.Count()
	m.Entries = make([]DirEntry, n)
	for i := range m.Entries {
		x := &m.Entries[i]
		x.Name = d.String()
		x.Ino = d.U64()
		x.Mode = d.U32()
		x.Attr.Decode(d)
	}
	m.EOF = d.Bool()
	for i := range m.Entries {
		decodeBlocks(d, &m.Entries[i].Attr)
	}
}

// StatFSResp is the file-system-wide capacity (request: Empty).
type StatFSResp struct {
	TotalBytes uint64
	FreeBytes  uint64
	AvailBytes uint64
	Inodes     uint64
	FreeInodes uint64
}

func (m *StatFSResp) Encode(e *Enc) {
	e.U64(m.TotalBytes)
	e.U64(m.FreeBytes)
	e.U64(m.AvailBytes)
	e.U64(m.Inodes)
	e.U64(m.FreeInodes)
}

func (m *StatFSResp) Decode(d *Dec) {
	m.TotalBytes = d.U64()
	m.FreeBytes = d.U64()
	m.AvailBytes = d.U64()
	m.Inodes = d.U64()
	m.FreeInodes = d.U64()
}

// Xattr flags (as setxattr(2)).
const (
	XattrCreate  uint32 = 1
	XattrReplace uint32 = 2
)

// XattrReq names one extended attribute; used by GetXattr (answers
// XattrResp, ENODATA if absent), SetXattr (Value, Flags; answers Empty) and
// RemoveXattr (answers Empty). ListXattr takes GetAttrReq and answers
// ListXattrResp.
type XattrReq struct {
	Hdr   ReqHeader
	Ino   uint64
	Name  string
	Value []byte
	Flags uint32
}

func (m *XattrReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.Ino)
	e.String(m.Name)
	e.Bytes(m.Value)
	e.U32(m.Flags)
}

func (m *XattrReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Ino = d.U64()
	m.Name = d.String()
	m.Value = d.Bytes()
	m.Flags = d.U32()
}

type XattrResp struct{ Value []byte }

func (m *XattrResp) Encode(e *Enc) { e.Bytes(m.Value) }
func (m *XattrResp) Decode(d *Dec) { m.Value = d.Bytes() }

type ListXattrResp struct{ Names []string }

func (m *ListXattrResp) Encode(e *Enc) { e.Strings(m.Names) }
func (m *ListXattrResp) Decode(d *Dec) { m.Names = d.Strings() }

// CommitSizeReq is sent by a writer on fsync, close and when write-behind
// drains: Size becomes max(current size, Size) — so that writers of disjoint
// regions (N-to-1) from any number of clients end with the right size — and
// mtime/ctime become Mtime. ClearSuid clears setuid/setgid (a write by a
// non-owner). Answers AttrResp.
//
// Deferred (appended; absent from older clients: false) asks for the
// answer once the commit is applied, before its log entry is durable, as
// for a namespace change: the answer's Stamp names the entry, and the
// client's next barrier for the file (fsync) waits for and checks it. The
// async policy's close sends it; a commit without it (fsync, the sync
// policy's close) is answered once durable. An older service ignores the
// flag and answers once durable, which is only slower.
type CommitSizeReq struct {
	Hdr       ReqHeader
	Ino       uint64
	Size      uint64
	Mtime     int64
	ClearSuid bool
	// Alloc: the chunks this client changed and the space each takes now
	// (appended; absent from older clients).
	Alloc    []SlotAlloc
	Deferred bool
}

// SlotAlloc is the space (bytes) the chunk of layout slot Slot takes.
type SlotAlloc struct {
	Slot  uint32
	Bytes uint64
}

func (m *CommitSizeReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.Ino)
	e.U64(m.Size)
	e.I64(m.Mtime)
	e.Bool(m.ClearSuid)
	EncodeSlotAllocs(e, m.Alloc)
	e.Bool(m.Deferred)
}

func (m *CommitSizeReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Ino = d.U64()
	m.Size = d.U64()
	m.Mtime = d.I64()
	m.ClearSuid = d.Bool()
	m.Alloc = DecodeSlotAllocs(d)
	m.Deferred = d.Len() > 0 && d.Bool()
}

// EncodeSlotAllocs appends allocs; DecodeSlotAllocs reads them, nil when
// the tail is absent (written before they existed).
func EncodeSlotAllocs(e *Enc, allocs []SlotAlloc) {
	e.U64(uint64(len(allocs)))
	for _, a := range allocs {
		e.U32(a.Slot)
		e.U64(a.Bytes)
	}
}

func DecodeSlotAllocs(d *Dec) []SlotAlloc {
	if d.Len() == 0 {
		return nil
	}
	n := d.Count()
	if n == 0 {
		return nil
	}
	out := make([]SlotAlloc, n)
	for i := range out {
		out[i] = SlotAlloc{Slot: d.U32(), Bytes: d.U64()}
	}
	return out
}

// Lock types (as fcntl).
const (
	LockRead   uint32 = 0 // F_RDLCK
	LockWrite  uint32 = 1 // F_WRLCK
	LockUnlock uint32 = 2 // F_UNLCK
)

// LockReq is a POSIX record lock, OFD lock or flock request. Owner is the
// kernel's lock owner (unique per process or open file description within a
// client); locks are held per (ClientID, Owner). End is inclusive, with
// ^uint64(0) meaning "to end of file". Flock locks whole files and never
// conflicts with record locks (Linux semantics). Handle names the client's
// open the lock is taken through; CloseHandle (with Type LockUnlock) drops
// every lock the client took through Handle on Ino, whatever its owner —
// the close of an open file description, which must not touch what the
// same owner (the kernel reuses owner names) took through another open.
//
// GetLk answers LockResp with the first conflicting lock, or Type=LockUnlock.
// SetLk answers Empty or EAGAIN on conflict. With Wait, the service waits a
// bounded time (about one second) for the lock before answering EAGAIN; the
// client repeats until granted or interrupted, so no request blocks forever.
type LockReq struct {
	ClientID uint64
	Ino      uint64
	Owner    uint64
	Start    uint64
	End      uint64
	Type     uint32
	Pid      uint32
	Flock    bool
	Wait     bool
	// Reclaim re-registers a lock the client held under an earlier lock
	// epoch: granted during the grace period that holds back new locks
	// after a restart; EAGAIN when it conflicts (the lock is lost).
	Reclaim     bool
	Handle      uint64 // the client's open the lock is taken through; 0: none
	CloseHandle bool   // drop every lock taken through Handle (Owner, range and Flock ignored)
}

func (m *LockReq) Encode(e *Enc) {
	e.U64(m.ClientID)
	e.U64(m.Ino)
	e.U64(m.Owner)
	e.U64(m.Start)
	e.U64(m.End)
	e.U32(m.Type)
	e.U32(m.Pid)
	e.Bool(m.Flock)
	e.Bool(m.Wait)
	e.Bool(m.Reclaim)
	e.U64(m.Handle)
	e.Bool(m.CloseHandle)
}

func (m *LockReq) Decode(d *Dec) {
	m.ClientID = d.U64()
	m.Ino = d.U64()
	m.Owner = d.U64()
	m.Start = d.U64()
	m.End = d.U64()
	m.Type = d.U32()
	m.Pid = d.U32()
	m.Flock = d.Bool()
	m.Wait = d.Bool()
	if d.Len() > 0 { // absent from older clients
		m.Reclaim = d.Bool()
	}
	if d.Len() > 0 { // absent from older clients
		m.Handle = d.U64()
		m.CloseHandle = d.Bool()
	}
}

// LockGrant answers SetLk: the lock epoch the lock was granted under (see
// SessionHeartbeatResp).
type LockGrant struct{ Epoch uint64 }

func (m *LockGrant) Encode(e *Enc) { e.U64(m.Epoch) }
func (m *LockGrant) Decode(d *Dec) { m.Epoch = optionalU64(d) }

type LockResp struct {
	Start uint64
	End   uint64
	Type  uint32
	Pid   uint32
}

func (m *LockResp) Encode(e *Enc) { e.U64(m.Start); e.U64(m.End); e.U32(m.Type); e.U32(m.Pid) }
func (m *LockResp) Decode(d *Dec) {
	m.Start = d.U64()
	m.End = d.U64()
	m.Type = d.U32()
	m.Pid = d.U32()
}

// SetDirLayoutReq sets a directory's default layout for new children
// (strata stripe set). Zero fields mean "system default". EINVAL when the
// values break layout.Validate's rules or Count exceeds the number of
// targets; ENOTDIR for a non-directory. Answers AttrResp.
type SetDirLayoutReq struct {
	Hdr         ReqHeader
	Dir         uint64
	StripeSize  uint32
	StripeCount uint32
	// Mirror changes the directory's mirror mark (new files under it go
	// on mirror groups): DirMirrorKeep, DirMirrorOn or DirMirrorOff.
	// Appended: absent from older clients (keep), so a layout set
	// through an older mount never clears the mark.
	Mirror uint8
}

// SetDirLayoutReq.Mirror values.
const (
	DirMirrorKeep uint8 = 0
	DirMirrorOn   uint8 = 1
	DirMirrorOff  uint8 = 2
)

func (m *SetDirLayoutReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(m.Dir)
	e.U32(m.StripeSize)
	e.U32(m.StripeCount)
	e.U8(m.Mirror)
}

func (m *SetDirLayoutReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Dir = d.U64()
	m.StripeSize = d.U32()
	m.StripeCount = d.U32()
	m.Mirror = DirMirrorKeep
	if d.Len() > 0 {
		m.Mirror = d.U8()
	}
}

// TargetReg describes one target of a registering storage server. UUID is
// stored in the target directory at format time and is the target's identity:
// a restarted server gets the same target ids back.
type TargetReg struct {
	UUID       string
	Path       string
	TotalBytes uint64
	FreeBytes  uint64
	// FSID and RawFree are as in ServerHeartbeatReq (0: unknown): with them
	// the capacity is right from the registration on, not only from the
	// first heartbeat.
	FSID    uint64
	RawFree uint64
	// PrevID is the id the target was last assigned, as its identity file
	// records it (0: never registered). A metadata service that does not
	// know the target refuses one with a PrevID: it holds the chunks of
	// another file system (or of a lost metadata store).
	PrevID uint32
	// InoCeiling bounds the inode numbers of the target's chunk files:
	// all are below it (a multiple of InoCeilingStep; 0: unknown). The
	// metadata service never hands out a number below it again, so that
	// a metadata store restored from an older copy does not give a new
	// file the number — and the chunks — of one it forgot.
	InoCeiling uint64
}

// InoCeilingStep is the granularity of TargetReg.InoCeiling: a target
// records a new ceiling (a synced write of its identity file) once per
// this many inode numbers.
const InoCeilingStep = 1 << 16

// RegisterServerReq announces a storage server (at start, and again if a
// heartbeat answers ESTALE). Answers RegisterServerResp with ids in the same
// order as Targets.
type RegisterServerReq struct {
	Addr    string // data-path address clients dial
	Host    string
	Targets []TargetReg
	// Domain is the server's failure domain (strata store --domain: a
	// rack, a power feed); mirror create --domain pairs across them.
	// Appended: absent from older servers (none).
	Domain string
}

func (m *RegisterServerReq) Encode(e *Enc) {
	e.String(m.Addr)
	e.String(m.Host)
	e.U64(uint64(len(m.Targets)))
	for i := range m.Targets {
		t := &m.Targets[i]
		e.String(t.UUID)
		e.String(t.Path)
		e.U64(t.TotalBytes)
		e.U64(t.FreeBytes)
		e.U64(t.FSID)
		e.U64(t.RawFree)
		e.U32(t.PrevID)
		e.U64(t.InoCeiling)
	}
	e.String(m.Domain)
}

func (m *RegisterServerReq) Decode(d *Dec) {
	m.Addr = d.String()
	m.Host = d.String()
	m.Targets = make([]TargetReg, d.Count())
	for i := range m.Targets {
		t := &m.Targets[i]
		t.UUID = d.String()
		t.Path = d.String()
		t.TotalBytes = d.U64()
		t.FreeBytes = d.U64()
		t.FSID = d.U64()
		t.RawFree = d.U64()
		t.PrevID = d.U32()
		t.InoCeiling = d.U64()
	}
	m.Domain = ""
	if d.Len() > 0 {
		m.Domain = d.String()
	}
}

type RegisterServerResp struct {
	ServerID  uint32
	TargetIDs []uint32
}

func (m *RegisterServerResp) Encode(e *Enc) { e.U32(m.ServerID); e.U32s(m.TargetIDs) }
func (m *RegisterServerResp) Decode(d *Dec) { m.ServerID = d.U32(); m.TargetIDs = d.U32s() }

// TargetUsage is a target's capacity as last reported.
type TargetUsage struct {
	ID         uint32
	TotalBytes uint64
	FreeBytes  uint64
}

// ServerHeartbeatReq renews a storage server's liveness and reports its
// targets' capacity. ESTALE if the service does not know ServerID: the
// server registers again.
//
// FSIDs (one per target, 0 = unknown) identify the file system
// each target lives on (statfs f_fsid): targets of one host on one file
// system share its capacity, which the service counts once. RawFree (one
// per target) is the file system's free space including blocks reserved
// for root (f_bfree); TargetUsage.FreeBytes is what this server may use.
type ServerHeartbeatReq struct {
	ServerID uint32
	Targets  []TargetUsage
	FSIDs    []uint64
	RawFree  []uint64
	// InoCeiling is the highest TargetReg.InoCeiling of the server's
	// targets: a metadata service restored from an older copy learns of
	// the inode numbers it forgot also from servers that do not register
	// again.
	InoCeiling uint64
	// Unsynced (one per target, in Targets order) says how much of each
	// target is written and not yet durable. Appended: an older server
	// sends none.
	Unsynced []TargetUnsynced
}

// TargetUnsynced is how much of a target is written and not yet synced:
// its chunks made dirty and not synced since, the bytes written to them
// since they became dirty, and the age of the oldest in milliseconds (0
// when there are none).
type TargetUnsynced struct {
	Chunks   uint64
	Bytes    uint64
	OldestMs int64
}

func encodeUnsynced(e *Enc, us []TargetUnsynced) {
	e.U64(uint64(len(us)))
	for _, u := range us {
		e.U64(u.Chunks)
		e.U64(u.Bytes)
		e.I64(u.OldestMs)
	}
}

func decodeUnsynced(d *Dec) []TargetUnsynced {
	us := make([]TargetUnsynced, d.Count())
	for i := range us {
		us[i].Chunks = d.U64()
		us[i].Bytes = d.U64()
		us[i].OldestMs = d.I64()
	}
	return us
}

func (m *ServerHeartbeatReq) Encode(e *Enc) {
	e.U32(m.ServerID)
	e.U64(uint64(len(m.Targets)))
	for i := range m.Targets {
		e.U32(m.Targets[i].ID)
		e.U64(m.Targets[i].TotalBytes)
		e.U64(m.Targets[i].FreeBytes)
	}
	e.U64s(m.FSIDs)
	e.U64s(m.RawFree)
	e.U64(m.InoCeiling)
	encodeUnsynced(e, m.Unsynced)
}

func (m *ServerHeartbeatReq) Decode(d *Dec) {
	m.ServerID = d.U32()
	m.Targets = make([]TargetUsage, d.Count())
	for i := range m.Targets {
		m.Targets[i].ID = d.U32()
		m.Targets[i].TotalBytes = d.U64()
		m.Targets[i].FreeBytes = d.U64()
	}
	m.FSIDs = d.U64s()
	m.RawFree = d.U64s()
	m.InoCeiling = d.U64()
	if d.Len() > 0 { // absent from older servers
		m.Unsynced = decodeUnsynced(d)
	}
}

// ServerInfo and TargetInfo describe the cluster registry with health.
type ServerInfo struct {
	ID         uint32
	Addr       string
	Host       string
	Alive      bool
	LastSeenMs int64 // milliseconds since the last heartbeat
}

type TargetInfo struct {
	ID         uint32
	ServerID   uint32
	Addr       string // the owning server's data address
	Path       string
	TotalBytes uint64
	FreeBytes  uint64
	Alive      bool
}

func (t *TargetInfo) Encode(e *Enc) {
	e.U32(t.ID)
	e.U32(t.ServerID)
	e.String(t.Addr)
	e.String(t.Path)
	e.U64(t.TotalBytes)
	e.U64(t.FreeBytes)
	e.Bool(t.Alive)
}

func (t *TargetInfo) Decode(d *Dec) {
	t.ID = d.U32()
	t.ServerID = d.U32()
	t.Addr = d.String()
	t.Path = d.String()
	t.TotalBytes = d.U64()
	t.FreeBytes = d.U64()
	t.Alive = d.Bool()
}

// ListTargetsResp answers MListTargets (request Empty): every target with the
// address of its server, for client routing.
type ListTargetsResp struct{ Targets []TargetInfo }

func (m *ListTargetsResp) Encode(e *Enc) {
	e.U64(uint64(len(m.Targets)))
	for i := range m.Targets {
		m.Targets[i].Encode(e)
	}
}

func (m *ListTargetsResp) Decode(d *Dec) {
	m.Targets = make([]TargetInfo, d.Count())
	for i := range m.Targets {
		m.Targets[i].Decode(d)
	}
}

// ClusterStatusResp answers MClusterStatus (request Empty).
type ClusterStatusResp struct {
	MetaAddr     string
	RaftState    string // Leader, Follower, Candidate
	Leader       string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	Inodes       uint64
	Sessions     uint32
	Servers      []ServerInfo
	Targets      []TargetInfo
	// DurableIndex: the raft log is on stable storage up to here.
	DurableIndex uint64
	// TotalBytes, FreeBytes: the cluster's capacity as statfs reports it,
	// each file system counted once however many targets live on it.
	TotalBytes, FreeBytes uint64
	// Clients are the mounts with a session, in id order.
	Clients []ClientInfo
	// Locks are the locks held, in (inode, client) order; at most
	// MaxStatusLocks of them. LocksTotal counts them all.
	Locks      []LockInfo
	LocksTotal uint32
	// LockGrace: a new leader is holding new locks back until the
	// LockGracePending clients that may hold locks have reclaimed them.
	LockGrace        bool
	LockGracePending uint32
	// Problems says, one sentence each, what keeps the metadata service's
	// own stores from working (a raft log that cannot be appended to or
	// synced, a store whose engine keeps failing); empty when healthy.
	Problems []string
	// FreePendingFiles, FreePendingBytes: removed files whose chunks the
	// background reaper has not freed yet (open ones included), and the
	// space they hold. Appended: an older service sends neither (zero).
	FreePendingFiles, FreePendingBytes uint64
	// Unsynced (one per target, in Targets order) is how much of each
	// target is written and not yet durable, as its server last reported
	// it, with OldestMs aged to the answer's time. Appended: an older
	// service sends none.
	Unsynced []TargetUnsynced
	// Groups are the mirror groups in id order (docs/design/0014).
	// Appended: an older service sends none.
	Groups []GroupInfo
	// Gateways are the NFS gateways' last reports, by session id.
	Gateways []GatewayStatus
	// Delegations are the create delegations held, in directory order
	// (deleg_msgs.go). Appended: an older service sends none.
	Delegations []DelegationInfo
}

// MaxStatusLocks bounds the locks one ClusterStatusResp lists.
const MaxStatusLocks = 1000

// ClientInfo describes one client session (a mount) in ClusterStatusResp.
type ClientInfo struct {
	ID         uint64
	Host       string
	MountPoint string
	Pid        uint32
	OpenedMs   int64  // when the session opened, ms since the Unix epoch
	LastSeenMs int64  // ms since its last heartbeat
	OpenFiles  uint32 // inodes it reported open
	Locks      uint32 // locks it holds
}

func (c *ClientInfo) Encode(e *Enc) {
	e.U64(c.ID)
	e.String(c.Host)
	e.String(c.MountPoint)
	e.U32(c.Pid)
	e.I64(c.OpenedMs)
	e.I64(c.LastSeenMs)
	e.U32(c.OpenFiles)
	e.U32(c.Locks)
}

func (c *ClientInfo) Decode(d *Dec) {
	c.ID = d.U64()
	c.Host = d.String()
	c.MountPoint = d.String()
	c.Pid = d.U32()
	c.OpenedMs = d.I64()
	c.LastSeenMs = d.I64()
	c.OpenFiles = d.U32()
	c.Locks = d.U32()
}

// LockInfo describes one held lock in ClusterStatusResp.
type LockInfo struct {
	Ino    uint64
	Client uint64 // session id (ClientInfo.ID)
	Owner  uint64 // the kernel's lock owner within the client
	Pid    uint32 // process that took it, as the client reported (0: unknown)
	Type   uint32 // LockRead or LockWrite
	Flock  bool   // flock(2) rather than an fcntl record lock
	Start  uint64
	End    uint64 // inclusive; math.MaxUint64: to the end of the file
}

func (l *LockInfo) Encode(e *Enc) {
	e.U64(l.Ino)
	e.U64(l.Client)
	e.U64(l.Owner)
	e.U32(l.Pid)
	e.U32(l.Type)
	e.Bool(l.Flock)
	e.U64(l.Start)
	e.U64(l.End)
}

func (l *LockInfo) Decode(d *Dec) {
	l.Ino = d.U64()
	l.Client = d.U64()
	l.Owner = d.U64()
	l.Pid = d.U32()
	l.Type = d.U32()
	l.Flock = d.Bool()
	l.Start = d.U64()
	l.End = d.U64()
}

func (m *ClusterStatusResp) Encode(e *Enc) {
	e.String(m.MetaAddr)
	e.String(m.RaftState)
	e.String(m.Leader)
	e.U64(m.Term)
	e.U64(m.CommitIndex)
	e.U64(m.AppliedIndex)
	e.U64(m.Inodes)
	e.U32(m.Sessions)
	e.U64(uint64(len(m.Servers)))
	for i := range m.Servers {
		s := &m.Servers[i]
		e.U32(s.ID)
		e.String(s.Addr)
		e.String(s.Host)
		e.Bool(s.Alive)
		e.I64(s.LastSeenMs)
	}
	e.U64(uint64(len(m.Targets)))
	for i := range m.Targets {
		m.Targets[i].Encode(e)
	}
	e.U64(m.DurableIndex)
	e.U64(m.TotalBytes)
	e.U64(m.FreeBytes)
	e.U64(uint64(len(m.Clients)))
	for i := range m.Clients {
		m.Clients[i].Encode(e)
	}
	e.U64(uint64(len(m.Locks)))
	for i := range m.Locks {
		m.Locks[i].Encode(e)
	}
	e.U32(m.LocksTotal)
	e.Bool(m.LockGrace)
	e.U32(m.LockGracePending)
	e.Strings(m.Problems)
	e.U64(m.FreePendingFiles)
	e.U64(m.FreePendingBytes)
	encodeUnsynced(e, m.Unsynced)
	e.U64(uint64(len(m.Groups)))
	for i := range m.Groups {
		m.Groups[i].Encode(e)
	}
	e.U64(uint64(len(m.Gateways)))
	for i := range m.Gateways {
		e.U64(m.Gateways[i].Client)
		m.Gateways[i].Report.Encode(e)
	}
	encodeDelegInfos(e, m.Delegations)
}

func (m *ClusterStatusResp) Decode(d *Dec) {
	m.MetaAddr = d.String()
	m.RaftState = d.String()
	m.Leader = d.String()
	m.Term = d.U64()
	m.CommitIndex = d.U64()
	m.AppliedIndex = d.U64()
	m.Inodes = d.U64()
	m.Sessions = d.U32()
	m.Servers = make([]ServerInfo, d.Count())
	for i := range m.Servers {
		s := &m.Servers[i]
		s.ID = d.U32()
		s.Addr = d.String()
		s.Host = d.String()
		s.Alive = d.Bool()
		s.LastSeenMs = d.I64()
	}
	m.Targets = make([]TargetInfo, d.Count())
	for i := range m.Targets {
		m.Targets[i].Decode(d)
	}
	m.DurableIndex = d.U64()
	m.TotalBytes = d.U64()
	m.FreeBytes = d.U64()
	m.Clients = make([]ClientInfo, d.Count())
	for i := range m.Clients {
		m.Clients[i].Decode(d)
	}
	m.Locks = make([]LockInfo, d.Count())
	for i := range m.Locks {
		m.Locks[i].Decode(d)
	}
	m.LocksTotal = d.U32()
	m.LockGrace = d.Bool()
	m.LockGracePending = d.U32()
	m.Problems = d.Strings()
	if d.Len() > 0 { // absent from older services
		m.FreePendingFiles = d.U64()
		m.FreePendingBytes = d.U64()
	}
	if d.Len() > 0 { // absent from older services
		m.Unsynced = decodeUnsynced(d)
	}
	m.Groups = nil
	if d.Len() > 0 { // absent from older services
		if n := d.Count(); n > 0 {
			m.Groups = make([]GroupInfo, n)
			for i := range m.Groups {
				m.Groups[i].Decode(d)
			}
		}
	}
	m.Gateways = nil
	if d.Len() > 0 { // absent from older services
		if n := d.Count(); n > 0 {
			m.Gateways = make([]GatewayStatus, n)
			for i := range m.Gateways {
				m.Gateways[i].Client = d.U64()
				m.Gateways[i].Report.Decode(d)
			}
		}
	}
	m.Delegations = decodeDelegInfos(d)
}

// SetAtimesReq sets each Inos[i]'s atime to Atimes[i] (ns since the
// epoch) where that is later than the atime it has; files gone meanwhile
// are skipped. At most MaxSetAtimes entries.
type SetAtimesReq struct {
	Hdr    ReqHeader
	Inos   []uint64
	Atimes []int64
}

// MaxSetAtimes bounds SetAtimesReq.Inos (about 20 bytes each on the wire:
// well inside the small frame limit).
const MaxSetAtimes = 1024

func (m *SetAtimesReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(uint64(len(m.Inos)))
	for i, ino := range m.Inos {
		e.U64(ino)
		e.I64(m.Atimes[i])
	}
}

func (m *SetAtimesReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	n := d.Count()
	if n == 0 {
		m.Inos, m.Atimes = nil, nil
		return
	}
	m.Inos, m.Atimes = make([]uint64, n), make([]int64, n)
	for i := range m.Inos {
		m.Inos[i] = d.U64()
		m.Atimes[i] = d.I64()
	}
}

// DirChangeResp answers MRmdir and MRename: the change's raft stamp and
// the attributes it left on the directories and entries it changed, which
// the client keeps for the kernel's next GETATTR of them (as
// ChangeResp.Dir) instead of asking again. Dir is the directory the entry
// left (rmdir: the parent of the removed directory; rename: the old
// parent), NewDir the one it went to (rename; the same inode as Dir within
// one directory), Entry the removed directory (Nlink 0) or the moved
// entry, Other the entry a rename replaced (its links after the change)
// or exchanged. An Attr with Ino 0 is none.
//
// The attributes are appended to Stamp's encoding, all four or none:
// older services, and answers replayed for a retry, send the bare Stamp,
// which decodes with all four unknown (Ino 0), and older clients decode
// this answer as a Stamp.
type DirChangeResp struct {
	Stamp
	Dir, NewDir, Entry, Other Attr
}

func (m *DirChangeResp) Encode(e *Enc) {
	m.Stamp.Encode(e)
	if m.Dir.Ino == 0 && m.NewDir.Ino == 0 && m.Entry.Ino == 0 && m.Other.Ino == 0 {
		return
	}
	m.Dir.Encode(e)
	m.NewDir.Encode(e)
	m.Entry.Encode(e)
	m.Other.Encode(e)
}

func (m *DirChangeResp) Decode(d *Dec) {
	m.Stamp.Decode(d)
	m.Dir, m.NewDir, m.Entry, m.Other = Attr{}, Attr{}, Attr{}, Attr{}
	if d.Len() == 0 {
		return
	}
	m.Dir.Decode(d)
	m.NewDir.Decode(d)
	m.Entry.Decode(d)
	m.Other.Decode(d)
}

// LinkResp answers MLink: the linked inode's attributes and stamp, encoded
// as AttrResp without Data (which older clients decode), then the attributes the link
// left on the new parent directory (Dir), for the client's cache as
// ChangeResp.Dir. Dir is appended only when set; absent (older services,
// answers replayed for a retry) it reads as unknown (Ino 0).
type LinkResp struct {
	AttrResp
	Dir Attr
}

func (m *LinkResp) Encode(e *Enc) {
	m.AttrResp.encodeAttrs(e)
	if m.Dir.Ino != 0 {
		m.Dir.Encode(e)
	}
}

func (m *LinkResp) Decode(d *Dec) {
	m.AttrResp.decodeAttrs(d)
	m.Data = nil
	m.Dir = Attr{}
	if d.Len() > 0 {
		m.Dir.Decode(d)
	}
}

// HALeaseReq asks for the lease Name for Holder for TTLMs milliseconds
// from the leader's receipt (a renewal when Holder holds it), or gives it
// up (Release; only its holder can). Holder names one process's life:
// a restarted process asks under a new id, so it never renews what its
// former self held.
type HALeaseReq struct {
	Name    string
	Holder  string
	TTLMs   uint32
	Release bool
}

// MaxHALeaseName bounds HALeaseReq.Name and Holder.
const MaxHALeaseName = 255

func (m *HALeaseReq) Encode(e *Enc) {
	e.String(m.Name)
	e.String(m.Holder)
	e.U32(m.TTLMs)
	e.Bool(m.Release)
}

func (m *HALeaseReq) Decode(d *Dec) {
	m.Name = d.String()
	m.Holder = d.String()
	m.TTLMs = d.U32()
	m.Release = d.Bool()
}

// HALeaseResp: the lease after the request. Granted says the asker holds
// it (for TTLMs from the leader's receipt of the request: the asker counts
// from before it sent it). Otherwise Holder ("" none) holds it for
// RemainingMs more, as the leader counts. Epoch grows at every change of
// holder.
type HALeaseResp struct {
	Granted     bool
	Holder      string
	RemainingMs uint32
	Epoch       uint64
}

func (m *HALeaseResp) Encode(e *Enc) {
	e.Bool(m.Granted)
	e.String(m.Holder)
	e.U32(m.RemainingMs)
	e.U64(m.Epoch)
}

func (m *HALeaseResp) Decode(d *Dec) {
	m.Granted = d.Bool()
	m.Holder = d.String()
	m.RemainingMs = d.U32()
	m.Epoch = d.U64()
}

// DirLayoutResp is a directory's default layout for new files (zero: the
// system default) and its mirror mark: new files under it go on mirror
// groups.
type DirLayoutResp struct {
	StripeSize  uint32
	StripeCount uint32
	Mirror      bool
}

func (m *DirLayoutResp) Encode(e *Enc) { e.U32(m.StripeSize); e.U32(m.StripeCount); e.Bool(m.Mirror) }
func (m *DirLayoutResp) Decode(d *Dec) {
	m.StripeSize = d.U32()
	m.StripeCount = d.U32()
	m.Mirror = d.Bool()
}
