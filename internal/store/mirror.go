package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Mirror groups at the storage server (docs/design/0014).
//
// The store learns the mirror groups with a copy on its targets from every
// heartbeat answer (rpc.ServerHeartbeatResp, register.go) and, when a
// request carries an epoch newer than it knows, from MListGroups (refresh:
// one at a time, bounded). groupMap holds, for each such group, the local
// target, the role, the peer's target and server address, the epoch and the
// state, and the primary lease: a store acts as a group's primary (or serves
// a group's read) only until LeaseMs after it SENT the last heartbeat that
// was answered, so a store cut off from the metadata service stops before
// the service (which waits FailoverTimeoutMs after it RECEIVED the last
// heartbeat) promotes the other copy.
//
// Admission (admitGroup) of a request whose ChunkID names a group:
//
//	request epoch < known                       ESTALE
//	request epoch > known                       refresh; still newer: EAGAIN
//	group has no copy here                      ESTALE
//	primary, lease expired                      EAGAIN (mutations and reads)
//	primary, read, its copy failed this epoch   EAGAIN (forward.go primaryFailed)
//	secondary, read, not in sync or no lease    ESTALE
//	secondary, read of a suspect chunk          EAGAIN (resync.go sendSuspects)
//	secondary, mutation                         applied (the primary forwards)
//
// Why the lease is checked at admission only: an admitted mutation of an
// in-sync or resyncing group is acknowledged only once the secondary
// applied it at the same epoch, and a promoted secondary has a newer one
// and refuses it — the forward's success proves this store was still the
// primary. A degraded group's secondary is never promoted, so its primary
// cannot have been replaced while a mutation ran. Reads are the lease's
// real charge: a primary (or in-sync secondary) that lost the service
// serves none once it may have been replaced.
//
// What the primary then does with a mutation is forward.go's; the record of
// what changed while degraded mirrorlog.go's; the catch-up resync.go's.
//
// Limits (not handled here):
//   - A primary that applied a mutation locally whose forward then failed
//     for good — it died, or it was deposed (the forward answered ESTALE)
//     — holds a change its peer lacks. The client normally sends the
//     mutation again to the new primary, which records it, and its resync
//     then overwrites this copy. If the client never does (it died too),
//     the copies may differ in that unacknowledged change. A restarted
//     primary finds such chunks in its intent log (suspects, mirrorlog.go)
//     and copies them itself if it is still the primary; a restarted copy
//     that is now the secondary hands them to its primary
//     (SMirrorSuspects), which degrades the group and has its resync copy
//     them whole. A chunk created since its last sync is not among them.
//   - A secondary that loses its page cache (power loss, not kill -9)
//     loses forwarded writes not yet synced there: the same suspects and
//     the same hand-over. If the primary dies before the secondary
//     handed them over, the service (which saw the group in sync)
//     promotes a copy that may be stale in those chunks: logged loudly.

// groupPeer is what the scrub and heal code needs of a group with a copy
// on this server.
type groupPeer struct {
	Local, PeerTarget uint32
	PeerAddr          string
	Epoch             uint64
	Primary, InSync   bool
}

// groupEntry is one group with a copy on this server.
type groupEntry struct {
	info       rpc.GroupInfo
	local      uint32 // our target's id
	primary    bool
	peerTarget uint32
	peerAddr   string
	// ackAfter: a primary that has just degraded the group acknowledges
	// mutations of the degraded epoch only from then on (see
	// degradeWait).
	ackAfter time.Time
	// ver is the map version (rpc.MapVersion) of the answer the entry
	// came from; 0: unknown.
	ver uint64
}

// groupMap is the server's view of its mirror groups.
type groupMap struct {
	mu         sync.Mutex
	groups     map[uint32]groupEntry
	leaseUntil time.Time
	leaseMs    uint32
	failoverMs uint32
	// gate holds the version of the last full map installed and refuses
	// older ones.
	gate rpc.MapGate
	// installs counts installs and attempts the MListGroups calls
	// started: a request that arrived before either moved has its
	// refresh done (or failed) already, and makes none of its own.
	installs, attempts uint64

	// failed: group → the epoch in which this server's copy, as the
	// primary, failed a mutation or sync with a disk error
	// (forward.go primaryFailed). Reads of the group are refused here in
	// that epoch: the copy may have lost acknowledged writes.
	failed map[uint32]uint64

	// refreshMu: one MListGroups at a time.
	refreshMu sync.Mutex

	// changed, if set, is called (outside mu) after an install with the
	// groups whose epoch changed.
	changed func(changed []groupEntry)
	log     *slog.Logger
}

