package rpc

import (
	"fmt"
	"time"

	"github.com/stratafs/strata/internal/layout"
)

// Mirror groups (docs/design/0014-mirror-groups.md).
//
// A mirror group is two targets on different servers holding the same
// chunks. A mirrored file's layout names groups instead of targets: a
// target id with GroupBit set is group (id &^ GroupBit). Requests to a
// group's chunk carry the group's epoch in their ChunkID (ChunkID.Epoch,
// on the wire only when Target has GroupBit); the store serving the group
// knows from the metadata service which of its targets is the group's
// copy and whether it is the primary in that epoch. Every mutation goes
// to the primary, which forwards it to the secondary; reads go to either
// copy while the group is in sync.
//
// # Errors a store answers for a group's chunk
//
//   - ESTALE: the request's epoch is older than the store's (the group
//     switched), or the store is not the primary for a mutation, or the
//     copy may not serve the read (out of sync), or the primary's own
//     copy failed the request with a disk error and its secondary, which
//     applied it, took over (MirrorPrimaryFailed). The caller re-reads the
//     group map (MListGroups) and sends the request again.
//   - EAGAIN: the store cannot serve the group right now (it has not yet
//     learnt the request's newer epoch, its primary lease expired because
//     it lost the metadata service, a degrade or primary-failed report is
//     in flight or failed, a read at a primary whose copy just failed). The
//     caller waits a little, re-reads the group map and tries again,
//     within the bounded wait it applies to an unreachable target.

// GroupBit marks a layout target id that names a mirror group
// (layout.GroupBit).
const GroupBit = layout.GroupBit

// IsGroup reports whether a layout target id names a mirror group.
func IsGroup(id uint32) bool { return layout.IsGroup(id) }

// Group states (GroupInfo.State).
const (
	// GroupInSync: both copies hold every acknowledged write; either may
	// serve reads; the secondary may be promoted.
	GroupInSync uint8 = 0
	// GroupDegraded: only the primary is current; the secondary is away
	// (or was never filled). The primary records what changes for the
	// resync. If the primary is lost too, the group is unavailable.
	GroupDegraded uint8 = 1
	// GroupResyncing: the secondary is back and being caught up; new
	// writes are forwarded to it, and the changed chunks copied. It serves
	// no reads and cannot be promoted until the group is in sync.
	GroupResyncing uint8 = 2
)

// GroupStateName is the name status --json uses for a group state.
func GroupStateName(s uint8) string {
	switch s {
	case GroupInSync:
		return "in_sync"
	case GroupDegraded:
		return "degraded"
	case GroupResyncing:
		return "resyncing"
	}
	return fmt.Sprintf("unknown(%d)", s)
}

// GroupInfo is one mirror group as the metadata service's replicated
// state holds it, with the current addresses of its targets' servers.
type GroupInfo struct {
	ID        uint32 // group number, without GroupBit
	Epoch     uint64 // bumped by every switch of primary and every state change
	Primary   uint32 // target id of the primary copy
	Secondary uint32 // target id of the secondary copy
	State     uint8  // GroupInSync, GroupDegraded, GroupResyncing
	// SinceMs is when the group entered State (Unix milliseconds).
	SinceMs int64
	// ResyncDone and ResyncTotal are the resync's progress in bytes
	// (resyncing; as last reported by the primary).
	ResyncDone, ResyncTotal uint64
	// PrimaryAddr, SecondaryAddr: the data addresses of the targets'
	// servers (as given to strata store --listen); PrimaryAlive,
	// SecondaryAlive: whether those servers heartbeat.
	PrimaryAddr, SecondaryAddr   string
	PrimaryAlive, SecondaryAlive bool
	// FullResync: the secondary's copy cannot be trusted at all (it was
	// the primary whose disk failed, MirrorPrimaryFailed), so the resync
	// copies every chunk to it, whatever the primary recorded. Set while
	// the group is degraded or resyncing after such a switch; cleared
	// with MirrorResyncDone. Not part of GroupInfo's own encoding (a
	// field appended inside a list element would shift the rest of the
	// list for an older decoder): ListGroupsResp and ServerHeartbeatResp
	// carry the ids of such groups in a trailing list (fullResyncIDs);
	// a lone group (GroupResp, the MMirrorReport answer) does not carry it.
	FullResync bool
}

