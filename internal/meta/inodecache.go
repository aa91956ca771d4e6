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

// inodeCacheMax bounds the decoded inodes kept (about 200 bytes each);
// beyond it an entry goes at random for each new one.
const inodeCacheMax = 1 << 15

// inodeCache keeps decoded inode records of the metadata store, so that a
// file's attributes read by a lookup, then by the open's close-to-open
// getattr and by the apply of its access time cost one store read instead
// of three (a point read of a large memtable is ~10 µs of cache misses).
//
// It is exact: a cached record is the store's committed value. The FSM is
// the only writer of inode records, and only through opCtx.flush; every
// batch commit goes through commitLocked, which makes seq odd before the
// store's batch is applied, drops the records the batch touched after,
// and makes seq even again. A reader that missed inserts what it read from
// the store only if seq was even when it began and has not moved since:
// no commit began or ended during its read, so the value is still the
// committed one. Between a commit and the drop, readers of a cached record
// get the old value and readers of an uncached one may get the new from the
// store, but no reader gets the old after any got the new (a record cached
// then is cached from before the commit until the drop, and nobody reads
// the store for it meanwhile); the proposer's answer comes after the drop.
type inodeCache struct {
	mu  sync.Mutex
	seq uint64 // odd while a batch is being committed
	m   map[uint64]*schema.Inode
}

// get returns a copy of ino's cached record. The copy shares the slices
// (Layout.Targets, Alloc) with the cache: readers must not change them.
func (c *inodeCache) get(ino uint64) (schema.Inode, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in, ok := c.m[ino]; ok {
		return *in, 0, true
	}
	return schema.Inode{}, c.seq, false
}

// add caches in as ino's record if no commit ran since get answered seq.
func (c *inodeCache) add(ino uint64, in *schema.Inode, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq != c.seq || seq%2 == 1 {
		return
	}
	if c.m == nil {
		c.m = make(map[uint64]*schema.Inode)
	}
	if len(c.m) >= inodeCacheMax {
		for k := range c.m { // one at random
			delete(c.m, k)
			break
		}
	}
	cp := *in
	c.m[ino] = &cp
}

// begin marks a commit under way: nothing read from now on is cached.
func (c *inodeCache) begin() {
	c.mu.Lock()
	c.seq++
	c.mu.Unlock()
}

// end drops the records a commit wrote (all when touched is nil) and ends it.
func (c *inodeCache) end(touched map[uint64]struct{}, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if all {
		clear(c.m)
	} else {
		for ino := range touched {
			delete(c.m, ino)
		}
	}
	c.seq++
}

// readInode reads ino's committed record, through the cache. The answer's
// slices may be shared with the cache: the caller must not change them.
func (f *fsm) readInode(ino uint64) (*schema.Inode, error) {
	in, seq, ok := f.icache.get(ino)
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
	f.icache.add(ino, &in, seq)
	return &in, nil
}

// cachedForApply copies ino's cached record into dst for an apply (its
// slices cloned, so the apply may change them), when the batch being
// applied has not written the record yet; false otherwise. Called with
// f.mu held: the cache then holds committed values only.
func (f *fsm) cachedForApply(ino uint64, dst *schema.Inode) bool {
	if _, ok := f.touched[ino]; ok {
		return false
	}
	in, _, ok := f.icache.get(ino)
	if !ok {
		return false
	}
	in.Layout.Targets = slices.Clone(in.Layout.Targets)
	in.Alloc = slices.Clone(in.Alloc)
	*dst = in
	return true
}
