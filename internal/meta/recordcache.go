package meta

import (
	"errors"
	"slices"
	"sync"
	"syscall"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// recordCacheMax bounds the decoded inode records kept (about 200 bytes
// each) and, apart, the directory entries (about 80); beyond it an entry
// goes at random for each new one.
const recordCacheMax = 1 << 16

// recordCache keeps decoded inode records and directory entries of the
// metadata store, so that the reads of a small-file read — the lookup's
// entry and inode, the open's close-to-open getattr, the access time's
// apply — are map reads instead of point reads of a large memtable (~10 µs
// of cache misses each on this project's machines).
//
// It is exact: a cached record is the store's committed value. The FSM is
// the only writer of both kinds of record — inodes only through
// opCtx.flush, entries through setDentry/delDentry — and every batch
// commit goes through commitLocked: it makes seq odd before the store's
// batch is applied, then writes the batch's final values of the records it
// touched into the cache (deleted ones dropped), and makes seq even again.
// A reader that missed inserts what it read from the store only if seq was
// even when it began and has not moved since: no commit began or ended
// during its read, so the value is still the committed one. Between a
// commit and the cache's update, readers of a cached record get the old
// value and readers of an uncached one may get the new from the store, but
// no reader gets the old after any got the new: a record cached then was
// cached before the commit and stays until the update (or an eviction,
// after which readers see the new value only), and nothing is inserted
// while seq is odd. The proposer's answer comes after the update.
type recordCache struct {
	mu      sync.Mutex
	seq     uint64 // odd while a batch is being committed
	inodes  map[uint64]*schema.Inode
	entries map[string]schema.Dentry // by schema.DentryKey
}

// batchRecords are the records a batch being applied wrote: their final
// values (nil: deleted), for the cache after the commit and so that the
// batch's own reads do not take the cache's older values.
type batchRecords struct {
	inodes  map[uint64]*schema.Inode
	entries map[string]*schema.Dentry
}

func (b *batchRecords) reset() {
	clear(b.inodes)
	clear(b.entries)
}

// noteInode records in (nil: deleted) as ino's value in the batch; in is
// copied with its slices.
func (b *batchRecords) noteInode(ino uint64, in *schema.Inode) {
	if in != nil {
		cp := *in
		cp.Layout.Targets = slices.Clone(in.Layout.Targets)
		cp.Alloc = slices.Clone(in.Alloc)
		in = &cp
	}
	b.inodes[ino] = in
}

func (b *batchRecords) noteEntry(key []byte, de *schema.Dentry) {
	if de != nil {
		cp := *de
		de = &cp
	}
	b.entries[string(key)] = de
}

func (c *recordCache) inode(ino uint64) (schema.Inode, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in, ok := c.inodes[ino]; ok {
		return *in, 0, true
	}
	return schema.Inode{}, c.seq, false
}

func (c *recordCache) entry(key []byte) (schema.Dentry, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if de, ok := c.entries[string(key)]; ok {
		return de, 0, true
	}
	return schema.Dentry{}, c.seq, false
}

// evictOne makes room in m for one more entry.
func evictOne[K comparable, V any](m map[K]V) {
	if len(m) < recordCacheMax {
		return
	}
	for k := range m { // one at random
		delete(m, k)
		return
	}
}

// addInode caches in as ino's record if no commit ran since the miss that
// answered seq.
func (c *recordCache) addInode(ino uint64, in *schema.Inode, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq != c.seq || seq%2 == 1 {
		return
	}
	evictOne(c.inodes)
	cp := *in
	c.inodes[ino] = &cp
}

func (c *recordCache) addEntry(key []byte, de schema.Dentry, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq != c.seq || seq%2 == 1 {
		return
	}
	evictOne(c.entries)
	c.entries[string(key)] = de
}

func newRecordCache() recordCache {
	return recordCache{inodes: make(map[uint64]*schema.Inode), entries: make(map[string]schema.Dentry)}
}

func newBatchRecords() batchRecords {
	return batchRecords{inodes: make(map[uint64]*schema.Inode), entries: make(map[string]*schema.Dentry)}
}

// clearAll empties the cache.
func (c *recordCache) clearAll() {
	c.mu.Lock()
	clear(c.inodes)
	clear(c.entries)
	c.mu.Unlock()
}

// begin marks a commit under way: nothing read from now on is cached.
func (c *recordCache) begin() {
	c.mu.Lock()
	c.seq++
	c.mu.Unlock()
}

// end writes a committed batch's records into the cache (or, with b nil,
// empties it) and ends the commit.
func (c *recordCache) end(b *batchRecords) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if b == nil {
		clear(c.inodes)
		clear(c.entries)
		return
	}
	for ino, in := range b.inodes {
		if in == nil {
			delete(c.inodes, ino)
			continue
		}
		if _, ok := c.inodes[ino]; !ok {
			evictOne(c.inodes)
		}
		c.inodes[ino] = in // the batch's copy, not changed after
	}
	for k, de := range b.entries {
		if de == nil {
			delete(c.entries, k)
			continue
		}
		if _, ok := c.entries[k]; !ok {
			evictOne(c.entries)
		}
		c.entries[k] = *de
	}
}

