package meta

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/raft"
	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// fsm is the metadata state machine: the namespace, sessions, dedupe
// records and registry, in one kv.Store, changed only by ApplyBatch.
//
// Invariants (checked by tests):
//   - Apply is a pure function of (store contents, command): no clocks, no
//     randomness, no map iteration order, no network.
//   - The counters record, including the last applied raft index, is written
//     in the same kv batch as the effects of the entries it covers, so a
//     replay after a restart skips exactly the entries already applied.
//   - The store has no WAL of its own: the raft log is its log. Before a
//     memtable is flushed the raft log is synced (Service's BeforeFlush
//     hook), so the persisted state never runs ahead of the persisted log;
//     entries above the persisted applied index are applied again at start.
//     Snapshot flushes first.
type fsm struct {
	db kv.Store

	// mu serialises ApplyBatch, Snapshot, Restore and applyLocal (raft never
	// calls them concurrently; applyLocal is for tests and bulk loads).
	mu  sync.Mutex
	ctr schema.Counters // guarded by mu
	x   opCtx           // scratch for one command; guarded by mu
	// sess mirrors the session records: client id → the highest seq with a
	// dedupe record (0: none). Derived from the store (loaded with the
	// counters, kept in step by apply), so every replica has the same; it
	// saves two point reads per mutation: "is this a session?" and, for a
	// seq above every recorded one, "was it applied already?".
	sess map[uint64]uint64 // guarded by mu

	// Published after each batch for readers outside the FSM goroutine.
	applied atomic.Uint64
	inodes  atomic.Uint64
	cid     atomic.Pointer[string] // the cluster id ("" or nil: none yet)
	// groups counts the mirror groups (changed by opMirrorCreate only:
	// groups are never removed), so that a create looks for a mirrored
	// parent only once there are groups.
	groups atomic.Int64

	// onBatch, if set, observes the number of entries in each applied batch.
	onBatch func(n int)

	// cache keeps decoded inode records and directory entries for readers
	// and applies (recordcache.go); batch holds what the batch being
	// applied wrote (guarded by mu), written to the cache at the commit.
	cache recordCache
	batch batchRecords

	// delegs mirrors the delegation records for the leader's recall gate
	// (delegation.go); published at each commit.
	delegs delegTable
}

var _ consensus.StateMachine = (*fsm)(nil)

