package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// startMeta runs a single metadata voter in this process and returns its
// address and the key file that reaches it.
func startMeta(t *testing.T) (addr, keyFile string) {
	t.Helper()
	key := []byte("metaadmin-test-key")
	keyFile = filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	// A long failover timeout: the mirror commands' tests register servers
	// that never heartbeat, and drive every switch themselves.
	s, err := meta.Open(meta.Config{DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", ClusterKey: key, FailoverTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.Addr(), keyFile
}

// deadAddr is a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

// TestStatusJSONMetaMember: strata status --json's "meta" member is the
// interface contract: leader (string), term (number), voters (address,
// state, applied_index) — with a real single voter.
func TestStatusJSONMetaMember(t *testing.T) {
	addr, key := startMeta(t)
	out, errOut, code := strata(t, nil, "status", "--json", "--meta", addr, "--key-file", key)
	if code != 0 {
		t.Fatalf("strata status --json: exit %d\n%s", code, errOut)
	}
	var doc struct {
		Meta map[string]json.RawMessage `json:"meta"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var leader string
	var term uint64
	var voters []map[string]any
	for name, v := range map[string]any{"leader": &leader, "term": &term, "voters": &voters} {
		if err := json.Unmarshal(doc.Meta[name], v); err != nil {
			t.Fatalf("meta.%s = %s: %v", name, doc.Meta[name], err)
		}
	}
	if leader != addr || term == 0 || len(voters) != 1 {
		t.Fatalf("meta: leader %q term %d voters %v", leader, term, voters)
	}
	v := voters[0]
	applied, ok := v["applied_index"].(float64)
	if v["address"] != addr || v["state"] != "leader" || !ok || applied < 1 {
		t.Fatalf("voter %v", v)
	}

	out, errOut, code = strata(t, nil, "status", "--meta", addr, "--key-file", key)
	if code != 0 || !strings.Contains(out, "leader "+addr+", term ") || !strings.Contains(out, "last leader change") ||
		!strings.Contains(out, "elected") {
		t.Fatalf("strata status: exit %d, no metadata section\n%s%s", code, out, errOut)
	}
}

// TestMetaMembersCommands: members lists the voter (also when --meta
// names an unreachable address first); add-voter of an unreachable
// address and remove-voter of an unknown one fail with a clear message
// and leave the configuration as it was; a not-the-leader answer is
// followed to the leader it names.
func TestMetaMembersCommands(t *testing.T) {
	addr, key := startMeta(t)
	dead := deadAddr(t)
	list := dead + "," + addr

	out, errOut, code := strata(t, nil, "meta", "members", "--meta", list, "--key-file", key)
	if code != 0 {
		t.Fatalf("members: exit %d\n%s", code, errOut)
	}
	if !strings.Contains(out, "VOTER") || !regexpLine(out, addr+` +leader +\d+ +\d+ +0 `) ||
		!strings.Contains(out, dead+" was given but is not a voter: unreachable") {
		t.Fatalf("members:\n%s", out)
	}
	members := func() membersDoc {
		t.Helper()
		out, errOut, code := strata(t, nil, "meta", "members", "--json", "--meta", addr, "--key-file", key)
		var d membersDoc
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil {
			t.Fatalf("members --json: exit %d %v\n%s%s", code, err, out, errOut)
		}
		return d
	}
	if d := members(); d.Leader != addr || len(d.Voters) != 1 || d.LastLeaderChange == nil {
		t.Fatalf("members --json: %+v", d)
	}

	for _, tc := range []struct {
		args []string
		says []string
	}{
		{[]string{"add-voter", dead}, []string{"add-voter", "cannot reach a metadata service", dead, "configuration is unchanged"}},
		{[]string{"remove-voter", "127.0.0.1:1"}, []string{"remove-voter", "127.0.0.1:1", "not a member", addr, "configuration is unchanged"}},
		{[]string{"transfer-leader"}, []string{"only voter"}},
		{[]string{"transfer-leader", "127.0.0.1:1"}, []string{"not a voter"}},
	} {
		args := append(append([]string{"meta"}, tc.args...), "--meta", list, "--key-file", key)
		out, errOut, code := strata(t, nil, args...)
		if code != 1 {
			t.Errorf("strata %s: exit %d, want 1\n%s%s", strings.Join(tc.args, " "), code, out, errOut)
		}
		for _, s := range tc.says {
			if !strings.Contains(errOut, s) {
				t.Errorf("strata %s: stderr does not say %q:\n%s", strings.Join(tc.args, " "), s, errOut)
			}
		}
	}
	if d := members(); len(d.Voters) != 1 || d.Voters[0].Address != addr || d.Voters[0].State != "leader" {
		t.Fatalf("configuration changed: %+v", d)
	}
	for _, args := range [][]string{{"meta", "add-voter"}, {"meta", "remove-voter", "a:1", "b:2"}, {"meta", "transfer-leader", "a:1", "b:2"}} {
		if _, errOut, code := strata(t, nil, args...); code != 2 {
			t.Errorf("strata %s: exit %d, want 2 (usage)\n%s", strings.Join(args, " "), code, errOut)
		}
	}

	// A voter that is not the leader names it: the command follows.
	follower := notLeaderServer(t, addr, key)
	_, errOut, code = strata(t, nil, "meta", "transfer-leader", "--meta", follower, "--key-file", key)
	if code != 1 || !strings.Contains(errOut, "only voter") {
		t.Fatalf("transfer-leader via a follower: exit %d, want the leader's refusal\n%s", code, errOut)
	}
}

// notLeaderServer serves membership requests by answering "not the
// leader, see leader", as a follower does.
func notLeaderServer(t *testing.T, leader, keyFile string) string {
	t.Helper()
	key, err := readKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer(key)
	refuse := func(context.Context, *rpc.MembershipReq) (*rpc.MembershipResp, error) {
		return nil, rpc.NotLeader(leader, "not the leader")
	}
	for _, m := range []rpc.Method{rpc.MAddVoter, rpc.MRemoveVoter, rpc.MTransferLeader} {
		transport.Handle(srv, m, refuse)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// regexpLine reports whether some line of out matches re.
func regexpLine(out, re string) bool {
	r := regexp.MustCompile(re)
	for _, l := range strings.Split(out, "\n") {
		if r.MatchString(l) {
			return true
		}
	}
	return false
}

// TestPrintMembersUnreachable: the table shows each voter's lag and last
// contact, and an unreachable voter's row says so and why.
func TestPrintMembersUnreachable(t *testing.T) {
	lag0, lag3, contact := uint64(0), uint64(3), 0.25
	zero := 0.0
	st := admin.MetaStatus{Leader: "a:1", Term: 4, Voters: []admin.Voter{
		{Address: "a:1", State: "leader", Term: 4, AppliedIndex: 10, Lag: &lag0, LastContactSeconds: &zero},
		{Address: "b:2", State: "follower", Term: 4, AppliedIndex: 7, Lag: &lag3, LastContactSeconds: &contact, Health: []string{"raft log: sync failed"}},
		{Address: "c:3", State: admin.StateUnreachable, Error: "dial tcp c:3: connection refused"},
	}}
	var out bytes.Buffer
	printMembers(&out, st, nil)
	s := out.String()
	for _, re := range []string{`^a:1 +leader +4 +10 +0 +-$`, `^b:2 +follower +4 +7 +3 +250ms ago$`, `FAILING: raft log: sync failed`,
		`^c:3 +unreachable +- +- +- +dial tcp c:3: connection refused$`, `^leader a:1, term 4$`} {
		if !regexpLine(s, re) {
			t.Errorf("members table has no line matching %q:\n%s", re, s)
		}
	}
}
