package rpc

import "fmt"

// Storage-server methods (data path). Numbered from 100 so that a frame sent
// to the wrong service fails with ENOSYS, never as another method.
const (
	SWrite Method = iota + 100
	SRead
	STruncate
	SPunch
	SSync
	SRemove
	SChunkStat
	SRemoveMany
	// SListChunks (ListChunksReq, ListChunksResp) lists a target's chunk
	// files, for `strata fsck`.
	SListChunks
	// SSeek (SeekReq, SeekResp) finds the next data or hole in a chunk
	// file: lseek's SEEK_DATA and SEEK_HOLE, for sparse-aware copies.
	SSeek
	// SSyncStat (ChunkReq, ChunkStatResp) is SSync and then SChunkStat in
	// one call: a close or fsync syncs the chunks it wrote and reports
	// their space with the size commit. A server without it answers
	// ENOSYS; the client then makes the two calls.
	SSyncStat
	// SScrub (ScrubReq, ScrubResp) verifies every block of a slice of a
	// target's chunks and, for a mirror group's primary copy, compares
	// them with the other copy and repairs the bad copy's blocks from the
	// good one: `strata scrub`. A server without it answers ENOSYS.
	SScrub
	// SChunkSums (ChunkSumsReq, ChunkSumsResp) answers a range of a
	// group chunk's stored block sums, which blocks fail them, and
	// optionally the blocks' bytes: what one copy of a mirror group asks
	// the other for to repair itself (heal.go, scrub.go in package store).
	// It never heals from the asker unless told (Heal), so two copies
	// never ask each other in a loop.
	SChunkSums
	// SMirrorSuspects (MirrorSuspectsReq, GroupResp) is sent by a mirror
	// group's secondary that an unclean stop left with chunks it may
	// have lost writes of (its intent log's suspects) to the group's
	// primary, which records them to be copied whole by the group's
	// resync and degrades the group first if it is not degraded yet (so
	// the unsure copy is neither read nor promoted); the answer is the
	// group after. A server without it answers ENOSYS.
	SMirrorSuspects
)

// MirrorSuspectsReq names the chunks (inode numbers) of mirror group
// Group (a number, without GroupBit) that its secondary's copy on Target
// is unsure of, in the epoch Epoch the secondary knows.
type MirrorSuspectsReq struct {
	Group  uint32
	Epoch  uint64
	Target uint32
	Inos   []uint64
}

func (m *MirrorSuspectsReq) Encode(e *Enc) {
	e.U32(m.Group)
	e.U64(m.Epoch)
	e.U32(m.Target)
	e.U64s(m.Inos)
}

func (m *MirrorSuspectsReq) Decode(d *Dec) {
	m.Group = d.U32()
	m.Epoch = d.U64()
	m.Target = d.U32()
	m.Inos = d.U64s()
}

// MaxSuspectsPerCall bounds the inode numbers of one MirrorSuspectsReq
// (a sender splits a longer list).
const MaxSuspectsPerCall = 1 << 16

// SeekReq asks for the first data (Data) or hole (!Data) at or after Off
// in a chunk file.
type SeekReq struct {
	Chunk ChunkID
	Off   uint64
	Data  bool
}

func (m *SeekReq) Encode(e *Enc) { m.Chunk.Encode(e); e.U64(m.Off); e.Bool(m.Data) }
func (m *SeekReq) Decode(d *Dec) { m.Chunk.Decode(d); m.Off = d.U64(); m.Data = d.Bool() }

// SeekResp: Off is the data or hole found; Found is false when the chunk
// has no data at or after the offset (a hole is always found: the chunk's
// end, or the offset itself past it, starts one).
type SeekResp struct {
	Off   uint64
	Found bool
}

func (m *SeekResp) Encode(e *Enc) { e.U64(m.Off); e.Bool(m.Found) }
func (m *SeekResp) Decode(d *Dec) { m.Off = d.U64(); m.Found = d.Bool() }

// ListChunksReq lists the chunk files of Target, a few of its 65,536
// fan-out directories at a time: from directory From on, whole directories,
// until at least Max chunks (or the last directory) are listed.
type ListChunksReq struct {
	Target uint32
	From   uint32
	Max    uint32
}

func (m *ListChunksReq) Encode(e *Enc) { e.U32(m.Target); e.U32(m.From); e.U32(m.Max) }
func (m *ListChunksReq) Decode(d *Dec) { m.Target = d.U32(); m.From = d.U32(); m.Max = d.U32() }

// ListChunksResp: the inode numbers of the chunks listed and their files'
// sizes; Next is the directory to list from next, Done when none is left.
type ListChunksResp struct {
	Inos  []uint64
	Bytes []uint64
	Next  uint32
	Done  bool
}

