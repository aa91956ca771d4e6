package client

import (
	"sync"
	"time"
)

// xattrMisses answers "no such extended attribute" without a metadata
// round trip for a while after the service said so, or after this client
// created the file (a new file has none). The kernel asks for
// security.capability before every write to a file (file_remove_privs),
// so without this each write to a FUSE file costs a GETXATTR round trip.
//
// An entry lives for the client's attribute timeout (Config.DirAttrTTL,
// as long as the kernel caches attributes): an xattr another mount sets
// is seen here within that time, as that mount's attribute changes are.
// This client's own SetXattr and RemoveXattr of the inode drop its entry
// at once, so its own changes are seen immediately.
type xattrMisses struct {
	mu sync.Mutex
	m  map[uint64]*xattrMiss
	// changes counts this client's xattr changes (any inode): an answer
	// to a question asked before one of them is not cached (changes are
	// rare; a miss not cached only costs a round trip).
	changes uint64
}

type xattrMiss struct {
	until time.Time
	none  bool                // the file has no xattrs at all (this client made it)
	names map[string]struct{} // names the service answered ENODATA for
}

// maxXattrMisses bounds the cache; beyond it, it starts over.
const maxXattrMisses = 100000

// absent reports whether name is known to be missing on ino.
func (x *xattrMisses) absent(ino uint64, name string, now time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.m[ino]
	if e == nil {
		return false
	}
	if now.After(e.until) {
		delete(x.m, ino)
		return false
	}
	if e.none {
		return true
	}
	_, ok := e.names[name]
	return ok
}

// entryLocked returns ino's entry, fresh for ttl from now; the caller holds mu.
func (x *xattrMisses) entryLocked(ino uint64, now time.Time, ttl time.Duration) *xattrMiss {
	if x.m == nil || len(x.m) >= maxXattrMisses {
		x.m = map[uint64]*xattrMiss{}
	}
	e := x.m[ino]
	if e == nil || now.After(e.until) {
		e = &xattrMiss{}
		x.m[ino] = e
	}
	e.until = now.Add(ttl)
	return e
}

// generation is the change count before a question to the service.
func (x *xattrMisses) generation() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.changes
}

// missing notes that the service answered ENODATA for name on ino to a
// question sent at asked, when the change count was gen.
func (x *xattrMisses) missing(ino uint64, name string, asked time.Time, ttl time.Duration, gen uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if gen != x.changes {
		return // this client changed xattrs since the question
	}
	e := x.entryLocked(ino, asked, ttl)
	if e.names == nil {
		e.names = map[string]struct{}{}
	}
	e.names[name] = struct{}{}
}

// none notes that ino, just created here, has no xattrs.
func (x *xattrMisses) none(ino uint64, ttl time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.entryLocked(ino, time.Now(), ttl).none = true
}

// changed drops what is known of ino's xattrs (this client sets or
// removes one) and bumps the change count that in-flight questions check.
func (x *xattrMisses) changed(ino uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.m, ino)
	x.changes++
}
