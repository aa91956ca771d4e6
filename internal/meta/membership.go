package meta

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// The raft group's membership and visibility: MMetaInfo (any voter),
// MAddVoter, MRemoveVoter and MTransferLeader (the leader), the raft
// gauges of /metrics, and a log line for each leader change with its cause.
//
// Addresses: a voter is named by its rpc address. In a group whose raft
// traffic shares the rpc port a voter's raft id and address are that rpc
// address; a single voter started without peers has a random id and a
// raft port of its own, and only it knows its rpc address (its own
// Addr). rpcAddrOf maps a raft server to its rpc address by these rules.

// membership is the service's membership state (see registerMembership).
type membership struct {
	s     *Service
	watch *consensus.LeaderWatch

	changes    *prometheus.CounterVec
	lastChange prometheus.Gauge
}

const (
	// infoTimeout bounds a call to another voter's MMetaInfo.
	infoTimeout = 3 * time.Second
	// readyWait bounds how long a transfer waits for the new leader to
	// serve.
	readyWait = 10 * time.Second
)

// registerMembership registers the membership methods and the raft
// metrics. A voter of a group serves before its raft node runs: until
// startLeaderWatch, these methods answer "not the leader".
func (s *Service) registerMembership() {
	m := s.membershipState()
	m.registerMetrics(s.m.reg)
	transport.Handle(s.srv, rpc.MMetaInfo, func(context.Context, *rpc.Empty) (*rpc.MetaInfoResp, error) {
		if s.raftNode.Load() == nil {
			return nil, rpc.NotLeader("", "metadata voter %s is starting", s.Addr())
		}
		return m.info(), nil
	})
	transport.Handle(s.srv, rpc.MAddVoter, m.leaderOnly(m.addVoter))
	transport.Handle(s.srv, rpc.MRemoveVoter, m.leaderOnly(m.removeVoter))
	transport.Handle(s.srv, rpc.MTransferLeader, m.leaderOnly(m.transferLeader))
}

// membershipState is the service's membership state, made at first use
// (by Open's goroutine, before anything serves).
func (s *Service) membershipState() *membership {
	if s.members == nil {
		// The metrics leaderChanged sets exist before the leader watch
		// runs, which may come before they are registered (serve).
		s.members = &membership{s: s, changes: newLeaderChanges(), lastChange: newLastLeaderChange()}
	}
	return s.members
}

// startLeaderWatch follows leader changes (until Close). Open calls it once
// the raft node runs, before publishing the node (raftNode), which the
// handlers above wait for.
func (s *Service) startLeaderWatch() {
	m := s.membershipState()
	m.watch = s.node.NewLeaderWatch(m.leaderChanged)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		m.watch.Run(s.stop)
	}()
}

func (m *membership) registerMetrics(reg *prometheus.Registry) {
	s := m.s
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.changes, m.lastChange,
		gauge("strata_meta_raft_is_leader", "1 when this voter is the metadata leader, else 0.", func() float64 {
			if s.node.IsLeader() {
				return 1
			}
			return 0
		}),
		gauge("strata_meta_raft_term", "This voter's raft term.", func() float64 { return float64(s.node.Term()) }),
		gauge("strata_meta_raft_applied_index", "Last raft log index this voter's state machine applied.", func() float64 { return float64(s.fsm.AppliedIndex()) }),
		gauge("strata_meta_raft_commit_index", "Last raft log index this voter knows committed.", func() float64 { return float64(s.node.Stats().CommitIndex) }),
		gauge("strata_meta_raft_voters", "Voters in the raft configuration this voter knows.", func() float64 {
			conf, err := s.node.Configuration()
			if err != nil {
				return 0
			}
			n := 0
			for _, v := range conf {
				if v.Voter {
					n++
				}
			}
			return float64(n)
		}),
	)
}

func newLeaderChanges() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_meta_raft_leader_changes_total",
		Help: "New metadata leaders this voter saw, by the cause of the change (elected: the first since start; transfer; leader_lost; stepped_down).",
	}, []string{"cause"})
}

func newLastLeaderChange() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "strata_meta_raft_last_leader_change_timestamp_seconds",
		Help: "When this voter last saw a leader elected or lost (Unix time; 0: none since start).",
	})
}

// leaderChanged logs a leader change (one line) and counts it.
func (m *membership) leaderChanged(c consensus.LeaderEvent) {
	m.lastChange.Set(float64(c.Time.UnixNano()) / 1e9)
	if c.Lost() {
		m.s.log.Warn("metadata leader lost", "leader", m.rpcAddrOf(c.Previous), "term", c.Term, "cause", c.Cause)
		return
	}
	m.changes.WithLabelValues(c.Reason).Inc()
	m.s.log.Info("metadata leader elected", "leader", m.rpcAddrOf(c.Leader), "term", c.Term,
		"cause", c.Cause, "this_voter", c.Leader == m.s.node.ID())
}