func (m *ListChunksResp) Encode(e *Enc) {
	e.U64s(m.Inos)
	e.U64s(m.Bytes)
	e.U32(m.Next)
	e.Bool(m.Done)
}

func (m *ListChunksResp) Decode(d *Dec) {
	m.Inos = d.U64s()
	m.Bytes = d.U64s()
	m.Next = d.U32()
	m.Done = d.Bool()
}

// ChunkID names one chunk file: the part of inode Ino stored on Target.
// A Target with GroupBit names a mirror group (mirror_msgs.go); the
// request then carries the group epoch the sender acts in, Epoch, which is
// on the wire right after Target only in that case (unmirrored chunks keep
// the older encoding byte for byte).
type ChunkID struct {
	Target uint32
	Ino    uint64
	Epoch  uint64 // mirror group epoch; only with GroupBit in Target
}

func (c *ChunkID) Encode(e *Enc) {
	e.U32(c.Target)
	if IsGroup(c.Target) {
		e.U64(c.Epoch)
	}
	e.U64(c.Ino)
}

func (c *ChunkID) Decode(d *Dec) {
	c.Target = d.U32()
	c.Epoch = 0
	if IsGroup(c.Target) {
		c.Epoch = d.U64()
	}
	c.Ino = d.U64()
}

// WriteReq writes Data at chunk offset Off. With Sync the chunk is on stable
// storage before the answer (WriteResp; Empty from older stores). ENOSPC when the target is full (nothing
// of this write is kept past the old end of file).
// Data is the last field so that the transport can send it without copying.
type WriteReq struct {
	Chunk ChunkID
	Off   uint64
	Sync  bool
	Data  []byte
}

func (m *WriteReq) Encode(e *Enc) { m.Chunk.Encode(e); e.U64(m.Off); e.Bool(m.Sync); e.Bytes(m.Data) }

// EncodeHead is Encode without Data's bytes (Tailer): the transport sends
// them from the caller's memory.
func (m *WriteReq) EncodeHead(e *Enc) []byte {
	m.Chunk.Encode(e)
	e.U64(m.Off)
	e.Bool(m.Sync)
	e.U64(uint64(len(m.Data)))
	return m.Data
}
func (m *WriteReq) Decode(d *Dec) {
	m.Chunk.Decode(d)
	m.Off = d.U64()
	m.Sync = d.Bool()
	m.Data = d.Bytes()
}

// ReadReq reads up to Len bytes at chunk offset Off. ReadResp.Data is short
// only at the end of the chunk file; holes read as zeros. A checksum mismatch
// answers EIO (and the server logs target and chunk).
type ReadReq struct {
	Chunk ChunkID
	Off   uint64
	Len   uint32
}

func (m *ReadReq) Encode(e *Enc) { m.Chunk.Encode(e); e.U64(m.Off); e.U32(m.Len) }
func (m *ReadReq) Decode(d *Dec) { m.Chunk.Decode(d); m.Off = d.U64(); m.Len = d.U32() }

// ReadResp carries the bytes read. A caller that sets Into before the call
// gets the bytes copied into it (Data then aliases Into) and lets the
// transport recycle the frame buffer at once; without Into, Data aliases the
// received frame. Into must be at least ReadReq.Len long.
type ReadResp struct {
	Data []byte
	Into []byte // optional destination, not sent on the wire
	// Direct (in-process calls only, with Into): the handler may read
	// straight into Into instead of into a buffer of its own that is then
	// copied. The caller owns Into for good then: after a call that failed
	// (it may have been abandoned while the handler still reads), Into may
	// still be written, so it must be dropped, never reused.
	Direct bool
}

// DirectDest is the destination an in-process handler may fill itself
// (DirectDecoder).
func (m *ReadResp) DirectDest() []byte {
	if m.Direct {
		return m.Into
	}
	return nil
}

func (m *ReadResp) Encode(e *Enc) { e.Bytes(m.Data) }

// EncodeHead is Encode without Data's bytes (Tailer).
func (m *ReadResp) EncodeHead(e *Enc) []byte {
	e.U64(uint64(len(m.Data)))
	return m.Data
}
func (m *ReadResp) Decode(d *Dec) {
	b := d.Bytes()
	if m.Into == nil {
		m.Data = b
		return
	}
	if len(b) > len(m.Into) {
		d.Fail(fmt.Errorf("%w: read answer of %d bytes exceeds the %d-byte destination", ErrMalformed, len(b), len(m.Into)))
		return
	}
	m.Data = m.Into[:copy(m.Into, b)]
}

