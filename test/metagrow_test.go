package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// startVoter starts voter i of g (its address g.peers[i], its data dir
// dataN) with the given --peers list; name tells restarts apart in the
// logs.
func (g *metaGroup) startVoter(i int, name string, peers []string) *testutil.Proc {
	return testutil.StartProc(g.t, g.dir, name, nil, g.bin, "meta",
		"--listen", g.peers[i], "--data", filepath.Join(g.dir, fmt.Sprintf("data%d", i+1)),
		"--peers", strings.Join(peers, ","), "--key-file", filepath.Join(g.dir, "key"), "--disk-reserve", "0")
}

// TestMetaGrowAndShrinkUnderLoad: an administrator grows a group of three
// `strata meta --peers` processes to four and shrinks it back to three
// while a mount given the first three (--meta A,B,C) runs a load of
// creates, stats, removes and fsync'ed records:
//   - D started with --peers A,B,C,D does not bootstrap: it says it waits
//     to be added; `strata meta add-voter D` adds it and it catches up;
//   - `strata meta remove-voter A` leaves three voters; A, restarted with
//     its old --peers, refuses to start (it was removed) and the group's
//     leader and term stay;
//   - each remaining voter restarted with the list it was started with
//     (A,B,C; A,B,C,D for D) refuses, naming both lists, and with the new
//     list B,C,D serves again;
//
// and the load sees no error, and no file lost or doubled.
func TestMetaGrowAndShrinkUnderLoad(t *testing.T) {
	g, mnts := startListedCluster(t, 1)
	key := filepath.Join(g.dir, "key")
	old := append([]string(nil), g.peers...)
	g.peers = append(g.peers, testutil.FreePort(t))
	g.procs = append(g.procs, nil)
	all := append([]string(nil), g.peers...)
	a, d := g.peers[0], g.peers[3]
	newList := g.peers[1:]
	strata := func(args ...string) (string, int) {
		t.Helper()
		return run(t, g.bin, g.dir, append(args, "--key-file", key)...)
	}
	members := func(list []string) (membersJSON, error) {
		out, code := strata("meta", "members", "--json", "--meta", strings.Join(list, ","))
		var m membersJSON
		if err := json.Unmarshal([]byte(out), &m); code != 0 || err != nil {
			return m, fmt.Errorf("meta members --json: exit %d, %v\n%s", code, err, out)
		}
		return m, nil
	}
	// settled waits until list's group has n voters, a leader, and every
	// voter following it within lag entries of its applied index.
	settled := func(list []string, n int, what string) membersJSON {
		t.Helper()
		var m membersJSON
		if err := testutil.WaitFor(30*time.Second, func() error {
			var err error
			if m, err = members(list); err != nil {
				return err
			}
			var top uint64
			for _, v := range m.Voters {
				top = max(top, v.AppliedIndex)
			}
			for _, v := range m.Voters {
				if v.State != "leader" && v.State != "follower" || v.AppliedIndex+200 < top {
					return fmt.Errorf("%s=%s applied %d of %d", v.Address, v.State, v.AppliedIndex, top)
				}
			}
			if len(m.Voters) != n || m.Leader == "" {
				return fmt.Errorf("leader %q, %s", m.Leader, m.states())
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return m
	}

	runLoad(t, mnts[0], func() {
		time.Sleep(time.Second)

		// Grow: D waits to be added, then add-voter.
		g.procs[3] = g.startVoter(3, "meta4", all)
		if err := testutil.WaitFor(20*time.Second, func() error {
			if !strings.Contains(g.procs[3].Tail(50), "waiting to be added: run `strata meta add-voter "+d+"` on the group") {
				return fmt.Errorf("D's log:\n%s", g.procs[3].Tail(10))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if m, err := members(old); err != nil || len(m.Voters) != 3 {
			t.Fatalf("members while D waits: %+v %v", m, err)
		}
		out, code := strata("meta", "add-voter", d, "--meta", strings.Join(old, ","))
		if code != 0 || !strings.Contains(out, "added "+d) {
			t.Fatalf("add-voter %s: exit %d\n%s", d, code, out)
		}
		m := settled(all, 4, "after add-voter D")
		t.Logf("after add-voter %s: %s", d, m.states())

		// Shrink: remove A (whichever role it has).
		out, code = strata("meta", "remove-voter", a, "--meta", strings.Join(all, ","))
		if code != 0 || !strings.Contains(out, "removed "+a) {
			t.Fatalf("remove-voter %s: exit %d\n%s", a, code, out)
		}
		m = settled(newList, 3, "after remove-voter A")
		if strings.Contains(m.states(), a) {
			t.Fatalf("after remove-voter %s: %s", a, m.states())
		}
		leader, term := m.Leader, m.Term

		// The removed voter restarted with its old --peers: it refuses to
		// start, or (its stored configuration still names it, and matches)
		// stays passive; either way it says it was removed, and the
		// group's leader and term stay.
		g.procs[0].Stop(10 * time.Second)
		g.procs[0] = g.startVoter(0, "meta1-removed", old)
		if err := testutil.WaitFor(20*time.Second, func() error {
			if log := g.procs[0].Tail(30); !strings.Contains(log, "was removed from the") {
				return fmt.Errorf("the removed voter restarted with --peers %s does not say it was removed:\n%s", strings.Join(old, ","), log)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if g.procs[0].Exited() {
			t.Logf("the removed voter refused to start: %s", g.procs[0].Tail(1))
		} else {
			t.Logf("the removed voter stays passive")
		}
		time.Sleep(2 * time.Second)
		if m = settled(newList, 3, "after the removed voter's restart"); m.Leader != leader || m.Term != term {
			t.Fatalf("the removed voter's restart disturbed the group: leader %s term %d, before %s term %d", m.Leader, m.Term, leader, term)
		}
		g.procs[0].Stop(10 * time.Second)
		g.procs[0] = nil

		// Restart each remaining voter: the stale list is refused, the
		// new one serves.
		for i := 1; i <= 3; i++ {
			stale := old // the list it was started with
			if i == 3 {
				stale = all
			}
			g.procs[i].Stop(10 * time.Second)
			p := g.startVoter(i, fmt.Sprintf("meta%d-stale", i+1), stale)
			if err, ok := p.Wait(20 * time.Second); !ok || err == nil {
				t.Fatalf("voter %s restarted with the stale --peers %s: still running or exit 0\n%s", g.peers[i], strings.Join(stale, ","), p.Tail(20))
			}
			stored, given := sortedList(newList), sortedList(stale)
			if log := p.Tail(20); !strings.Contains(log, stored) || !strings.Contains(log, given) {
				t.Fatalf("voter %s refused the stale list without naming both lists (%s, %s):\n%s", g.peers[i], stored, given, log)
			}
			g.procs[i] = g.startVoter(i, fmt.Sprintf("meta%d-new", i+1), newList)
			settled(newList, 3, fmt.Sprintf("after restarting %s with --peers %s", g.peers[i], strings.Join(newList, ",")))
		}
		if out, code := strata("status", "--meta", strings.Join(all, ",")); code != 0 {
			t.Fatalf("status --meta A,B,C,D: exit %d\n%s", code, out)
		}
	})
}

// sortedList is the addresses sorted and comma-joined, as the refusals
// name lists.
func sortedList(l []string) string {
	return strings.Join(slices.Sorted(slices.Values(l)), ",")
}

// TestMetaSingleNodeGrowsIntoGroup: the data dir of a `strata meta`
// started without --peers, restarted with --peers A,B,C, becomes voter A
// with its namespace; B and C started with the same --peers wait to be
// added; `strata meta add-voter` adds them; A restarts with --peers A,B,C
// like any voter and the namespace is there.
func TestMetaSingleNodeGrowsIntoGroup(t *testing.T) {
	g := &metaGroup{t: t, bin: testutil.Binary(t), dir: t.TempDir(), key: []byte("grow-test-key")}
	key := filepath.Join(g.dir, "key")
	if err := os.WriteFile(key, g.key, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		g.peers = append(g.peers, testutil.FreePort(t))
	}
	g.procs = make([]*testutil.Proc, 3)
	t.Cleanup(func() {
		for _, p := range g.procs {
			if p != nil {
				p.Stop(10 * time.Second)
			}
		}
	})
	a, list := g.peers[0], strings.Join(g.peers, ",")
	g.procs[0] = testutil.StartProc(t, g.dir, "single", nil, g.bin, "meta", "--listen", a,
		"--data", filepath.Join(g.dir, "data1"), "--key-file", key, "--disk-reserve", "0")
	c := g.client(g.peers[g.leader(-1)])
	var sess rpc.SessionOpenResp
	if err := call(c, rpc.MSessionOpen, &rpc.SessionOpenReq{Host: "t", MountPoint: "/t", Pid: 1}, &sess); err != nil {
		t.Fatal(err)
	}
	var made rpc.ChangeResp
	if err := call(c, rpc.MCreate, &rpc.CreateReq{Hdr: rpc.ReqHeader{ClientID: sess.ClientID, Seq: 1}, Parent: 1, Name: "kept", Mode: syscall.S_IFDIR | 0o755}, &made); err != nil {
		t.Fatal(err)
	}
	if err := g.procs[0].Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	g.procs[0] = g.startVoter(0, "meta1", g.peers)
	g.leader(-1)
	for i := 1; i < 3; i++ {
		g.procs[i] = g.startVoter(i, fmt.Sprintf("meta%d", i+1), g.peers)
		if err := testutil.WaitFor(20*time.Second, func() error {
			if !strings.Contains(g.procs[i].Tail(50), "waiting to be added: run `strata meta add-voter "+g.peers[i]+"` on the group") {
				return fmt.Errorf("%s's log:\n%s", g.peers[i], g.procs[i].Tail(10))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		out, code := run(t, g.bin, g.dir, "meta", "add-voter", g.peers[i], "--meta", list, "--key-file", key)
		if code != 0 || !strings.Contains(out, "added "+g.peers[i]) {
			t.Fatalf("add-voter %s: exit %d\n%s", g.peers[i], code, out)
		}
	}
	g.procs[0].Stop(10 * time.Second)
	g.procs[0] = g.startVoter(0, "meta1-again", g.peers)
	var m membersJSON
	if err := testutil.WaitFor(30*time.Second, func() error {
		out, code := run(t, g.bin, g.dir, "meta", "members", "--json", "--meta", list, "--key-file", key)
		if err := json.Unmarshal([]byte(out), &m); code != 0 || err != nil {
			return fmt.Errorf("members: exit %d %v\n%s", code, err, out)
		}
		if len(m.Voters) != 3 || m.Leader == "" || strings.Contains(m.states(), "unreachable") || strings.Contains(m.states(), "candidate") {
			return fmt.Errorf("members: leader %q, %s", m.Leader, m.states())
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, g.procs[0].Tail(20))
	}
	var r rpc.AttrResp
	if err := call(g.client(g.peers[g.leader(-1)]), rpc.MLookup, &rpc.LookupReq{Parent: 1, Name: "kept"}, &r); err != nil || r.Attr.Ino != made.Attr.Ino {
		t.Fatalf("lookup of the single node's directory in the grown group: ino %d (made %d), %v", r.Attr.Ino, made.Attr.Ino, err)
	}
}
