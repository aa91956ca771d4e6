package meta

import (
	"errors"
	"fmt"

	"github.com/stratafs/strata/internal/codec"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// op identifies a state-machine command. Numbers are part of the raft log
// format: never reuse or renumber one.
type op uint8

const (
	opInit op = iota + 1
	opCreate
	opSetAttr
	opUnlink
	opRmdir
	opRename
	opLink
	opSetXattr
	opRemoveXattr
	opCommitSize
	opSetDirLayout
	opSessionOpen
	opSessionClose
	opRegister
	opReap
	opReapMany  // appended: op numbers are part of the log format
	opRaiseIno  // NextIno = max(NextIno, Ino): a target holds chunks up to there
	opTmpfile   // a regular file with no name (O_TMPFILE): operands as opCreate, Name empty
	opSetAtimes // a client's batch of access times (rpc.MSetAtimes), each only forward
	// Mirror groups (mirror.go, docs/design/0014), appended:
	opMirrorCreate   // pair targets into groups (auto, by domain, or the listed pairs)
	opMirrorFailOver // the secondary becomes the primary (planned, or the primary is dead)
	opMirrorReport   // a store's report: secondary lost, resync progress, resync done
	opMirrorReplace  // a new (empty) target in place of the group's out-of-sync copy
	opMirrorResync   // the degraded group's secondary is back: resync it
	opHALease        // a named lease asked for, renewed or released (halease.go), appended
	// Create delegations (inoranges.go, delegation.go, docs/design/0016), appended:
	opReserveInos // Size inode numbers reserved for the session Hdr.ClientID
	opCreateBatch // empty regular files with the session's numbers, each deduplicated alone
	opDelegate    // the create delegation on directory Ino for the session Hdr.ClientID
	opReturn      // the delegation on Ino of session Client (granted at Epoch; 0: any) ends
	// Inline data (docs/design/0017), appended:
	opUninline // file Ino's inline data (Size bytes, at Ctime) is now on its targets, taking Alloc
)

// command is one state-machine command: the payload of a raft log entry.
// The leader fills in everything that is not a pure function of the state —
// the time, the live targets a new file may be placed on and the
// round-robin start — before proposing, so that Apply is deterministic.
//
// Commands are meta's own types, not wire messages: a change to an rpc
// message never changes what the log holds (handlers copy what a command
// needs out of the request). What the log keeps is fixed by the table
// below and only changed under a new version.
//
// # Raft log command format
//
//	offset  field      encoding (package codec)
//	0       version    byte: commandFormatV1
//	1       op         byte (op; numbers never reused)
//	2       Now        zig-zag varint, ns since the Unix epoch
//	        Hdr        ClientID, Seq: uvarints (0, 0 for ops without one)
//	        operands   per op, below
//
// Operands (integers as uvarints, times as zig-zag varints, strings and
// Value length-prefixed, lists as a count and then the elements; [...] was
// appended within version 1 and may be absent):
//
//	op                                    operands
//	Init, SessionClose, Reap, RaiseIno    Ino
//	ReapMany                              Inos
//	SetAtimes                             count, then (Ino, Atime) pairs
//	Create, Tmpfile                       Parent, Name, Mode, Uid, Gid, Rdev, Symlink,
//	                                      Cands (ID, FreeBytes each), RRStart
//	SetAttr                               Ino, Valid, Mode, Uid, Gid, Size, Atime, Mtime, Ctime
//	Unlink, Rmdir                         Parent, Name
//	Rename                                Parent, Name, NewParent, NewName, Flags
//	Link                                  Ino, NewParent, NewName
//	SetXattr, RemoveXattr                 Ino, Name, Value, Flags
//	CommitSize                            Ino, Size, Mtime, ClearSuid (byte),
//	                                      [Alloc (Slot, Bytes each)]
//	SetDirLayout                          Ino, Size (stripe size), Flags (stripe count),
//	                                      [Mirror (byte: 1 on, 2 off; absent: keep)]
//	SessionOpen                           Host, MountPoint, Pid, LeaseMs
//	Register                              Addr, Host, Targets (UUID, Path each),
//	                                      [each target's InoCeiling, no count],
//	                                      [Domain (absent: none)]
//	MirrorCreate                          Flags (1 auto, 2 by domain), Pairs
//	MirrorFailOver                        Group, Epoch (0: any), Flags (1: automatic)
//	MirrorReport                          Group, Epoch, Target, Flags (event), Done, Total
//	MirrorReplace                         Group, Target
//	MirrorResync                          Group, Epoch
//	HALease                               Name (lease), Host (holder), LeaseMs (TTL),
//	                                      Flags (1: release)
//	ReserveInos                           Size (how many)
//	CreateBatch                           Cands (ID, FreeBytes each), RRStart, then
//	                                      count and per create: Seq, Parent, Name, Ino,
//	                                      Mode, Uid, Gid, Time, Layout (StripeSize,
//	                                      StripeCount, Targets)
//	Delegate                              Ino (directory)
//	Return                                Ino (directory), Client (holder), Epoch
//	Uninline                              Ino, Ctime, Size, Alloc (Slot, Bytes each)
//
// The flag fields keep the values of the wire's constants of the same
// meaning, which are frozen by TestCommandFlagValues: Valid holds the
// SetAttr bits (rpc.SetMode …), Flags the rename (rpc.RenameNoReplace …)
// or xattr (rpc.XattrCreate …) flags, or a stripe count.
//
// # Version history
//
//	1  initial. Appended within version 1 (read as absent from older
//	   entries): opRegister's targets' InoCeiling run, opCommitSize's
//	   Alloc list; ops opReapMany, opRaiseIno, opTmpfile and opSetAtimes;
//	   then opSetDirLayout's Mirror byte, opRegister's Domain, and the
//	   mirror-group ops opMirrorCreate … opMirrorResync (whose event
//	   numbers in Flags are the wire's rpc.Mirror* values); then
//	   opMirrorReport's event 5, rpc.MirrorPrimaryFailed (a node that
//	   does not know it refuses the entry with EINVAL and changes
//	   nothing: upgrade every voter before the stores); then opHALease
//	   (an NFS gateway HA pair's lease; a node that does not know it
//	   stops at the entry: upgrade every voter before starting a pair).
//	   Then opReserveInos, opCreateBatch, opDelegate and opReturn (create
//	   delegations, docs/design/0016; a node that does not know them
//	   stops at the entry: upgrade every voter before the clients). A
//	   batch's Hdr names the session with Seq 0: each of its creates is
//	   deduplicated by its own (ClientID, Seq). Then opCreateBatch's
//	   appended per-create records (Written, Size, Mtime, Alloc) of
//	   files written and closed before their create was sent; an
//	   older node stops at such an entry (trailing bytes): upgrade
//	   every voter before the clients. Then inline data (docs/design/
//	   0017): a Written byte of 3 in opCreateBatch's records means the
//	   create carries its file's data, which follows its Alloc list
//	   (length-prefixed), and op opUninline; an older node stops at
//	   either (a bad bool; an unknown op): upgrade every voter before
//	   the clients.
//
// A node refuses an entry of a newer version (errNewerCommand) and stops
// rather than skip it: a state machine that skipped an entry its peers
// applied has diverged for good. So a leader may propose a new version only
// once every voter reads it (rolling upgrades: upgrade all voters first,
// then enable the new format).
type command struct {
	Op  op
	Now int64
	Hdr reqHeader

	// namespace operands (meaning per op, see apply*)
	Ino, Parent, NewParent uint64
	Name, NewName          string
	Mode, Uid, Gid, Rdev   uint32
	Flags, Valid           uint32
	Size                   uint64
	Atime, Mtime, Ctime    int64
	Symlink                string
	Value                  []byte
	ClearSuid              bool

	// file placement (create)
	Cands   []layout.Candidate
	RRStart uint64

	// sessions and registry
	Host, MountPoint, Addr string
	Pid                    uint32
	LeaseMs                uint32
	Targets                []targetReg

	// orphan reaping (opReapMany); files whose atimes change (opSetAtimes)
	Inos []uint64
	// the access times of Inos (opSetAtimes)
	Atimes []int64

	// space of a file's chunks (opCommitSize)
	Alloc []slotAlloc

	// mirror groups (opMirror*; Flags holds a report's event)
	Group       uint32
	Epoch       uint64
	Target      uint32
	Done, Total uint64
	Pairs       []uint32
	// Domain: a registering server's failure domain (opRegister)
	Domain string
	// MirrorMode: a directory's mirror mark change (opSetDirLayout):
	// rpc.DirMirrorKeep, DirMirrorOn or DirMirrorOff
	MirrorMode uint8

	// Batch: the creates of opCreateBatch; Client: the holder whose
	// delegation opReturn ends
	Batch  []batchCreate
	Client uint64

	// Deferred: the request asked for its answer before its entry is
	// durable (rpc.CommitSizeReq.Deferred); Durable: after
	// (rpc.CreateBatchReq.Durable). Not in the log: they change only
	// when the proposer answers, never what the entry does.
	Deferred bool
	Durable  bool
}

// reqHeader names a deduplicated request: the session's client id and the
// request's sequence number (from the wire's rpc.ReqHeader).
type reqHeader struct{ ClientID, Seq uint64 }

func hdrOf(h rpc.ReqHeader) reqHeader { return reqHeader{ClientID: h.ClientID, Seq: h.Seq} }

// targetReg is what opRegister keeps of a target's registration.
type targetReg struct {
	UUID, Path string
	InoCeiling uint64 // see rpc.TargetReg.InoCeiling
}

func targetRegsOf(ts []rpc.TargetReg) []targetReg {
	out := make([]targetReg, len(ts))
	for i, t := range ts {
		out[i] = targetReg{UUID: t.UUID, Path: t.Path, InoCeiling: t.InoCeiling}
	}
	return out
}

// batchCreate is one create of opCreateBatch (rpc.BatchCreate).
type batchCreate struct {
	Seq, Parent, Ino uint64
	Name             string
	Mode, Uid, Gid   uint32
	Time             int64
	Layout           layout.Layout
	// Written, Size, Mtime, Alloc: a file written and closed before
	// its create was sent (rpc.BatchCreate.Written)
	Written bool
	Size    uint64
	Mtime   int64
	Alloc   []slotAlloc
	// Inline (Written, not nil): the file's data, kept with its inode
	Inline []byte
}

// slotAlloc is the space (bytes) the chunk of layout slot Slot takes.
type slotAlloc struct {
	Slot  uint32
	Bytes uint64
}

func slotAllocsOf(as []rpc.SlotAlloc) []slotAlloc {
	if as == nil {
		return nil
	}
	out := make([]slotAlloc, len(as))
	for i, a := range as {
		out[i] = slotAlloc{Slot: a.Slot, Bytes: a.Bytes}
	}
	return out
}

// encodeSlotAllocs appends a count and each (Slot, Bytes);
// decodeSlotAllocs reads them back (nil for none).
func encodeSlotAllocs(e *codec.Enc, as []slotAlloc) {
	e.U64(uint64(len(as)))
	for _, a := range as {
		e.U32(a.Slot)
		e.U64(a.Bytes)
	}
}

func decodeSlotAllocs(d *codec.Dec) []slotAlloc {
	n := d.Count()
	if n == 0 {
		return nil
	}
	out := make([]slotAlloc, n)
	for i := range out {
		out[i] = slotAlloc{Slot: d.U32(), Bytes: d.U64()}
	}
	return out
}

// errNewerCommand marks a command written by a newer version of Strata.
var errNewerCommand = errors.New("raft command written by a newer Strata")

const commandFormatV1 = 1

// writtenInline is the Written byte of a create carrying inline data.
const writtenInline = 3

// answerBeforeDurable reports whether the answer to c may go out before its
// raft entry is on stable storage: namespace changes, which (as on a local
// file system) become durable at the client's next fsync or close barrier,
// and size commits the client asked to defer (the async policy's close,
// whose data the stores were not asked to sync either: a lost commit
// leaves the file shorter than the bytes its chunks hold, which are its
// own). Truncation, the other size commits, sessions, registrations and
// reaping always wait: a lost size change after the chunks were already
// truncated, or a lost reap after the data was deleted, would contradict
// what is on the targets.
func (c *command) answerBeforeDurable() bool {
	switch c.Op {
	case opCreate, opTmpfile, opUnlink, opRmdir, opRename, opLink, opSetXattr, opRemoveXattr, opSetDirLayout, opSetAtimes,
		opReturn:
		return true
	case opCreateBatch:
		return !c.Durable
	case opSetAttr:
		return c.Valid&rpc.SetSize == 0
	case opCommitSize:
		return c.Deferred
	}
	return false
}

func (c *command) encode(b []byte) []byte {
	e := &codec.Enc{B: b}
	e.U8(commandFormatV1)
	e.U8(uint8(c.Op))
	e.I64(c.Now)
	e.U64(c.Hdr.ClientID)
	e.U64(c.Hdr.Seq)
	switch c.Op {
	case opInit, opSessionClose, opReap, opRaiseIno:
		e.U64(c.Ino)
	case opReapMany:
		e.U64s(c.Inos)
	case opSetAtimes:
		e.U64(uint64(len(c.Inos)))
		for i, ino := range c.Inos {
			e.U64(ino)
			e.I64(c.Atimes[i])
		}
	case opCreate, opTmpfile:
		e.U64(c.Parent)
		e.String(c.Name)
		e.U32(c.Mode)
		e.U32(c.Uid)
		e.U32(c.Gid)
		e.U32(c.Rdev)
		e.String(c.Symlink)
		e.U64(uint64(len(c.Cands)))
		for _, x := range c.Cands {
			e.U32(x.ID)
			e.U64(x.FreeBytes)
		}
		e.U64(c.RRStart)
	case opSetAttr:
		e.U64(c.Ino)
		e.U32(c.Valid)
		e.U32(c.Mode)
		e.U32(c.Uid)
		e.U32(c.Gid)
		e.U64(c.Size)
		e.I64(c.Atime)
		e.I64(c.Mtime)
		e.I64(c.Ctime)
	case opUnlink, opRmdir:
		e.U64(c.Parent)
		e.String(c.Name)
	case opRename:
		e.U64(c.Parent)
		e.String(c.Name)
		e.U64(c.NewParent)
		e.String(c.NewName)
		e.U32(c.Flags)
	case opLink:
		e.U64(c.Ino)
		e.U64(c.NewParent)
		e.String(c.NewName)
	case opSetXattr, opRemoveXattr:
		e.U64(c.Ino)
		e.String(c.Name)
		e.Bytes(c.Value)
		e.U32(c.Flags)
	case opCommitSize:
		e.U64(c.Ino)
		e.U64(c.Size)
		e.I64(c.Mtime)
		e.Bool(c.ClearSuid)
		// Appended (absent in entries written before it): the space of
		// the chunks the client changed.
		encodeSlotAllocs(e, c.Alloc)
	case opSetDirLayout:
		e.U64(c.Ino)
		e.U64(c.Size)
		e.U32(c.Flags)         // stripe count
		if c.MirrorMode != 0 { // appended; only when set, so older nodes read the rest
			e.U8(c.MirrorMode)
		}
	case opSessionOpen:
		e.String(c.Host)
		e.String(c.MountPoint)
		e.U32(c.Pid)
		e.U32(c.LeaseMs)
	case opRegister:
		e.String(c.Addr)
		e.String(c.Host)
		e.U64(uint64(len(c.Targets)))
		for _, t := range c.Targets {
			e.String(t.UUID)
			e.String(t.Path)
		}
		// Appended section (absent in entries written before it): each
		// target's inode ceiling.
		for _, t := range c.Targets {
			e.U64(t.InoCeiling)
		}
		if c.Domain != "" { // appended; only when set, so older nodes read the rest
			e.String(c.Domain)
		}
	case opMirrorCreate:
		e.U32(c.Flags)
		e.U32s(c.Pairs)
	case opMirrorFailOver:
		e.U32(c.Group)
		e.U64(c.Epoch)
		e.U32(c.Flags)
	case opMirrorReport:
		e.U32(c.Group)
		e.U64(c.Epoch)
		e.U32(c.Target)
		e.U32(c.Flags)
		e.U64(c.Done)
		e.U64(c.Total)
	case opMirrorReplace:
		e.U32(c.Group)
		e.U32(c.Target)
	case opMirrorResync:
		e.U32(c.Group)
		e.U64(c.Epoch)
	case opHALease:
		e.String(c.Name)
		e.String(c.Host)
		e.U32(c.LeaseMs)
		e.U32(c.Flags)
	case opReserveInos:
		e.U64(c.Size)
	case opCreateBatch:
		e.U64(uint64(len(c.Cands)))
		for _, x := range c.Cands {
			e.U32(x.ID)
			e.U64(x.FreeBytes)
		}
		e.U64(c.RRStart)
		e.U64(uint64(len(c.Batch)))
		for i := range c.Batch {
			b := &c.Batch[i]
			e.U64(b.Seq)
			e.U64(b.Parent)
			e.String(b.Name)
			e.U64(b.Ino)
			e.U32(b.Mode)
			e.U32(b.Uid)
			e.U32(b.Gid)
			e.I64(b.Time)
			e.U32(b.Layout.StripeSize)
			e.U32(b.Layout.StripeCount)
			e.U32s(b.Layout.Targets)
		}
		// Appended, only when a create is Written (absent: none is):
		// per create Written, Size, Mtime and the Alloc list.
		written := false
		for i := range c.Batch {
			written = written || c.Batch[i].Written
		}
		if written {
			for i := range c.Batch {
				b := &c.Batch[i]
				inline := b.Written && b.Inline != nil
				if inline {
					e.U8(writtenInline)
				} else {
					e.Bool(b.Written)
				}
				e.U64(b.Size)
				e.I64(b.Mtime)
				encodeSlotAllocs(e, b.Alloc)
				if inline {
					e.Bytes(b.Inline)
				}
			}
		}
	case opDelegate:
		e.U64(c.Ino)
	case opReturn:
		e.U64(c.Ino)
		e.U64(c.Client)
		e.U64(c.Epoch)
	case opUninline:
		e.U64(c.Ino)
		e.I64(c.Ctime)
		e.U64(c.Size)
		encodeSlotAllocs(e, c.Alloc)
	}
	return e.B
}

// decodeCommand is the inverse of encode. Strings are copies; Value aliases b.
func decodeCommand(b []byte, c *command) error {
	d := codec.NewDec(b)
	switch v := d.U8(); {
	case d.Err() != nil:
		return fmt.Errorf("command: %w", d.Err())
	case v > commandFormatV1:
		return fmt.Errorf("%w: format version %d, this build reads up to %d: upgrade this node", errNewerCommand, v, commandFormatV1)
	case v != commandFormatV1:
		return fmt.Errorf("command format version %d is unknown (corrupt entry?)", v)
	}
	*c = command{}
	c.Op = op(d.U8())
	c.Now = d.I64()
	c.Hdr.ClientID = d.U64()
	c.Hdr.Seq = d.U64()
	switch c.Op {
	case opInit, opSessionClose, opReap, opRaiseIno:
		c.Ino = d.U64()
	case opReapMany:
		c.Inos = d.U64s()
	case opSetAtimes:
		if n := d.Count(); n > 0 {
			c.Inos, c.Atimes = make([]uint64, n), make([]int64, n)
			for i := range c.Inos {
				c.Inos[i] = d.U64()
				c.Atimes[i] = d.I64()
			}
		}
	case opCreate, opTmpfile:
		c.Parent = d.U64()
		c.Name = d.String()
		c.Mode = d.U32()
		c.Uid = d.U32()
		c.Gid = d.U32()
		c.Rdev = d.U32()
		c.Symlink = d.String()
		n := d.Count()
		if n > 0 {
			c.Cands = make([]layout.Candidate, n)
			for i := range c.Cands {
				c.Cands[i].ID = d.U32()
				c.Cands[i].FreeBytes = d.U64()
			}
		}
		c.RRStart = d.U64()
	case opSetAttr:
		c.Ino = d.U64()
		c.Valid = d.U32()
		c.Mode = d.U32()
		c.Uid = d.U32()
		c.Gid = d.U32()
		c.Size = d.U64()
		c.Atime = d.I64()
		c.Mtime = d.I64()
		c.Ctime = d.I64()
	case opUnlink, opRmdir:
		c.Parent = d.U64()
		c.Name = d.String()
	case opRename:
		c.Parent = d.U64()
		c.Name = d.String()
		c.NewParent = d.U64()
		c.NewName = d.String()
		c.Flags = d.U32()
	case opLink:
		c.Ino = d.U64()
		c.NewParent = d.U64()
		c.NewName = d.String()
	case opSetXattr, opRemoveXattr:
		c.Ino = d.U64()
		c.Name = d.String()
		c.Value = d.Bytes()
		c.Flags = d.U32()
	case opCommitSize:
		c.Ino = d.U64()
		c.Size = d.U64()
		c.Mtime = d.I64()
		c.ClearSuid = d.Bool()
		if d.Len() > 0 { // absent from entries written before it
			c.Alloc = decodeSlotAllocs(d)
		}
	case opSetDirLayout:
		c.Ino = d.U64()
		c.Size = d.U64()
		c.Flags = d.U32()
		if len(d.B) > 0 { // absent from entries written before it
			c.MirrorMode = d.U8()
		}
	case opSessionOpen:
		c.Host = d.String()
		c.MountPoint = d.String()
		c.Pid = d.U32()
		c.LeaseMs = d.U32()
	case opRegister:
		c.Addr = d.String()
		c.Host = d.String()
		n := d.Count()
		c.Targets = make([]targetReg, n)
		for i := range c.Targets {
			c.Targets[i].UUID = d.String()
			c.Targets[i].Path = d.String()
		}
		if len(d.B) > 0 {
			for i := range c.Targets {
				c.Targets[i].InoCeiling = d.U64()
			}
		}
		if len(d.B) > 0 { // absent from entries written before it
			c.Domain = d.String()
		}
	case opMirrorCreate:
		c.Flags = d.U32()
		c.Pairs = d.U32s()
	case opMirrorFailOver:
		c.Group = d.U32()
		c.Epoch = d.U64()
		c.Flags = d.U32()
	case opMirrorReport:
		c.Group = d.U32()
		c.Epoch = d.U64()
		c.Target = d.U32()
		c.Flags = d.U32()
		c.Done = d.U64()
		c.Total = d.U64()
	case opMirrorReplace:
		c.Group = d.U32()
		c.Target = d.U32()
	case opMirrorResync:
		c.Group = d.U32()
		c.Epoch = d.U64()
	case opHALease:
		c.Name = d.String()
		c.Host = d.String()
		c.LeaseMs = d.U32()
		c.Flags = d.U32()
	case opReserveInos:
		c.Size = d.U64()
	case opCreateBatch:
		if n := d.Count(); n > 0 {
			c.Cands = make([]layout.Candidate, n)
			for i := range c.Cands {
				c.Cands[i].ID = d.U32()
				c.Cands[i].FreeBytes = d.U64()
			}
		}
		c.RRStart = d.U64()
		if n := d.Count(); n > 0 {
			c.Batch = make([]batchCreate, n)
			for i := range c.Batch {
				b := &c.Batch[i]
				b.Seq = d.U64()
				b.Parent = d.U64()
				b.Name = d.String()
				b.Ino = d.U64()
				b.Mode = d.U32()
				b.Uid = d.U32()
				b.Gid = d.U32()
				b.Time = d.I64()
				b.Layout.StripeSize = d.U32()
				b.Layout.StripeCount = d.U32()
				b.Layout.Targets = d.U32s()
			}
			if d.Len() > 0 { // written files' sizes (absent: none written)
				for i := range c.Batch {
					b := &c.Batch[i]
					w := d.U8()
					if w > 1 && w != writtenInline {
						return fmt.Errorf("command op %d: create %d: written byte %d", c.Op, i, w)
					}
					b.Written = w != 0
					b.Size = d.U64()
					b.Mtime = d.I64()
					b.Alloc = decodeSlotAllocs(d)
					if w == writtenInline {
						b.Inline = append([]byte{}, d.Bytes()...)
					}
				}
			}
		}
	case opDelegate:
		c.Ino = d.U64()
	case opReturn:
		c.Ino = d.U64()
		c.Client = d.U64()
		c.Epoch = d.U64()
	case opUninline:
		c.Ino = d.U64()
		c.Ctime = d.I64()
		c.Size = d.U64()
		c.Alloc = decodeSlotAllocs(d)
	default:
		return fmt.Errorf("unknown command op %d", c.Op)
	}
	if err := d.Err(); err != nil {
		return fmt.Errorf("command op %d: %w", c.Op, err)
	}
	if len(d.B) != 0 {
		return fmt.Errorf("command op %d: %d trailing bytes", c.Op, len(d.B))
	}
	return nil
}