// rpcAddrOf is the rpc address of the raft server id: this service's own
// for its own id, the id itself when it is a host:port (a group sharing
// the rpc port names voters so), else "" (unknown: a raft address of its
// own says nothing of the rpc port).
func (m *membership) rpcAddrOf(id string) string {
	switch {
	case id == "":
		return ""
	case id == m.s.node.ID():
		return m.s.Addr()
	case isHostPort(id):
		return id
	}
	return ""
}

// isHostPort reports whether a is host:port with a non-zero port.
func isHostPort(a string) bool {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p > 0 && p <= 65535
}

// leaderAddr is the leader's rpc address as this voter knows it.
func (m *membership) leaderAddr() string {
	_, id := m.s.node.Leader()
	return m.rpcAddrOf(id)
}

func (m *membership) notLeader() error {
	return rpc.NotLeader(m.leaderAddr(), "metadata voter %s is not the leader: membership changes go to the leader", m.s.Addr())
}

// leaderOnly answers the membership changes on the leader only.
func (m *membership) leaderOnly(fn func(context.Context, *rpc.MembershipReq) (*rpc.MembershipResp, error)) func(context.Context, *rpc.MembershipReq) (*rpc.MembershipResp, error) {
	return func(ctx context.Context, r *rpc.MembershipReq) (*rpc.MembershipResp, error) {
		if m.s.raftNode.Load() == nil {
			return nil, rpc.NotLeader("", "metadata voter %s is starting", m.s.Addr())
		}
		if !m.s.node.IsLeader() {
			return nil, m.notLeader()
		}
		start := time.Now()
		resp, err := fn(ctx, r)
		if err != nil {
			if errors.Is(err, consensus.ErrNotLeader) {
				return nil, m.notLeader()
			}
			return nil, err
		}
		if resp.TookNs == 0 {
			resp.TookNs = time.Since(start).Nanoseconds()
		}
		if resp.Voters == nil {
			resp.Voters, _ = m.voters()
		}
		return resp, nil
	}
}

// voters is the raft configuration with each server's rpc address.
func (m *membership) voters() ([]rpc.VoterInfo, error) {
	conf, err := m.s.node.Configuration()
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "%v", err)
	}
	out := make([]rpc.VoterInfo, 0, len(conf))
	for _, v := range conf {
		out = append(out, rpc.VoterInfo{ID: v.ID, Addr: m.rpcAddrOf(v.ID), RaftAddr: v.Addr, Voter: v.Voter})
	}
	return out, nil
}

// info is this voter's MMetaInfo answer.
func (m *membership) info() *rpc.MetaInfoResp {
	s := m.s
	st := s.node.Stats()
	_, lid := s.node.Leader()
	r := &rpc.MetaInfoResp{
		Addr: s.Addr(), ID: s.node.ID(), RaftAddr: s.node.Addr(), State: strings.ToLower(st.State), Term: st.Term,
		AppliedIndex: s.fsm.AppliedIndex(), CommitIndex: st.CommitIndex, LastIndex: st.LastIndex,
		Leader: m.rpcAddrOf(lid), LeaderID: lid, LastContactMs: -1, Serving: s.ready.Load(),
	}
	r.Voters, _ = m.voters()
	switch lc := s.node.LastContact(); {
	case s.node.IsLeader():
		r.LastContactMs = 0
	case !lc.IsZero():
		r.LastContactMs = time.Since(lc).Milliseconds()
	}
	if c, ok := m.watch.Last(); ok {
		r.LeaderChangeNs, r.LeaderChangeCause = c.Time.UnixNano(), c.Cause
	}
	for _, err := range s.node.Health() {
		r.Health = append(r.Health, err.Error())
	}
	return r
}

// find looks addr up in the configuration: by rpc address, raft id or
// raft address.
func find(vs []rpc.VoterInfo, addr string) (rpc.VoterInfo, bool) {
	for _, v := range vs {
		if v.Addr == addr || v.ID == addr || v.RaftAddr == addr {
			return v, true
		}
	}
	return rpc.VoterInfo{}, false
}

// names lists the voters' rpc addresses (raft ids when unknown).
func names(vs []rpc.VoterInfo) string {
	var out []string
	for _, v := range vs {
		if v.Addr != "" {
			out = append(out, v.Addr)
		} else {
			out = append(out, v.ID)
		}
	}
	return strings.Join(out, ", ")
}

