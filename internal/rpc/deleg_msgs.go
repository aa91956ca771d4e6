package rpc

import (
	"syscall"

	"github.com/stratafs/strata/internal/layout"
)

// Create delegations and inode ranges (docs/design/0016): the messages of
// MReserveInos, MCreateBatch, MDelegate, MReturnDelegation and
// MWaitRecall, and the delegations of ClusterStatusResp.

// MaxReserveInos bounds ReserveInosReq.Count; MaxCreateBatch the creates
// of one CreateBatchReq; MaxDelegEntries the entries of a directory that
// can be delegated (the grant answers them all).
const (
	MaxReserveInos  = 65536
	MaxCreateBatch  = 256
	MaxDelegEntries = 16384
	// MaxWaitRecallMs bounds WaitRecallReq.WaitMs.
	MaxWaitRecallMs = 30000
)

// ReserveInosReq reserves Count inode numbers for the session Hdr.ClientID.
// ESTALE for an unknown session, EAGAIN while the session already holds
// MaxSessionRanges ranges.
type ReserveInosReq struct {
	Hdr   ReqHeader
	Count uint32
}

// MaxSessionRanges bounds the ranges one session holds at a time.
const MaxSessionRanges = 16

func (m *ReserveInosReq) Encode(e *Enc) { m.Hdr.Encode(e); e.U32(m.Count) }
func (m *ReserveInosReq) Decode(d *Dec) { m.Hdr.Decode(d); m.Count = d.U32() }

// ReserveInosResp: the numbers [Start, Start+Count) are the session's
// until it uses them or ends.
type ReserveInosResp struct {
	Start, Count uint64
	Stamp
}

func (m *ReserveInosResp) Encode(e *Enc) { e.U64(m.Start); e.U64(m.Count); m.Stamp.Encode(e) }
func (m *ReserveInosResp) Decode(d *Dec) { m.Start = d.U64(); m.Count = d.U64(); m.Stamp.Decode(d) }

// BatchCreate is one create of a CreateBatchReq: an empty regular file
// Name in Parent with inode number Ino (from the session's ranges: EINVAL
// otherwise), permission bits Mode (type bits, if any, must be S_IFREG),
// owner Uid/Gid (the parent's gid under a setgid parent, as MCreate),
// times Time (ns since the epoch; 0: the service's clock) and Layout
// (empty Targets: the service places the file as MCreate does; else the
// client's choice from its delegation's template, checked: registered
// targets, or mirror groups under a mirrored directory). Seq is the
// create's own ReqHeader.Seq: each create is deduplicated alone.
//
// Written: the file was written and closed before its create was sent
// (the client answered the create under a delegation): it is made with
// Size bytes, modified at Mtime, its chunks taking Alloc — what the
// close's size commit would have said (CommitSizeReq), in the same entry.
type BatchCreate struct {
	Seq    uint64
	Parent uint64
	Name   string
	Ino    uint64
	Mode   uint32
	Uid    uint32
	Gid    uint32
	Time   int64
	Layout layout.Layout

	Written bool
	Size    uint64
	Mtime   int64
	Alloc   []SlotAlloc
	// Inline (with Written, not nil): the file's data, kept with its
	// inode instead of on its targets (docs/design/0017); len(Inline) ==
	// Size, at most MaxInlineBytes. Alloc is then empty.
	Inline []byte
}

func (c *BatchCreate) Encode(e *Enc) {
	e.U64(c.Seq)
	e.U64(c.Parent)
	e.String(c.Name)
	e.U64(c.Ino)
	e.U32(c.Mode)
	e.U32(c.Uid)
	e.U32(c.Gid)
	e.I64(c.Time)
	EncodeLayout(e, &c.Layout)
}

func (c *BatchCreate) Decode(d *Dec) {
	c.Seq = d.U64()
	c.Parent = d.U64()
	c.Name = d.String()
	c.Ino = d.U64()
	c.Mode = d.U32()
	c.Uid = d.U32()
	c.Gid = d.U32()
	c.Time = d.I64()
	DecodeLayout(d, &c.Layout)
}

// writtenInline is the Written byte of a create with inline data.
const writtenInline = 3

// MaxInlineBytes bounds the data a file keeps with its inode (a create's
// BatchCreate.Inline, an AttrResp's Data).
const MaxInlineBytes = 64 << 10

