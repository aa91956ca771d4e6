package schema

import (
	"fmt"

	"github.com/stratafs/strata/internal/codec"
	"github.com/stratafs/strata/internal/layout"
)

// formatV1 is the first byte of every value written by this version,
// except Result (resultFormatV2).
const formatV1 = 1

func begin(b []byte) *codec.Enc { return beginVersion(b, formatV1) }

func beginVersion(b []byte, v uint8) *codec.Enc {
	e := &codec.Enc{B: b}
	e.U8(v)
	return e
}

func open(what string, b []byte) (*codec.Dec, error) {
	d, _, err := openVersion(what, b, formatV1)
	return d, err
}

// openVersion reads a value's version byte: any from 1 to newest.
func openVersion(what string, b []byte, newest uint8) (*codec.Dec, uint8, error) {
	if len(b) == 0 {
		return nil, 0, fmt.Errorf("%w: empty %s value", ErrCorrupt, what)
	}
	switch v := b[0]; {
	case v > newest:
		return nil, v, fmt.Errorf("%w: %s value has format version %d, this build reads up to %d (written by a newer Strata)", ErrNewer, what, v, newest)
	case v == 0:
		return nil, v, fmt.Errorf("%w: %s value has format version 0", ErrCorrupt, what)
	default:
		return codec.NewDec(b[1:]), v, nil
	}
}

func finish(what string, d *codec.Dec) error {
	if err := d.Finish(); err != nil {
		return fmt.Errorf("%w: %s value: %v", ErrCorrupt, what, err)
	}
	return nil
}

// encodeLayout and decodeLayout are the stored form of a layout.Layout.
func encodeLayout(e *codec.Enc, l *layout.Layout) {
	e.U32(l.StripeSize)
	e.U32(l.StripeCount)
	e.U32s(l.Targets)
}

func decodeLayout(d *codec.Dec, l *layout.Layout) {
	l.StripeSize = d.U32()
	l.StripeCount = d.U32()
	l.Targets = d.U32s()
}

// Inode is an inode record. Times are nanoseconds since the Unix epoch.
type Inode struct {
	Mode   uint32 // S_IF* type bits and permission bits
	Nlink  uint32
	Uid    uint32
	Gid    uint32
	Rdev   uint32
	Size   uint64
	Atime  int64
	Mtime  int64
	Ctime  int64
	Layout layout.Layout // file: its layout; directory: default for children
	// Parent is, for a directory, the directory containing it (the root's
	// parent is itself); 0 for other types, which may have many links.
	Parent uint64
	// Entries is, for a directory, its number of entries.
	Entries uint64
	// Symlink is a symlink's target.
	Symlink string
	// Alloc is, for a regular file, the space each chunk (by layout slot)
	// takes on its target, as clients last reported at a size commit; nil
	// while never reported (files written before it was kept). Encoded as
	// an optional tail, present only when not nil.
	Alloc []uint64
	// Mirror is, for a directory, the mark that new files under it go on
	// mirror groups (strata stripe set --mirror); new subdirectories
	// inherit it. Only a marked inode is written in format version 2.
	Mirror bool
	// Inline is, for a regular file whose data is kept with its inode
	// (docs/design/0017), the file's first bytes; bytes from len(Inline)
	// to Size read as zeros, and the file has no chunks on its targets
	// while Inline is not nil (an inline file of no bytes is an empty,
	// non-nil slice). nil: the data is on the targets. Written in format
	// version 2.
	Inline []byte
}

// IsInline reports whether the file's data is kept with its inode.
func (in *Inode) IsInline() bool { return in.Inline != nil }

// AllocBlocks is the file's space in 512-byte units and whether it is
// known (Alloc reported).
func (in *Inode) AllocBlocks() (uint64, bool) {
	if in.Alloc == nil {
		return 0, false
	}
	var sum uint64
	for _, a := range in.Alloc {
		sum += a
	}
	return (sum + 511) / 512, true
}

