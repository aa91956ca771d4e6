package meta

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Namespace changes are answered once applied; the log catches up at the
// client's barrier (MSync). A size commit (fsync, close) is answered only
// when durable unless deferred (the async close), and with StrictSync
// everything is.
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
	// A deferred size commit (the async close) is answered once applied,
	// with its entry's stamp for the client's barrier.
	time.Sleep(50 * time.Millisecond)
	if err := c.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c.hdr(), Ino: g.Ino, Size: 20, Mtime: time.Now().UnixNano(), Deferred: true}, &resp); err != nil {
		t.Fatal(err)
	}
	if d, a := durable(), s.fsm.AppliedIndex(); d >= a || resp.Index != a || resp.Term == 0 || resp.Attr.Size != 20 {
		t.Fatalf("deferred size commit answered with durable index %d, applied %d, stamp %+v, size %d: want durable < applied = stamp, size 20",
			d, a, resp.Stamp, resp.Attr.Size)
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
	if a, err := c2.lookup(1, "g"); err != nil || a.Size != 20 {
		t.Fatalf("g after restart: %+v, %v; want size 20", a, err)
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
	g2, err := c2.lookup(1, "g")
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: c2.hdr(), Ino: g2.Ino, Size: 30, Deferred: true}, &resp); err != nil {
		t.Fatal(err)
	}
	if d, a := s.node.Stats().DurableIndex, s.fsm.AppliedIndex(); d < a {
		t.Fatalf("StrictSync: deferred size commit answered with durable index %d < applied %d", d, a)
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
	c2 := &client{t: t, c: transport.NewClient(s.Addr(), transport.ClientConfig{Key: testKey}), id: c.id}
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
	s, c := openDeferred(t, testConfig(t, ""))
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
	s, c := openDeferred(t, testConfig(t, ""))
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

// A create (a directory: no targets needed) answered before it was
// durable, then a crash of the metadata machine that loses it: the close barrier (MSync with the answer's index
// and term) fails with EIO instead of vouching for the lost file, both
// while the log is shorter than the index and once other entries (of a
// newer term) have taken it. Durable changes still pass.
func TestSyncDetectsLostChange(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SyncDelay = time.Hour
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	var kept rpc.ChangeResp
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "kept", Mode: dirMode}, &kept); err != nil {
		t.Fatal(err)
	}
	if kept.Term == 0 {
		t.Fatal("create answered without the entry's term")
	}
	if err := c.call(rpc.MSync, &rpc.SyncReq{Index: kept.Index, Term: kept.Term}, &rpc.SyncResp{}); err != nil {
		t.Fatalf("MSync of a durable create: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The disk as a machine crash would leave it: nothing after this point
	// reaches it.
	disk := t.TempDir()
	copyTree(t, dir, disk)

	s, c = openDeferred(t, cfg)
	var lost rpc.ChangeResp
	if err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: 1, Name: "lost", Mode: dirMode}, &lost); err != nil {
		t.Fatal(err)
	}
	// Other changes answered before durable carry their entry too (Stamp),
	// for a directory fsync's barrier to check.
	stamps := map[string]rpc.Stamp{"create": lost.ChangeStamp()}
	var st rpc.Stamp
	if err := c.call(rpc.MRename, &rpc.RenameReq{Hdr: c.hdr(), OldParent: 1, OldName: "kept", NewParent: 1, NewName: "kept2"}, &st); err != nil {
		t.Fatal(err)
	}
	stamps["rename"] = st
	if err := c.call(rpc.MSetXattr, &rpc.XattrReq{Hdr: c.hdr(), Ino: kept.Attr.Ino, Name: "user.k", Value: []byte("v")}, &st); err != nil {
		t.Fatal(err)
	}
	stamps["setxattr"] = st
	var ar rpc.AttrResp
	if err := c.call(rpc.MSetAttr, &rpc.SetAttrReq{Hdr: c.hdr(), Ino: kept.Attr.Ino, Valid: rpc.SetMode, Mode: 0o700}, &ar); err != nil {
		t.Fatal(err)
	}
	stamps["setattr"] = ar.Stamp
	var top uint64
	for what, st := range stamps {
		if st.Index == 0 || st.Term == 0 {
			t.Fatalf("%s answered without its entry: %+v", what, st)
		}
		top = max(top, st.Index)
	}
	if d := s.node.DurableIndex(); d >= lost.Index {
		t.Fatalf("precondition: the create is durable (%d >= %d)", d, lost.Index)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The crash: the log and the namespace store are as they were on the
	// disk before; raft's term and vote, synced when they change (at this
	// run's election), are as this run left them.
	stable := t.TempDir()
	copyTree(t, filepath.Join(dir, "raft", "log"), stable)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	copyTree(t, disk, dir)
	if err := os.RemoveAll(filepath.Join(dir, "raft", "log")); err != nil {
		t.Fatal(err)
	}
	copyTree(t, stable, filepath.Join(dir, "raft", "log"))

	s = openService(t, cfg)
	c = newClient(t, s.Addr())
	if _, err := c.lookup(1, "lost"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("precondition: the lost file is there after the crash (%v)", err)
	}
	check := func(when string) {
		t.Helper()
		for what, st := range stamps {
			err := c.call(rpc.MSync, &rpc.SyncReq{Index: st.Index, Term: st.Term}, &rpc.SyncResp{})
			if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "lost") {
				t.Fatalf("%s: MSync of the lost %s: %v, want EIO naming the loss", when, what, err)
			}
		}
	}
	if a := s.fsm.AppliedIndex(); a >= lost.Index {
		t.Fatalf("precondition: the log reaches %d again at once (applied %d)", lost.Index, a)
	}
	check("log shorter than the index")
	for i := 0; ; i++ { // newer entries take the lost ones' indexes
		if s.fsm.AppliedIndex() >= top {
			break
		}
		c.mustCreate(1, fmt.Sprintf("filler%d", i), dirMode)
	}
	check("index taken by a newer entry")
	var r rpc.SyncResp
	if err := c.call(rpc.MSync, &rpc.SyncReq{Index: kept.Index, Term: kept.Term}, &r); err != nil {
		t.Fatalf("MSync of the durable create after the crash: %v", err)
	}
	if r.Term <= lost.Term {
		t.Fatalf("term after the restart %d, not above the lost entry's %d", r.Term, lost.Term)
	}
}

// openDeferred opens a service whose log syncs only when somebody waits
// (SyncDelay an hour) and a client, then waits out the eager-sync window
// of the client's session open: the next change is answered before it is
// durable.
func openDeferred(t *testing.T, cfg Config) (*Service, *client) {
	t.Helper()
	cfg.SyncDelay = time.Hour
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	time.Sleep(50 * time.Millisecond)
	return s, c
}

// copyTree copies the regular files and directories under src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s to %s: %v", src, dst, err)
	}
}
