package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Member is one metadata voter as the admin commands find it: its rpc
// address, and its MMetaInfo answer or why there is none.
type Member struct {
	Address string
	Info    *rpc.MetaInfoResp // nil: unreachable (Err says why)
	Err     error
	// InConfig: the voter is in the raft configuration the leader (else
	// the voter with the newest term) knows; false for an address that
	// was given but is not a voter (removed, or another service).
	InConfig bool
}

// AskFunc asks the metadata service at addr for its MMetaInfo.
type AskFunc func(ctx context.Context, addr string) (*rpc.MetaInfoResp, error)

// ErrNoMetaInfo: the service answered MMetaInfo as an unknown method (an
// older build): it cannot describe its raft group.
var ErrNoMetaInfo = errors.New("the metadata service does not describe its raft group (an older build)")

// Members finds the metadata voters from seeds (addresses given by the
// user) and asks each for its MMetaInfo, in parallel, each call bounded by
// timeout: first the seeds, then the leader they name, then every voter
// of the leader's configuration not asked yet. The result lists the
// configuration's voters in its order, then the seeds that are not in it.
func Members(ctx context.Context, seeds []string, ask AskFunc, timeout time.Duration) []Member {
	got := map[string]*Member{}
	var order []string
	askAll := func(addrs []string) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, a := range addrs {
			if _, ok := got[a]; ok || a == "" {
				continue
			}
			m := &Member{Address: a}
			got[a] = m
			order = append(order, a)
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				info, err := ask(cctx, m.Address)
				if errors.Is(err, syscall.ENOSYS) {
					err = fmt.Errorf("%w: %v", ErrNoMetaInfo, err)
				}
				mu.Lock()
				m.Info, m.Err = info, err
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	askAll(seeds)
	leader := leaderInfo(got)
	if leader == nil {
		if l := namedLeader(got); l != "" {
			askAll([]string{l})
			leader = leaderInfo(got)
		}
	}
	conf := leader
	if conf == nil {
		conf = newestInfo(got)
	}
	if conf == nil {
		out := make([]Member, 0, len(order))
		for _, a := range order {
			out = append(out, *got[a])
		}
		return out
	}
	// The configuration's voters, matched to answers by raft id (a seed
	// may be written differently from the configuration's address).
	byID := map[string]*Member{}
	for _, m := range got {
		if m.Info != nil && m.Info.ID != "" {
			byID[m.Info.ID] = m
		}
	}
	var missing []string
	for _, v := range conf.Voters {
		if byID[v.ID] == nil && v.Addr != "" {
			missing = append(missing, v.Addr)
		}
	}
	askAll(missing)
	for _, m := range got {
		if m.Info != nil && m.Info.ID != "" {
			byID[m.Info.ID] = m
		}
	}
	var out []Member
	used := map[*Member]bool{}
	for _, v := range conf.Voters {
		if !v.Voter {
			continue
		}
		m := byID[v.ID]
		if m == nil {
			m = got[v.Addr]
		}
		if m == nil {
			// Its rpc address is unknown (a voter whose raft id is not
			// its address): it cannot be asked.
			m = &Member{Address: v.ID, Err: fmt.Errorf("rpc address of raft server %s (raft %s) unknown", v.ID, v.RaftAddr)}
		}
		used[m] = true
		c := *m
		if c.Info != nil && c.Info.Addr != "" {
			c.Address = c.Info.Addr
		} else if v.Addr != "" {
			c.Address = v.Addr
		}
		c.InConfig = true
		out = append(out, c)
	}
	for _, a := range order {
		if m := got[a]; !used[m] {
			out = append(out, *m)
		}
	}
	return out
}

// leaderInfo is the answer of the voter that says it leads, with the
// newest term (nil: none).
func leaderInfo(got map[string]*Member) *rpc.MetaInfoResp {
	var best *rpc.MetaInfoResp
	for _, m := range got {
		if m.Info != nil && m.Info.State == "leader" && (best == nil || m.Info.Term > best.Term) {
			best = m.Info
		}
	}
	return best
}

// newestInfo is the answer with the newest term (nil: no answer).
func newestInfo(got map[string]*Member) *rpc.MetaInfoResp {
	var best *rpc.MetaInfoResp
	for _, m := range got {
		if m.Info != nil && (best == nil || m.Info.Term > best.Term) {
			best = m.Info
		}
	}
	return best
}

// namedLeader is the leader address the answer with the newest term names.
func namedLeader(got map[string]*Member) string {
	var best *rpc.MetaInfoResp
	for _, m := range got {
		if m.Info != nil && m.Info.Leader != "" && (best == nil || m.Info.Term > best.Term) {
			best = m.Info
		}
	}
	if best == nil {
		return ""
	}
	return best.Leader
}

// LeaderChange is the last leader change a voter saw.
type LeaderChange struct {
	Time  string `json:"time"` // RFC 3339
	Cause string `json:"cause"`
	Voter string `json:"voter"` // the voter that saw it
}

// StateUnreachable is the state of a voter that did not answer.
const StateUnreachable = "unreachable"

// SetMembers fills the metadata part of the status document from the
// voters' answers (Members): the leader, the newest term, each voter of
// the configuration with its state, applied index and lag behind the
// leader, and the most recent leader change any of them saw. It reports
// false, changing nothing, when no voter answered.
func SetMembers(ms *MetaStatus, members []Member) bool {
	var leader *rpc.MetaInfoResp
	answered := false
	for _, m := range members {
		if m.Info == nil {
			continue
		}
		answered = true
		if m.Info.State == "leader" && (leader == nil || m.Info.Term > leader.Term) {
			leader = m.Info
		}
	}
	if !answered {
		return false
	}
	ms.Leader, ms.Term, ms.Voters, ms.LastLeaderChange = "", 0, []Voter{}, nil
	if leader != nil {
		ms.Leader = leader.Addr
	}
	unreachable := map[string]bool{}
	for _, m := range members {
		if m.Info == nil {
			unreachable[m.Address] = true
		}
	}
	var last *rpc.MetaInfoResp
	for _, m := range members {
		if m.Info != nil {
			ms.Term = max(ms.Term, m.Info.Term)
			// The leader a voter names, unless it did not answer (a dead
			// leader that its followers have not missed yet).
			if ms.Leader == "" && m.Info.Leader != "" && !unreachable[m.Info.Leader] {
				ms.Leader = m.Info.Leader
			}
			if m.Info.LeaderChangeNs != 0 && (last == nil || m.Info.LeaderChangeNs > last.LeaderChangeNs) {
				last = m.Info
			}
		}
		if !m.InConfig {
			continue
		}
		ms.Voters = append(ms.Voters, VoterOf(m, leader))
	}
	if last != nil {
		ms.LastLeaderChange = &LeaderChange{Time: time.Unix(0, last.LeaderChangeNs).UTC().Format(time.RFC3339Nano),
			Cause: last.LeaderChangeCause, Voter: last.Addr}
	}
	return true
}

// VoterOf is one voter's line of the document; leader is the leader's
// answer (nil: unknown) for the lag.
func VoterOf(m Member, leader *rpc.MetaInfoResp) Voter {
	v := Voter{Address: m.Address, State: StateUnreachable, Health: []string{}}
	if m.Err != nil {
		v.Error = m.Err.Error()
	}
	i := m.Info
	if i == nil {
		return v
	}
	v.State, v.AppliedIndex, v.Term = i.State, i.AppliedIndex, i.Term
	switch i.State {
	case "leader", "follower", "candidate":
	default:
		v.State = StateUnreachable // shutting down
	}
	if leader != nil {
		lag := uint64(0)
		if leader.AppliedIndex > i.AppliedIndex {
			lag = leader.AppliedIndex - i.AppliedIndex
		}
		v.Lag = &lag
	}
	if i.LastContactMs >= 0 {
		v.LastContactSeconds = ageSeconds(i.LastContactMs)
	}
	v.Health = append([]string{}, i.Health...)
	return v
}
