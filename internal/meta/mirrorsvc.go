package meta

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// The leader's side of mirror groups (docs/design/0014): the mirror
// methods, the heartbeat answer with the server's groups and its lease,
// placement on groups, and the automatic switch (checkMirrors, on the
// leader loop's failover ticker). What a group is lives in the replicated
// state (mirror.go); what the leader adds is server liveness, which is
// its memory.

// mirrorState is the leader's memory about groups.
type mirrorState struct {
	mu sync.Mutex
	// cands caches the placement candidates (groups) for candidateTTL.
	cands   []layout.Candidate
	candsAt time.Time
	// stuck: the epoch of each group whose dead primary was logged as
	// having no copy to take over (one line per group and epoch).
	stuck map[uint32]uint64
	// noGroupsLogged: when a create under a mirrored directory without
	// any group was last logged (one line per 10 s).
	noGroupsLogged time.Time
}

// mirrorMetrics are the mirror collectors of /metrics.
type mirrorMetrics struct {
	failovers *prometheus.CounterVec
	groups    *prometheus.GaugeVec
	resync    *prometheus.GaugeVec
	copyBad   prometheus.Counter
}

func newMirrorMetrics(reg *prometheus.Registry) *mirrorMetrics {
	m := &mirrorMetrics{
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_mirror_failovers_total", Help: "Mirror group switches of primary by this leader: automatic (the primary's server went silent), disk (the primary reported its own copy failed: EIO, EROFS, ENOSPC) or planned (strata mirror fail-over).",
		}, []string{"kind"}),
		groups: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "strata_mirror_groups", Help: "Mirror groups by state (in_sync, degraded, resyncing), as the leader last checked them.",
		}, []string{"state"}),
		resync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "strata_mirror_resync_progress_ratio", Help: "Resync progress of each resyncing mirror group (0 to 1), as its primary last reported it.",
		}, []string{"group"}),
		copyBad: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_mirror_copies_repaired_total", Help: "Reports of a mirrored copy that failed its checksums and was repaired from the other.",
		}),
	}
	reg.MustRegister(m.failovers, m.groups, m.resync, m.copyBad)
	return m
}

// leaseOf is the primary lease a heartbeat answer grants: 2/3 of the
// failover timeout, so that a primary that no longer hears the service
// stops acknowledging writes a third of the timeout before its secondary
// may be promoted.
func leaseOf(failover time.Duration) time.Duration { return failover * 2 / 3 }

// heardWithin reports whether server has heartbeated (or registered)
// within the failover timeout before now. A new leader starts every
// server's clock afresh: it counts from when it took office, not from a
// heartbeat it never saw.
func (s *Service) heardWithin(server uint32, now time.Time) bool {
	last, _ := s.live.lastSeen(server)
	if since := time.Unix(0, s.leaderSince.Load()); last.Before(since) {
		last = since
	}
	return now.Sub(last) < s.cfg.FailoverTimeout
}

// lastSeen is when server last heartbeated or registered (zero: never,
// under this leader).
func (l *liveness) lastSeen(server uint32) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.mu.servers[server]
	return t, ok
}

// mirrorView is the registry as group answers need it: each target's
// server and each server's address.
type mirrorView struct {
	serverOf map[uint32]uint32 // target → server
	addr     map[uint32]string // server → data address
}

func (s *Service) mirrorView() (*mirrorView, error) { return mirrorViewOf(s.db) }

// mirrorViewOf reads the registry of r as group answers need it.
func mirrorViewOf(r kv.Reader) (*mirrorView, error) {
	v := &mirrorView{serverOf: map[uint32]uint32{}, addr: map[uint32]string{}}
	ts, err := readTargets(r)
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "read targets: %v", err)
	}
	for _, t := range ts {
		v.serverOf[t.ID] = t.ServerID
	}
	servers, err := readServers(r)
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "read storage servers: %v", err)
	}
	for _, sv := range servers {
		v.addr[sv.ID] = sv.Addr
	}
	return v, nil
}