func newGroupMap() *groupMap { return &groupMap{groups: map[uint32]groupEntry{}, log: slog.Default()} }

// peerOf answers the copy of group on this server: local target, peer,
// epoch, role and whether the group is in sync.
func (m *groupMap) peerOf(group uint32) (p groupPeer, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.groups[group]
	if !ok {
		return groupPeer{}, false
	}
	return groupPeer{Local: g.local, PeerTarget: g.peerTarget, PeerAddr: g.peerAddr, Epoch: g.info.Epoch,
		Primary: g.primary, InSync: g.info.State == rpc.GroupInSync}, true
}

// markFailed records that the local copy of group failed in epoch.
func (m *groupMap) markFailed(group uint32, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failed == nil {
		m.failed = map[uint32]uint64{}
	}
	m.failed[group] = max(m.failed[group], epoch)
}

// entry answers the group's entry.
func (m *groupMap) entry(group uint32) (groupEntry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.groups[group]
	return g, ok
}

// leaseValid reports whether the primary lease runs at now.
func (m *groupMap) leaseValid(now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return now.Before(m.leaseUntil)
}

// all answers every entry (tests, resync start).
func (m *groupMap) all() []groupEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]groupEntry, 0, len(m.groups))
	for _, g := range m.groups {
		out = append(out, g)
	}
	return out
}

// mapAnswer is an answer of the metadata service that carries groups.
type mapAnswer struct {
	groups []rpc.GroupInfo
	// version: the map version the groups were read at (0: unknown).
	version uint64
	// full: groups is every group with a copy here (a heartbeat answer,
	// or MListGroups' whole list): a known group missing from it is
	// forgotten. Else they are lone groups (a report's answer).
	full bool
	// lease (a heartbeat answer): the primary lease runs until
	// leaseUntil.
	lease               bool
	leaseUntil          time.Time
	leaseMs, failoverMs uint32
}

// install adopts groups as the metadata service answered them. ours
// answers whether a target id is served here. Versions order the answers
// (docs/design/0014 § Group map versions): a full map older than the one
// installed is refused whole; a group whose entry came from an answer newer
// than this one is kept as it is; a lone group is taken only if its answer
// is not older than the entry's, or, for a group without an entry here,
// than the full map that had none. Unknown versions (0) install as before
// versions existed. Besides, a group's older epoch never replaces a newer
// one. The lease of a heartbeat answer counts whatever its map's version:
// it is the service's receipt of the heartbeat that grants it.
func (m *groupMap) install(a mapAnswer, ours func(uint32) bool) {
	var changed []groupEntry
	m.mu.Lock()
	if a.lease {
		if a.leaseUntil.After(m.leaseUntil) {
			m.leaseUntil = a.leaseUntil
		}
		m.leaseMs, m.failoverMs = a.leaseMs, a.failoverMs
	}
	v := a.version
	if a.full {
		installed := m.gate.Version
		ok, wentBack := m.gate.Admit(v, time.Now())
		if !ok {
			m.mu.Unlock()
			return
		}
		if wentBack {
			m.log.Warn("the metadata service's mirror group map went back in version: taking it (was its state restored from an older copy?)",
				"installed", installed, "answered", v)
		}
		if v == 0 || wentBack {
			m.forgetVersions()
		}
	}
	seen := map[uint32]bool{}
	for _, gi := range a.groups {
		old, had := m.groups[gi.ID]
		if v != 0 && ((had && old.ver > v) || (!had && !a.full && v < m.gate.Version)) {
			seen[gi.ID] = had
			continue // older than what is known of the group
		}
		var e groupEntry
		switch {
		case ours(gi.Primary):
			e = groupEntry{info: gi, local: gi.Primary, primary: true, peerTarget: gi.Secondary, peerAddr: gi.SecondaryAddr}
		case ours(gi.Secondary):
			e = groupEntry{info: gi, local: gi.Secondary, peerTarget: gi.Primary, peerAddr: gi.PrimaryAddr}
		default:
			continue
		}
		e.ver = v
		seen[gi.ID] = true
		if had && old.info.Epoch > gi.Epoch {
			continue
		}
		if had && old.info.Epoch == gi.Epoch {
			// Same epoch: keep the role, refresh what is not epoch-bound
			// (addresses, liveness, progress). FullResync changes only
			// with the epoch, and a lone GroupInfo (a report's answer)
			// does not carry it: keep it.
			e.ackAfter = old.ackAfter
			e.info.FullResync = e.info.FullResync || old.info.FullResync
			m.groups[gi.ID] = e
			continue
		}
		if e.primary && gi.State == rpc.GroupDegraded && had && old.primary && old.info.State != rpc.GroupDegraded {
			e.ackAfter = time.Now().Add(degradeWait(m.leaseMs))
		} else if had && old.primary == e.primary && old.local == e.local {
			e.ackAfter = old.ackAfter
		}
		m.groups[gi.ID] = e
		changed = append(changed, e)
	}
	if a.full {
		for id, e := range m.groups {
			if !seen[id] && (v == 0 || e.ver <= v) {
				delete(m.groups, id)
			}
		}
	}
	m.installs++
	fn := m.changed
	m.mu.Unlock()
	if fn != nil && len(changed) > 0 {
		fn(changed)
	}
}

