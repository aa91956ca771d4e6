package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
	"github.com/stratafs/strata/internal/transport"
)

// metaGroup is a metadata group of real `strata meta --peers` processes.
type metaGroup struct {
	t     *testing.T
	bin   string
	dir   string
	key   []byte
	peers []string
	procs []*testutil.Proc
}

func startMetaGroup(t *testing.T, n int) *metaGroup {
	g := &metaGroup{t: t, bin: testutil.Binary(t), dir: t.TempDir(), key: []byte("quorum-test-key")}
	if err := os.WriteFile(filepath.Join(g.dir, "key"), g.key, 0o600); err != nil {
		t.Fatal(err)
	}
	for range n {
		g.peers = append(g.peers, testutil.FreePort(t))
	}
	g.procs = make([]*testutil.Proc, n)
	for i := range n {
		g.start(i)
	}
	t.Cleanup(func() {
		for _, p := range g.procs {
			if p != nil {
				syscall.Kill(p.Pid(), syscall.SIGCONT)
				p.Stop(10 * time.Second)
			}
		}
	})
	return g
}

func (g *metaGroup) start(i int) {
	g.procs[i] = testutil.StartProc(g.t, g.dir, fmt.Sprintf("meta%d", i+1), nil, g.bin, "meta",
		"--listen", g.peers[i], "--data", filepath.Join(g.dir, fmt.Sprintf("data%d", i+1)),
		"--peers", strings.Join(g.peers, ","), "--key-file", filepath.Join(g.dir, "key"), "--disk-reserve", "0")
}

func (g *metaGroup) client(addr string) *transport.Client {
	c := transport.NewClient(addr, transport.ClientConfig{Key: g.key, Conns: 1, DialTimeout: time.Second})
	g.t.Cleanup(func() { c.Close() })
	return c
}

