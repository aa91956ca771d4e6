package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// membersJSON is strata meta members --json, and the "meta" member of
// strata status --json.
type membersJSON struct {
	Leader string `json:"leader"`
	Term   uint64 `json:"term"`
	Voters []struct {
		Address      string `json:"address"`
		State        string `json:"state"`
		AppliedIndex uint64 `json:"applied_index"`
		Lag          *uint64
	} `json:"voters"`
	LastLeaderChange *struct {
		Time, Cause, Voter string
	} `json:"last_leader_change"`
}

// states is "addr=state,..." in the document's order.
func (m membersJSON) states() string {
	var out []string
	for _, v := range m.Voters {
		out = append(out, v.Address+"="+v.State)
	}
	return strings.Join(out, ",")
}

// TestMetaMembersRealVoters: three `strata meta --peers` processes, and
// the membership commands as an administrator runs them: members lists
// the voters; transfer-leader moves leadership and says to whom;
// remove-voter of the leader hands over first and shrinks the group;
// add-voter adds the voter back; an unreachable address is refused with
// the group unchanged; a voter killed with -9 shows as unreachable in
// members and in strata status --json. Skipped by a strata whose meta has
// no --peers (a single voter only).
func TestMetaMembersRealVoters(t *testing.T) {
	bin := testutil.Binary(t)
	if out, _ := exec.Command(bin, "meta", "--help").CombinedOutput(); !strings.Contains(string(out), "--peers") {
		t.Skip("this strata's meta has no --peers: no multi-voter group to test")
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("members-e2e-key"), 0o600); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for i := 0; i < 3; i++ {
		addrs = append(addrs, testutil.FreePort(t))
	}
	peers := strings.Join(addrs, ",")
	procs := map[string]*testutil.Proc{}
	for i, a := range addrs {
		procs[a] = testutil.StartProc(t, dir, fmt.Sprintf("meta%d", i), nil, bin, "meta", "--listen", a,
			"--data", filepath.Join(dir, fmt.Sprintf("meta%d", i)), "--peers", peers, "--key-file", key)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.Kill()
		}
	})
	strata := func(args ...string) (string, int) {
		t.Helper()
		return run(t, bin, dir, append(args, "--key-file", key)...)
	}
	membersErr := func() (membersJSON, error) {
		out, code := strata("meta", "members", "--json", "--meta", peers)
		var m membersJSON
		if err := json.Unmarshal([]byte(out), &m); code != 0 || err != nil {
			return m, fmt.Errorf("meta members --json: exit %d, %v\n%s", code, err, out)
		}
		return m, nil
	}
	members := func() membersJSON {
		t.Helper()
		m, err := membersErr()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var m membersJSON
	if err := testutil.WaitFor(20*time.Second, func() error {
		var err error
		if m, err = membersErr(); err != nil {
			return err
		}
		if m.Leader == "" || len(m.Voters) != 3 || strings.Contains(m.states(), "unreachable") || strings.Contains(m.states(), "candidate") {
			return fmt.Errorf("members: leader %q, %s", m.Leader, m.states())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	out, code := strata("meta", "members", "--meta", addrs[0])
	if code != 0 || !strings.Contains(out, "leader "+m.Leader+", term ") || strings.Count(out, "follower") != 2 {
		t.Fatalf("meta members (one address given): exit %d\n%s", code, out)
	}

	// A planned switch.
	old := m.Leader
	out, code = strata("meta", "transfer-leader", "--meta", peers)
	if code != 0 || !strings.Contains(out, "leadership moved from "+old+" to ") {
		t.Fatalf("transfer-leader: exit %d\n%s", code, out)
	}
	m = members()
	if m.Leader == old || m.Leader == "" || !strings.Contains(out, "leader: "+m.Leader) || m.LastLeaderChange == nil || m.LastLeaderChange.Cause != "transfer" {
		t.Fatalf("after transfer-leader (%s): %+v", out, m)
	}

	// strata status --json of the leader: the "meta" member.
	out, code = strata("status", "--json", "--meta", m.Leader)
	var st struct {
		Meta membersJSON `json:"meta"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Meta.Leader != m.Leader || st.Meta.states() != m.states() || st.Meta.Term == 0 {
		t.Fatalf("status --json: exit %d %v: %+v\n%s", code, err, st.Meta, out)
	}

	// Remove the leader: it hands over first.
	gone := m.Leader
	out, code = strata("meta", "remove-voter", gone, "--meta", peers)
	if code != 0 || !strings.Contains(out, "handed leadership to ") || !strings.Contains(out, "removed "+gone) {
		t.Fatalf("remove-voter %s (the leader): exit %d\n%s", gone, code, out)
	}
	m = members()
	if len(m.Voters) != 2 || strings.Contains(m.states(), gone) || m.Leader == gone || m.Leader == "" {
		t.Fatalf("after remove-voter %s: %+v", gone, m)
	}

	// Refused: an address where nothing answers; an unknown voter.
	dead := testutil.FreePort(t)
	out, code = strata("meta", "add-voter", dead, "--meta", peers)
	if code != 1 || !strings.Contains(out, "cannot reach") || !strings.Contains(out, "unchanged") {
		t.Fatalf("add-voter %s (nothing there): exit %d\n%s", dead, code, out)
	}
	out, code = strata("meta", "remove-voter", dead, "--meta", peers)
	if code != 1 || !strings.Contains(out, "not a member") {
		t.Fatalf("remove-voter %s (unknown): exit %d\n%s", dead, code, out)
	}
	if m2 := members(); len(m2.Voters) != 2 {
		t.Fatalf("a refused change changed the group: %+v", m2)
	}

	// Add the removed voter back.
	out, code = strata("meta", "add-voter", gone, "--meta", peers)
	if code != 0 || !strings.Contains(out, "added "+gone) {
		t.Fatalf("add-voter %s: exit %d\n%s", gone, code, out)
	}
	if err := testutil.WaitFor(20*time.Second, func() error {
		m = members()
		if len(m.Voters) != 3 || strings.Contains(m.states(), "unreachable") || !strings.Contains(m.states(), gone+"=follower") {
			return fmt.Errorf("members: %s", m.states())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// kill -9 of a follower.
	var victim string
	for _, v := range m.Voters {
		if v.State == "follower" {
			victim = v.Address
		}
	}
	procs[victim].Kill()
	m = members()
	if !strings.Contains(m.states(), victim+"=unreachable") || m.Leader == "" || m.Leader == victim {
		t.Fatalf("after kill -9 of %s: %+v", victim, m)
	}
	out, code = strata("status", "--json", "--meta", m.Leader)
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || !strings.Contains(st.Meta.states(), victim+"=unreachable") {
		t.Fatalf("status --json after kill -9 of %s: exit %d %v\n%s", victim, code, err, out)
	}
	out, code = strata("status", "--meta", m.Leader)
	if code != 0 || !strings.Contains(out, victim) || !strings.Contains(out, "unreachable") {
		t.Fatalf("status after kill -9 of %s: exit %d\n%s", victim, code, out)
	}
}
