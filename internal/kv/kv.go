package kv

import "errors"

// ErrNotFound is answered by Get for an absent key.
var ErrNotFound = errors.New("kv: key not found")

// Reader reads keys. Implemented by Store, Batch and Snapshot.
type Reader interface {
	// Get returns a copy of key's value, or ErrNotFound.
	Get(key []byte) ([]byte, error)
	// NewIter iterates keys in [lower, upper) in order; nil bounds are open.
	NewIter(lower, upper []byte) (Iter, error)
}

// Writer changes keys. Implemented by Batch.
type Writer interface {
	Set(key, value []byte) error
	Delete(key []byte) error
	// DeleteRange deletes every key in [start, end).
	DeleteRange(start, end []byte) error
}

// Iter walks a key range. Positioning methods report whether the iterator
// is on a key. Key and Value alias internal memory valid until the next move.
type Iter interface {
	First() bool
	Last() bool
	SeekGE(key []byte) bool
	Next() bool
	Prev() bool
	Valid() bool
	Key() []byte
	Value() []byte
	// Error reports an error that stopped iteration; check it after the loop.
	Error() error
	Close() error
}

// Batch is an indexed write batch: reads through it see its own writes.
type Batch interface {
	Reader
	Writer
	// Apply commits the batch atomically; with sync it is on stable storage
	// before Apply returns. A batch can be applied once.
	Apply(sync bool) error
	// Count is the number of operations in the batch.
	Count() int
	// Close releases the batch (after Apply, or to discard it).
	Close() error
}

// Snapshot is a consistent, read-only view of a Store at one moment.
type Snapshot interface {
	Reader
	Close() error
}

// Store is an ordered key/value store. Safe for concurrent use.
type Store interface {
	Reader
	NewBatch() Batch
	NewSnapshot() Snapshot
	// Sync makes every write applied so far durable (a synced, empty WAL
	// record: the log is sequential, so earlier records reach disk too;
	// without a WAL, a memtable flush).
	Sync() error
	// Flush writes the memtable to a table file.
	Flush() error
	// Checkpoint writes a consistent copy of the store to dir, which must
	// not exist (hard links where possible).
	Checkpoint(dir string) error
	// Health is nil unless the engine keeps failing in the background
	// (flushes or compactions that cannot write): then the latest error,
	// with how long the failures have gone on.
	Health() error
	Close() error
}