// groupMap is the group table and the registry it names as of one raft
// index, its version (rpc.MapVersion): all three read from one snapshot
// of the state, so that a map's version says exactly which state it is.
type groupMap struct {
	groups  []schema.Group
	view    *mirrorView // nil when there are no groups
	version uint64
}

// readGroupMap reads the group map from one snapshot of the state. The
// version is the applied index stored with the state (fsm.commitLocked
// writes it in each batch): a position in the replicated log, so answers
// of different leaders compare as exactly as one leader's (§ Group map
// versions in docs/design/0014).
func (s *Service) readGroupMap() (*groupMap, error) {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	m := &groupMap{}
	switch v, err := snap.Get(schema.CountersKey()); {
	case errors.Is(err, kv.ErrNotFound): // nothing applied yet: version 0
	case err != nil:
		return nil, rpc.Errorf(syscall.EIO, "read counters: %v", err)
	default:
		ctr, err := schema.DecodeCounters(v)
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "counters: %v", err)
		}
		m.version = ctr.AppliedIndex
	}
	var err error
	if m.groups, err = readGroups(snap); err != nil {
		return nil, rpc.Errorf(syscall.EIO, "read mirror groups: %v", err)
	}
	if len(m.groups) > 0 {
		if m.view, err = mirrorViewOf(snap); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// groupInfos puts the servers' addresses (of v; nil: as they are now)
// and liveness on groups.
func (s *Service) groupInfos(infos []rpc.GroupInfo, v *mirrorView) ([]rpc.GroupInfo, error) {
	if len(infos) == 0 {
		return infos, nil
	}
	if v == nil {
		var err error
		if v, err = s.mirrorView(); err != nil {
			return nil, err
		}
	}
	now := s.cfg.Clock.Now()
	for i := range infos {
		g := &infos[i]
		ps, ss := v.serverOf[g.Primary], v.serverOf[g.Secondary]
		g.PrimaryAddr, g.SecondaryAddr = v.addr[ps], v.addr[ss]
		g.PrimaryAlive, g.SecondaryAlive = s.heardWithin(ps, now), s.heardWithin(ss, now)
	}
	return infos, nil
}

// listGroups is every group with its servers, in id order, and the map's
// version.
func (s *Service) listGroups() ([]rpc.GroupInfo, uint64, error) {
	m, err := s.readGroupMap()
	if err != nil {
		return nil, 0, err
	}
	infos := make([]rpc.GroupInfo, len(m.groups))
	for i := range m.groups {
		infos[i] = groupInfoOf(&m.groups[i])
	}
	infos, err = s.groupInfos(infos, m.view)
	return infos, m.version, err
}

// mirrorChange proposes a mirror command and answers the groups it
// changed or made, with their servers, and the version they are of (the
// command's raft index; 0 for a create's new groups).
func (s *Service) mirrorChange(c *command) ([]rpc.GroupInfo, uint64, error) {
	res, err := s.propose(c)
	if err != nil {
		return nil, 0, err
	}
	if err := res.err(); err != nil {
		return nil, 0, err
	}
	s.mir.mu.Lock()
	s.mir.candsAt = time.Time{}
	s.mir.mu.Unlock()
	resp, ok := res.reply().(*rpc.ListGroupsResp)
	if !ok {
		return nil, 0, rpc.Errorf(syscall.EIO, "mirror change answered %T", res.reply())
	}
	gs, err := s.groupInfos(resp.Groups, nil)
	return gs, resp.Version, err
}

// oneGroup answers a change of one group, with its version.
func oneGroup(gs []rpc.GroupInfo, version uint64, err error) (rpc.Message, error) {
	if err != nil {
		return nil, err
	}
	if len(gs) != 1 {
		return nil, rpc.Errorf(syscall.EIO, "mirror change answered %d groups", len(gs))
	}
	return &rpc.GroupResp{Group: gs[0], Version: version}, nil
}

func groupLog(g *rpc.GroupInfo) []any {
	return []any{"group", g.ID, "epoch", g.Epoch, "state", rpc.GroupStateName(g.State),
		"primary", g.Primary, "primary_server", g.PrimaryAddr, "secondary", g.Secondary, "secondary_server", g.SecondaryAddr}
}

func (s *Service) registerMirror() {
	handle(s, rpc.MListGroups, func(_ context.Context, _ *rpc.Empty) (rpc.Message, error) {
		gs, version, err := s.listGroups()
		if err != nil {
			return nil, err
		}
		return &rpc.ListGroupsResp{Groups: gs, Version: version}, nil
	})
	handle(s, rpc.MMirrorCreate, func(_ context.Context, r *rpc.MirrorCreateReq) (rpc.Message, error) {
		c := &command{Op: opMirrorCreate, Now: s.now(), Pairs: r.Pairs}
		if r.Auto {
			c.Flags |= mirrorAuto
		}
		if r.ByDomain {
			c.Flags |= mirrorByDomain
		}
		gs, _, err := s.mirrorChange(c)
		if err != nil {
			return nil, err
		}
		for i := range gs {
			s.log.Info("mirror group created", groupLog(&gs[i])...)
		}
		return &rpc.ListGroupsResp{Groups: gs}, nil
	})
	handle(s, rpc.MMirrorFailOver, func(_ context.Context, r *rpc.MirrorGroupReq) (rpc.Message, error) {
		if err := s.checkSecondaryAlive(r.Group); err != nil {
			return nil, err
		}
		gs, version, err := s.mirrorChange(&command{Op: opMirrorFailOver, Now: s.now(), Group: r.Group, Epoch: r.Epoch})
		if err == nil && len(gs) == 1 {
			s.m.mirror.failovers.WithLabelValues("planned").Inc()
			s.log.Info("mirror group failed over", append([]any{"cause", "planned (strata mirror fail-over)"}, groupLog(&gs[0])...)...)
		}
		return oneGroup(gs, version, err)
	})
	handle(s, rpc.MMirrorReplace, func(_ context.Context, r *rpc.MirrorReplaceReq) (rpc.Message, error) {
		gs, version, err := s.mirrorChange(&command{Op: opMirrorReplace, Now: s.now(), Group: r.Group, Target: r.Target})
		if err == nil && len(gs) == 1 {
			s.log.Info("mirror group copy replaced: a full resync starts when the new target's server heartbeats", groupLog(&gs[0])...)
		}
		return oneGroup(gs, version, err)
	})
	handle(s, rpc.MMirrorReport, s.mirrorReport)
}

// checkSecondaryAlive refuses a planned switch to a secondary whose
// server is silent: it would make a dead copy the primary (the group
// degrades within the failover timeout; replace its copy then).
func (s *Service) checkSecondaryAlive(id uint32) error {
	gs, _, err := s.listGroups()
	if err != nil {
		return err
	}
	for _, g := range gs {
		if g.ID == id && !g.SecondaryAlive {
			return rpc.Errorf(syscall.EBUSY, "mirror group %d: the secondary's server %s sends no heartbeat: it cannot take over", id, g.SecondaryAddr)
		}
	}
	return nil // an unknown group: the command says so
}

// mirrorReport handles a store's report on a group. A bad copy is only
// counted and logged (the store repaired it); the other events change
// the replicated group.
func (s *Service) mirrorReport(_ context.Context, r *rpc.MirrorReportReq) (rpc.Message, error) {
	if r.Event == rpc.MirrorCopyBad {
		gs, version, err := s.listGroups()
		if err != nil {
			return nil, err
		}
		for i := range gs {
			if g := &gs[i]; g.ID == r.Group {
				if r.Epoch < g.Epoch {
					return nil, rpc.Errorf(syscall.ESTALE, "mirror group %d is at epoch %d, not %d", g.ID, g.Epoch, r.Epoch)
				}
				s.m.mirror.copyBad.Inc()
				s.log.Warn("mirrored copy failed its checksums and was repaired from the other copy",
					"group", g.ID, "target", r.Target, "server", r.ServerID, "detail", r.Detail)
				return &rpc.GroupResp{Group: *g, Version: version}, nil
			}
		}
		return nil, noGroup(r.Group)
	}
	if r.Event == rpc.MirrorPrimaryFailed {
		// The forward to the secondary just succeeded, but a copy whose
		// server the service does not hear would be a primary without a
		// lease: refuse (the store answers its client EAGAIN).
		if err := s.checkSecondaryAlive(r.Group); err != nil {
			return nil, err
		}
	}
	gs, version, err := s.mirrorChange(&command{Op: opMirrorReport, Now: s.now(), Group: r.Group, Epoch: r.Epoch,
		Target: r.Target, Flags: uint32(r.Event), Done: r.Done, Total: r.Total})
	if err == nil && len(gs) == 1 {
		g := &gs[0]
		switch r.Event {
		case rpc.MirrorSecondaryLost:
			s.log.Warn("mirror group degraded", append([]any{"cause", "the primary could not reach the secondary", "detail", r.Detail}, groupLog(g)...)...)
		case rpc.MirrorPrimaryFailed:
			s.m.mirror.failovers.WithLabelValues("disk").Inc()
			s.log.Warn("mirror group failed over", append([]any{"cause", "the primary's disk failed (target " + strconv.FormatUint(uint64(r.Target), 10) +
				"); its copy is resynced whole", "detail", r.Detail}, groupLog(g)...)...)
		case rpc.MirrorResyncDone:
			s.log.Info("mirror group in sync again", groupLog(g)...)
		case rpc.MirrorResyncProgress:
			if g.ResyncTotal > 0 {
				s.m.mirror.resync.WithLabelValues(strconv.FormatUint(uint64(g.ID), 10)).Set(float64(g.ResyncDone) / float64(g.ResyncTotal))
			}
		}
	}
	return oneGroup(gs, version, err)
}

// serverGroups answers a server's heartbeat: the groups with a copy on
// its targets, its lease, and the map's version. A degraded group whose
// secondary is on this server, degraded for at least the failover timeout
// (a link that flaps resyncs at most once per timeout) and whose primary
// is alive, starts resyncing here; the map is then read again, so that
// the answer's groups and version are of one state, the resync's included.
func (s *Service) serverGroups(srv *schema.Server, now time.Time) (*rpc.ServerHeartbeatResp, error) {
	resp := &rpc.ServerHeartbeatResp{
		LeaseMs:           uint32(min(leaseOf(s.cfg.FailoverTimeout).Milliseconds(), math.MaxUint32)),
		FailoverTimeoutMs: uint32(min(s.cfg.FailoverTimeout.Milliseconds(), math.MaxUint32)),
	}
	mine := map[uint32]bool{}
	for _, t := range srv.Targets {
		mine[t] = true
	}
	for pass := 0; ; pass++ {
		// Even without groups the answer carries its version: an empty
		// map read before a group was created must not replace, when it
		// arrives late, a newer map with the group.
		m, err := s.readGroupMap()
		if err != nil {
			return nil, err
		}
		var infos []rpc.GroupInfo
		started := false
		for i := range m.groups {
			g := &m.groups[i]
			if !mine[g.Primary] && !mine[g.Secondary] {
				continue
			}
			if pass == 0 && g.State == schema.GroupDegraded && mine[g.Secondary] && now.Sub(time.Unix(0, g.Since)) >= s.cfg.FailoverTimeout {
				started = s.startResync(g, now) || started
			}
			infos = append(infos, groupInfoOf(g))
		}
		if started {
			continue
		}
		if resp.Groups, err = s.groupInfos(infos, m.view); err != nil {
			return nil, err
		}
		resp.Version = m.version
		return resp, nil
	}
}

// startResync marks g resyncing when its primary's server is alive (the
// primary does the copying); true if it did.
func (s *Service) startResync(g *schema.Group, now time.Time) bool {
	v, err := s.mirrorView()
	if err != nil || !s.heardWithin(v.serverOf[g.Primary], now) {
		return false
	}
	gs, _, err := s.mirrorChange(&command{Op: opMirrorResync, Now: s.now(), Group: g.ID, Epoch: g.Epoch})
	if err != nil || len(gs) != 1 {
		if err != nil && !errors.Is(err, syscall.ESTALE) {
			s.log.Warn("could not start a mirror group's resync; the next heartbeat tries again", "group", g.ID, "err", err)
		}
		return false
	}
	s.log.Info("mirror group resyncing: its secondary's server is back", groupLog(&gs[0])...)
	return true
}

// checkMirrors is the automatic switch, run on the leader loop's failover
// ticker. A primary whose server has been silent for the failover timeout
// is replaced by its secondary when the group is in sync and the
// secondary's server is alive (one raft command: the group degrades under
// a new epoch with the old primary as its secondary); a group that is not
// in sync keeps its primary and waits for it (logged once per epoch). A
// silent secondary degrades its group, so that its primary records what
// changes for the resync and `strata mirror replace` may give it another.
func (s *Service) checkMirrors() {
	if s.fsm.groups.Load() == 0 {
		return
	}
	gs, err := readGroups(s.db)
	if err != nil {
		s.log.Warn("check mirror groups", "err", err)
		return
	}
	v, err := s.mirrorView()
	if err != nil {
		s.log.Warn("check mirror groups", "err", err)
		return
	}
	now := s.cfg.Clock.Now()
	byState := map[uint8]int{}
	s.m.mirror.resync.Reset()
	for i := range gs {
		g := &gs[i]
		ps, ss := v.serverOf[g.Primary], v.serverOf[g.Secondary]
		pAlive, sAlive := s.heardWithin(ps, now), s.heardWithin(ss, now)
		switch {
		case !pAlive && g.State == schema.GroupInSync && sAlive:
			silent := s.silentFor(ps, now)
			out, _, err := s.mirrorChange(&command{Op: opMirrorFailOver, Now: s.now(), Group: g.ID, Epoch: g.Epoch, Flags: mirrorAutomatic})
			if err != nil {
				s.log.Warn("automatic mirror fail-over failed; the next check tries again", "group", g.ID, "err", err)
				break
			}
			s.m.mirror.failovers.WithLabelValues("automatic").Inc()
			s.log.Warn("mirror group failed over", append([]any{"cause", "the primary's server " + v.addr[ps] + " sent no heartbeat for " + silent.String(),
				"failover_timeout", s.cfg.FailoverTimeout}, groupLog(&out[0])...)...)
			*g = schema.Group{ID: g.ID, Epoch: out[0].Epoch, State: out[0].State}
		case !pAlive:
			s.mir.mu.Lock()
			if s.mir.stuck == nil {
				s.mir.stuck = map[uint32]uint64{}
			}
			logged, ok := s.mir.stuck[g.ID]
			if !ok || logged != g.Epoch {
				s.mir.stuck[g.ID] = g.Epoch
				s.log.Warn("mirror group's primary is down and no in-sync copy can take over: its files give EIO until the primary's server returns",
					"group", g.ID, "epoch", g.Epoch, "state", rpc.GroupStateName(g.State), "primary", g.Primary, "primary_server", v.addr[ps],
					"secondary", g.Secondary, "secondary_alive", sAlive)
			}
			s.mir.mu.Unlock()
		case !sAlive && g.State != schema.GroupDegraded:
			out, _, err := s.mirrorChange(&command{Op: opMirrorReport, Now: s.now(), Group: g.ID, Epoch: g.Epoch,
				Target: g.Primary, Flags: uint32(rpc.MirrorSecondaryLost)})
			if err != nil {
				if !errors.Is(err, syscall.ESTALE) {
					s.log.Warn("degrade mirror group", "group", g.ID, "err", err)
				}
				break
			}
			s.log.Warn("mirror group degraded", append([]any{"cause", "the secondary's server " + v.addr[ss] + " sent no heartbeat for " + s.silentFor(ss, now).String()},
				groupLog(&out[0])...)...)
			g.State = out[0].State
		}
		byState[g.State]++
		if g.State == schema.GroupResyncing && g.ResyncTotal > 0 {
			s.m.mirror.resync.WithLabelValues(strconv.FormatUint(uint64(g.ID), 10)).Set(float64(g.ResyncDone) / float64(g.ResyncTotal))
		}
	}
	for _, st := range []uint8{schema.GroupInSync, schema.GroupDegraded, schema.GroupResyncing} {
		s.m.mirror.groups.WithLabelValues(rpc.GroupStateName(st)).Set(float64(byState[st]))
	}
}

// silentFor is how long server has not been heard (since this leader took
// office, at most).
func (s *Service) silentFor(server uint32, now time.Time) time.Duration {
	last, _ := s.live.lastSeen(server)
	if since := time.Unix(0, s.leaderSince.Load()); last.Before(since) {
		last = since
	}
	return now.Sub(last).Round(time.Millisecond)
}

// groupCandidates lists the groups a new mirrored file may be placed on:
// those whose primary's server is alive, each with the free space of its
// fuller copy (a copy whose space is unknown — its server has not
// reported under this leader — does not count). The slice is shared.
func (s *Service) groupCandidates() []layout.Candidate {
	now := s.cfg.Clock.Now()
	s.mir.mu.Lock()
	if !s.mir.candsAt.IsZero() && now.Sub(s.mir.candsAt) < candidateTTL {
		c := s.mir.cands
		s.mir.mu.Unlock()
		return c
	}
	s.mir.mu.Unlock()
	gs, err := readGroups(s.db)
	if err != nil {
		s.log.Warn("read mirror groups for placement", "err", err)
		return nil
	}
	var out []layout.Candidate
	for _, g := range gs {
		p, ok := s.live.usage(g.Primary)
		if !ok || p.free == 0 || !s.heardWithin(p.server, now) {
			continue
		}
		free := p.free
		if sc, ok := s.live.usage(g.Secondary); ok {
			free = min(free, sc.free)
		}
		if free > 0 {
			out = append(out, layout.Candidate{ID: layout.GroupBit | g.ID, FreeBytes: free})
		}
	}
	s.mir.mu.Lock()
	s.mir.cands, s.mir.candsAt = out, now
	s.mir.mu.Unlock()
	return out
}

// placeMirrored fills in c's candidates with groups when its parent is
// marked mirrored (ok false: it is not, or there are no groups at all — the
// state machine then refuses a mirrored parent by name).
func (s *Service) placeMirrored(ctx context.Context, c *command) (bool, error) {
	if s.fsm.groups.Load() == 0 {
		return false, nil
	}
	dir, err := s.readInode(c.Parent)
	if err != nil || !dir.Mirror {
		return false, nil // the create reports a missing parent
	}
	c.Cands = s.waitCandidates(ctx, s.groupCandidates)
	if len(c.Cands) == 0 {
		return true, rpc.Errorf(syscall.ENOSPC, "cannot place a new file in mirrored directory %d: no mirror group's primary is on a live storage server with free space (strata mirror list)", c.Parent)
	}
	c.RRStart = s.rr.Add(1)
	return true, nil
}

// noteNoGroups logs (once per 10 s) a create refused because its
// directory is mirrored and no group exists.
func (s *Service) noteNoGroups(err error) {
	var e *rpc.Error
	if !errors.As(err, &e) || e.Errno != syscall.ENOSPC || !strings.Contains(e.Msg, "no mirror group exists") {
		return
	}
	now := time.Now()
	s.mir.mu.Lock()
	due := now.Sub(s.mir.noGroupsLogged) >= 10*time.Second
	if due {
		s.mir.noGroupsLogged = now
	}
	s.mir.mu.Unlock()
	if due {
		s.log.Warn("create refused: the directory is marked mirrored but no mirror group exists (strata mirror create --auto)", "err", e.Msg)
	}
}