// fullResyncIDs answers the ids of the groups with FullResync set, for a
// list's trailing FullResync list.
func fullResyncIDs(gs []GroupInfo) []uint32 {
	var ids []uint32
	for i := range gs {
		if gs[i].FullResync {
			ids = append(ids, gs[i].ID)
		}
	}
	return ids
}

// decodeFullResync reads a list's trailing FullResync ids (absent: none,
// an older service) and sets the flag on those groups.
func decodeFullResync(d *Dec, gs []GroupInfo) {
	if d.Err() != nil || d.Len() == 0 {
		return
	}
	for _, id := range d.U32s() {
		for i := range gs {
			if gs[i].ID == id {
				gs[i].FullResync = true
			}
		}
	}
}

func (g *GroupInfo) Encode(e *Enc) {
	e.U32(g.ID)
	e.U64(g.Epoch)
	e.U32(g.Primary)
	e.U32(g.Secondary)
	e.U8(g.State)
	e.I64(g.SinceMs)
	e.U64(g.ResyncDone)
	e.U64(g.ResyncTotal)
	e.String(g.PrimaryAddr)
	e.String(g.SecondaryAddr)
	e.Bool(g.PrimaryAlive)
	e.Bool(g.SecondaryAlive)
}

func (g *GroupInfo) Decode(d *Dec) {
	g.ID = d.U32()
	g.Epoch = d.U64()
	g.Primary = d.U32()
	g.Secondary = d.U32()
	g.State = d.U8()
	g.SinceMs = d.I64()
	g.ResyncDone = d.U64()
	g.ResyncTotal = d.U64()
	g.PrimaryAddr = d.String()
	g.SecondaryAddr = d.String()
	g.PrimaryAlive = d.Bool()
	g.SecondaryAlive = d.Bool()
}

// ListGroupsResp answers MListGroups (request Empty) and MMirrorCreate:
// mirror groups in id order, then (appended) the ids of the groups with
// FullResync set, then (appended) the map's Version (see MapVersion).
type ListGroupsResp struct {
	Groups []GroupInfo
	// Version: MListGroups' map version (MapVersion); 0 in MMirrorCreate's
	// answer, which lists the new groups only and is no map.
	Version uint64
}

func (m *ListGroupsResp) Encode(e *Enc) {
	e.U64(uint64(len(m.Groups)))
	for i := range m.Groups {
		m.Groups[i].Encode(e)
	}
	e.U32s(fullResyncIDs(m.Groups))
	e.U64(m.Version)
}

func (m *ListGroupsResp) Decode(d *Dec) {
	m.Groups = make([]GroupInfo, d.Count())
	for i := range m.Groups {
		m.Groups[i].Decode(d)
	}
	decodeFullResync(d, m.Groups)
	m.Version = decodeVersion(d)
}

// MirrorCreateReq pairs targets into mirror groups. With Auto, every
// target in no group is paired with one on another server (and, with
// ByDomain, in another failure domain: RegisterServerReq.Domain); an odd
// one out stays unpaired. Otherwise Pairs lists (primary, secondary)
// target ids, two per group. EINVAL names the first bad pair (a target in
// a group already, unknown, or both on one server / domain).
type MirrorCreateReq struct {
	Hdr      ReqHeader
	Auto     bool
	ByDomain bool
	Pairs    []uint32
}

func (m *MirrorCreateReq) Encode(e *Enc) {
	m.Hdr.Encode(e)
	e.Bool(m.Auto)
	e.Bool(m.ByDomain)
	e.U32s(m.Pairs)
}

func (m *MirrorCreateReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Auto = d.Bool()
	m.ByDomain = d.Bool()
	m.Pairs = d.U32s()
}

