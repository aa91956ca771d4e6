package consensus

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stratafs/strata/internal/kv"
)

// counter is a small persistent state machine: it sums uint64 commands and
// records the applied index with each batch, as the contract requires.
type counter struct {
	db      kv.Store
	mu      sync.Mutex
	sum     uint64
	applied uint64
	batches int
}

func openCounter(t *testing.T, dir string) *counter {
	db, err := kv.Open(dir, kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := &counter{db: db}
	if v, err := db.Get([]byte("state")); err == nil {
		c.sum, c.applied = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
	}
	return c
}

func (c *counter) state() []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, c.sum), c.applied)
}

func (c *counter) ApplyBatch(logs []*raft.Log) []any {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]any, len(logs))
	for i, l := range logs {
		if l.Index <= c.applied {
			continue
		}
		if l.Type == raft.LogCommand {
			c.sum += binary.BigEndian.Uint64(l.Data)
			out[i] = c.sum
		}
		c.applied = l.Index
	}
	b := c.db.NewBatch()
	b.Set([]byte("state"), c.state())
	b.Apply(false)
	b.Close()
	c.batches++
	return out
}

func (c *counter) Apply(l *raft.Log) any { return c.ApplyBatch([]*raft.Log{l})[0] }
func (c *counter) AppliedIndex() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied
}

type snap struct{ b []byte }

func (s snap) Persist(sink raft.SnapshotSink) error { sink.Write(s.b); return sink.Close() }
func (snap) Release()                               {}

func (c *counter) Snapshot() (raft.FSMSnapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.db.Sync(); err != nil {
		return nil, err
	}
	return snap{c.state()}, nil
}

func (c *counter) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || len(b) != 16 {
		return errors.New("bad snapshot")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sum, c.applied = binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
	wb := c.db.NewBatch()
	wb.Set([]byte("state"), b)
	defer wb.Close()
	return wb.Apply(true)
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func startNode(t *testing.T, dir string, fsm *counter) *Node {
	n, err := Open(Config{Dir: dir, NodeID: "n1", BindAddr: "127.0.0.1:0", FSM: fsm, Bootstrap: true,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, SnapshotThreshold: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for !n.IsLeader() {
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

func TestNodeGroupCommitRestartAndSnapshot(t *testing.T) {
	raftDir, fsmDir := t.TempDir(), t.TempDir()
	fsm := openCounter(t, fsmDir)
	n := startNode(t, raftDir, fsm)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if _, err := n.Apply(u64(1), 5*time.Second); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if fsm.sum != 800 {
		t.Fatalf("sum %d", fsm.sum)
	}
	if fsm.batches >= 800 {
		t.Errorf("no group commit: %d batches for 800 entries", fsm.batches)
	}
	t.Logf("800 entries in %d apply batches", fsm.batches)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	fsm.db.Close()

	// restart: the log replays, the FSM skips what it has
	fsm = openCounter(t, fsmDir)
	n = startNode(t, raftDir, fsm)
	if err := n.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if fsm.sum != 800 {
		t.Fatalf("sum after restart %d (double apply?)", fsm.sum)
	}
	if r, err := n.Apply(u64(5), 5*time.Second); err != nil || r.(uint64) != 805 {
		t.Fatalf("apply after restart = %v %v", r, err)
	}
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	fsm.db.Close()

	// a lost FSM store is rebuilt from the snapshot (+ the log after it)
	fsm = openCounter(t, t.TempDir())
	n = startNode(t, raftDir, fsm)
	defer n.Close()
	if err := n.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if fsm.sum != 805 {
		t.Fatalf("sum after snapshot restore %d", fsm.sum)
	}
	if st := n.Stats(); st.State != "Leader" || st.AppliedIndex == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLogStore(t *testing.T) {
	s, err := openLogStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: u64(i), AppendedAt: time.Unix(0, int64(i))})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if err := s.GetLog(4, &l); err != nil || l.Index != 4 || l.Term != 2 || !bytes.Equal(l.Data, u64(4)) || l.AppendedAt.UnixNano() != 4 {
		t.Fatalf("get = %+v %v", l, err)
	}
	if err := s.GetLog(11, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("missing = %v", err)
	}
	s.DeleteRange(1, 3)
	if f, _ := s.FirstIndex(); f != 4 {
		t.Fatalf("first %d", f)
	}
	if l, _ := s.LastIndex(); l != 10 {
		t.Fatalf("last %d", l)
	}
	if v, err := s.Get([]byte("absent")); err != nil || len(v) != 0 {
		t.Fatalf("absent stable key: %v %v", v, err)
	}
	s.SetUint64([]byte("term"), 7)
	if v, _ := s.GetUint64([]byte("term")); v != 7 {
		t.Fatalf("term %d", v)
	}
}

func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(nil, &raft.Log{Term: 1, Type: raft.LogCommand, Data: []byte("x")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if decodeLog(b, &l) == nil {
			var again raft.Log
			if err := decodeLog(encodeLog(nil, &l), &again); err != nil {
				t.Fatalf("re-decode: %v", err)
			}
		}
	})
}

// Proposals racing a Close are all answered — applied, or refused with an
// error — rather than left waiting on a future that raft's shutdown never
// completes (hashicorp/raft answers nothing still queued in its apply
// channel when it stops).
func TestCloseAnswersRacingProposals(t *testing.T) {
	for round := range 10 {
		fsm := openCounter(t, t.TempDir())
		n := startNode(t, t.TempDir(), fsm)
		var wg sync.WaitGroup
		var applied, refused sync.Map
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 100_000 {
					if _, _, err := n.ApplyIndex(u64(1), time.Second); err != nil {
						refused.Store(w, err)
						return
					}
					applied.Store(w, i+1)
				}
			}()
		}
		time.Sleep(time.Duration(20+round*5) * time.Millisecond)
		if err := n.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: proposals made while the node closed were never answered", round)
		}
		refused.Range(func(_, v any) bool {
			if err := v.(error); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrNotLeader) {
				t.Errorf("round %d: a proposal refused at close says %v, want ErrClosed", round, err)
			}
			return true
		})
		fsm.db.Close()
	}
}
