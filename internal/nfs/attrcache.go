package nfs

import (
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// attrCache keeps the attributes the metadata service last answered for
// an inode, for READ, WRITE and COMMIT to check permissions and bound a
// read with, instead of a metadata call each (a 4 KiB READ cost a GetAttr
// and a store read).
//
// Freshness: an entry serves for ttl (Config.AttrTimeout) after the call
// that answered it was sent, then the next call asks again. Every
// attribute answer the gateway gets refreshes it — GETATTR, LOOKUP,
// ACCESS, SETATTR, the creations, READDIRPLUS' entries, WRITE's and
// COMMIT's post-operation attributes — so a change made through this
// gateway is seen at once, and one made elsewhere (a FUSE mount, another
// gateway) within ttl, which is the FUSE mount's own attribute timeout for
// its permission checks and reads. GETATTR and ACCESS always ask the
// metadata service: they are the NFS client's close-to-open revalidation
// (RFC 1813 leaves caching to clients), so a client opening a file after
// another closed it sees its new size and mtime, and its READs then the
// new size here. The uncommitted state of this gateway's own open files
// (write-behind, a truncate) is folded in at each use
// (client.Client.MergeLocal), as GetAttr does.
//
// A file this gateway removes (REMOVE) leaves the cache at once, so its
// handle is NFS3ERR_STALE at once; a RENAME empties the cache (the
// replaced file is unknown); one removed elsewhere is STALE after at most
// ttl.
type attrCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[uint64]cachedAttr
	// floor: answers to calls sent before it are not taken (reset).
	floor time.Time
}

type cachedAttr struct {
	a     rpc.Attr
	since uint64    // the client's SizeSeq before the call (MergeLocal)
	at    time.Time // when the call that answered a was sent (a tombstone: when dropped)
	gone  bool      // a tombstone: dropped at at
}

// attrCacheMax bounds the cache; when full, the entries older than ttl go
// (never served, and a tombstone that old turns away only answers that
// would be too old to serve anyway), and if none is, everything (with a
// floor at now).
const attrCacheMax = 16384

func newAttrCache(ttl time.Duration) *attrCache {
	return &attrCache{ttl: ttl, m: map[uint64]cachedAttr{}}
}

// get returns ino's attributes if answered to a call sent within ttl.
func (c *attrCache) get(ino uint64) (cachedAttr, bool) {
	if c.ttl <= 0 {
		return cachedAttr{}, false
	}
	c.mu.Lock()
	e, ok := c.m[ino]
	c.mu.Unlock()
	if !ok || e.gone || time.Since(e.at) >= c.ttl {
		return cachedAttr{}, false
	}
	return e, true
}

// put keeps a, answered to a call sent at at (since: the client's SizeSeq
// before it), unless the entry holds an answer to a later call or a drop
// after at, or a reset came after at.
func (c *attrCache) put(a *rpc.Attr, since uint64, at time.Time) {
	if c.ttl <= 0 || a.Ino == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.Before(c.floor) {
		return
	}
	if old, ok := c.m[a.Ino]; ok && old.at.After(at) {
		return
	}
	c.setLocked(a.Ino, cachedAttr{a: *a, since: since, at: at})
}

// drop forgets ino: answers to calls sent before now are not taken.
func (c *attrCache) drop(ino uint64) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(ino, cachedAttr{at: time.Now(), gone: true})
}

// reset forgets everything: answers to calls sent before now are not
// taken.
func (c *attrCache) reset() {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	c.floor = time.Now()
}

func (c *attrCache) setLocked(ino uint64, e cachedAttr) {
	if _, ok := c.m[ino]; !ok && len(c.m) >= attrCacheMax {
		now := time.Now()
		for k, old := range c.m {
			if now.Sub(old.at) >= c.ttl {
				delete(c.m, k)
			}
		}
		if len(c.m) >= attrCacheMax {
			clear(c.m)
			c.floor = now
			if e.at.Before(now) && !e.gone {
				return
			}
		}
	}
	c.m[ino] = e
}

// changeRefused reports whether err is the metadata service refusing a
// namespace change for what it asked (the namespace is as it was); nil is
// not a refusal.
func changeRefused(err error) bool {
	switch rpc.ErrnoOf(err) {
	case syscall.EEXIST, syscall.ENOENT, syscall.ENOTEMPTY, syscall.ENOTDIR, syscall.EISDIR, syscall.EINVAL,
		syscall.EPERM, syscall.EMLINK, syscall.ENAMETOOLONG, syscall.ENOSPC, syscall.EXDEV:
		return true
	}
	return false
}