// CreateBatchReq carries up to MaxCreateBatch creates of session
// Hdr.ClientID (Hdr.Seq is unused: each create has its own), applied in
// order by one raft entry.
//
// Format: the header, the creates (BatchCreate.Encode), then — appended,
// only when a create is Written — one record per create: Written, Size,
// Mtime, Alloc. A service that predates the appended records refuses such
// a request (trailing bytes: EINVAL) rather than make the files empty.
// Written is a byte: 0 no, 1 yes, 3 yes with inline data, which then
// follows the Alloc list (length-prefixed); a service before inline data
// refuses the 3 (a bad bool: EINVAL).
//
// Durable (appended after the records, which are then always sent: a
// flags byte, bit 0): answer once the batch's entry is on stable storage,
// as a durable size commit is (a sync-policy close waiting for its file's
// create); a service before it refuses the byte (trailing bytes: EINVAL).
type CreateBatchReq struct {
	Hdr     ReqHeader
	Creates []BatchCreate
	Durable bool
}

func (m *CreateBatchReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.U64(uint64(len(m.Creates)))
	written := false
	for i := range m.Creates {
		m.Creates[i].Encode(e)
		written = written || m.Creates[i].Written
	}
	if written || m.Durable {
		for i := range m.Creates {
			c := &m.Creates[i]
			switch {
			case c.Written && c.Inline != nil:
				e.U8(writtenInline)
			default:
				e.Bool(c.Written)
			}
			e.U64(c.Size)
			e.I64(c.Mtime)
			EncodeSlotAllocs(e, c.Alloc)
			if c.Written && c.Inline != nil {
				e.Bytes(c.Inline)
			}
		}
	}
	if m.Durable {
		e.U8(batchDurable)
	}
}

// batchDurable is CreateBatchReq's flags bit for Durable.
const batchDurable = 1

func (m *CreateBatchReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	n := d.Count()
	if n > MaxCreateBatch {
		d.Fail(ErrMalformed)
		return
	}
	m.Creates = make([]BatchCreate, n)
	for i := range m.Creates {
		m.Creates[i].Decode(d)
	}
	if d.Len() > 0 { // the appended records of written files
		for i := range m.Creates {
			c := &m.Creates[i]
			w := d.U8()
			switch w {
			case 0, 1, writtenInline:
			default:
				d.Fail(ErrMalformed)
				return
			}
			c.Written = w != 0
			c.Size = d.U64()
			c.Mtime = d.I64()
			c.Alloc = DecodeSlotAllocs(d)
			if w == writtenInline {
				if c.Inline = d.Bytes(); c.Inline == nil {
					c.Inline = []byte{}
				}
			}
		}
	}
	m.Durable = false
	if d.Len() > 0 {
		f := d.U8()
		if f&^batchDurable != 0 {
			d.Fail(ErrMalformed)
			return
		}
		m.Durable = f&batchDurable != 0
	}
}

// BatchResult answers one create of a batch: Errno 0 and the file's and
// its directory's attributes with the entry's stamp, or the errno and
// message of its failure (the other creates stand).
type BatchResult struct {
	Errno uint32
	Msg   string
	Attr  Attr
	Dir   Attr
	Stamp
}

func (r *BatchResult) Encode(e *Enc) {
	e.U32(r.Errno)
	e.String(r.Msg)
	if r.Errno == 0 {
		r.Attr.Encode(e)
		r.Dir.Encode(e)
		r.Stamp.Encode(e)
	}
}

func (r *BatchResult) Decode(d *Dec) {
	r.Errno = d.U32()
	r.Msg = d.String()
	if r.Errno == 0 {
		r.Attr.Decode(d)
		r.Dir.Decode(d)
		r.Index = d.U64()
		r.Term = d.U64()
	}
}

// Err is the create's error (nil: made).
func (r *BatchResult) Err() error {
	if r.Errno == 0 {
		return nil
	}
	return &Error{Errno: syscall.Errno(r.Errno), Msg: r.Msg}
}

// CreateBatchResp: Results[i] answers Creates[i]; Stamp is the batch's
// raft entry (for a barrier).
type CreateBatchResp struct {
	Results []BatchResult
	Stamp
}

// ChangeStamp returns the batch's entry.
func (m *CreateBatchResp) ChangeStamp() Stamp { return m.Stamp }

func (m *CreateBatchResp) Encode(e *Enc) {
	e.U64(uint64(len(m.Results)))
	for i := range m.Results {
		m.Results[i].Encode(e)
	}
	m.Stamp.Encode(e)
}

func (m *CreateBatchResp) Decode(d *Dec) {
	m.Results = make([]BatchResult, d.Count())
	for i := range m.Results {
		m.Results[i].Decode(d)
	}
	m.Stamp.Decode(d)
}

// DelegateReq asks for the create delegation on directory Dir for the
// session Hdr.ClientID.
type DelegateReq struct {
	Hdr ReqHeader
	Dir uint64
}

func (m *DelegateReq) Encode(e *Enc) { m.Hdr.Encode(e); e.U64(m.Dir) }
func (m *DelegateReq) Decode(d *Dec) { m.Hdr.Decode(d); m.Dir = d.U64() }

// DelegEntry is one name of a delegated directory.
type DelegEntry struct {
	Name string
	Ino  uint64
	Mode uint32 // the type bits
}