// inodeFormatV2 is the Inode format of a directory marked mirrored or a
// file with inline data: version 1's fields up to Symlink, then a flags
// byte (inodeHasAlloc, inodeMirror, inodeInline), the Alloc list when
// inodeHasAlloc and the inline data (length-prefixed) when inodeInline.
// Every other inode is still written in version 1, which older builds
// read; they refuse a version 2 record as written by a newer Strata.
const inodeFormatV2 = 2

const (
	inodeHasAlloc = 1 << 0
	inodeMirror   = 1 << 1
	inodeInline   = 1 << 2
	inodeKnown    = inodeHasAlloc | inodeMirror | inodeInline
)

// AppendInode appends the encoding of in to b.
func AppendInode(b []byte, in *Inode) []byte {
	v := uint8(formatV1)
	if in.Mirror || in.Inline != nil {
		v = inodeFormatV2
	}
	e := beginVersion(b, v)
	e.U32(in.Mode)
	e.U32(in.Nlink)
	e.U32(in.Uid)
	e.U32(in.Gid)
	e.U32(in.Rdev)
	e.U64(in.Size)
	e.I64(in.Atime)
	e.I64(in.Mtime)
	e.I64(in.Ctime)
	encodeLayout(e, &in.Layout)
	e.U64(in.Parent)
	e.U64(in.Entries)
	e.String(in.Symlink)
	if v == inodeFormatV2 {
		var flags uint8
		if in.Mirror {
			flags |= inodeMirror
		}
		if in.Alloc != nil {
			flags |= inodeHasAlloc
		}
		if in.Inline != nil {
			flags |= inodeInline
		}
		e.U8(flags)
		if in.Alloc != nil {
			e.U64s(in.Alloc)
		}
		if in.Inline != nil {
			e.Bytes(in.Inline)
		}
		return e.B
	}
	if in.Alloc != nil {
		e.U64s(in.Alloc)
	}
	return e.B
}

// DecodeInode decodes an inode record into in.
func DecodeInode(b []byte, in *Inode) error {
	d, v, err := openVersion("inode", b, inodeFormatV2)
	if err != nil {
		return err
	}
	in.Mode = d.U32()
	in.Nlink = d.U32()
	in.Uid = d.U32()
	in.Gid = d.U32()
	in.Rdev = d.U32()
	in.Size = d.U64()
	in.Atime = d.I64()
	in.Mtime = d.I64()
	in.Ctime = d.I64()
	decodeLayout(d, &in.Layout)
	in.Parent = d.U64()
	in.Entries = d.U64()
	in.Symlink = d.String()
	in.Alloc = nil
	in.Mirror = false
	in.Inline = nil
	if v == inodeFormatV2 {
		flags := d.U8()
		if flags&^inodeKnown != 0 {
			return fmt.Errorf("%w: inode value has flags %#x, this build knows %#x (written by a newer Strata)", ErrNewer, flags, inodeKnown)
		}
		in.Mirror = flags&inodeMirror != 0
		if flags&inodeHasAlloc != 0 {
			if in.Alloc = d.U64s(); in.Alloc == nil {
				in.Alloc = []uint64{}
			}
		}
		if flags&inodeInline != 0 {
			if in.Inline = d.Bytes(); in.Inline == nil {
				in.Inline = []byte{}
			}
		}
		return finish("inode", d)
	}
	if d.Err() == nil && d.Len() > 0 {
		in.Alloc = d.U64s()
		if in.Alloc == nil {
			in.Alloc = []uint64{}
		}
	}
	return finish("inode", d)
}

// Dentry is a directory entry's value.
type Dentry struct {
	Ino  uint64
	Type uint32 // the S_IF* bits of the inode's mode
}

// AppendDentry appends the encoding of de to b.
func AppendDentry(b []byte, de Dentry) []byte {
	e := begin(b)
	e.U64(de.Ino)
	e.U32(de.Type)
	return e.B
}