// forgetVersions makes every entry's version unknown (mu held).
func (m *groupMap) forgetVersions() {
	for id, e := range m.groups {
		e.ver = 0
		m.groups[id] = e
	}
}

// expireLease ends the lease at once (tests; a heartbeat answered ESTALE).
func (m *groupMap) expireLease() {
	m.mu.Lock()
	m.leaseUntil = time.Time{}
	m.mu.Unlock()
}

// ours answers whether target id is served by s.
func (s *Server) ours(id uint32) bool { return (*s.byID.Load())[id] != nil }

// installGroups is the one way groups enter the map besides heartbeat
// answers: MListGroups (full, with its version), mirror report and
// suspect hand-over answers (lone groups, each with its version) and tests.
func (s *Server) installGroups(groups []rpc.GroupInfo, version uint64, full bool) {
	s.groups.install(mapAnswer{groups: groups, version: version, full: full}, s.ours)
}

// installHeartbeat adopts a heartbeat answer sent at sent, and then deals
// with the chunks an unclean stop left suspect (consumeSuspects).
func (s *Server) installHeartbeat(resp *rpc.ServerHeartbeatResp, sent time.Time) {
	s.groups.install(mapAnswer{groups: resp.Groups, version: resp.Version, full: true, lease: resp.LeaseMs > 0,
		leaseUntil: sent.Add(time.Duration(resp.LeaseMs) * time.Millisecond), leaseMs: resp.LeaseMs, failoverMs: resp.FailoverTimeoutMs}, s.ours)
	s.consumeSuspects()
}

// degradeWait is how long a primary that degraded its group waits before
// it acknowledges a mutation the secondary lacks: the lease length. The
// secondary may be alive and reachable by clients though not by us (a
// slow disk, a one-way cut), and serve reads as an in-sync copy until it
// learns the degraded epoch from its next heartbeat answer, or until its
// lease — granted by an answer sent before the degrade — runs out, which
// is less than a lease length after the degrade. A promoted secondary
// (failover) does not wait: the old primary's lease ran out before the
// service promoted it. Capped by degradeWaitCap (tests).
func degradeWait(leaseMs uint32) time.Duration {
	return min(time.Duration(leaseMs)*time.Millisecond, time.Duration(degradeWaitCap.Load()))
}

// degradeWaitCap caps degradeWait; a variable for tests.
var degradeWaitCap atomic.Int64

func init() { degradeWaitCap.Store(math.MaxInt64) }

// refreshTimeout bounds one MListGroups.
const refreshTimeout = 2 * time.Second

// mapSeen is what a request saw of the map when it arrived.
type mapSeen struct{ installs, attempts uint64 }

// seen answers the map's counters now.
func (m *groupMap) seen() mapSeen {
	m.mu.Lock()
	defer m.mu.Unlock()
	return mapSeen{m.installs, m.attempts}
}

// refreshGroups re-reads the group map from the metadata service, unless
// the map was installed or another refresh was tried since the caller's
// request arrived (seen). One at a time: while the service does not
// answer, the requests waiting meanwhile share one attempt.
func (s *Server) refreshGroups(ctx context.Context, seen mapSeen) error {
	if s.meta == nil {
		return errors.New("no metadata service to ask for the group map")
	}
	s.groups.refreshMu.Lock()
	defer s.groups.refreshMu.Unlock()
	s.groups.mu.Lock()
	done := s.groups.installs != seen.installs || s.groups.attempts != seen.attempts
	if !done {
		s.groups.attempts++
	}
	s.groups.mu.Unlock()
	if done {
		return nil
	}
	// A context of its own: the caller's values (lent buffers) stay
	// with the caller's handler.
	cctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	var resp rpc.ListGroupsResp
	if err := s.meta.Call(cctx, rpc.MListGroups, &rpc.Empty{}, &resp); err != nil {
		return fmt.Errorf("list mirror groups: %w", err)
	}
	s.installGroups(resp.Groups, resp.Version, true)
	return nil
}