// DecodeTail is Decode for a body whose Data bytes are held apart (the
// in-process hand-over, TailDecoder): d holds the length prefix, tail the
// bytes, which are copied into Into.
func (m *ReadResp) DecodeTail(d *Dec, tail []byte) {
	n := d.U64()
	if d.Err() != nil {
		return
	}
	if n != uint64(len(tail)) {
		d.Fail(fmt.Errorf("%w: read answer length %d but %d bytes handed over", ErrMalformed, n, len(tail)))
		return
	}
	if m.Into == nil {
		d.Fail(fmt.Errorf("%w: read answer handed over without a destination", ErrMalformed))
		return
	}
	if len(tail) > len(m.Into) {
		d.Fail(fmt.Errorf("%w: read answer of %d bytes exceeds the %d-byte destination", ErrMalformed, len(tail), len(m.Into)))
		return
	}
	if len(tail) > 0 && &tail[0] == &m.Into[0] {
		m.Data = m.Into[:len(tail)] // the handler read into Into itself (Direct)
		return
	}
	m.Data = m.Into[:copy(m.Into, tail)]
}

// CopiesOut reports that Decode copies the body out (CopyingDecoder).
func (m *ReadResp) CopiesOut() bool { return m.Into != nil }

// WriteResp answers a write (SWrite): Alloc is the space the chunk's data
// takes on the target's disk after it (bytes, as ChunkStatResp's), valid
// when HasAlloc. An older store answers Empty, which decodes as unknown
// (both appended: a missing tail reads as zero).
type WriteResp struct {
	Alloc    uint64
	HasAlloc bool
}

func (m *WriteResp) Encode(e *Enc) { e.U64(m.Alloc); e.Bool(m.HasAlloc) }

func (m *WriteResp) Decode(d *Dec) {
	m.Alloc, m.HasAlloc = 0, false
	if d.Len() > 0 {
		m.Alloc = d.U64()
		m.HasAlloc = d.Bool()
	}
}

// TruncateReq sets the chunk file's length (answers Empty). A missing chunk
// is created when Size > 0.
type TruncateReq struct {
	Chunk ChunkID
	Size  uint64
}

func (m *TruncateReq) Encode(e *Enc) { m.Chunk.Encode(e); e.U64(m.Size) }
func (m *TruncateReq) Decode(d *Dec) { m.Chunk.Decode(d); m.Size = d.U64() }

// PunchReq deallocates [Off, Off+Len) of a chunk; it reads as zeros after.
type PunchReq struct {
	Chunk ChunkID
	Off   uint64
	Len   uint64
}

func (m *PunchReq) Encode(e *Enc) { m.Chunk.Encode(e); e.U64(m.Off); e.U64(m.Len) }
func (m *PunchReq) Decode(d *Dec) { m.Chunk.Decode(d); m.Off = d.U64(); m.Len = d.U64() }

// ChunkReq names a chunk; used by Sync (fsync data and checksums), Remove
// (delete; absent is not an error) and ChunkStat (answers ChunkStatResp).
type ChunkReq struct{ Chunk ChunkID }

func (m *ChunkReq) Encode(e *Enc) { m.Chunk.Encode(e) }
func (m *ChunkReq) Decode(d *Dec) { m.Chunk.Decode(d) }

type ChunkStatResp struct {
	Size   uint64 // length of the chunk file; 0 if absent
	Exists bool
	// Alloc is the space the chunk's data takes on the target's disk
	// (bytes); valid when HasAlloc (appended: older stores send neither).
	Alloc    uint64
	HasAlloc bool
}

func (m *ChunkStatResp) Encode(e *Enc) {
	e.U64(m.Size)
	e.Bool(m.Exists)
	e.U64(m.Alloc)
	e.Bool(m.HasAlloc)
}

func (m *ChunkStatResp) Decode(d *Dec) {
	m.Size = d.U64()
	m.Exists = d.Bool()
	m.Alloc, m.HasAlloc = 0, false
	if d.Len() > 0 {
		m.Alloc = d.U64()
		m.HasAlloc = d.Bool()
	}
}

// ChunksReq names many chunks; used by RemoveMany (the metadata service's
// orphan reaper removes the chunks of many deleted files in one call).
// Answers Empty, or the first error after trying every chunk.
type ChunksReq struct{ Chunks []ChunkID }

func (m *ChunksReq) Encode(e *Enc) {
	e.U64(uint64(len(m.Chunks)))
	for i := range m.Chunks {
		m.Chunks[i].Encode(e)
	}
}

func (m *ChunksReq) Decode(d *Dec) {
	m.Chunks = make([]ChunkID, d.Count())
	for i := range m.Chunks {
		m.Chunks[i].Decode(d)
	}
}

// ScrubReq asks a storage server to verify the chunks of Target listed in
// its fan-out directories from From on, whole directories, until about
// Max chunks (or a few seconds of work, or the last directory) are done.
// Every block is read and checked against its stored sum. With Group (a
// mirror group number, without GroupBit) whose primary copy Target is,
// each chunk is also compared with the group's other copy (SChunkSums):
// a block whose sum fails on one copy and holds on the other is bad on
// the first, and with Repair it is rewritten from the good copy. Reads
// are paced to RateBytes per second (0: unpaced).
type ScrubReq struct {
	Target    uint32
	From      uint32
	Max       uint32
	Repair    bool
	RateBytes uint64
	Group     uint32
}

