package meta_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
	"github.com/stratafs/strata/internal/transport"
)

const dirMode = 0o40755

// open starts a single-voter service (Open) on listen with raft id id
// ("" random).
func open(t *testing.T, listen, id string) *meta.Service {
	t.Helper()
	s, err := meta.Open(meta.Config{DataDir: t.TempDir(), ListenAddr: listen, NodeID: id, ClusterKey: meta.TestKey, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mkdir makes a directory in the root through the service at addr, as a
// client would (a session, then a create).
func mkdir(addr, name string) error {
	var sess rpc.SessionOpenResp
	if err := adminCall(addr, rpc.MSessionOpen, &rpc.SessionOpenReq{Host: "t", MountPoint: "/t", Pid: 1}, &sess); err != nil {
		return err
	}
	var r rpc.ChangeResp
	return adminCall(addr, rpc.MCreate, &rpc.CreateReq{Hdr: rpc.ReqHeader{ClientID: sess.ClientID, Seq: 1}, Parent: 1, Name: name, Mode: dirMode}, &r)
}

func mustMkdir(t *testing.T, addr, name string) {
	t.Helper()
	// A voter raft just made leader answers not-leader until its service
	// has taken office (sessions and locks loaded): slow under load, and
	// a client retries, so the test does too, for a bounded time.
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := mkdir(addr, name)
		if err == nil {
			return
		}
		if !errors.Is(err, meta.ErrNotLeader) || time.Now().After(deadline) {
			t.Fatalf("mkdir %s on %s: %v", name, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adminCall calls method at addr as the admin commands do.
func adminCall(addr string, method rpc.Method, req, resp rpc.Message) error {
	c := transport.NewClient(addr, transport.ClientConfig{Key: meta.TestKey, Conns: 1, DialTimeout: time.Second, CallTimeout: 20 * time.Second})
	defer c.Close()
	return c.Call(context.Background(), method, req, resp)
}

func metaInfo(t *testing.T, addr string) *rpc.MetaInfoResp {
	t.Helper()
	var r rpc.MetaInfoResp
	if err := adminCall(addr, rpc.MMetaInfo, &rpc.Empty{}, &r); err != nil {
		t.Fatalf("meta info of %s: %v", addr, err)
	}
	return &r
}

func askInfo(ctx context.Context, addr string) (*rpc.MetaInfoResp, error) {
	c := transport.NewClient(addr, transport.ClientConfig{Key: meta.TestKey, Conns: 1, DialTimeout: time.Second})
	defer c.Close()
	var r rpc.MetaInfoResp
	if err := c.Call(ctx, rpc.MMetaInfo, &rpc.Empty{}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// voterAddrs lists a configuration's rpc addresses.
func voterAddrs(vs []rpc.VoterInfo) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Addr)
	}
	return strings.Join(out, ",")
}

// waitFor polls cond for up to 15 s.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetaInfoSingleVoter: today's single voter (random raft id, raft
// port of its own) describes itself by its rpc address; the membership
// changes that would break it are refused with the configuration
// unchanged; /metrics shows the raft gauges.
func TestMetaInfoSingleVoter(t *testing.T) {
	s := open(t, "127.0.0.1:0", "")
	mustMkdir(t, s.Addr(), "d")

	i := metaInfo(t, s.Addr())
	if i.Addr != s.Addr() || !strings.HasPrefix(i.ID, "meta-") || i.RaftAddr != s.RaftAddr() || i.State != "leader" || !i.Serving ||
		i.Leader != s.Addr() || i.LeaderID != i.ID || i.Term == 0 || i.AppliedIndex == 0 || i.CommitIndex < i.AppliedIndex ||
		i.LastIndex < i.CommitIndex || i.LastContactMs != 0 || len(i.Health) != 0 {
		t.Fatalf("meta info %+v", i)
	}
	if len(i.Voters) != 1 || i.Voters[0].Addr != s.Addr() || i.Voters[0].ID != i.ID || !i.Voters[0].Voter {
		t.Fatalf("voters %+v", i.Voters)
	}
	if i.LeaderChangeCause != "elected" || time.Since(time.Unix(0, i.LeaderChangeNs)) > time.Minute {
		t.Fatalf("last leader change %q at %v", i.LeaderChangeCause, time.Unix(0, i.LeaderChangeNs))
	}

	var resp rpc.MembershipResp
	err := adminCall(s.Addr(), rpc.MTransferLeader, &rpc.MembershipReq{}, &resp)
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "only voter") {
		t.Errorf("transfer in a group of one: %v", err)
	}
	err = adminCall(s.Addr(), rpc.MRemoveVoter, &rpc.MembershipReq{Addr: s.Addr()}, &resp)
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "only voter") {
		t.Errorf("removing the only voter: %v", err)
	}
	err = adminCall(s.Addr(), rpc.MRemoveVoter, &rpc.MembershipReq{Addr: "127.0.0.1:1"}, &resp)
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "not a member") || !strings.Contains(err.Error(), s.Addr()) {
		t.Errorf("removing an unknown voter: %v", err)
	}
	dead := testutil.FreePort(t)
	err = adminCall(s.Addr(), rpc.MAddVoter, &rpc.MembershipReq{Addr: dead}, &resp)
	if !errors.Is(err, syscall.EHOSTUNREACH) || !strings.Contains(err.Error(), "cannot reach") || !strings.Contains(err.Error(), "unchanged") {
		t.Errorf("adding an unreachable voter: %v", err)
	}
	err = adminCall(s.Addr(), rpc.MAddVoter, &rpc.MembershipReq{Addr: "nonsense"}, &resp)
	if !errors.Is(err, syscall.EINVAL) {
		t.Errorf("adding a non-address: %v", err)
	}
	if i := metaInfo(t, s.Addr()); len(i.Voters) != 1 || i.State != "leader" {
		t.Fatalf("after the refused changes: %+v", i)
	}
	mustMkdir(t, s.Addr(), "e") // still serving: no voter was added that it waits for

	// Another group's voter is refused.
	other := open(t, "127.0.0.1:0", "")
	err = adminCall(s.Addr(), rpc.MAddVoter, &rpc.MembershipReq{Addr: other.Addr()}, &resp)
	if !errors.Is(err, syscall.EEXIST) || !strings.Contains(err.Error(), "another metadata group") {
		t.Errorf("adding another group's voter: %v", err)
	}

	body := testutil.ScrapeMetrics(t, s.MetricsAddr())
	for _, want := range []string{"strata_meta_raft_is_leader 1", "strata_meta_raft_voters 1",
		fmt.Sprintf("strata_meta_raft_term %d", i.Term), `strata_meta_raft_leader_changes_total{cause="elected"} 1`,
		"strata_meta_raft_applied_index ", "strata_meta_raft_commit_index ", "strata_meta_raft_last_leader_change_timestamp_seconds "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The status document's "meta" member.
	var st admin.MetaStatus
	if !admin.SetMembers(&st, admin.Members(context.Background(), []string{s.Addr()}, askInfo, 3*time.Second)) {
		t.Fatal("no voter answered")
	}
	if st.Leader != s.Addr() || st.Term != i.Term || len(st.Voters) != 1 || st.Voters[0].Address != s.Addr() ||
		st.Voters[0].State != "leader" || st.Voters[0].AppliedIndex == 0 || st.Voters[0].Lag == nil || *st.Voters[0].Lag != 0 ||
		st.LastLeaderChange == nil || st.LastLeaderChange.Cause != "elected" {
		t.Fatalf("status meta %+v", st)
	}
}

// TestMembershipThreeVoters: three real voters in one process. The
// leader adds two (meta-level), members lists them, transfer-leader moves
// leadership and a create works on the new leader, a follower refuses
// membership changes naming the leader, remove-voter of the leader
// itself hands over first and shrinks the configuration, add-voter adds
// it back, and a killed voter shows as unreachable.
func TestMembershipThreeVoters(t *testing.T) {
	addrA := testutil.FreePort(t)
	a := open(t, addrA, addrA)
	b := meta.OpenVoter(t, testutil.FreePort(t))
	c := meta.OpenVoter(t, testutil.FreePort(t))
	byAddr := map[string]*meta.Service{a.Addr(): a, b.Addr(): b, c.Addr(): c}

	// Add b and c through whichever voter leads: on a loaded machine a
	// group of two may lose its leader while it grows (an election, as it
	// should), and a change sent to a follower is refused naming the
	// leader, which is then asked.
	for _, v := range []*meta.Service{b, c} {
		var resp rpc.MembershipResp
		to := a.Addr()
		waitFor(t, "add voter "+v.Addr(), func() error {
			err := adminCall(to, rpc.MAddVoter, &rpc.MembershipReq{Addr: v.Addr()}, &resp)
			if h := rpc.LeaderHint(err); errors.Is(err, syscall.ENOTCONN) && h != "" {
				to = h
			}
			return err
		})
		if !strings.Contains(resp.Done, "added "+v.Addr()) && !strings.Contains(resp.Done, "already a voter") {
			t.Fatalf("add voter answered %+v", resp)
		}
	}
	// The rest of the test starts from a leading: hand leadership back
	// if an election moved it.
	waitFor(t, "a leads", func() error {
		i := metaInfo(t, a.Addr())
		if i.State == "leader" && i.Serving {
			return nil
		}
		if i.Leader == "" {
			return errors.New("no leader known")
		}
		var resp rpc.MembershipResp
		if err := adminCall(i.Leader, rpc.MTransferLeader, &rpc.MembershipReq{Addr: a.Addr()}, &resp); err != nil {
			return fmt.Errorf("transfer to %s: %w", a.Addr(), err)
		}
		return fmt.Errorf("leadership handed back (%s)", resp.Done)
	})
	var resp rpc.MembershipResp
	if err := adminCall(a.Addr(), rpc.MAddVoter, &rpc.MembershipReq{Addr: b.Addr()}, &resp); err != nil || !strings.Contains(resp.Done, "already a voter") {
		t.Fatalf("adding a voter twice: %+v %v", resp, err)
	}
	want := strings.Join([]string{a.Addr(), b.Addr(), c.Addr()}, ",")
	for _, s := range []*meta.Service{a, b, c} {
		waitFor(t, "every voter knows the configuration and the leader", func() error {
			i := metaInfo(t, s.Addr())
			if voterAddrs(i.Voters) != want || i.Leader != a.Addr() || i.AppliedIndex < metaInfo(t, a.Addr()).CommitIndex {
				return fmt.Errorf("%s: voters %s leader %s applied %d", s.Addr(), voterAddrs(i.Voters), i.Leader, i.AppliedIndex)
			}
			return nil
		})
	}
	// members, from one address: every voter, the leader first in
	// configuration order.
	ms := admin.Members(context.Background(), []string{c.Addr()}, askInfo, 3*time.Second)
	var st admin.MetaStatus
	admin.SetMembers(&st, ms)
	if st.Leader != a.Addr() || len(st.Voters) != 3 {
		t.Fatalf("members: %+v", st)
	}
	for i, v := range st.Voters {
		wantState := "follower"
		if i == 0 {
			wantState = "leader"
		}
		if v.Address != strings.Split(want, ",")[i] || v.State != wantState || v.Lag == nil || v.LastContactSeconds == nil {
			t.Errorf("voter %d: %+v", i, v)
		}
	}

	// A follower refuses, naming the leader.
	err := adminCall(b.Addr(), rpc.MTransferLeader, &rpc.MembershipReq{}, &resp)
	if !errors.Is(err, syscall.ENOTCONN) || rpc.LeaderHint(err) != a.Addr() {
		t.Fatalf("transfer sent to a follower: %v (hint %q)", err, rpc.LeaderHint(err))
	}

	// transfer-leader: to the most caught-up voter.
	if err := adminCall(a.Addr(), rpc.MTransferLeader, &rpc.MembershipReq{}, &resp); err != nil {
		t.Fatalf("transfer: %v", err)
	}
	nl := byAddr[resp.Leader]
	if nl == nil || nl == a || !strings.Contains(resp.Done, "moved from "+a.Addr()+" to "+nl.Addr()) || resp.TookNs <= 0 {
		t.Fatalf("transfer answered %+v", resp)
	}
	if i := metaInfo(t, nl.Addr()); i.State != "leader" || !i.Serving || i.LeaderChangeCause != "transfer" {
		t.Fatalf("new leader's info %+v", i)
	}
	if i := metaInfo(t, a.Addr()); i.State != "follower" || i.LeaderChangeCause != "transfer" {
		t.Fatalf("old leader's info %+v", i)
	}
	mustMkdir(t, nl.Addr(), "after-transfer")
	if err := mkdir(a.Addr(), "on-old-leader"); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("old leader answers %v", err)
	}

	// transfer-leader to a named voter.
	var target *meta.Service
	for _, s := range []*meta.Service{a, b, c} {
		if s != nl {
			target = s
			break
		}
	}
	if err := adminCall(nl.Addr(), rpc.MTransferLeader, &rpc.MembershipReq{Addr: target.Addr()}, &resp); err != nil || resp.Leader != target.Addr() {
		t.Fatalf("transfer to %s: %+v %v", target.Addr(), resp, err)
	}
	nl = target

	// remove-voter of the leader itself: handed over first.
	if err := adminCall(nl.Addr(), rpc.MRemoveVoter, &rpc.MembershipReq{Addr: nl.Addr()}, &resp); err != nil {
		t.Fatalf("remove the leader: %v", err)
	}
	removed := nl
	if resp.Leader == removed.Addr() || byAddr[resp.Leader] == nil || !strings.Contains(resp.Done, "handed leadership to "+resp.Leader) ||
		len(resp.Voters) != 2 || strings.Contains(voterAddrs(resp.Voters), removed.Addr()) {
		t.Fatalf("remove the leader answered %+v", resp)
	}
	nl = byAddr[resp.Leader]
	if i := metaInfo(t, nl.Addr()); len(i.Voters) != 2 || i.State != "leader" {
		t.Fatalf("after removing %s: %+v", removed.Addr(), i)
	}
	mustMkdir(t, nl.Addr(), "after-remove")

	// add-voter adds it back.
	if err := adminCall(nl.Addr(), rpc.MAddVoter, &rpc.MembershipReq{Addr: removed.Addr()}, &resp); err != nil || len(resp.Voters) != 3 {
		t.Fatalf("add %s back: %+v %v", removed.Addr(), resp, err)
	}
	waitFor(t, "the voter added back catches up", func() error {
		i := metaInfo(t, removed.Addr())
		if i.State != "follower" || i.Leader != nl.Addr() || len(i.Voters) != 3 {
			return fmt.Errorf("%+v", i)
		}
		return nil
	})

	// A killed voter (a follower) is unreachable; the others still serve.
	var victim *meta.Service
	for _, s := range []*meta.Service{a, b, c} {
		if s != nl {
			victim = s
		}
	}
	victim.Close()
	ms = admin.Members(context.Background(), []string{nl.Addr()}, askInfo, 2*time.Second)
	st = admin.MetaStatus{}
	admin.SetMembers(&st, ms)
	if len(st.Voters) != 3 || st.Leader != nl.Addr() {
		t.Fatalf("after killing %s: %+v", victim.Addr(), st)
	}
	for _, v := range st.Voters {
		switch {
		case v.Address == victim.Addr() && (v.State != admin.StateUnreachable || v.Error == "" || v.Lag != nil):
			t.Errorf("killed voter: %+v", v)
		case v.Address != victim.Addr() && v.State == admin.StateUnreachable:
			t.Errorf("live voter: %+v", v)
		}
	}
	mustMkdir(t, nl.Addr(), "after-kill")
}