func countVoters(vs []rpc.VoterInfo) int {
	n := 0
	for _, v := range vs {
		if v.Voter {
			n++
		}
	}
	return n
}

// infoClient is a client for another metadata service's MMetaInfo (not
// cached: the address may be anything an admin typed).
func (m *membership) infoClient(addr string) *transport.Client {
	return transport.NewClient(addr, transport.ClientConfig{Key: m.s.cfg.ClusterKey, TLS: m.s.cfg.TLS, Conns: 1, DialTimeout: infoTimeout, CallTimeout: infoTimeout})
}

// askInfo calls MMetaInfo through c, bounded by infoTimeout.
func askInfo(ctx context.Context, c *transport.Client) (*rpc.MetaInfoResp, error) {
	ctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	var r rpc.MetaInfoResp
	if err := c.Call(ctx, rpc.MMetaInfo, &rpc.Empty{}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// addVoter adds the metadata service at r.Addr, after asking it who it
// is: it must answer (else the group would wait for a voter that is not
// there) and must not belong to another group.
func (m *membership) addVoter(ctx context.Context, r *rpc.MembershipReq) (*rpc.MembershipResp, error) {
	if !isHostPort(r.Addr) {
		return nil, rpc.Errorf(syscall.EINVAL, "add voter: %q is not an address (host:port)", r.Addr)
	}
	vs, err := m.voters()
	if err != nil {
		return nil, err
	}
	if v, ok := find(vs, r.Addr); ok && v.Voter {
		return &rpc.MembershipResp{Done: fmt.Sprintf("%s is already a voter; nothing changed", r.Addr), Leader: m.s.Addr(), Voters: vs}, nil
	}
	c := m.infoClient(r.Addr)
	info, err := askInfo(ctx, c)
	c.Close()
	if err != nil {
		return nil, rpc.Errorf(syscall.EHOSTUNREACH, "add voter %s: cannot reach a metadata service there: %v; the configuration is unchanged (%s)", r.Addr, err, names(vs))
	}
	if info.ID == "" {
		return nil, rpc.Errorf(syscall.EINVAL, "add voter %s: it answered without a raft id; the configuration is unchanged", r.Addr)
	}
	if err := m.reachable(r.Addr, info); err != nil {
		return nil, err
	}
	if info.LastIndex > 0 && len(info.Voters) > 0 {
		if _, ours := find(info.Voters, m.s.node.ID()); !ours {
			return nil, rpc.Errorf(syscall.EEXIST, "add voter %s: it already belongs to another metadata group (voters: %s); start it on an empty data directory to join this one; the configuration is unchanged",
				r.Addr, names(info.Voters))
		}
	}
	raftAddr := info.RaftAddr
	if raftAddr == "" {
		raftAddr = r.Addr
	}
	if err := m.s.node.AddMember(info.ID, raftAddr, applyTimeout); err != nil {
		if errors.Is(err, consensus.ErrNotLeader) {
			return nil, err
		}
		return nil, rpc.Errorf(syscall.EIO, "add voter %s: %v", r.Addr, err)
	}
	if vs, err = m.voters(); err != nil {
		return nil, err
	}
	if _, ok := find(vs, info.ID); !ok {
		return nil, rpc.Errorf(syscall.EIO, "add voter %s: committed, but the configuration does not hold it (%s)", r.Addr, names(vs))
	}
	m.s.log.Info("metadata voter added", "addr", r.Addr, "raft_id", info.ID, "raft_addr", raftAddr, "voters", countVoters(vs))
	return &rpc.MembershipResp{Done: fmt.Sprintf("added %s as a voter; the group has %d voters", r.Addr, countVoters(vs)), Leader: m.s.Addr(), Voters: vs}, nil
}

// removeVoter removes the voter at r.Addr; the leader removing itself
// hands leadership to the most caught-up voter first and has the new
// leader remove it.
func (m *membership) removeVoter(ctx context.Context, r *rpc.MembershipReq) (*rpc.MembershipResp, error) {
	vs, err := m.voters()
	if err != nil {
		return nil, err
	}
	v, ok := find(vs, r.Addr)
	if !ok {
		return nil, rpc.Errorf(syscall.ENOENT, "remove voter %s: not a member of this metadata group (voters: %s); the configuration is unchanged", r.Addr, names(vs))
	}
	if v.Voter && countVoters(vs) == 1 {
		return nil, rpc.Errorf(syscall.EINVAL, "remove voter %s: it is the only voter; the configuration is unchanged", r.Addr)
	}
	if v.ID == m.s.node.ID() {
		start := time.Now()
		id, _, err := m.watch.Transfer("", "", applyTimeout)
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "remove voter %s (the leader): hand leadership over first: %v; the configuration is unchanged", r.Addr, err)
		}
		leader := m.rpcAddrOf(id)
		if leader == "" {
			return nil, rpc.NotLeader("", "remove voter %s: leadership went to %s, whose rpc address is unknown here; ask it", r.Addr, id)
		}
		var resp rpc.MembershipResp
		cctx, cancel := context.WithTimeout(ctx, applyTimeout)
		defer cancel()
		if err := m.callLeader(cctx, leader, rpc.MRemoveVoter, r, &resp); err != nil {
			return nil, fmt.Errorf("remove voter %s: handed leadership to %s, which did not remove it: %w", r.Addr, leader, err)
		}
		resp.Done = fmt.Sprintf("handed leadership to %s, then %s", leader, resp.Done)
		resp.TookNs = time.Since(start).Nanoseconds()
		return &resp, nil
	}
	if err := m.s.node.RemoveMember(v.ID, applyTimeout); err != nil {
		if errors.Is(err, consensus.ErrNotLeader) {
			return nil, err
		}
		return nil, rpc.Errorf(syscall.EIO, "remove voter %s: %v", r.Addr, err)
	}
	if vs, err = m.voters(); err != nil {
		return nil, err
	}
	m.s.log.Info("metadata voter removed", "addr", r.Addr, "raft_id", v.ID, "voters", countVoters(vs))
	return &rpc.MembershipResp{Done: fmt.Sprintf("removed %s; the group has %d voters", r.Addr, countVoters(vs)), Leader: m.s.Addr(), Voters: vs}, nil
}