func (m *ScrubReq) Encode(e *Enc) {
	e.U32(m.Target)
	e.U32(m.From)
	e.U32(m.Max)
	e.Bool(m.Repair)
	e.U64(m.RateBytes)
	e.U32(m.Group)
}

func (m *ScrubReq) Decode(d *Dec) {
	m.Target = d.U32()
	m.From = d.U32()
	m.Max = d.U32()
	m.Repair = d.Bool()
	m.RateBytes = d.U64()
	m.Group = d.U32()
}

// ScrubResp counts what one SScrub call found: Chunks and Bytes verified
// (the local copy's), BadBlocks failing their sums on either copy,
// Repaired of them rewritten from the other copy, Unrepairable bad on
// both copies (or on an unmirrored chunk, or with no copy in sync to take
// them from; without Repair every bad block stays and counts here too),
// Mismatched blocks good on both copies but different, PeerMissing chunks
// the other copy does not have. Problems names the first few chunks with
// unrepairable or mismatched blocks. Next is the fan-out directory to go
// on from, Done when none is left.
type ScrubResp struct {
	Chunks, Bytes       uint64
	BadBlocks, Repaired uint64
	Unrepairable        uint64
	Mismatched          uint64
	PeerMissing         uint64
	Problems            []string
	Next                uint32
	Done                bool
}

func (m *ScrubResp) Encode(e *Enc) {
	e.U64(m.Chunks)
	e.U64(m.Bytes)
	e.U64(m.BadBlocks)
	e.U64(m.Repaired)
	e.U64(m.Unrepairable)
	e.U64(m.Mismatched)
	e.U64(m.PeerMissing)
	e.Strings(m.Problems)
	e.U32(m.Next)
	e.Bool(m.Done)
}

func (m *ScrubResp) Decode(d *Dec) {
	m.Chunks = d.U64()
	m.Bytes = d.U64()
	m.BadBlocks = d.U64()
	m.Repaired = d.U64()
	m.Unrepairable = d.U64()
	m.Mismatched = d.U64()
	m.PeerMissing = d.U64()
	m.Problems = d.Strings()
	m.Next = d.U32()
	m.Done = d.Bool()
}

// MaxChunkSumsData bounds the range of a ChunkSumsReq that asks for the
// blocks' bytes; MaxChunkSumsRange the range of one without.
const (
	MaxChunkSumsData  = 16 << 20
	MaxChunkSumsRange = 1 << 30
)

// ChunkSumsReq asks for the blocks of a group chunk in [Off, Off+Len)
// (Off a multiple of 4 KiB; clipped to the chunk's length): their stored
// sums, which fail them and, with Data, their bytes. With Heal the server
// first rewrites the blocks that fail on its copy from the group's other
// copy (as a self-healing read would).
type ChunkSumsReq struct {
	Chunk ChunkID
	Off   uint64
	Len   uint64
	Data  bool
	Heal  bool
}

func (m *ChunkSumsReq) Encode(e *Enc) {
	m.Chunk.Encode(e)
	e.U64(m.Off)
	e.U64(m.Len)
	e.Bool(m.Data)
	e.Bool(m.Heal)
}

func (m *ChunkSumsReq) Decode(d *Dec) {
	m.Chunk.Decode(d)
	m.Off = d.U64()
	m.Len = d.U64()
	m.Data = d.Bool()
	m.Heal = d.Bool()
}

// ChunkSumsResp: Exists is false for an absent chunk (nothing else set);
// Size is the chunk's length; Sums the stored sum of each block of the
// range (clipped to Size); Bad the indexes, from the range's first block,
// of blocks whose data fails its sum (after healing, with Heal); Healed
// how many were rewritten; Data, when asked, the blocks' bytes padded with
// zeros to whole blocks (a bad block's as read).
type ChunkSumsResp struct {
	Exists bool
	Size   uint64
	Sums   []uint32
	Bad    []uint32
	Healed uint32
	Data   []byte
}

func (m *ChunkSumsResp) Encode(e *Enc) {
	e.Bool(m.Exists)
	e.U64(m.Size)
	e.U32s(m.Sums)
	e.U32s(m.Bad)
	e.U32(m.Healed)
	e.Bytes(m.Data)
}

func (m *ChunkSumsResp) Decode(d *Dec) {
	m.Exists = d.Bool()
	m.Size = d.U64()
	m.Sums = d.U32s()
	m.Bad = d.U32s()
	m.Healed = d.U32()
	m.Data = d.Bytes()
}