// PlacementCand is a target (or, with layout.GroupBit, a mirror group) a
// new file may be placed on, with its free space (layout.Candidate).
type PlacementCand struct {
	ID        uint32
	FreeBytes uint64
}

// DelegateResp grants the delegation: its Epoch (the grant's raft index:
// name it when returning), the directory's attributes, every entry of it,
// and the placement template — the directory's default layout (zero:
// system default), the candidates and the round-robin start the service
// would use, so that the client lays out new files as placeFile does
// (layout.Choose over Cands from RRStart, one step per file).
type DelegateResp struct {
	Epoch   uint64
	Dir     Attr
	Entries []DelegEntry
	// the placement template
	StripeSize, StripeCount uint32
	Cands                   []PlacementCand
	RRStart                 uint64
	Stamp
}

func (m *DelegateResp) Encode(e *Enc) {
	e.U64(m.Epoch)
	m.Dir.Encode(e)
	e.U64(uint64(len(m.Entries)))
	for _, x := range m.Entries {
		e.String(x.Name)
		e.U64(x.Ino)
		e.U32(x.Mode)
	}
	e.U32(m.StripeSize)
	e.U32(m.StripeCount)
	e.U64(uint64(len(m.Cands)))
	for _, c := range m.Cands {
		e.U32(c.ID)
		e.U64(c.FreeBytes)
	}
	e.U64(m.RRStart)
	m.Stamp.Encode(e)
}

func (m *DelegateResp) Decode(d *Dec) {
	m.Epoch = d.U64()
	m.Dir.Decode(d)
	m.Entries = make([]DelegEntry, d.Count())
	for i := range m.Entries {
		m.Entries[i] = DelegEntry{Name: d.String(), Ino: d.U64(), Mode: d.U32()}
	}
	m.StripeSize = d.U32()
	m.StripeCount = d.U32()
	m.Cands = make([]PlacementCand, d.Count())
	for i := range m.Cands {
		m.Cands[i] = PlacementCand{ID: d.U32(), FreeBytes: d.U64()}
	}
	m.RRStart = d.U64()
	m.Stamp.Decode(d)
}

// ReturnDelegationReq gives back the delegation on Dir granted at Epoch
// (0: whichever the session holds). Returning one not held is no error.
type ReturnDelegationReq struct {
	Hdr   ReqHeader
	Dir   uint64
	Epoch uint64
}

func (m *ReturnDelegationReq) Encode(e *Enc) { m.Hdr.Encode(e); e.U64(m.Dir); e.U64(m.Epoch) }
func (m *ReturnDelegationReq) Decode(d *Dec) { m.Hdr.Decode(d); m.Dir = d.U64(); m.Epoch = d.U64() }

// WaitRecallReq waits up to WaitMs (at most MaxWaitRecallMs) for a recall
// of one of session Client's delegations.
type WaitRecallReq struct {
	Client uint64
	WaitMs uint32
}

func (m *WaitRecallReq) Encode(e *Enc) { e.U64(m.Client); e.U32(m.WaitMs) }
func (m *WaitRecallReq) Decode(d *Dec) { m.Client = d.U64(); m.WaitMs = d.U32() }

// WaitRecallResp lists the directories whose delegation is recalled (the
// holder flushes and returns each); empty when the wait ran out. A recall
// stays listed until returned, so a lost answer loses nothing.
type WaitRecallResp struct{ Dirs []uint64 }

func (m *WaitRecallResp) Encode(e *Enc) { e.U64s(m.Dirs) }
func (m *WaitRecallResp) Decode(d *Dec) { m.Dirs = d.U64s() }

// DelegationInfo describes one delegation in ClusterStatusResp.
type DelegationInfo struct {
	Client    uint64 // the holding session (ClientInfo.ID)
	Dir       uint64
	Epoch     uint64
	GrantedMs int64 // ms since the Unix epoch
	Recalled  bool  // the leader asked for it back
}

func encodeDelegInfos(e *Enc, ds []DelegationInfo) {
	e.U64(uint64(len(ds)))
	for _, x := range ds {
		e.U64(x.Client)
		e.U64(x.Dir)
		e.U64(x.Epoch)
		e.I64(x.GrantedMs)
		e.Bool(x.Recalled)
	}
}

// decodeDelegInfos reads the appended list (absent: none).
func decodeDelegInfos(d *Dec) []DelegationInfo {
	if d.Len() == 0 {
		return nil
	}
	n := d.Count()
	if n == 0 {
		return nil
	}
	out := make([]DelegationInfo, n)
	for i := range out {
		out[i] = DelegationInfo{Client: d.U64(), Dir: d.U64(), Epoch: d.U64(), GrantedMs: d.I64(), Recalled: d.Bool()}
	}
	return out
}