// leader finds the voter that serves (skipping skip), bounded.
func (g *metaGroup) leader(skip int) int {
	g.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for i, a := range g.peers {
			if i == skip || g.procs[i] == nil || g.procs[i].Exited() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			var r rpc.AttrResp
			c := transport.NewClient(a, transport.ClientConfig{Key: g.key, Conns: 1})
			err := c.Call(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &r)
			c.Close()
			cancel()
			if err == nil {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, p := range g.procs {
		if p != nil {
			g.t.Logf("%s:\n%s", p.Name, p.Tail(30))
		}
	}
	g.t.Fatal("no metadata leader within 20s")
	return -1
}

func call(c *transport.Client, m rpc.Method, req, resp rpc.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Call(ctx, m, req, resp)
}

// TestMetaQuorumProcesses: three `strata meta --peers` processes bootstrap
// a group; after kill -9 of the leader another leads within seconds and a
// create retried there with the same (client, seq) answers as the first
// did; a leader stopped with SIGSTOP while the others elect a new one and
// change the namespace does not answer a read from its stale state when it
// resumes.
func TestMetaQuorumProcesses(t *testing.T) {
	g := startMetaGroup(t, 3)
	l := g.leader(-1)
	c := g.client(g.peers[l])
	var sess rpc.SessionOpenResp
	if err := call(c, rpc.MSessionOpen, &rpc.SessionOpenReq{Host: "t", MountPoint: "/t", Pid: 1}, &sess); err != nil {
		t.Fatal(err)
	}
	hdr := rpc.ReqHeader{ClientID: sess.ClientID, Seq: 1}
	mkdir := func(c *transport.Client, h rpc.ReqHeader, name string) (rpc.ChangeResp, error) {
		var r rpc.ChangeResp
		err := call(c, rpc.MCreate, &rpc.CreateReq{Hdr: h, Parent: 1, Name: name, Mode: syscall.S_IFDIR | 0o755}, &r)
		return r, err
	}
	first, err := mkdir(c, hdr, "a")
	if err != nil {
		t.Fatal(err)
	}

	// kill -9 of the leader: another voter leads within seconds.
	start := time.Now()
	g.procs[l].Kill()
	nl := g.leader(l)
	t.Logf("kill -9 of %s: %s leads after %v", g.peers[l], g.peers[nl], time.Since(start).Round(time.Millisecond))
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("failover took %v", d)
	}
	c2 := g.client(g.peers[nl])
	again, err := mkdir(c2, hdr, "a")
	if err != nil {
		t.Fatalf("create retried on the new leader: %v", err)
	}
	if again.Attr.Ino != first.Attr.Ino {
		t.Fatalf("retried create: ino %d, first answer %d", again.Attr.Ino, first.Attr.Ino)
	}
	g.start(l) // back, as a follower

	// SIGSTOP of the leader: a connection to it is open before, a read
	// is queued on it while it is stopped and after the others changed
	// the namespace, then it resumes.
	old := nl
	oc := g.client(g.peers[old])
	var r rpc.AttrResp
	if err := call(oc, rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &r); err != nil {
		t.Fatalf("leader before SIGSTOP: %v", err)
	}
	if err := syscall.Kill(g.procs[old].Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(g.procs[old].Pid(), syscall.SIGCONT)
		}
	}()
	nl2 := g.leader(old)
	c3 := g.client(g.peers[nl2])
	hdr.Seq = 2
	if _, err := mkdir(c3, hdr, "after"); err != nil {
		t.Fatalf("create on the leader elected during the stop: %v", err)
	}
	const reads = 32
	answer := make(chan error, reads)
	for range reads {
		go func() {
			var r rpc.AttrResp
			answer <- call(oc, rpc.MLookup, &rpc.LookupReq{Parent: 1, Name: "after"}, &r)
		}()
	}
	time.Sleep(300 * time.Millisecond) // the requests wait in the stopped process's socket
	if err := syscall.Kill(g.procs[old].Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	for range reads {
		select {
		case err := <-answer:
			switch {
			case err == nil:
			case errors.Is(err, syscall.ENOTCONN):
			default:
				t.Fatalf("deposed leader answered a read with %v: a stale read (the entry exists on the new leader)", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("no answer from the resumed leader")
		}
	}
}

// TestUpMetaVoters: `strata up --meta-voters 3` serves with three voters
// (DATA/meta, DATA/meta-2, DATA/meta-3), stops cleanly, serves the same
// files again, and refuses to reopen them as a single voter or with an
// unsupported count.
func TestUpMetaVoters(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	p := startUp(t, bin, dir, data, mnt, "--meta-voters", "3")
	t.Cleanup(func() { p.Kill(); testutil.ForceUnmount(mnt) })
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("three voters"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"meta", "meta-2", "meta-3"} {
		if _, err := os.Stat(filepath.Join(data, d, "meta.json")); err != nil {
			t.Fatalf("voter dir %s: %v", d, err)
		}
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, p.Tail(20))
	}
	out, err := runBounded(30*time.Second, bin, "up", "--data", data, "--mount", mnt)
	if err == nil || !strings.Contains(string(out), "--peers") {
		t.Fatalf("a 3-voter data dir opened as one voter: %v\n%s", err, out)
	}
	testutil.ForceUnmount(mnt)
	p = startUp(t, bin, dir, data, mnt, "--meta-voters", "3")
	b, err := os.ReadFile(filepath.Join(mnt, "f"))
	if err != nil || string(b) != "three voters" {
		t.Fatalf("after restart: %q %v", b, err)
	}
	out, err = runBounded(20*time.Second, bin, "up", "--data", t.TempDir(), "--mount", t.TempDir(), "--meta-voters", "2")
	if err == nil || !strings.Contains(string(out), "meta-voters") {
		t.Fatalf("--meta-voters 2: %v\n%s", err, out)
	}
}

// TestMetaVoterRefusals: `strata meta --peers` refuses to start, naming
// the problem, with a wrong key, with peers that differ from the stored
// configuration, with a duplicate peer, and on an address in use; the
// voter then starts with its right configuration.
func TestMetaVoterRefusals(t *testing.T) {
	g := startMetaGroup(t, 3)
	g.leader(-1)
	g.procs[2].Stop(10 * time.Second)
	g.procs[2] = nil
	data3 := filepath.Join(g.dir, "data3")
	wrongKey := filepath.Join(g.dir, "wrong")
	if err := os.WriteFile(wrongKey, []byte("not the key"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := append([]string{}, g.peers[:2]...)
	other = append(other, testutil.FreePort(t))
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"wrong key", []string{"--listen", g.peers[2], "--data", data3, "--peers", strings.Join(g.peers, ","), "--key-file", wrongKey}, "wrong cluster key"},
		{"other peers", []string{"--listen", other[2], "--data", data3, "--peers", strings.Join(other, ","), "--key-file", filepath.Join(g.dir, "key")}, "belongs to the voter"},
		{"duplicate", []string{"--listen", g.peers[2], "--data", data3, "--peers", strings.Join(append(g.peers, g.peers[0]), ","), "--key-file", filepath.Join(g.dir, "key")}, "twice"},
		{"address in use", []string{"--listen", g.peers[0], "--data", t.TempDir(), "--peers", strings.Join(g.peers, ","), "--key-file", filepath.Join(g.dir, "key")}, "already uses this address"},
	}
	for _, c := range cases {
		out, err := runBounded(20*time.Second, g.bin, append([]string{"meta", "--disk-reserve", "0"}, c.args...)...)
		t.Logf("%s: %s", c.name, lastLine(out))
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%s: want a refusal naming %q, got %v\n%s", c.name, c.want, err, out)
		}
	}
	// Peers that differ from the stored configuration: both lists named.
	moved := append([]string{}, g.peers...)
	moved[0] = testutil.FreePort(t)
	out, err := runBounded(20*time.Second, g.bin, "meta", "--disk-reserve", "0", "--listen", g.peers[2], "--data", data3,
		"--peers", strings.Join(moved, ","), "--key-file", filepath.Join(g.dir, "key"))
	if err == nil || !strings.Contains(out, "lists the voters") || !strings.Contains(out, moved[0]) {
		t.Errorf("changed peers: %v\n%s", err, out)
	}
	g.start(2)
	l := g.leader(-1)
	c := g.client(g.peers[l])
	var sess rpc.SessionOpenResp
	if err := call(c, rpc.MSessionOpen, &rpc.SessionOpenReq{Host: "t", MountPoint: "/t", Pid: 1}, &sess); err != nil {
		t.Fatalf("group after the refusals: %v", err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
