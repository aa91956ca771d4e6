package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// group is a fake set of voters answering MMetaInfo from a table
// (missing: unreachable), recording who was asked.
type group struct {
	mu    sync.Mutex
	infos map[string]*rpc.MetaInfoResp
	errs  map[string]error
	asked []string
}

func (g *group) ask(_ context.Context, addr string) (*rpc.MetaInfoResp, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked = append(g.asked, addr)
	if err := g.errs[addr]; err != nil {
		return nil, err
	}
	if i := g.infos[addr]; i != nil {
		return i, nil
	}
	return nil, fmt.Errorf("dial %s: connection refused", addr)
}

func voters(addrs ...string) []rpc.VoterInfo {
	var out []rpc.VoterInfo
	for _, a := range addrs {
		out = append(out, rpc.VoterInfo{ID: a, Addr: a, RaftAddr: a, Voter: true})
	}
	return out
}

// TestMembersFromOneFollower: given one follower's address, the leader it
// names and every voter of the leader's configuration are asked; the
// document lists them in the configuration's order with their lag; a dead
// voter is unreachable; a given address outside the configuration is
// listed apart; the newest leader change wins.
func TestMembersFromOneFollower(t *testing.T) {
	conf := voters("a:1", "b:2", "c:3")
	g := &group{infos: map[string]*rpc.MetaInfoResp{
		"a:1": {Addr: "a:1", ID: "a:1", State: "leader", Term: 5, AppliedIndex: 100, Leader: "a:1", Voters: conf,
			LeaderChangeNs: 1e18, LeaderChangeCause: "elected"},
		"b:2": {Addr: "b:2", ID: "b:2", State: "follower", Term: 5, AppliedIndex: 90, Leader: "a:1", Voters: conf[:2], LastContactMs: 40,
			LeaderChangeNs: 2e18, LeaderChangeCause: "leader lost: no contact for 1s"},
		// A removed voter that still runs: not in the configuration.
		"d:4": {Addr: "d:4", ID: "d:4", State: "follower", Term: 4, Voters: voters("a:1", "b:2", "d:4")},
	}}
	ms := Members(context.Background(), []string{"b:2", "d:4"}, g.ask, time.Second)
	if len(ms) != 4 || ms[0].Address != "a:1" || ms[1].Address != "b:2" || ms[2].Address != "c:3" || ms[3].Address != "d:4" {
		t.Fatalf("members %+v", ms)
	}
	if !ms[0].InConfig || !ms[2].InConfig || ms[3].InConfig || ms[2].Info != nil || ms[2].Err == nil {
		t.Fatalf("members %+v", ms)
	}
	var st MetaStatus
	if !SetMembers(&st, ms) {
		t.Fatal("SetMembers: no answer")
	}
	if st.Leader != "a:1" || st.Term != 5 || len(st.Voters) != 3 {
		t.Fatalf("status %+v", st)
	}
	a, b, c := st.Voters[0], st.Voters[1], st.Voters[2]
	if a.State != "leader" || a.Lag == nil || *a.Lag != 0 || b.State != "follower" || b.Lag == nil || *b.Lag != 10 ||
		b.LastContactSeconds == nil || *b.LastContactSeconds != 0.04 || b.AppliedIndex != 90 {
		t.Errorf("voters a %+v b %+v", a, b)
	}
	if c.State != StateUnreachable || c.Lag != nil || c.Error == "" || c.Health == nil {
		t.Errorf("dead voter %+v", c)
	}
	if st.LastLeaderChange == nil || st.LastLeaderChange.Voter != "b:2" || st.LastLeaderChange.Cause != "leader lost: no contact for 1s" {
		t.Errorf("last leader change %+v", st.LastLeaderChange)
	}
	for _, addr := range []string{"a:1", "b:2", "c:3", "d:4"} {
		n := 0
		for _, x := range g.asked {
			if x == addr {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s asked %d times (%v)", addr, n, g.asked)
		}
	}
}

// TestMembersMatchByID: a seed written otherwise than the configuration
// (localhost for 127.0.0.1) is one voter, not two; with no leader known
// the newest term's configuration counts and no lag is given.
func TestMembersMatchByID(t *testing.T) {
	conf := voters("127.0.0.1:7400", "127.0.0.1:7401")
	g := &group{infos: map[string]*rpc.MetaInfoResp{
		"localhost:7400": {Addr: "127.0.0.1:7400", ID: "127.0.0.1:7400", State: "candidate", Term: 7, Voters: conf},
		"127.0.0.1:7401": {Addr: "127.0.0.1:7401", ID: "127.0.0.1:7401", State: "follower", Term: 6, Voters: conf},
	}}
	ms := Members(context.Background(), []string{"localhost:7400"}, g.ask, time.Second)
	var st MetaStatus
	SetMembers(&st, ms)
	if len(ms) != 2 || st.Leader != "" || st.Term != 7 || len(st.Voters) != 2 || st.Voters[0].Address != "127.0.0.1:7400" ||
		st.Voters[0].State != "candidate" || st.Voters[0].Lag != nil {
		t.Fatalf("members %+v status %+v", ms, st)
	}
}

// TestMembersNoAnswer: nobody answers: the document is left as it was;
// an older service's ENOSYS says what it means.
func TestMembersNoAnswer(t *testing.T) {
	g := &group{errs: map[string]error{"old:1": rpc.Errorf(syscall.ENOSYS, "unknown method")}}
	ms := Members(context.Background(), []string{"old:1", "dead:2"}, g.ask, time.Second)
	if len(ms) != 2 || !errors.Is(ms[0].Err, ErrNoMetaInfo) || ms[1].Err == nil {
		t.Fatalf("members %+v", ms)
	}
	st := MetaStatus{Leader: "old:1", Voters: []Voter{{Address: "old:1", State: "leader"}}}
	if SetMembers(&st, ms) || st.Leader != "old:1" || len(st.Voters) != 1 {
		t.Fatalf("SetMembers without answers changed %+v", st)
	}
}

// TestMembersDeadLeader: a leader its followers still name but that does
// not answer is not shown as the leader.
func TestMembersDeadLeader(t *testing.T) {
	conf := voters("a:1", "b:2")
	g := &group{infos: map[string]*rpc.MetaInfoResp{
		"b:2": {Addr: "b:2", ID: "b:2", State: "follower", Term: 3, Leader: "a:1", Voters: conf},
	}}
	var st MetaStatus
	SetMembers(&st, Members(context.Background(), []string{"a:1", "b:2"}, g.ask, time.Second))
	if st.Leader != "" || len(st.Voters) != 2 || st.Voters[0].State != StateUnreachable || st.Voters[1].State != "follower" {
		t.Fatalf("status %+v", st)
	}
}