// readInode reads ino's committed record, through the cache. The answer's
// slices may be shared with the cache: the caller must not change them.
func (f *fsm) readInode(ino uint64) (*schema.Inode, error) {
	in, seq, ok := f.cache.inode(ino)
	if ok {
		return &in, nil
	}
	v, err := f.db.Get(schema.InodeKey(ino))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, rpc.Errorf(syscall.ENOENT, "inode %d does not exist", ino)
	}
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "read inode %d: %v", ino, err)
	}
	if err := schema.DecodeInode(v, &in); err != nil {
		return nil, rpc.Errorf(syscall.EIO, "inode %d: %v", ino, err)
	}
	f.cache.addInode(ino, &in, seq)
	return &in, nil
}

// readEntry reads the committed entry under key (schema.DentryKey),
// through the cache; kv.ErrNotFound if there is none.
func (f *fsm) readEntry(key []byte) (schema.Dentry, error) {
	de, seq, ok := f.cache.entry(key)
	if ok {
		return de, nil
	}
	v, err := f.db.Get(key)
	if err != nil {
		return schema.Dentry{}, err
	}
	if de, err = schema.DecodeDentry(v); err != nil {
		return schema.Dentry{}, err
	}
	f.cache.addEntry(key, de, seq)
	return de, nil
}

// cachedForApply copies ino's cached record into dst for an apply (its
// slices cloned, so the apply may change them), when the batch being
// applied has not written the record; false otherwise. Called with f.mu
// held: the cache then holds committed values only.
func (f *fsm) cachedForApply(ino uint64, dst *schema.Inode) bool {
	if _, ok := f.batch.inodes[ino]; ok {
		return false
	}
	in, _, ok := f.cache.inode(ino)
	if !ok {
		return false
	}
	in.Layout.Targets = slices.Clone(in.Layout.Targets)
	in.Alloc = slices.Clone(in.Alloc)
	*dst = in
	return true
}

// entryForApply answers an apply's read of the entry under key without the
// store when it can: the batch's own value if the batch being applied wrote
// the key (found false: deleted), else the cached committed value (an
// unlink's or a rename's entry, cached by the create or lookup before);
// ok false when neither knows. Called with f.mu held, as cachedForApply.
func (f *fsm) entryForApply(key []byte) (de schema.Dentry, found, ok bool) {
	if p, in := f.batch.entries[string(key)]; in {
		if p == nil {
			return schema.Dentry{}, false, true
		}
		return *p, true, true
	}
	if de, _, cached := f.cache.entry(key); cached {
		return de, true, true
	}
	return schema.Dentry{}, false, false
}