// callLeader calls method on the new leader at addr, retrying while it
// is still taking office (bounded by ctx).
func (m *membership) callLeader(ctx context.Context, addr string, method rpc.Method, req, resp rpc.Message) error {
	for {
		err := m.s.peer(addr).Call(ctx, method, req, resp)
		if err == nil || !errors.Is(err, syscall.ENOTCONN) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// transferLeader hands leadership to r.Addr, or to the most caught-up
// voter, and waits until the new leader serves.
func (m *membership) transferLeader(ctx context.Context, r *rpc.MembershipReq) (*rpc.MembershipResp, error) {
	vs, err := m.voters()
	if err != nil {
		return nil, err
	}
	var id, raftAddr string
	if r.Addr != "" {
		v, ok := find(vs, r.Addr)
		if !ok || !v.Voter {
			return nil, rpc.Errorf(syscall.ENOENT, "transfer leadership to %s: not a voter of this metadata group (voters: %s)", r.Addr, names(vs))
		}
		if v.ID == m.s.node.ID() {
			return &rpc.MembershipResp{Done: fmt.Sprintf("%s is the leader already; nothing changed", m.s.Addr()), Leader: m.s.Addr(), Voters: vs}, nil
		}
		id, raftAddr = v.ID, v.RaftAddr
	}
	start := time.Now()
	from := m.s.Addr()
	nid, _, err := m.watch.Transfer(id, raftAddr, applyTimeout)
	switch {
	case errors.Is(err, consensus.ErrNoOtherVoter):
		return nil, rpc.Errorf(syscall.EINVAL, "transfer leadership: %s is the only voter; nobody to hand leadership to", from)
	case err != nil && errors.Is(err, consensus.ErrNotLeader):
		return nil, err
	case err != nil:
		return nil, rpc.Errorf(syscall.EIO, "transfer leadership from %s: %v", from, err)
	}
	leader := m.rpcAddrOf(nid)
	done := fmt.Sprintf("leadership moved from %s to %s", from, leader)
	if leader == "" {
		done = fmt.Sprintf("leadership moved from %s to raft server %s", from, nid)
	} else if err := m.waitServing(ctx, leader); err != nil {
		done += fmt.Sprintf(" (not yet serving: %v)", err)
	}
	m.s.log.Info("metadata leadership transferred", "from", from, "to", leader, "took", time.Since(start))
	return &rpc.MembershipResp{Done: done, Leader: leader, TookNs: time.Since(start).Nanoseconds()}, nil
}

// waitServing waits until the metadata service at addr leads and serves.
func (m *membership) waitServing(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	c := m.infoClient(addr)
	defer c.Close()
	for {
		info, err := askInfo(ctx, c)
		if err == nil && info.Serving {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%s is %s", addr, info.State)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}
