package rpc

import "fmt"

// Messages of the metadata group's membership methods (MMetaInfo,
// MAddVoter, MRemoveVoter, MTransferLeader).

// VoterInfo is one server of a raft configuration. Addr is its rpc
// address ("" when the answering voter cannot tell it: a voter whose raft
// id is not its rpc address), RaftAddr the address raft dials (the same
// as Addr in a group whose raft traffic shares the rpc port).
type VoterInfo struct {
	ID       string
	Addr     string
	RaftAddr string
	Voter    bool // false: a non-voting member
}

func (v *VoterInfo) Encode(e *Enc) {
	e.String(v.ID)
	e.String(v.Addr)
	e.String(v.RaftAddr)
	e.Bool(v.Voter)
}

func (v *VoterInfo) Decode(d *Dec) {
	v.ID = d.String()
	v.Addr = d.String()
	v.RaftAddr = d.String()
	v.Voter = d.Bool()
}

// MaxVoters bounds the servers of one configuration in an answer.
const MaxVoters = 64

func encodeVoters(e *Enc, vs []VoterInfo) {
	e.U64(uint64(len(vs)))
	for i := range vs {
		vs[i].Encode(e)
	}
}

func decodeVoters(d *Dec) []VoterInfo {
	n := d.Count()
	if n > MaxVoters {
		d.Fail(fmt.Errorf("%w: %d servers in a configuration; at most %d", ErrMalformed, n, MaxVoters))
		return nil
	}
	if n == 0 {
		return nil
	}
	vs := make([]VoterInfo, n)
	for i := range vs {
		vs[i].Decode(d)
	}
	return vs
}

// MetaInfoResp answers MMetaInfo: the answering voter's view of its raft
// group.
type MetaInfoResp struct {
	Addr     string // this voter's rpc address
	ID       string // its raft server id
	RaftAddr string // its raft transport address
	State    string // leader, follower, candidate or shutdown
	Term     uint64
	// AppliedIndex: the last log index its state machine applied;
	// CommitIndex: the last it knows committed; LastIndex: the last in its
	// log.
	AppliedIndex uint64
	CommitIndex  uint64
	LastIndex    uint64
	// Leader is the leader's rpc address as this voter knows it (LeaderID
	// its raft id); "" while it knows none.
	Leader   string
	LeaderID string
	// Voters is the latest raft configuration this voter knows.
	Voters []VoterInfo
	// LastContactMs: milliseconds since a leader last contacted this
	// voter; 0 on the leader, -1 never.
	LastContactMs int64
	// LeaderChangeNs (ns since the Unix epoch; 0: none seen since it
	// started) and LeaderChangeCause: the last leader change this voter
	// saw (a leader elected or lost) and why.
	LeaderChangeNs    int64
	LeaderChangeCause string
	// Health lists what keeps this voter's stores from working (empty:
	// healthy).
	Health []string
	// Serving: this voter leads and has caught up, so it answers the
	// leader-only requests.
	Serving bool
}

func (m *MetaInfoResp) Encode(e *Enc) {
	e.String(m.Addr)
	e.String(m.ID)
	e.String(m.RaftAddr)
	e.String(m.State)
	e.U64(m.Term)
	e.U64(m.AppliedIndex)
	e.U64(m.CommitIndex)
	e.U64(m.LastIndex)
	e.String(m.Leader)
	e.String(m.LeaderID)
	encodeVoters(e, m.Voters)
	e.I64(m.LastContactMs)
	e.I64(m.LeaderChangeNs)
	e.String(m.LeaderChangeCause)
	e.Strings(m.Health)
	e.Bool(m.Serving)
}

func (m *MetaInfoResp) Decode(d *Dec) {
	m.Addr = d.String()
	m.ID = d.String()
	m.RaftAddr = d.String()
	m.State = d.String()
	m.Term = d.U64()
	m.AppliedIndex = d.U64()
	m.CommitIndex = d.U64()
	m.LastIndex = d.U64()
	m.Leader = d.String()
	m.LeaderID = d.String()
	m.Voters = decodeVoters(d)
	m.LastContactMs = d.I64()
	m.LeaderChangeNs = d.I64()
	m.LeaderChangeCause = d.String()
	m.Health = d.Strings()
	m.Serving = d.Bool()
}

// MembershipReq asks the leader to add or remove the voter at Addr (its
// rpc address), or to hand leadership to it (MTransferLeader; Addr "":
// to the most caught-up voter).
type MembershipReq struct{ Addr string }

func (m *MembershipReq) Encode(e *Enc) { e.String(m.Addr) }
func (m *MembershipReq) Decode(d *Dec) { m.Addr = d.String() }

// MembershipResp says what a membership change did: Done in words, the
// leader after it (rpc address), the configuration after it, and how long
// it took.
type MembershipResp struct {
	Done   string
	Leader string
	Voters []VoterInfo
	TookNs int64
}

func (m *MembershipResp) Encode(e *Enc) {
	e.String(m.Done)
	e.String(m.Leader)
	encodeVoters(e, m.Voters)
	e.I64(m.TookNs)
}

func (m *MembershipResp) Decode(d *Dec) {
	m.Done = d.String()
	m.Leader = d.String()
	m.Voters = decodeVoters(d)
	m.TookNs = d.I64()
}
