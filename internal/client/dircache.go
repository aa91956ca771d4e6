package client

import (
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// dirCache holds directories' attributes as the metadata service answered
// them to this client's own namespace changes — create, mkdir, mknod and
// symlink, unlink, rmdir, rename (both parents and a moved directory), link,
// setattr and layout of a directory (rpc.ChangeResp.Dir, rpc.DirChangeResp,
// rpc.LinkResp.Dir, rpc.AttrResp) — for GetAttr to serve for ttl instead
// of asking again.
//
// Why: with default_permissions the kernel re-reads a directory's
// attributes after every entry change in it (they are invalidated by the
// change, and the next create or unlink needs them for its permission
// check), so each change cost two metadata calls. The answer to the change
// already carries them.
//
// Order: every answer carries the raft index of its change, and the
// attributes it carries are the directory's state right after that entry.
// An entry keeps the answer of the highest index seen for its inode, so
// answers overtaking each other on their way back (concurrent creates in
// one directory) never put an older state in place of a newer one. A
// change known to alter a directory without saying how (xattrs, rmdir of
// it, an answer replayed for a retry without the attributes) leaves a
// tombstone at its index: GetAttr asks the service, and older answers are
// not taken while they could still be served.
//
// Staleness is that of the kernel's own attribute cache (the same ttl):
// another client's change shows after at most ttl. A change whose effect on
// directories is unknown (a call that failed other than by a refusal)
// empties the cache, and an answer to a call sent before that is not
// stored (gen).
type dirCache struct {
	ttl time.Duration
	mu  sync.Mutex
	gen uint64
	m   map[uint64]dirAttr
}

type dirAttr struct {
	a     rpc.Attr
	at    time.Time // when the call that answered it was sent (tombstone: when it was set)
	index uint64    // raft index of the change that answered it
	gone  bool      // a tombstone: the state after index is unknown here
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

// note stores the attributes a of a directory as the change at raft index
// answered them to a call begun at (gen, at). Attributes of anything but a
// directory are ignored; a directory without links (removed) leaves a
// tombstone; index 0 (an answer of unknown order) leaves one for a.Ino.
func (d *dirCache) note(a *rpc.Attr, index, gen uint64, at time.Time) {
	if d.ttl <= 0 || a.Ino == 0 || a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return
	}
	if index == 0 {
		d.reset()
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.gen {
		return // a change of unknown effect came in between
	}
	if a.Nlink == 0 {
		d.buryLocked(a.Ino, index)
		return
	}
	if old, ok := d.m[a.Ino]; ok && old.index >= index {
		return // this change's answer, or a later one's, is here already
	}
	d.putLocked(a.Ino, dirAttr{a: *a, at: at, index: index})
}

// changed records that the change at raft index altered directory ino in a
// way not answered: its cached attributes go, and answers of earlier
// changes are not taken (index 0, order unknown: everything goes).
func (d *dirCache) changed(ino, index uint64) {
	if d.ttl <= 0 || ino == 0 {
		return
	}
	if index == 0 {
		d.reset()
		return
	}
	d.mu.Lock()
	d.buryLocked(ino, index)
	d.mu.Unlock()
}

// touch records a create this client answered itself in directory ino,
// which it holds the create delegation of (createq.go): its mtime and
// ctime are t (ns). Nobody else changes the directory's entries while the
// delegation is held, so the cached attributes stay this client's to keep
// and are served for ttl from now; the batch's answer, at its index,
// replaces them.
func (d *dirCache) touch(ino uint64, t int64) {
	if d.ttl <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[ino]
	if !ok || e.gone {
		return
	}
	e.a.Mtime, e.a.Ctime = max(e.a.Mtime, t), max(e.a.Ctime, t)
	e.at = time.Now()
	d.m[ino] = e
}

// buryLocked leaves a tombstone for ino at index. It lives for ttl from
// now: every answer of an earlier change was sent before now, so it is too
// old to be served once the tombstone is gone.
func (d *dirCache) buryLocked(ino, index uint64) {
	if old, ok := d.m[ino]; ok && old.index > index {
		return
	}
	d.putLocked(ino, dirAttr{at: time.Now(), index: index, gone: true})
}

func (d *dirCache) putLocked(ino uint64, e dirAttr) {
	if _, ok := d.m[ino]; !ok && len(d.m) >= dirCacheMax {
		// Starting over forgets tombstones: answers to calls sent
		// before are not taken either.
		d.gen++
		clear(d.m)
	}
	d.m[ino] = e
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
	if e.gone {
		return rpc.Attr{}, false
	}
	return e.a, true
}

// reset forgets everything (a change of unknown effect was made).
func (d *dirCache) reset() {
	d.mu.Lock()
	d.gen++
	clear(d.m)
	d.mu.Unlock()
}