func newFSM(db kv.Store) (*fsm, error) {
	f := &fsm{db: db, cache: newRecordCache(), batch: newBatchRecords()}
	if err := f.loadCounters(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *fsm) loadCounters() error {
	v, err := f.db.Get(schema.CountersKey())
	switch {
	case errors.Is(err, kv.ErrNotFound):
		f.ctr = schema.Counters{}
	case err != nil:
		return fmt.Errorf("load counters: %w", err)
	default:
		if f.ctr, err = schema.DecodeCounters(v); err != nil {
			return fmt.Errorf("load counters: %w", err)
		}
	}
	f.applied.Store(f.ctr.AppliedIndex)
	f.inodes.Store(f.ctr.Inodes)
	var id string
	switch v, err := f.db.Get(schema.ClusterIDKey()); {
	case err == nil:
		id = string(v)
	case !errors.Is(err, kv.ErrNotFound):
		return fmt.Errorf("load cluster id: %w", err)
	}
	f.cid.Store(&id)
	gs, err := readGroups(f.db)
	if err != nil {
		return fmt.Errorf("load mirror groups: %w", err)
	}
	f.groups.Store(int64(len(gs)))
	if err := f.delegs.load(f.db); err != nil {
		return err
	}
	return f.loadSessions()
}

// loadSessions rebuilds sess from the session and dedupe records.
func (f *fsm) loadSessions() error {
	f.sess = map[uint64]uint64{}
	p := schema.SessionPrefix()
	it, err := f.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return fmt.Errorf("load sessions: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		id, err := schema.DecodeSessionKey(it.Key())
		if err != nil {
			it.Close()
			return fmt.Errorf("load sessions: %w", err)
		}
		f.sess[id] = 0
	}
	it.Close()
	for id := range f.sess {
		p := schema.DedupePrefix(id)
		it, err := f.db.NewIter(p, kv.PrefixEnd(p))
		if err != nil {
			return fmt.Errorf("load dedupe records: %w", err)
		}
		if it.Last() { // keys end in the big-endian seq: the last is the highest
			_, seq, err := schema.DecodeDedupeKey(it.Key())
			if err != nil {
				it.Close()
				return fmt.Errorf("load dedupe records: %w", err)
			}
			f.sess[id] = seq
		}
		it.Close()
	}
	return nil
}

// AppliedIndex is the last raft index whose effects are in the store.
func (f *fsm) AppliedIndex() uint64 { return f.applied.Load() }

// result is the answer of one applied command.
type result struct {
	errno syscall.Errno
	msg   string
	ans   *answer // when errno is 0; nil: nothing to say
	// wire is the answer of a dedupe record of format version 1: the
	// encoded wire message (schema.AnswerWire), sent as it is.
	wire []byte
}

func (r *result) err() error {
	if r.errno == 0 {
		return nil
	}
	return &rpc.Error{Errno: r.errno, Msg: r.msg}
}

func errResult(err error) *result {
	errno := rpc.ErrnoOf(err)
	if errno == 0 {
		errno = syscall.EIO
	}
	return &result{errno: errno, msg: err.Error()}
}

func (f *fsm) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies a group of committed entries in one kv batch: the
// state-machine half of group commit.
func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	failpoint.HitSub("meta/before-apply", lastOp(logs))
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]any, len(logs))
	b := f.db.NewBatch()
	defer b.Close()
	n := 0
	for i, l := range logs {
		if l.Index <= f.ctr.AppliedIndex {
			out[i] = &result{errno: syscall.EALREADY, msg: "entry already applied"}
			continue
		}
		if l.Type == raft.LogCommand {
			out[i] = f.applyOne(b, l.Data, l.Index, l.Term)
			n++
		}
		f.ctr.AppliedIndex, f.ctr.AppliedTerm = l.Index, l.Term
	}
	f.commitLocked(b)
	failpoint.HitSub("meta/after-apply", lastOp(logs))
	if f.onBatch != nil && n > 0 {
		f.onBatch(n)
	}
	return out
}

// applyLocal applies commands without a raft log: for bulk loads in tests.
// The applied index does not move.
func (f *fsm) applyLocal(cmds [][]byte) []*result {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.db.NewBatch()
	defer b.Close()
	out := make([]*result, len(cmds))
	for i, c := range cmds {
		out[i] = f.applyOne(b, c, 0, 0)
	}
	f.commitLocked(b)
	return out
}

func (f *fsm) commitLocked(b kv.Batch) {
	if err := b.Set(schema.CountersKey(), schema.AppendCounters(nil, &f.ctr)); err != nil {
		panic(fmt.Sprintf("meta: kv batch set counters: %v", err))
	}
	// A failed write leaves the replicas' states unknown; the only safe
	// answer is to stop and let the restart replay the log.
	f.cache.begin()
	if err := b.Apply(false); err != nil {
		panic(fmt.Sprintf("meta: applying raft batch to the metadata store failed: %v", err))
	}
	f.cache.end(&f.batch)
	f.batch.reset()
	f.delegs.publish()
	f.applied.Store(f.ctr.AppliedIndex)
	f.inodes.Store(f.ctr.Inodes)
}

// mutating reports whether op carries a ReqHeader worth deduplicating.
func (o op) deduped() bool {
	switch o {
	case opInit, opSessionOpen, opSessionClose, opRegister, opReap, opReapMany, opRaiseIno,
		// Mirror changes answer wire messages; they come from stores and
		// admin commands without a session, and carry the epoch they
		// expect instead (a request sent twice is refused the second time).
		opMirrorCreate, opMirrorFailOver, opMirrorReport, opMirrorReplace, opMirrorResync,
		// A batch is not deduplicated as a whole: each of its creates is,
		// by its own seq (createBatch).
		opCreateBatch,
		// The leader's own step (spill.go), compared against the inode.
		opUninline:
		return false
	}
	return true
}

// dedupeKeep is how many answers are kept per client: a client retries
// only its few outstanding requests, so a few hundred is plenty.
const dedupeKeep = 512

