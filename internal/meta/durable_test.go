package meta

import (
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Namespace changes are answered once applied; the log catches up at the
// client's barrier (MSync). A size commit (fsync, close) is answered only
// when durable, and with StrictSync everything is.
func TestDurabilityOfAnswers(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.SyncDelay = time.Hour // nothing becomes durable unless somebody waits
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	c.registerTargets("127.0.0.1:1", "u1") // registration waits: durable
	durable := func() uint64 { return s.node.Stats().DurableIndex }

	// The log syncs at once after a recent durability wait (registration
	// was one): wait past that window to see a change answered before its
	// sync.
	time.Sleep(50 * time.Millisecond)
	c.mustCreate(1, "f", fileMode)
	if d, a := durable(), s.fsm.AppliedIndex(); d >= a {
		t.Fatalf("create answered with durable index %d >= applied %d: it waited for the disk", d, a)
	}
	if _, err := c.unlink(1, "f"); err != nil {
		t.Fatal(err)
	}
	if err := c.call(rpc.MSync, &rpc.SyncReq{}, &rpc.SyncResp{}); err != nil {
		t.Fatalf("MSync: %v", err)
	}
	if d, a := durable(), s.fsm.AppliedIndex(); d < a {
		t.Fatalf("after MSync durable index %d < applied %d", d, a)
	}

	g := c.mustCreate(1, "g", fileMode)
	var resp rpc.AttrResp
	if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: g.Ino, Size: 10, Mtime: time.Now().UnixNano()}, &resp); err != nil {
		t.Fatal(err)
	}
	if d, a := durable(), s.fsm.AppliedIndex(); d < a {
		t.Fatalf("size commit answered with durable index %d < applied %d", d, a)
	}
	c.mustCreate(1, "late", dirMode) // answered before durable; Close syncs it

	// After a restart the changes are there: Close synced the log and
	// the store replays what it had not flushed.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.StrictSync = true
	s = openService(t, cfg)
	c2 := newClient(t, s.Addr())
	if _, err := c2.lookup(1, "g"); err != nil {
		t.Fatalf("g after restart: %v", err)
	}
	if _, err := c2.lookup(1, "late"); err != nil {
		t.Fatalf("late after restart: %v", err)
	}
	if _, err := c2.lookup(1, "f"); err == nil {
		t.Fatal("f is back after restart; its unlink was lost")
	}
	c2.mustCreate(1, "strict", dirMode)
	if d, a := s.node.Stats().DurableIndex, s.fsm.AppliedIndex(); d < a {
		t.Fatalf("StrictSync: mkdir answered with durable index %d < applied %d", d, a)
	}
}

// A retry is answered from its dedupe record also after a restart and out
// of order (an older seq retried after newer ones applied): the in-memory
// "highest recorded seq" of each session is rebuilt from the store.
func TestDedupeAcrossRestart(t *testing.T) {
	cfg := testConfig(t, "")
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	first := &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "a", Mode: dirMode}
	var a rpc.AttrResp
	if err := c.call(rpc.MCreate, first, &a); err != nil {
		t.Fatal(err)
	}
	c.mustCreate(1, "b", dirMode) // a newer seq
	var r rpc.AttrResp
	if err := c.call(rpc.MCreate, first, &r); err != nil || r.Attr.Ino != a.Attr.Ino {
		t.Fatalf("out-of-order retry: %+v, %v; want the first answer (ino %d)", r.Attr, err, a.Attr.Ino)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openService(t, cfg)
	c2 := &client{t: t, c: rpc.NewClient(s.Addr(), rpc.ClientConfig{Key: testKey}), id: c.id}
	t.Cleanup(func() { c2.c.Close() })
	if err := c2.call(rpc.MCreate, first, &r); err != nil || r.Attr.Ino != a.Attr.Ino {
		t.Fatalf("retry after restart: %+v, %v; want the first answer (ino %d)", r.Attr, err, a.Attr.Ino)
	}
	// A new seq of the same session is applied, not mistaken for a retry.
	c2.seq.Store(c.seq.Load())
	if _, err := c2.create(1, "c", dirMode); err != nil {
		t.Fatal(err)
	}
}

// Before the state machine's store persists a memtable, the raft log is made
// durable up to everything applied: the persisted state never runs ahead of
// the persisted log.
func TestStoreFlushSyncsLogFirst(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.SyncDelay = time.Hour
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	time.Sleep(50 * time.Millisecond) // past the eager-sync window of the session open
	c.mustCreate(1, "d", dirMode)
	if d, a := s.node.Stats().DurableIndex, s.fsm.AppliedIndex(); d >= a {
		t.Fatalf("precondition: mkdir answered with durable %d >= applied %d", d, a)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if d, a := s.node.Stats().DurableIndex, s.fsm.AppliedIndex(); d < a {
		t.Fatalf("store flushed with the log durable only to %d of %d applied", d, a)
	}
}

// A create answers its raft index; MSync for that index returns once the
// log is durable at least that far, and says how far.
func TestSyncToIndex(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.SyncDelay = time.Hour
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	time.Sleep(50 * time.Millisecond) // past the eager-sync window of the session open
	var ch rpc.ChangeResp
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "d", Mode: dirMode}, &ch); err != nil {
		t.Fatal(err)
	}
	if ch.Index == 0 || ch.Index != s.fsm.AppliedIndex() {
		t.Fatalf("create answered index %d, applied %d", ch.Index, s.fsm.AppliedIndex())
	}
	if ch.Dir.Ino != 1 || ch.Dir.Nlink != 3 {
		t.Fatalf("directory attributes in the answer: %+v", ch.Dir)
	}
	if d := s.node.DurableIndex(); d >= ch.Index {
		t.Fatalf("precondition: durable %d >= %d before any wait", d, ch.Index)
	}
	var r rpc.SyncResp
	if err := c.call(rpc.MSync, &rpc.SyncReq{Index: ch.Index}, &r); err != nil {
		t.Fatal(err)
	}
	if r.Durable < ch.Index || s.node.DurableIndex() < ch.Index {
		t.Fatalf("MSync to %d answered durable %d (node: %d)", ch.Index, r.Durable, s.node.DurableIndex())
	}
}
