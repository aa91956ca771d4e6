package admin

import (
	"math"
	"strings"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// The JSON of `strata status --json`. Conventions of every --json of the
// admin commands: snake_case names, units in the names (_bytes,
// _seconds), times as RFC 3339 strings, null for unknown.

// Status is the document of `strata status --json`.
type Status struct {
	Meta     MetaStatus     `json:"meta"`
	Health   string         `json:"health"`   // "ok" or "failing"
	Problems []string       `json:"problems"` // one sentence each; empty when ok
	Inodes   uint64         `json:"inodes"`
	Sessions uint32         `json:"sessions"`
	Servers  []ServerStatus `json:"servers"`
	Targets  []TargetStatus `json:"targets"`
	Capacity Capacity       `json:"capacity"`
	Clients  []ClientStatus `json:"clients"`
	Locks    LockStatus     `json:"locks"`

	// FreePendingFiles, FreePendingBytes: removed files whose chunks the
	// background reaper has not freed yet, and the space they hold.
	FreePendingFiles uint64 `json:"free_pending_files"`
	FreePendingBytes uint64 `json:"free_pending_bytes"`

	// MirrorGroups are the mirror groups in id order (docs/design/0014;
	// a contract scripts rely on: id, primary_server, secondary_server,
	// state, epoch).
	MirrorGroups []MirrorGroup `json:"mirror_groups"`

	// NFSGateways are the NFS gateways (strata nfs, strata up --nfs) with
	// their last heartbeat's report.
	NFSGateways []NFSGateway `json:"nfs_gateways"`
}

// NFSGateway is one NFS gateway as its session last reported it.
type NFSGateway struct {
	Client  uint64   `json:"client"`  // its session (clients[].id)
	Host    string   `json:"host"`    // the gateway's host
	Address string   `json:"address"` // where it serves NFS and MOUNT
	Exports []string `json:"exports"` // PATH=OPTIONS, every option spelt out
	// NFSClients: client addresses with a call in the last 5 minutes.
	NFSClients   uint32   `json:"nfs_clients"`
	Ops          uint64   `json:"ops"`                // calls answered since it started
	OpsPerSecond uint32   `json:"ops_per_second"`     // over its last heartbeat period
	ReportAge    *float64 `json:"report_age_seconds"` // null: unknown
}

// MirrorGroup is one mirror group: two targets on different servers.
type MirrorGroup struct {
	ID uint32 `json:"id"`
	// PrimaryServer, SecondaryServer: the addresses of the copies'
	// storage servers, as given to strata store --listen.
	PrimaryServer   string `json:"primary_server"`
	SecondaryServer string `json:"secondary_server"`
	PrimaryTarget   uint32 `json:"primary_target"`
	SecondaryTarget uint32 `json:"secondary_target"`
	PrimaryAlive    bool   `json:"primary_alive"`
	SecondaryAlive  bool   `json:"secondary_alive"`
	State           string `json:"state"` // in_sync, degraded or resyncing
	Epoch           uint64 `json:"epoch"`
	Since           string `json:"since"` // RFC 3339: when the group entered State
	// ResyncDoneBytes, ResyncTotalBytes, ResyncPercent: a resyncing
	// group's progress as its primary last reported it (0 otherwise).
	ResyncDoneBytes  uint64  `json:"resync_done_bytes"`
	ResyncTotalBytes uint64  `json:"resync_total_bytes"`
	ResyncPercent    float64 `json:"resync_percent"`
	// FullResync: the secondary's copy failed as the primary (its disk),
	// so its resync copies every chunk, not only the recorded changes.
	FullResync bool `json:"full_resync"`
}

// MirrorGroupOf is a group as status shows it.
func MirrorGroupOf(g *rpc.GroupInfo) MirrorGroup {
	m := MirrorGroup{ID: g.ID, PrimaryServer: g.PrimaryAddr, SecondaryServer: g.SecondaryAddr,
		PrimaryTarget: g.Primary, SecondaryTarget: g.Secondary, PrimaryAlive: g.PrimaryAlive, SecondaryAlive: g.SecondaryAlive,
		State: rpc.GroupStateName(g.State), Epoch: g.Epoch, Since: time.UnixMilli(g.SinceMs).UTC().Format(time.RFC3339),
		ResyncDoneBytes: g.ResyncDone, ResyncTotalBytes: g.ResyncTotal, FullResync: g.FullResync}
	if g.ResyncTotal > 0 {
		m.ResyncPercent = math.Floor(1000*float64(min(g.ResyncDone, g.ResyncTotal))/float64(g.ResyncTotal)) / 10
	}
	return m
}

// MetaStatus is the metadata service as the answering node sees it.
type MetaStatus struct {
	Leader       string  `json:"leader"` // address of the leader ("" while none is known)
	Term         uint64  `json:"term"`
	CommitIndex  uint64  `json:"commit_index"`
	DurableIndex uint64  `json:"durable_index"`
	Voters       []Voter `json:"voters"`
	// UnsyncedEntries: log entries applied but not yet on stable storage
	// (answered before durable: namespace changes, deferred size commits;
	// the log syncs them within its sync delay, or at the next barrier).
	UnsyncedEntries uint64 `json:"unsynced_entries"`
	// LastLeaderChange: the most recent leader change any voter saw
	// (null: none known; SetMembers).
	LastLeaderChange *LeaderChange `json:"last_leader_change"`
}

// UnsyncedEntries is how many metadata log entries st says were applied
// but are not yet durable.
func UnsyncedEntries(st *rpc.ClusterStatusResp) uint64 {
	if st.AppliedIndex > st.DurableIndex {
		return st.AppliedIndex - st.DurableIndex
	}
	return 0
}

// Voter is one member of the metadata service's Raft group.
type Voter struct {
	Address      string `json:"address"`
	State        string `json:"state"` // leader, follower, candidate or unreachable
	AppliedIndex uint64 `json:"applied_index"`
	Term         uint64 `json:"term"`
	// Lag: log entries the voter has applied fewer than the leader (null:
	// no leader known, or the voter is unreachable).
	Lag *uint64 `json:"lag"`
	// LastContactSeconds: since the leader last reached the voter (0 on
	// the leader; null: never, or unreachable).
	LastContactSeconds *float64 `json:"last_contact_seconds"`
	Health             []string `json:"health"`          // what fails on the voter; empty when healthy
	Error              string   `json:"error,omitempty"` // why an unreachable voter did not answer
}

// ServerStatus is one storage server.
type ServerStatus struct {
	ID                  uint32   `json:"id"`
	Address             string   `json:"address"`
	Host                string   `json:"host"`
	Alive               bool     `json:"alive"`
	HeartbeatAgeSeconds *float64 `json:"heartbeat_age_seconds"` // null: none since this node leads
}

// TargetStatus is one storage target. AvailBytes is what writes may still
// use: the file system's free space less the target's reserve.
type TargetStatus struct {
	ID         uint32 `json:"id"`
	ServerID   uint32 `json:"server_id"`
	Address    string `json:"address"`
	Path       string `json:"path"`
	SizeBytes  uint64 `json:"size_bytes"`
	AvailBytes uint64 `json:"avail_bytes"`
	Alive      bool   `json:"alive"`
	// UnsyncedChunks, UnsyncedBytes, OldestUnsyncedSeconds: the chunks
	// written and not yet durable on the target (its server syncs them
	// within its --sync-interval, at an fsync or at its stop), the bytes
	// written to them, and the age of the oldest; as the target's server
	// last reported them (0 from a server that reports none).
	UnsyncedChunks        uint64  `json:"unsynced_chunks"`
	UnsyncedBytes         uint64  `json:"unsynced_bytes"`
	OldestUnsyncedSeconds float64 `json:"oldest_unsynced_seconds"`
}

// Capacity is the file system's as df on a mount shows it: targets that
// share a file system count once; used is size less free space (blocks
// reserved for root are not used), avail is what writes may use.
type Capacity struct {
	SizeBytes   uint64  `json:"size_bytes"`
	UsedBytes   uint64  `json:"used_bytes"`
	AvailBytes  uint64  `json:"avail_bytes"`
	UsedPercent float64 `json:"used_percent"` // used / (used + avail), as df
}

// ClientStatus is one mount's session.
type ClientStatus struct {
	ID                  uint64   `json:"id"`
	Host                string   `json:"host"`
	MountPoint          string   `json:"mount_point"`
	Pid                 uint32   `json:"pid"`
	OpenedAt            string   `json:"opened_at"`             // RFC 3339
	HeartbeatAgeSeconds *float64 `json:"heartbeat_age_seconds"` // null: not known to a follower
	OpenFiles           uint32   `json:"open_files"`
	Locks               uint32   `json:"locks"`
	// Delegations are the directory create delegations the session holds
	// (docs/design/0016), in directory order.
	Delegations []Delegation `json:"delegations"`
}

// Delegation is a create delegation a session holds on a directory.
type Delegation struct {
	Directory uint64 `json:"directory"`  // inode
	Epoch     uint64 `json:"epoch"`      // the grant's raft index
	GrantedAt string `json:"granted_at"` // RFC 3339
	Recalled  bool   `json:"recalled"`   // the metadata leader asked for it back
}

// LockStatus summarises the locks the metadata service holds.
type LockStatus struct {
	Held uint32 `json:"held"`
	// Grace: after a metadata restart new locks wait until
	// GracePendingClients clients have reclaimed theirs.
	Grace               bool   `json:"grace"`
	GracePendingClients uint32 `json:"grace_pending_clients"`
	List                []Lock `json:"list"` // with --locks (at most 1000); else empty
}

// Lock is one held lock.
type Lock struct {
	Inode  uint64  `json:"inode"`
	Kind   string  `json:"kind"` // fcntl or flock
	Type   string  `json:"type"` // read or write
	Start  uint64  `json:"start"`
	End    *uint64 `json:"end"` // inclusive; null: to the end of the file, however it grows
	Client uint64  `json:"client"`
	Pid    uint32  `json:"pid"` // 0: unknown
}

// CapacityOf computes the df figures from the statfs answer.
func CapacityOf(fs rpc.StatFSResp) Capacity {
	free := max(fs.FreeBytes, fs.AvailBytes)
	c := Capacity{SizeBytes: fs.TotalBytes, AvailBytes: fs.AvailBytes}
	if fs.TotalBytes > free {
		c.UsedBytes = fs.TotalBytes - free
	}
	if d := c.UsedBytes + c.AvailBytes; d > 0 {
		// df rounds up: 0.1% used shows as 1%; keep one decimal instead.
		c.UsedPercent = math.Ceil(1000*float64(c.UsedBytes)/float64(d)) / 10
	}
	return c
}

// StatusOf builds the JSON document; withLocks lists the locks.
func StatusOf(st *rpc.ClusterStatusResp, fs rpc.StatFSResp, withLocks bool) Status {
	out := Status{
		Meta: MetaStatus{
			Leader: st.Leader, Term: st.Term, CommitIndex: st.CommitIndex, DurableIndex: st.DurableIndex,
			Voters:          []Voter{{Address: st.MetaAddr, State: strings.ToLower(st.RaftState), AppliedIndex: st.AppliedIndex, Term: st.Term, Health: []string{}}},
			UnsyncedEntries: UnsyncedEntries(st),
		},
		Health: "ok", Problems: append([]string{}, st.Problems...),
		Inodes: st.Inodes, Sessions: st.Sessions,
		FreePendingFiles: st.FreePendingFiles, FreePendingBytes: st.FreePendingBytes,
		Servers: []ServerStatus{}, Targets: []TargetStatus{}, Clients: []ClientStatus{}, MirrorGroups: []MirrorGroup{}, NFSGateways: []NFSGateway{},
		Capacity: CapacityOf(fs),
		Locks:    LockStatus{Held: st.LocksTotal, Grace: st.LockGrace, GracePendingClients: st.LockGracePending, List: []Lock{}},
	}
	if strings.EqualFold(st.RaftState, "leader") {
		out.Meta.Leader = st.MetaAddr
	}
	if len(st.Problems) > 0 {
		out.Health = "failing"
	}
	for _, s := range st.Servers {
		out.Servers = append(out.Servers, ServerStatus{ID: s.ID, Address: s.Addr, Host: s.Host, Alive: s.Alive, HeartbeatAgeSeconds: ageSeconds(s.LastSeenMs)})
	}
	for i, t := range st.Targets {
		ts := TargetStatus{ID: t.ID, ServerID: t.ServerID, Address: t.Addr, Path: t.Path,
			SizeBytes: t.TotalBytes, AvailBytes: t.FreeBytes, Alive: t.Alive}
		if i < len(st.Unsynced) {
			u := st.Unsynced[i]
			ts.UnsyncedChunks, ts.UnsyncedBytes, ts.OldestUnsyncedSeconds = u.Chunks, u.Bytes, float64(u.OldestMs)/1000
		}
		out.Targets = append(out.Targets, ts)
	}
	for i := range st.Groups {
		out.MirrorGroups = append(out.MirrorGroups, MirrorGroupOf(&st.Groups[i]))
	}
	for _, c := range st.Clients {
		out.Clients = append(out.Clients, ClientStatus{ID: c.ID, Host: c.Host, MountPoint: c.MountPoint, Pid: c.Pid,
			OpenedAt: time.UnixMilli(c.OpenedMs).UTC().Format(time.RFC3339), HeartbeatAgeSeconds: ageSeconds(c.LastSeenMs),
			OpenFiles: c.OpenFiles, Locks: c.Locks, Delegations: DelegationsOf(st, c.ID)})
	}
	out.NFSGateways = append(out.NFSGateways, NFSGatewaysOf(st)...)
	if withLocks {
		for _, l := range st.Locks {
			out.Locks.List = append(out.Locks.List, LockOf(l))
		}
	}
	return out
}

// NFSGatewaysOf lists the gateways of the status answer, with their
// sessions' hosts and heartbeat ages.
func NFSGatewaysOf(st *rpc.ClusterStatusResp) []NFSGateway {
	var out []NFSGateway
	for _, g := range st.Gateways {
		gw := NFSGateway{Client: g.Client, Address: g.Report.Address, Exports: append([]string{}, g.Report.Exports...),
			NFSClients: g.Report.Clients, Ops: g.Report.Ops, OpsPerSecond: g.Report.OpsPerSec}
		for _, c := range st.Clients {
			if c.ID == g.Client {
				gw.Host, gw.ReportAge = c.Host, ageSeconds(c.LastSeenMs)
			}
		}
		out = append(out, gw)
	}
	return out
}

// LockOf converts one lock of the status answer.
func LockOf(l rpc.LockInfo) Lock {
	out := Lock{Inode: l.Ino, Kind: "fcntl", Type: "read", Start: l.Start, Client: l.Client, Pid: l.Pid}
	if l.Flock {
		out.Kind = "flock"
	}
	if l.Type == rpc.LockWrite {
		out.Type = "write"
	}
	if l.End != math.MaxUint64 {
		end := l.End
		out.End = &end
	}
	return out
}

// ageSeconds turns a millisecond age (negative: unknown) into seconds.
func ageSeconds(ms int64) *float64 {
	if ms < 0 {
		return nil
	}
	s := float64(ms) / 1000
	return &s
}

// DelegationsOf lists the create delegations session client holds.
func DelegationsOf(st *rpc.ClusterStatusResp, client uint64) []Delegation {
	out := []Delegation{}
	for _, d := range st.Delegations {
		if d.Client == client {
			out = append(out, Delegation{Directory: d.Dir, Epoch: d.Epoch,
				GrantedAt: time.UnixMilli(d.GrantedMs).UTC().Format(time.RFC3339), Recalled: d.Recalled})
		}
	}
	return out
}