// admitted is an admitted request for a group's chunk.
type admitted struct {
	g groupEntry
	t *target
}

// admitGroup admits a request for chunk id of a group (see the table at
// the top). mutation: write, truncate, punch, remove, sync.
func (s *Server) admitGroup(ctx context.Context, id rpc.ChunkID, mutation bool) (admitted, error) {
	group := id.Target &^ rpc.GroupBit
	s.groups.mu.Lock()
	g, ok := s.groups.groups[group]
	seen := mapSeen{s.groups.installs, s.groups.attempts}
	failedIn, failed := s.groups.failed[group]
	s.groups.mu.Unlock()
	if !ok || id.Epoch > g.info.Epoch {
		if err := s.refreshGroups(ctx, seen); err != nil {
			s.log.Debug("cannot refresh the mirror group map", "group", group, "epoch", id.Epoch, "err", err)
		}
		g, ok = s.groups.entry(group)
		if ok && id.Epoch > g.info.Epoch {
			return admitted{}, rpc.Errorf(syscall.EAGAIN, "mirror group %d: epoch %d is newer than this server's %d (%s)", group, id.Epoch, g.info.Epoch, s.addr)
		}
	}
	if !ok {
		return admitted{}, rpc.Errorf(syscall.ESTALE, "mirror group %d has no copy on storage server %s", group, s.addr)
	}
	if id.Epoch < g.info.Epoch {
		return admitted{}, rpc.Errorf(syscall.ESTALE, "mirror group %d: epoch %d is older than the current %d", group, id.Epoch, g.info.Epoch)
	}
	t, err := s.target(g.local, id.Ino)
	if err != nil {
		return admitted{}, rpc.Errorf(syscall.ESTALE, "mirror group %d: %v", group, err)
	}
	lease := s.groups.leaseValid(time.Now())
	switch {
	case g.primary && !lease:
		return admitted{}, rpc.Errorf(syscall.EAGAIN, "mirror group %d: storage server %s has no valid primary lease (out of touch with the metadata service)", group, s.addr)
	case g.primary && !mutation && failed && failedIn == g.info.Epoch:
		return admitted{}, rpc.Errorf(syscall.EAGAIN, "mirror group %d: the primary's copy on %s failed a write or sync in epoch %d and may lack acknowledged data; the secondary is being promoted",
			group, s.addr, failedIn)
	case !g.primary && !mutation && (g.info.State != rpc.GroupInSync || !lease):
		return admitted{}, rpc.Errorf(syscall.ESTALE, "mirror group %d: the secondary copy on %s may not serve reads (state %s, lease %v)",
			group, s.addr, rpc.GroupStateName(g.info.State), lease)
	case !g.primary && !mutation && t.mlog.suspect(id.Ino):
		return admitted{}, rpc.Errorf(syscall.EAGAIN, "mirror group %d chunk %x: the secondary copy on %s may lack writes since an unclean stop (resync.go sendSuspects); read the primary",
			group, id.Ino, s.addr)
	}
	return admitted{g: g, t: t}, nil
}

// peerCallTimeout bounds a call to another storage server without a
// deadline of its own.
const peerCallTimeout = 5 * time.Second

// peerCall calls another storage server at addr through the server's pool
// of clients. The call is bounded by ctx's deadline (else peerCallTimeout)
// and ends when ctx does, but carries none of ctx's values: a handler's
// context holds its own caller's lent buffers, which must not reach
// another handler.
func (s *Server) peerCall(ctx context.Context, addr string, m rpc.Method, req, resp rpc.Message) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(peerCallTimeout)
	}
	cctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	return s.peer(addr).Call(cctx, m, req, resp)
}

// peer answers the pooled client of the storage server at addr.
func (s *Server) peer(addr string) *transport.Client {
	s.peers.Lock()
	defer s.peers.Unlock()
	c := s.peers.m[addr]
	if c == nil {
		c = transport.NewClient(addr, transport.ClientConfig{Key: s.cfg.ClusterKey, TLS: s.cfg.TLS, Conns: 2, DialTimeout: time.Second,
			NoLocal: peersOverNetwork.Load()})
		s.peers.m[addr] = c
	}
	return c
}

// peersOverNetwork makes calls to other stores go over loopback TCP even
// when they serve in this process (tests of the path separate processes
// take).
var peersOverNetwork atomic.Bool

// closePeers closes the pooled clients.
func (s *Server) closePeers() {
	s.peers.Lock()
	defer s.peers.Unlock()
	for a, c := range s.peers.m {
		c.Close()
		delete(s.peers.m, a)
	}
}
