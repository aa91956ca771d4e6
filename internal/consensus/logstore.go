package consensus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stratafs/strata/internal/kv"
)

// logStore is raft's LogStore and StableStore over one kv.Store. Every
// write is synced: the raft log is the durability of the whole service.
//
// Keys: 'l' index(8, big-endian) → log entry; 's' key → stable value.
//
// Log entry value, version 1:
//
//	field       encoding
//	version     1 byte (1)
//	term        uvarint
//	type        1 byte (raft.LogType)
//	appendedAt  varint, ns since epoch (0: unset)
//	data        uvarint length + bytes
//	extensions  uvarint length + bytes
type logStore struct {
	kv kv.Store

	// mu guards the cached first/last index (0, 0 when empty). Raft calls the
	// log store from several goroutines (leader loop, replication, FSM
	// replay), so the cache is kept under a mutex.
	mu          sync.Mutex
	first, last uint64
}

var (
	_ raft.LogStore    = (*logStore)(nil)
	_ raft.StableStore = (*logStore)(nil)
)

const (
	prefixLog    = 'l'
	prefixStable = 's'
	logFormatV1  = 1
)

func logKey(i uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixLog}, i)
}

func openLogStore(dir string) (*logStore, error) {
	store, err := kv.Open(dir, kv.Options{CacheBytes: 16 << 20, MemTableBytes: 16 << 20})
	if err != nil {
		return nil, err
	}
	s := &logStore{kv: store}
	if err := s.loadBounds(); err != nil {
		store.Close()
		return nil, err
	}
	return s, nil
}

func (s *logStore) loadBounds() error {
	it, err := s.kv.NewIter([]byte{prefixLog}, []byte{prefixLog + 1})
	if err != nil {
		return err
	}
	defer it.Close()
	if it.First() {
		s.first = binary.BigEndian.Uint64(it.Key()[1:])
		it.Last()
		s.last = binary.BigEndian.Uint64(it.Key()[1:])
	}
	return it.Error()
}

func (s *logStore) FirstIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first, nil
}

func (s *logStore) LastIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, nil
}

func (s *logStore) GetLog(index uint64, l *raft.Log) error {
	v, err := s.kv.Get(logKey(index))
	if errors.Is(err, kv.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raft log get %d: %w", index, err)
	}
	if err := decodeLog(v, l); err != nil {
		return fmt.Errorf("raft log entry %d: %w", index, err)
	}
	l.Index = index
	return nil
}

func (s *logStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs writes all entries in one synced batch: this is the group
// commit, one fsync for everything raft gathered.
func (s *logStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	b := s.kv.NewBatch()
	defer b.Close()
	var buf []byte
	for _, l := range logs {
		buf = encodeLog(buf[:0], l)
		if err := b.Set(logKey(l.Index), buf); err != nil {
			return fmt.Errorf("raft log store %d: %w", l.Index, err)
		}
	}
	if err := b.Apply(true); err != nil {
		return fmt.Errorf("raft log store %d..%d: %w", logs[0].Index, logs[len(logs)-1].Index, err)
	}
	s.mu.Lock()
	if s.first == 0 || logs[0].Index < s.first {
		s.first = logs[0].Index
	}
	if l := logs[len(logs)-1].Index; l > s.last {
		s.last = l
	}
	s.mu.Unlock()
	return nil
}

func (s *logStore) DeleteRange(min, max uint64) error {
	b := s.kv.NewBatch()
	defer b.Close()
	if err := b.DeleteRange(logKey(min), logKey(max+1)); err != nil {
		return err
	}
	if err := b.Apply(true); err != nil {
		return fmt.Errorf("raft log delete %d..%d: %w", min, max, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first, s.last = 0, 0
	return s.loadBounds()
}

func (s *logStore) Set(key, val []byte) error {
	b := s.kv.NewBatch()
	defer b.Close()
	if err := b.Set(append([]byte{prefixStable}, key...), val); err != nil {
		return err
	}
	if err := b.Apply(true); err != nil {
		return fmt.Errorf("raft stable set %q: %w", key, err)
	}
	return nil
}

// Get returns an empty value for an absent key, as raft expects.
func (s *logStore) Get(key []byte) ([]byte, error) {
	v, err := s.kv.Get(append([]byte{prefixStable}, key...))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	return v, err
}

func (s *logStore) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

func (s *logStore) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil || len(v) == 0 {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raft stable %q: %d bytes, want 8", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func (s *logStore) Close() error { return s.kv.Close() }

func encodeLog(b []byte, l *raft.Log) []byte {
	b = append(b, logFormatV1)
	b = binary.AppendUvarint(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	return append(b, l.Extensions...)
}

var errBadLog = errors.New("malformed raft log entry")

func decodeLog(b []byte, l *raft.Log) error {
	if len(b) < 1 || b[0] != logFormatV1 {
		return fmt.Errorf("%w: unknown format", errBadLog)
	}
	b = b[1:]
	term, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+1 {
		return fmt.Errorf("%w: term", errBadLog)
	}
	l.Term = term
	l.Type = raft.LogType(b[n])
	b = b[n+1:]
	at, n := binary.Varint(b)
	if n <= 0 {
		return fmt.Errorf("%w: time", errBadLog)
	}
	b = b[n:]
	l.AppendedAt = time.Time{}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	field := func() ([]byte, bool) {
		ln, n := binary.Uvarint(b)
		if n <= 0 || ln > uint64(len(b)-n) {
			return nil, false
		}
		v := b[n : n+int(ln)]
		b = b[n+int(ln):]
		if len(v) == 0 {
			return nil, true
		}
		return v, true
	}
	var ok bool
	if l.Data, ok = field(); !ok {
		return fmt.Errorf("%w: data", errBadLog)
	}
	if l.Extensions, ok = field(); !ok {
		return fmt.Errorf("%w: extensions", errBadLog)
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errBadLog, len(b))
	}
	return nil
}