// DecodeDentry decodes a directory entry's value.
func DecodeDentry(b []byte) (Dentry, error) {
	d, err := open("dentry", b)
	if err != nil {
		return Dentry{}, err
	}
	de := Dentry{Ino: d.U64(), Type: d.U32()}
	return de, finish("dentry", d)
}

// Counters is the single record of allocation counters and apply progress.
// It is rewritten once per applied batch.
type Counters struct {
	NextIno      uint64 // next inode number to hand out (0: not initialised)
	NextClient   uint64 // next session client id
	NextServer   uint32 // next storage server id
	NextTarget   uint32 // next storage target id
	Inodes       uint64 // inodes in use
	AppliedIndex uint64 // last raft index applied to this store
	AppliedTerm  uint64
}

func AppendCounters(b []byte, c *Counters) []byte {
	e := begin(b)
	e.U64(c.NextIno)
	e.U64(c.NextClient)
	e.U32(c.NextServer)
	e.U32(c.NextTarget)
	e.U64(c.Inodes)
	e.U64(c.AppliedIndex)
	e.U64(c.AppliedTerm)
	return e.B
}

func DecodeCounters(b []byte) (Counters, error) {
	d, err := open("counters", b)
	if err != nil {
		return Counters{}, err
	}
	var c Counters
	c.NextIno = d.U64()
	c.NextClient = d.U64()
	c.NextServer = d.U32()
	c.NextTarget = d.U32()
	c.Inodes = d.U64()
	c.AppliedIndex = d.U64()
	c.AppliedTerm = d.U64()
	return c, finish("counters", d)
}

// Orphan records an inode without links whose data still has to be
// removed once no client holds it open: an unlinked file, or a file made
// with O_TMPFILE.
type Orphan struct {
	Since int64 // ns since epoch, the unlink's (or the O_TMPFILE create's) time
	// Tmpfile: made nameless by O_TMPFILE and never linked since, so it may
	// still be given a name (linkat of its open descriptor). An unlinked
	// file may not. Encoded as an optional trailing byte, written only when
	// set, so that other orphans keep the layout older versions read.
	Tmpfile bool
}

func AppendOrphan(b []byte, o Orphan) []byte {
	e := begin(b)
	e.I64(o.Since)
	if o.Tmpfile {
		e.Bool(true)
	}
	return e.B
}

func DecodeOrphan(b []byte) (Orphan, error) {
	d, err := open("orphan", b)
	if err != nil {
		return Orphan{}, err
	}
	o := Orphan{Since: d.I64()}
	if d.Err() == nil && len(d.B) > 0 {
		o.Tmpfile = d.Bool()
	}
	return o, finish("orphan", d)
}

// Session is an open client session.
type Session struct {
	Host       string
	MountPoint string
	Pid        uint32
	Opened     int64 // ns since epoch
}

func AppendSession(b []byte, s *Session) []byte {
	e := begin(b)
	e.String(s.Host)
	e.String(s.MountPoint)
	e.U32(s.Pid)
	e.I64(s.Opened)
	return e.B
}

func DecodeSession(b []byte) (Session, error) {
	d, err := open("session", b)
	if err != nil {
		return Session{}, err
	}
	var s Session
	s.Host = d.String()
	s.MountPoint = d.String()
	s.Pid = d.U32()
	s.Opened = d.I64()
	return s, finish("session", d)
}

// Result is the recorded answer of a deduplicated request (the dedupe
// table): the errno and message of a failure, or what the change answered.
// It is the store's own record, not a wire message: the service builds the
// wire answer from it, so a change of the wire never changes the table.
type Result struct {
	Errno uint32
	Msg   string
	// Answer is the answer of a change that succeeded.
	Answer Answer
	// Wire is, in a record of format version 1 (Answer.Kind AnswerWire),
	// the answer as the wire message of its time: version 1 stored encoded
	// rpc answers. The service sends it as it is; wire decoders keep
	// reading those answers (rpc's version history). Such records go with
	// their sessions, so a later version may stop reading them.
	Wire []byte
}

// AnswerKind says which of Answer's fields a change answered.
type AnswerKind uint8