func (f *fsm) applyOne(b kv.Batch, data []byte, index, term uint64) *result {
	var c command
	if err := decodeCommand(data, &c); err != nil {
		if errors.Is(err, errNewerCommand) {
			// Skipping it would leave this replica's state behind its
			// peers' for good; stopping leaves the entry for an upgraded
			// binary to apply.
			panic(fmt.Sprintf("meta: raft log entry %d: %v", index, err))
		}
		return &result{errno: syscall.EINVAL, msg: err.Error()}
	}
	record := false
	if c.Op.deduped() && c.Hdr.ClientID != 0 {
		var res *result
		if res, record = f.deduped(b, c.Hdr); res != nil {
			return res
		}
	}
	x := &f.x
	x.reset(f, b, c.Now)
	x.index, x.term = index, term
	res := x.resultOf(x.apply(&c))
	if record {
		f.recordResult(b, c.Op, c.Hdr, res)
	}
	return res
}

// resultOf is the result of an applied command's answer: on success the
// command's inodes are written to the batch first.
func (x *opCtx) resultOf(ans *answer, err error) *result {
	if err != nil {
		return errResult(err)
	}
	if err := x.flush(); err != nil {
		panic(fmt.Sprintf("meta: kv batch write: %v", err))
	}
	return &result{ans: ans}
}

// deduped looks (client, seq) up in the dedupe table: the recorded answer
// of a request applied before (nil: none), and whether the answer of this
// one is to be recorded (the client has a session). Only sessions'
// requests are remembered: their records are dropped with the session, so
// the table stays bounded. A seq above the session's highest recorded one
// has no record.
func (f *fsm) deduped(b kv.Batch, h reqHeader) (*result, bool) {
	maxSeq, isSession := f.sess[h.ClientID]
	if !isSession || h.Seq <= maxSeq {
		key := schema.DedupeKey(h.ClientID, h.Seq)
		if v, err := b.Get(key); err == nil {
			r, err := schema.DecodeResult(v)
			if err != nil {
				return errResult(fmt.Errorf("dedupe record of client %d seq %d: %w", h.ClientID, h.Seq, err)), false
			}
			res := &result{errno: syscall.Errno(r.Errno), msg: r.Msg}
			switch {
			case r.Errno != 0:
			case r.Answer.Kind == schema.AnswerWire:
				res.wire = r.Wire
			case r.Answer.Kind != schema.AnswerNone:
				res.ans = &answer{rec: r.Answer}
			}
			return res, false
		}
	}
	return nil, isSession
}

// recordResult writes the dedupe record of (client, seq) and drops the
// one dedupeKeep requests older.
func (f *fsm) recordResult(b kv.Batch, o op, h reqHeader, res *result) {
	rec := schema.Result{Errno: uint32(res.errno), Msg: res.msg}
	if res.ans != nil {
		if res.ans.msg != nil {
			panic(fmt.Sprintf("meta: deduplicated op %d answered a wire message", o))
		}
		rec.Answer = res.ans.rec
	}
	if err := b.Set(schema.DedupeKey(h.ClientID, h.Seq), schema.AppendResult(nil, &rec)); err != nil {
		panic(fmt.Sprintf("meta: kv batch write: %v", err))
	}
	if _, ok := f.sess[h.ClientID]; ok && h.Seq > f.sess[h.ClientID] {
		f.sess[h.ClientID] = h.Seq
	}
	if h.Seq > dedupeKeep {
		if err := b.Delete(schema.DedupeKey(h.ClientID, h.Seq-dedupeKeep)); err != nil {
			panic(fmt.Sprintf("meta: kv batch write: %v", err))
		}
	}
}

// Snapshot captures a consistent view of the store. Raft calls it on the
// goroutine that applies entries, so it does only that; Persist, which
// runs concurrently with later applies, makes the store durable (a memtable
// flush: up to hundreds of milliseconds, which here would stall every
// metadata change) and streams the view. Raft truncates the log only after
// Persist succeeded, so the store is durable past the snapshot's index
// before the entries it replaces are gone.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &fsmSnapshot{db: f.db, snap: f.db.NewSnapshot()}, nil
}