// MirrorGroupReq names a group (MMirrorFailOver).
type MirrorGroupReq struct {
	Hdr   ReqHeader
	Group uint32
	// Epoch, when not 0, is the epoch the caller saw: the service refuses
	// with ESTALE if the group has changed since, so a request sent again
	// (a leader change during the call) never switches twice. Appended:
	// absent, 0.
	Epoch uint64
}

func (m *MirrorGroupReq) Encode(e *Enc) { m.Hdr.Encode(e); e.U32(m.Group); e.U64(m.Epoch) }
func (m *MirrorGroupReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Group = d.U32()
	m.Epoch = 0
	if d.Len() > 0 {
		m.Epoch = d.U64()
	}
}

// MirrorReplaceReq gives group Group the empty target Target in place of
// its out-of-sync (or dead) copy.
type MirrorReplaceReq struct {
	Hdr    ReqHeader
	Group  uint32
	Target uint32
}

func (m *MirrorReplaceReq) Encode(e *Enc) { m.Hdr.Encode(e); e.U32(m.Group); e.U32(m.Target) }
func (m *MirrorReplaceReq) Decode(d *Dec) {
	m.Hdr.Decode(d)
	m.Group = d.U32()
	m.Target = d.U32()
}

// Mirror report events (MirrorReportReq.Event).
const (
	// MirrorSecondaryLost: the primary could not forward to the
	// secondary. The service degrades the group (new epoch) and answers
	// the new GroupInfo; the primary acknowledges the write only then.
	MirrorSecondaryLost uint8 = 1
	// MirrorResyncProgress: Done of Total bytes copied.
	MirrorResyncProgress uint8 = 2
	// MirrorResyncDone: the secondary holds everything the primary does
	// (new writes were forwarded meanwhile); the group is in sync again.
	MirrorResyncDone uint8 = 3
	// MirrorCopyBad: Target's copy of a chunk failed its checksums and was
	// repaired from the other (counted and logged by the service; Detail
	// names the chunk).
	MirrorCopyBad uint8 = 4
	// MirrorPrimaryFailed: the primary's own copy (Target) failed a
	// mutation or a sync with a disk error (EIO, EROFS, ENOSPC) while the
	// forward to the secondary succeeded. The service promotes the
	// secondary of an in-sync group (new epoch, degraded, the failed copy
	// its secondary, FullResync set) and answers the new GroupInfo; the
	// reporter answers its client ESTALE, and the client sends the request
	// again to the new primary. A group not in sync has no other current
	// copy: EIO.
	MirrorPrimaryFailed uint8 = 5
)

// MirrorReportReq is a store's report about group Group, made in epoch
// Epoch by the server of target Target. A report with an epoch older than
// the group's is refused with ESTALE (answering the current GroupInfo is
// not enough: the caller must act on the new epoch).
type MirrorReportReq struct {
	ServerID    uint32
	Group       uint32
	Epoch       uint64
	Target      uint32
	Event       uint8
	Done, Total uint64
	Detail      string
}

func (m *MirrorReportReq) Encode(e *Enc) {
	e.U32(m.ServerID)
	e.U32(m.Group)
	e.U64(m.Epoch)
	e.U32(m.Target)
	e.U8(m.Event)
	e.U64(m.Done)
	e.U64(m.Total)
	e.String(m.Detail)
}

func (m *MirrorReportReq) Decode(d *Dec) {
	m.ServerID = d.U32()
	m.Group = d.U32()
	m.Epoch = d.U64()
	m.Target = d.U32()
	m.Event = d.U8()
	m.Done = d.U64()
	m.Total = d.U64()
	m.Detail = d.String()
}