// Answer kinds. Numbers are part of the Result format: never reuse one.
const (
	AnswerNone   AnswerKind = iota // nothing to say (a rename of a name onto its own inode)
	AnswerStamp                    // Index, Term
	AnswerAttr                     // Index, Term, Attr
	AnswerChange                   // Index, Term, Attr, Dir
	AnswerWire                     // a version 1 record: Result.Wire (never encoded)
	AnswerRange                    // Index, Term, Start, Count: an inode range reserved
)

// Answer is what a deduplicated change answered: the raft entry it was
// applied from and, per Kind, the attributes it left.
type Answer struct {
	Kind        AnswerKind
	Index, Term uint64
	Attr, Dir   Attr
	// Start, Count: the inode range [Start, Start+Count) (AnswerRange)
	Start, Count uint64
}

// Attr is an inode's attributes as a change answers them.
type Attr struct {
	Ino                         uint64
	Mode, Nlink, Uid, Gid, Rdev uint32
	Size                        uint64
	Atime, Mtime, Ctime         int64
	Layout                      layout.Layout
	Blocks                      uint64 // 512-byte units, when BlocksKnown
	BlocksKnown                 bool
	Inline                      bool // the file's data is kept with its inode
}

// resultFormatV2 is the version of Result records this build writes.
//
// Result format history:
//
//	1  Errno (uvarint), Msg (string), Body (bytes: the encoded rpc answer).
//	   Read as Answer.Kind AnswerWire with Wire = Body.
//	2  Errno, Msg, Kind (byte); then per Kind: AnswerStamp: Index, Term;
//	   AnswerAttr: Index, Term, Attr; AnswerChange: Index, Term, Attr, Dir.
//	   Attr: Ino, Mode, Nlink, Uid, Gid, Rdev, Size, Atime, Mtime, Ctime,
//	   Layout (StripeSize, StripeCount, Targets), Blocks, BlocksKnown.
//	   Then kind AnswerRange (5): Index, Term, Start, Count (an older
//	   build refuses such a record as corrupt; only sessions of a newer
//	   client, which an older service never served, have them).
const resultFormatV2 = 2

func AppendResult(b []byte, r *Result) []byte {
	if r.Answer.Kind == AnswerWire {
		// Kept as read: a version 1 record rewritten stays version 1.
		e := begin(b)
		e.U32(r.Errno)
		e.String(r.Msg)
		e.Bytes(r.Wire)
		return e.B
	}
	e := beginVersion(b, resultFormatV2)
	e.U32(r.Errno)
	e.String(r.Msg)
	a := &r.Answer
	e.U8(uint8(a.Kind))
	switch a.Kind {
	case AnswerStamp, AnswerAttr, AnswerChange, AnswerRange:
		e.U64(a.Index)
		e.U64(a.Term)
	}
	switch a.Kind {
	case AnswerRange:
		e.U64(a.Start)
		e.U64(a.Count)
	case AnswerAttr:
		encodeAttr(e, &a.Attr)
	case AnswerChange:
		encodeAttr(e, &a.Attr)
		encodeAttr(e, &a.Dir)
	}
	return e.B
}

func DecodeResult(b []byte) (Result, error) {
	d, v, err := openVersion("result", b, resultFormatV2)
	if err != nil {
		return Result{}, err
	}
	var r Result
	r.Errno = d.U32()
	r.Msg = d.String()
	if v == formatV1 {
		r.Answer.Kind = AnswerWire
		r.Wire = append([]byte(nil), d.Bytes()...)
		return r, finish("result", d)
	}
	a := &r.Answer
	a.Kind = AnswerKind(d.U8())
	switch a.Kind {
	case AnswerNone:
	case AnswerStamp, AnswerAttr, AnswerChange, AnswerRange:
		a.Index = d.U64()
		a.Term = d.U64()
	default:
		return Result{}, fmt.Errorf("%w: result value has answer kind %d", ErrCorrupt, a.Kind)
	}
	switch a.Kind {
	case AnswerRange:
		a.Start = d.U64()
		a.Count = d.U64()
	case AnswerAttr:
		decodeAttr(d, &a.Attr)
	case AnswerChange:
		decodeAttr(d, &a.Attr)
		decodeAttr(d, &a.Dir)
	}
	return r, finish("result", d)
}

