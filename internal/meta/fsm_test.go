package meta

import (
	"bytes"
	"fmt"
	"math/rand"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

func newTestFSM(t testing.TB) *fsm {
	t.Helper()
	db, err := kv.Open(t.TempDir(), kv.Options{CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f, err := newFSM(db)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dump(t testing.TB, r kv.Reader) map[string]string {
	t.Helper()
	it, err := r.NewIter([]byte{0}, []byte{0xff})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	out := map[string]string{}
	for ok := it.First(); ok; ok = it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	return out
}

func equalDumps(t *testing.T, a, b map[string]string, what string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d keys vs %d keys", what, len(a), len(b))
	}
	for k, v := range a {
		if b[k] != v {
			t.Fatalf("%s: key %x differs: %x vs %x", what, k, v, b[k])
		}
	}
}

// randomCommands builds a reproducible mixed workload of commands.
func randomCommands(seed int64, n int) [][]byte {
	rng := rand.New(rand.NewSource(seed))
	now := int64(1_700_000_000_000_000_000)
	cands := []layout.Candidate{{ID: 1, FreeBytes: 100}, {ID: 2, FreeBytes: 100}, {ID: 3, FreeBytes: 1}}
	cmds := [][]byte{
		(&command{Op: opInit, Now: now}).encode(nil),
		(&command{Op: opSessionOpen, Now: now, Host: "h", LeaseMs: 1000}).encode(nil),
		(&command{Op: opRegister, Now: now, Addr: "a:1", Targets: []targetReg{{UUID: "x"}, {UUID: "y"}, {UUID: "z"}}}).encode(nil),
		// Inode numbers 2 … 2+n for session 1 (NextIno is 2 here): the
		// batches below use them, without drawing on rng.
		(&command{Op: opReserveInos, Now: now, Hdr: reqHeader{ClientID: 1, Seq: 1}, Size: uint64(n)}).encode(nil),
	}
	dirs := []uint64{1}
	seq := uint64(1)
	name := func() string { return fmt.Sprintf("n%d", rng.Intn(40)) }
	for i := 0; i < n; i++ {
		switch i % 100 {
		case 10:
			seq++
			cmds = append(cmds, (&command{Op: opDelegate, Now: now, Hdr: reqHeader{ClientID: 1, Seq: seq}, Ino: 1}).encode(nil))
		case 25, 75:
			b := command{Op: opCreateBatch, Now: now, Hdr: reqHeader{ClientID: 1}, Cands: cands, RRStart: uint64(i)}
			for k := range 2 {
				seq++
				b.Batch = append(b.Batch, batchCreate{Seq: seq, Parent: 1, Name: fmt.Sprintf("b%d", i/25+k%2), Ino: uint64(2 + i + k), Mode: 0o644})
			}
			cmds = append(cmds, b.encode(nil))
		case 60:
			cmds = append(cmds, (&command{Op: opReturn, Now: now, Ino: 1, Client: 1}).encode(nil))
		}
		now += int64(rng.Intn(1000))
		seq++
		h := reqHeader{ClientID: 1, Seq: seq}
		if rng.Intn(10) == 0 {
			seq-- // a retry
			h.Seq = max(seq, 1)
		}
		d := dirs[rng.Intn(len(dirs))]
		d2 := dirs[rng.Intn(len(dirs))]
		var c command
		switch rng.Intn(11) {
		case 0, 1:
			c = command{Op: opCreate, Parent: d, Name: name(), Mode: fileMode, Cands: cands, RRStart: uint64(i)}
		case 2:
			c = command{Op: opCreate, Parent: d, Name: name(), Mode: dirMode}
			dirs = append(dirs, uint64(i)) // guessed inode numbers: some miss, which is fine
		case 3:
			c = command{Op: opUnlink, Parent: d, Name: name()}
		case 4:
			c = command{Op: opRmdir, Parent: d, Name: name()}
		case 5:
			c = command{Op: opRename, Parent: d, Name: name(), NewParent: d2, NewName: name(), Flags: uint32(rng.Intn(3))}
		case 6:
			c = command{Op: opLink, Ino: uint64(rng.Intn(i + 2)), NewParent: d2, NewName: name()}
		case 7:
			c = command{Op: opSetXattr, Ino: uint64(rng.Intn(i + 2)), Name: "user.a", Value: []byte{byte(i)}, Flags: uint32(rng.Intn(3))}
		case 8:
			c = command{Op: opSetAttr, Ino: uint64(rng.Intn(i + 2)), Valid: rpc.SetMode | rpc.SetSize, Mode: 0o600, Size: uint64(i)}
		case 9:
			c = command{Op: opTmpfile, Parent: d, Mode: fileMode, Cands: cands, RRStart: uint64(i)}
		case 10:
			c = command{Op: opCommitSize, Ino: uint64(rng.Intn(i + 2)), Size: uint64(rng.Intn(1 << 30)), Mtime: now,
				Alloc: []slotAlloc{{Slot: uint32(rng.Intn(4)), Bytes: uint64(rng.Intn(1 << 30))}}}
		}
		c.Now, c.Hdr = now, h
		cmds = append(cmds, c.encode(nil))
	}
	return cmds
}

func applyAll(f *fsm, cmds [][]byte, batch int, firstIndex uint64) []any {
	var out []any
	idx := firstIndex
	for len(cmds) > 0 {
		n := min(batch, len(cmds))
		logs := make([]*raft.Log, n)
		for i := range logs {
			logs[i] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: cmds[i]}
			idx++
		}
		out = append(out, f.ApplyBatch(logs)...)
		cmds = cmds[n:]
	}
	return out
}

type memSink struct {
	bytes.Buffer
	closed bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func TestFSMDeterminismAndSnapshot(t *testing.T) {
	const seed = 42
	cmds := randomCommands(seed, 3000)
	a, b := newTestFSM(t), newTestFSM(t)
	ra := applyAll(a, cmds, 1, 1)
	rb := applyAll(b, cmds, 97, 1) // different batching, same result
	for i := range ra {
		x, y := ra[i].(*result), rb[i].(*result)
		if x.errno != y.errno || !reflect.DeepEqual(x.ans, y.ans) {
			t.Fatalf("seed %d: answer %d differs: %+v vs %+v", seed, i, x, y)
		}
	}
	da := dump(t, a.db)
	equalDumps(t, da, dump(t, b.db), "same commands")
	if len(da) < 50 {
		t.Fatalf("workload built only %d keys", len(da))
	}

	// replaying already-applied entries changes nothing
	applyAll(a, cmds[:100], 10, 1)
	equalDumps(t, da, dump(t, a.db), "replay")

	// snapshot then restore into a fresh FSM; entries applied between
	// Snapshot and Persist (Persist flushes the store, concurrently with
	// later applies) are not in it
	snap, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	applyAll(b, randomCommands(11, 100), 7, b.AppliedIndex()+1)
	var sink memSink
	if err := snap.Persist(&sink); err != nil || !sink.closed {
		t.Fatalf("persist: %v", err)
	}
	snap.Release()
	c := newTestFSM(t)
	applyAll(c, randomCommands(7, 50), 10, 1) // restore must discard this
	if err := c.Restore(nopCloser{bytes.NewReader(sink.Bytes())}); err != nil {
		t.Fatal(err)
	}
	equalDumps(t, da, dump(t, c.db), "restored")
	if c.AppliedIndex() != a.AppliedIndex() || c.inodes.Load() != a.inodes.Load() {
		t.Fatalf("restored applied %d inodes %d, want %d %d", c.AppliedIndex(), c.inodes.Load(), a.AppliedIndex(), a.inodes.Load())
	}
	// and both continue identically
	more := randomCommands(9, 200)[3:]
	applyAll(a, more, 13, a.AppliedIndex()+1)
	applyAll(c, more, 200, c.AppliedIndex()+1)
	equalDumps(t, dump(t, a.db), dump(t, c.db), "after restore")

	// a corrupt snapshot is refused
	bad := append([]byte(nil), sink.Bytes()...)
	bad = bad[:len(bad)-3]
	if err := newTestFSM(t).Restore(nopCloser{bytes.NewReader(bad)}); err == nil {
		t.Fatal("truncated snapshot restored")
	}
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range randomCommands(1, 20) {
		f.Add(c)
	}
	for _, s := range commandSamples() {
		f.Add(s.c.encode(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c command
		if decodeCommand(b, &c) == nil {
			var again command
			if err := decodeCommand(c.encode(nil), &again); err != nil || !reflect.DeepEqual(again, c) {
				t.Fatalf("%+v re-decodes to %+v, %v", c, again, err)
			}
		}
	})
}

// TestReadDirUnderChange pages through a directory with a small page size
// while other clients create and remove names: every entry that exists for
// the whole listing must appear exactly once.
func TestReadDirUnderChange(t *testing.T) {
	_, c := newNamespace(t)
	d := c.mustCreate(1, "d", dirMode)
	stable := map[string]bool{}
	for i := 0; i < 300; i++ {
		n := fmt.Sprintf("s%03d", i*3)
		stable[n] = true
		if _, err := c.create(d.Ino, n, modeFifo|0o644); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := fmt.Sprintf("s%03d-%d", (i*7+w)%900, w) // sorts among the stable names
				c.create(d.Ino, n, modeFifo|0o644)
				if i%2 == 1 {
					c.unlink(d.Ino, n)
				}
			}
		}(w)
	}
	for round := 0; round < 5; round++ {
		ents, err := c.readdirAll(d.Ino, 16, round%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		prev := ""
		for _, e := range ents {
			seen[e.Name]++
			if e.Name <= prev {
				t.Fatalf("listing out of order: %q after %q", e.Name, prev)
			}
			prev = e.Name
		}
		for n := range stable {
			if seen[n] != 1 {
				t.Fatalf("round %d: stable entry %q listed %d times", round, n, seen[n])
			}
		}
	}
	close(stop)
	wg.Wait()
}

// TestReadDirMillion pages through a 1,000,000-entry directory through the
// real readdir rpc. The directory is filled by applying create commands to
// the state machine directly in big batches (same code as the raft path,
// without a million round trips).
func TestReadDirMillion(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 100_000 // keeps -race and -short runs near a minute; the full size runs in the plain suite
		t.Logf("short or race run: %d entries instead of 1,000,000", n)
	}
	s, c := newNamespace(t)
	d := c.mustCreate(1, "big", dirMode)
	start := time.Now()
	now := time.Now().UnixNano()
	cands := []layout.Candidate{{ID: 1, FreeBytes: 1 << 30}, {ID: 2, FreeBytes: 1 << 30}}
	const batch = 2000
	cmds := make([][]byte, 0, batch)
	buf := make([]byte, 0, batch*64)
	for i := 0; i < n; i++ {
		cmd := command{Op: opCreate, Now: now, Parent: d.Ino, Name: fmt.Sprintf("f%07d", i), Mode: fileMode, Cands: cands, RRStart: uint64(i)}
		off := len(buf)
		buf = cmd.encode(buf)
		cmds = append(cmds, buf[off:len(buf):len(buf)])
		if len(cmds) == batch || i == n-1 {
			for j, r := range s.fsm.applyLocal(cmds) {
				if r.errno != 0 {
					t.Fatalf("create %d: %s", j, r.msg)
				}
			}
			cmds, buf = cmds[:0], make([]byte, 0, batch*64)
		}
	}
	t.Logf("filled %d entries in %v", n, time.Since(start))
	start = time.Now()
	count := 0
	after := ""
	for {
		var r rpc.ReadDirResp
		if err := c.call(rpc.MReadDir, &rpc.ReadDirReq{Dir: d.Ino, After: after, Limit: 8192}, &r); err != nil {
			t.Fatal(err)
		}
		for _, e := range r.Entries {
			if want := fmt.Sprintf("f%07d", count); e.Name != want {
				t.Fatalf("entry %d is %q, want %q", count, e.Name, want)
			}
			count++
		}
		if r.EOF {
			break
		}
		after = r.Entries[len(r.Entries)-1].Name
	}
	if count != n {
		t.Fatalf("listed %d entries, want %d", count, n)
	}
	if a := c.mustGetattr(d.Ino); a.Nlink != 2 {
		t.Fatalf("dir nlink %d", a.Nlink)
	}
	t.Logf("listed %d entries in %v", count, time.Since(start))
}