// ServerHeartbeatResp answers MServerHeartbeat (older services answered
// Empty, which decodes as no groups and no lease; appended: the ids of the
// groups with FullResync set, absent: none). Groups are the mirror
// groups with a copy on the server's targets. LeaseMs: the server may act
// as primary of a group (acknowledge writes) until LeaseMs after it SENT
// the heartbeat this answers; the service fails a primary over only after
// FailoverTimeoutMs without heartbeats, which is longer, so a primary cut
// off from the service stops before its secondary is promoted.
type ServerHeartbeatResp struct {
	Groups            []GroupInfo
	LeaseMs           uint32
	FailoverTimeoutMs uint32
	// Version: the map version of Groups (MapVersion; appended, absent 0).
	Version uint64
}

func (m *ServerHeartbeatResp) Encode(e *Enc) {
	e.U64(uint64(len(m.Groups)))
	for i := range m.Groups {
		m.Groups[i].Encode(e)
	}
	e.U32(m.LeaseMs)
	e.U32(m.FailoverTimeoutMs)
	e.U32s(fullResyncIDs(m.Groups))
	e.U64(m.Version)
}

func (m *ServerHeartbeatResp) Decode(d *Dec) {
	*m = ServerHeartbeatResp{}
	if d.Len() == 0 {
		return
	}
	m.Groups = make([]GroupInfo, d.Count())
	for i := range m.Groups {
		m.Groups[i].Decode(d)
	}
	m.LeaseMs = d.U32()
	m.FailoverTimeoutMs = d.U32()
	decodeFullResync(d, m.Groups)
	m.Version = decodeVersion(d)
}

// Group map versions (appended; docs/design/0014 § Group map versions).
//
// A MapVersion orders the answers that carry mirror groups: it is the
// raft index of the metadata service's replicated state the groups were
// read from (the applied index, read from the same snapshot as the
// groups, or the index of the command whose answer a lone group is). Two
// answers read at different moments may arrive in the other order; a
// holder of the map installs a full map only if its version is not older
// than the map it has, and a lone group only if its version is not older
// than what it knows of that group. 0: unknown (an older service, or a
// test's stand-in), installed as before versions existed.
type MapVersion = uint64

// MapGate decides which full group maps their holder (a store's or a
// client's group map) installs: not one older than the installed one's
// Version — unless every full map has been older for MapRegressAfter,
// when the metadata service's state must have gone back (restored from an
// older copy), and the older one is taken. A map of unknown version (0)
// is taken, as before versions existed, and leaves Version unknown.
type MapGate struct {
	Version      MapVersion
	refusedSince time.Time
}

// MapRegressAfter: see MapGate. A late answer of the race versions close
// is a single answer, with newer ones within a heartbeat of it.
const MapRegressAfter = 30 * time.Second

// Admit reports whether a full map of version v, answered at now, is to be
// installed (the Version is then v), and whether it is taken although it is
// older (wentBack: the holder forgets the versions of what it kept, and
// logs it).
func (g *MapGate) Admit(v MapVersion, now time.Time) (ok, wentBack bool) {
	if v == 0 || v >= g.Version {
		g.Version, g.refusedSince = v, time.Time{}
		return true, false
	}
	if g.refusedSince.IsZero() {
		g.refusedSince = now
	}
	if now.Sub(g.refusedSince) < MapRegressAfter {
		return false, false
	}
	g.Version, g.refusedSince = v, time.Time{}
	return true, true
}

// decodeVersion reads a trailing map version (absent: 0, unknown).
func decodeVersion(d *Dec) MapVersion {
	if d.Err() != nil || d.Len() == 0 {
		return 0
	}
	return d.U64()
}

// GroupResp answers a change of one group (MMirrorReport,
// MMirrorFailOver, MMirrorReplace) and SMirrorSuspects: the group, then
// (appended) the map version it was read at. Its first part is
// GroupInfo's encoding, so an older caller decoding a GroupInfo reads it
// and leaves the version unread; an older answer decodes with Version 0.
type GroupResp struct {
	Group   GroupInfo
	Version MapVersion
}

func (m *GroupResp) Encode(e *Enc) { m.Group.Encode(e); e.U64(m.Version) }

func (m *GroupResp) Decode(d *Dec) {
	m.Group.Decode(d)
	m.Version = decodeVersion(d)
}