func encodeAttr(e *codec.Enc, a *Attr) {
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
	encodeLayout(e, &a.Layout)
	e.U64(a.Blocks)
	// One byte: bit 0 BlocksKnown, bit 1 Inline (a record with bit 1
	// set reads as corrupt to a build before inline data).
	var b uint8
	if a.BlocksKnown {
		b |= 1
	}
	if a.Inline {
		b |= 2
	}
	e.U8(b)
}

func decodeAttr(d *codec.Dec, a *Attr) {
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
	decodeLayout(d, &a.Layout)
	a.Blocks = d.U64()
	switch b := d.U8(); {
	case b&^3 != 0:
		d.Fail(fmt.Errorf("%w: attribute flags %#x", codec.ErrMalformed, b))
	default:
		a.BlocksKnown = b&1 != 0
		a.Inline = b&2 != 0
	}
}

// Server is a registered storage server.
type Server struct {
	ID      uint32
	Addr    string
	Host    string
	Targets []uint32
	// Domain is the server's failure domain label (strata store
	// --domain); "" for none. An optional tail, written only when set.
	Domain string
}

func AppendServer(b []byte, s *Server) []byte {
	e := begin(b)
	e.U32(s.ID)
	e.String(s.Addr)
	e.String(s.Host)
	e.U32s(s.Targets)
	if s.Domain != "" {
		e.String(s.Domain)
	}
	return e.B
}

func DecodeServer(b []byte) (Server, error) {
	d, err := open("server", b)
	if err != nil {
		return Server{}, err
	}
	var s Server
	s.ID = d.U32()
	s.Addr = d.String()
	s.Host = d.String()
	s.Targets = d.U32s()
	if d.Err() == nil && d.Len() > 0 {
		s.Domain = d.String()
	}
	return s, finish("server", d)
}

// Target is a registered storage target.
type Target struct {
	ID       uint32
	ServerID uint32
	UUID     string
	Path     string
}

func AppendTarget(b []byte, t *Target) []byte {
	e := begin(b)
	e.U32(t.ID)
	e.U32(t.ServerID)
	e.String(t.UUID)
	e.String(t.Path)
	return e.B
}

func DecodeTarget(b []byte) (Target, error) {
	d, err := open("target", b)
	if err != nil {
		return Target{}, err
	}
	var t Target
	t.ID = d.U32()
	t.ServerID = d.U32()
	t.UUID = d.String()
	t.Path = d.String()
	return t, finish("target", d)
}

// TargetRef maps a target UUID to its id.
type TargetRef struct{ ID uint32 }

func AppendTargetRef(b []byte, r TargetRef) []byte {
	e := begin(b)
	e.U32(r.ID)
	return e.B
}

func DecodeTargetRef(b []byte) (TargetRef, error) {
	d, err := open("target ref", b)
	if err != nil {
		return TargetRef{}, err
	}
	r := TargetRef{ID: d.U32()}
	return r, finish("target ref", d)
}

// Group states (Group.State). The numbers are the stored format, and the
// same as the wire's (rpc.GroupInSync …), which TestGroupStateValues
// checks in package meta.
const (
	GroupInSync    uint8 = 0
	GroupDegraded  uint8 = 1
	GroupResyncing uint8 = 2
)

