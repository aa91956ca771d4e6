package client

import (
	"sync"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// dirCache holds directories' attributes as the metadata service answered
// them with this client's own creates and unlinks (rpc.ChangeResp), for
// GetAttr to serve for ttl instead of asking again.
//
// Why: with default_permissions the kernel re-reads a directory's
// attributes after every entry change in it (they are invalidated by the
// change, and the next create or unlink needs them for its permission
// check), so each create or unlink cost two metadata calls. The answer to
// the change already carries them.
//
// Staleness is that of the kernel's own attribute cache (the same ttl):
// another client's change shows after at most ttl. Every other namespace
// change made through this client (rename, rmdir, link, setattr, xattrs,
// layouts) empties the cache, and an answer to a call sent before such a
// change is not stored (gen).
type dirCache struct {
	ttl time.Duration
	mu  sync.Mutex
	gen uint64
	m   map[uint64]dirAttr
}

type dirAttr struct {
	a  rpc.Attr
	at time.Time // when the call that answered it was sent
}

// dirCacheMax bounds the cache; when full it starts over.
const dirCacheMax = 4096

func newDirCache(ttl time.Duration) *dirCache {
	return &dirCache{ttl: ttl, m: map[uint64]dirAttr{}}
}

// begin returns the generation to pass to note for a call sent now.
func (d *dirCache) begin() (uint64, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gen, time.Now()
}

// note stores a directory's attributes answered by a call begun at (gen, at).
func (d *dirCache) note(a rpc.Attr, gen uint64, at time.Time) {
	if d.ttl <= 0 || a.Ino == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.gen {
		return // the namespace changed since the call was sent
	}
	if old, ok := d.m[a.Ino]; ok {
		switch {
		case old.a.Ctime > a.Ctime:
			return // a later change's answer is already here
		case old.a.Ctime == a.Ctime && !sameDirAttr(&old.a, &a):
			delete(d.m, a.Ino) // same instant, different state: order unknown
			return
		}
	}
	if len(d.m) >= dirCacheMax {
		clear(d.m)
	}
	d.m[a.Ino] = dirAttr{a: a, at: at}
}

// get returns a cached directory's attributes younger than ttl.
func (d *dirCache) get(ino uint64) (rpc.Attr, bool) {
	if d.ttl <= 0 {
		return rpc.Attr{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[ino]
	if !ok {
		return rpc.Attr{}, false
	}
	if time.Since(e.at) > d.ttl {
		delete(d.m, ino)
		return rpc.Attr{}, false
	}
	return e.a, true
}

// reset forgets everything (another kind of namespace change was made).
func (d *dirCache) reset() {
	d.mu.Lock()
	d.gen++
	clear(d.m)
	d.mu.Unlock()
}

// sameDirAttr compares the fields that a directory's changes move.
func sameDirAttr(x, y *rpc.Attr) bool {
	return x.Mode == y.Mode && x.Nlink == y.Nlink && x.Uid == y.Uid && x.Gid == y.Gid &&
		x.Size == y.Size && x.Mtime == y.Mtime && x.Atime == y.Atime
}