// Snapshot stream format, version 1:
//
//	magic "STRATAMS" (8 bytes), version (1 byte, 1)
//	records: uvarint key length (> 0), key, uvarint value length, value
//	end: uvarint 0, then uvarint record count
var snapMagic = []byte("STRATAMS")

const snapFormatV1 = 1

type fsmSnapshot struct {
	db   kv.Store
	snap kv.Snapshot
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	// Everything the view holds was committed before this flush began.
	if err := s.db.Sync(); err != nil {
		sink.Cancel()
		return fmt.Errorf("snapshot: sync metadata store: %w", err)
	}
	if err := writeSnapshot(s.snap, sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { s.snap.Close() }

func writeSnapshot(r kv.Reader, w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	bw.Write(snapMagic)
	bw.WriteByte(snapFormatV1)
	it, err := r.NewIter([]byte{0}, []byte{0xff})
	if err != nil {
		return err
	}
	defer it.Close()
	var n uint64
	var hdr []byte
	for ok := it.First(); ok; ok = it.Next() {
		hdr = binary.AppendUvarint(hdr[:0], uint64(len(it.Key())))
		bw.Write(hdr)
		bw.Write(it.Key())
		hdr = binary.AppendUvarint(hdr[:0], uint64(len(it.Value())))
		bw.Write(hdr)
		if _, err := bw.Write(it.Value()); err != nil {
			return fmt.Errorf("write snapshot: %w", err)
		}
		n++
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("read store for snapshot: %w", err)
	}
	bw.Write(binary.AppendUvarint(nil, 0))
	bw.Write(binary.AppendUvarint(nil, n))
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	return nil
}

// Restore replaces the whole store with a snapshot. The counters record
// (which carries the applied index) is written last, in the final synced
// batch, so a crash mid-restore leaves a store that knows it is incomplete
// (applied index 0) and is restored again at the next start.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	// Every record may change: the cache is emptied and stays out of use
	// (odd seq) until the restore ends, when it is emptied again.
	f.cache.begin()
	f.cache.clearAll()
	defer f.cache.end(nil)
	br := bufio.NewReaderSize(rc, 1<<20)
	head := make([]byte, len(snapMagic)+1)
	if _, err := io.ReadFull(br, head); err != nil {
		return fmt.Errorf("restore: read snapshot header: %w", err)
	}
	if string(head[:len(snapMagic)]) != string(snapMagic) || head[len(snapMagic)] != snapFormatV1 {
		return fmt.Errorf("restore: not a metadata snapshot of format %d", snapFormatV1)
	}
	b := f.db.NewBatch()
	if err := b.DeleteRange([]byte{0}, []byte{0xff}); err != nil {
		b.Close()
		return err
	}
	var counters []byte
	var n uint64
	readField := func(max uint64) ([]byte, error) {
		ln, err := binary.ReadUvarint(br)
		if err != nil {
			return nil, err
		}
		if ln > max {
			return nil, fmt.Errorf("field of %d bytes", ln)
		}
		v := make([]byte, ln)
		_, err = io.ReadFull(br, v)
		return v, err
	}
	for {
		k, err := readField(1 << 20)
		if err != nil {
			b.Close()
			return fmt.Errorf("restore: read key: %w", err)
		}
		if len(k) == 0 {
			break
		}
		v, err := readField(256 << 20)
		if err != nil {
			b.Close()
			return fmt.Errorf("restore: read value: %w", err)
		}
		n++
		if string(k) == string(schema.CountersKey()) {
			counters = v
			continue
		}
		if err := b.Set(k, v); err != nil {
			b.Close()
			return err
		}
		if b.Count() >= 50000 {
			if err := b.Apply(false); err != nil {
				b.Close()
				return fmt.Errorf("restore: %w", err)
			}
			b.Close()
			b = f.db.NewBatch()
		}
	}
	defer b.Close()
	want, err := binary.ReadUvarint(br)
	if err != nil || want != n {
		return fmt.Errorf("restore: snapshot has %d records, trailer says %d (%v)", n, want, err)
	}
	if counters != nil {
		if err := b.Set(schema.CountersKey(), counters); err != nil {
			return err
		}
	}
	if err := b.Apply(true); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return f.loadCounters()
}