// Group is a mirror group: two targets on different servers holding the
// same chunks (docs/design/0014).
type Group struct {
	ID        uint32
	Epoch     uint64 // bumped by every change of primary or state
	Primary   uint32 // target id
	Secondary uint32 // target id
	State     uint8  // GroupInSync, GroupDegraded, GroupResyncing
	Since     int64  // ns since the epoch: when the group entered State
	// ResyncDone, ResyncTotal: the resync's progress in bytes as the
	// primary last reported it (resyncing).
	ResyncDone, ResyncTotal uint64
	// CopyBad counts the blocks a copy failed its checksums and was
	// repaired from the other (MirrorCopyBad reports).
	CopyBad uint64
	// FullResync: the secondary was the primary until its disk failed
	// (MirrorPrimaryFailed); its resync copies every chunk. Cleared when
	// the group is in sync again. Appended; written only when set.
	FullResync bool
}

func AppendGroup(b []byte, g *Group) []byte {
	e := begin(b)
	e.U32(g.ID)
	e.U64(g.Epoch)
	e.U32(g.Primary)
	e.U32(g.Secondary)
	e.U8(g.State)
	e.I64(g.Since)
	e.U64(g.ResyncDone)
	e.U64(g.ResyncTotal)
	e.U64(g.CopyBad)
	if g.FullResync {
		e.Bool(true)
	}
	return e.B
}

func DecodeGroup(b []byte) (Group, error) {
	d, err := open("group", b)
	if err != nil {
		return Group{}, err
	}
	var g Group
	g.ID = d.U32()
	g.Epoch = d.U64()
	g.Primary = d.U32()
	g.Secondary = d.U32()
	g.State = d.U8()
	g.Since = d.I64()
	g.ResyncDone = d.U64()
	g.ResyncTotal = d.U64()
	g.CopyBad = d.U64()
	if d.Err() == nil && d.Len() > 0 {
		g.FullResync = d.Bool()
	}
	return g, finish("group", d)
}

// HALease is a named lease: who holds it until when (docs/design/0015 §
// HA pair). A lease whose Expiry has passed is free, though Holder still
// names its last holder.
type HALease struct {
	Holder string
	Expiry int64  // ns since the epoch, in the leader's stamps
	Epoch  uint64 // bumped at every change of holder
}

func AppendHALease(b []byte, l *HALease) []byte {
	e := begin(b)
	e.String(l.Holder)
	e.I64(l.Expiry)
	e.U64(l.Epoch)
	return e.B
}

func DecodeHALease(b []byte) (HALease, error) {
	d, err := open("lease", b)
	if err != nil {
		return HALease{}, err
	}
	var l HALease
	l.Holder = d.String()
	l.Expiry = d.I64()
	l.Epoch = d.U64()
	return l, finish("lease", d)
}

// SessionRange is an inode range reserved for a client session: the
// numbers [start, End), start being in its key (SessionRangeKey). Numbers
// leave the range as the session's creates use them, so none is used twice.
type SessionRange struct {
	End uint64
}

func AppendSessionRange(b []byte, r SessionRange) []byte {
	e := begin(b)
	e.U64(r.End)
	return e.B
}

func DecodeSessionRange(b []byte) (SessionRange, error) {
	d, err := open("session range", b)
	if err != nil {
		return SessionRange{}, err
	}
	var r SessionRange
	r.End = d.U64()
	return r, finish("session range", d)
}

// Delegation is a create delegation on a directory (its key names it):
// the session holding it, the raft index of its grant (Epoch: a later grant
// on the same directory has a higher one) and when it was granted.
type Delegation struct {
	Client  uint64
	Epoch   uint64
	Granted int64 // ns since the epoch, in the leader's stamps
}

func AppendDelegation(b []byte, g Delegation) []byte {
	e := begin(b)
	e.U64(g.Client)
	e.U64(g.Epoch)
	e.I64(g.Granted)
	return e.B
}

func DecodeDelegation(b []byte) (Delegation, error) {
	d, err := open("delegation", b)
	if err != nil {
		return Delegation{}, err
	}
	var g Delegation
	g.Client = d.U64()
	g.Epoch = d.U64()
	g.Granted = d.I64()
	return g, finish("delegation", d)
}

// DelegRef is the value of a session's delegation index entry
// (SessionDelegKey): only the format byte.
func DelegRef() []byte { return begin(nil).B }
