package consensus

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestRebindSingleVoter: a single node's raft state renamed to another id
// and address opens under them, elects itself, keeps its state and goes
// on; renaming again to the same is a no-op; a configuration with a second
// server is refused and left as it was.
func TestRebindSingleVoter(t *testing.T) {
	raftDir, fsmDir := t.TempDir(), t.TempDir()
	fsm := openCounter(t, fsmDir)
	n := startNode(t, raftDir, fsm)
	for range 10 {
		if _, err := n.Apply(u64(1), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	old, err := RebindSingleVoter(raftDir, "n2", addr, slog.Default())
	if err != nil || old != "n1" {
		t.Fatalf("rebind: %q %v", old, err)
	}
	n, err = Open(Config{Dir: raftDir, NodeID: "n2", BindAddr: addr, FSM: fsm, Bootstrap: true,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !n.IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("the renamed node did not lead")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sum, err := n.Apply(u64(1), time.Second)
	if err != nil || sum.(uint64) != 11 {
		t.Fatalf("apply after the rename: %v %v", sum, err)
	}
	if conf, err := n.Configuration(); err != nil || len(conf) != 1 || conf[0].ID != "n2" || conf[0].Addr != addr {
		t.Fatalf("configuration after the rename: %v %v", conf, err)
	}
	// A non-voter added: two servers now.
	if err := n.raft.AddNonvoter("n3", "127.0.0.1:1", 0, time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if old, err := RebindSingleVoter(raftDir, "n2", addr, slog.Default()); !errors.Is(err, ErrNotSingleVoter) {
		t.Fatalf("rebind of a group of two: %q %v", old, err)
	}

	// The same id and address: nothing to do.
	dir2 := t.TempDir()
	m := startNode(t, dir2, openCounter(t, t.TempDir()))
	self := m.Addr()
	m.Close()
	if old, err := RebindSingleVoter(dir2, "n1", self, slog.Default()); err != nil || old != "" {
		t.Fatalf("rebind to itself: %q %v", old, err)
	}
	var l raft.Log
	w, err := openWAL(dir2+"/wal", DefaultSegmentBytes, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	last, _ := w.LastIndex()
	if err := w.GetLog(last, &l); err != nil || l.Type == raft.LogConfiguration && last > 1 {
		t.Fatalf("rebind to itself appended an entry: %+v %v", l, err)
	}
}
