package store

import (
	"container/list"
	"errors"
	"sync"
)

// chunkKey names a chunk across the server's targets.
type chunkKey struct {
	t   *target
	ino uint64
}

// chunkCache keeps recently used chunks open: opening two files per 4 KiB
// request would cost more than the request. It is a bounded LRU of
// reference-counted handles.
//
// Invariants (under mu): a handle is in m iff it is in lru and !gone; a
// handle's descriptors are closed exactly once, by whoever drops the last
// reference of a gone handle (or evicts an unreferenced one). A handle in m
// may still be opening: users wait on ready.
type chunkCache struct {
	s   *Server
	max int
	mu  struct {
		sync.Mutex
		m   map[chunkKey]*chunk
		lru list.List // of *chunk, most recent at the front
	}
}

func newChunkCache(s *Server, max int) *chunkCache {
	cc := &chunkCache{s: s, max: max}
	cc.mu.m = map[chunkKey]*chunk{}
	return cc
}

// maxCreateJoins bounds how often a creator joins another caller's open
// that then finds no chunk: a reader's open creates for a creator that
// joined it in time (wantCreate), so this only takes a creator that came
// after the reader's open had already failed.
const maxCreateJoins = 64

// get returns a referenced handle for (t, ino), opening the chunk if
// needed; with create a missing chunk is created, without it errNotExist is
// returned. The caller must release the handle.
func (cc *chunkCache) get(t *target, ino uint64, create bool) (*chunk, error) {
	key := chunkKey{t, ino}
	for attempt := 0; ; attempt++ {
		cc.mu.Lock()
		if c := cc.mu.m[key]; c != nil {
			c.refs++
			cc.mu.lru.MoveToFront(c.elem)
			if create {
				c.wantCreate = true
			}
			cc.mu.Unlock()
			<-c.ready
			if c.openErr == nil {
				return c, nil
			}
			cc.release(c)
			// Another caller's open failed; a creator tries itself.
			if errors.Is(c.openErr, errNotExist) && create && attempt < maxCreateJoins {
				continue
			}
			return nil, c.openErr
		}
		c := &chunk{t: t, ino: ino, dataFd: -1, sumFd: -1, refs: 1, ready: make(chan struct{})}
		c.elem = cc.mu.lru.PushFront(c)
		cc.mu.m[key] = c
		victims := cc.evictLocked()
		cc.mu.Unlock()
		for _, v := range victims {
			v.closeFiles()
		}
		err := c.open(create, cc.s)
		if errors.Is(err, errNotExist) {
			// A creator that joined this open is served by it, or it
			// could starve behind readers that keep finding nothing.
			cc.mu.Lock()
			join := c.wantCreate
			cc.mu.Unlock()
			if join {
				err = c.open(true, cc.s)
			}
		}
		c.openErr = err
		if err != nil {
			// Out of the map before the waiters wake: a creator that
			// joined this failed open retries with an entry of its own
			// instead of finding this one again.
			cc.mu.Lock()
			cc.dropLocked(c)
			cc.mu.Unlock()
			close(c.ready)
			cc.release(c)
			return nil, err
		}
		close(c.ready)
		return c, nil
	}
}

// lookup returns a referenced handle if the chunk is open, else nil.
func (cc *chunkCache) lookup(t *target, ino uint64) *chunk {
	cc.mu.Lock()
	c := cc.mu.m[chunkKey{t, ino}]
	if c != nil {
		c.refs++
	}
	cc.mu.Unlock()
	if c == nil {
		return nil
	}
	<-c.ready
	if c.openErr != nil {
		cc.release(c)
		return nil
	}
	return c
}

// release drops a reference; the last reference of a gone handle closes it.
func (cc *chunkCache) release(c *chunk) {
	cc.mu.Lock()
	c.refs--
	last := c.refs == 0 && c.gone
	var victims []*chunk
	if c.refs == 0 && len(cc.mu.m) > cc.max {
		victims = cc.evictLocked()
	}
	cc.mu.Unlock()
	if last {
		c.closeFiles()
	}
	for _, v := range victims {
		v.closeFiles()
	}
}

// forget takes c out of the cache (after a remove); it closes when its
// last reference goes.
func (cc *chunkCache) forget(c *chunk) {
	cc.mu.Lock()
	cc.dropLocked(c)
	cc.mu.Unlock()
}

func (cc *chunkCache) dropLocked(c *chunk) {
	if c.gone {
		return
	}
	c.gone = true
	cc.mu.lru.Remove(c.elem)
	if cc.mu.m[chunkKey{c.t, c.ino}] == c {
		delete(cc.mu.m, chunkKey{c.t, c.ino})
	}
}

// evictLocked drops unreferenced handles from the cold end until the cache
// is within bounds, and returns them for closing outside the lock. A dirty
// handle is remembered as the target's own (target.ours) before anyone can
// reopen it, so the reopen does not mistake it for crash debris.
func (cc *chunkCache) evictLocked() []*chunk {
	var victims []*chunk
	for e := cc.mu.lru.Back(); e != nil && len(cc.mu.m) > cc.max; {
		c := e.Value.(*chunk)
		e = e.Prev()
		if c.refs != 0 {
			continue
		}
		if c.flag.dirty && !c.flag.removed {
			c.t.markOurs(c.ino)
		}
		cc.dropLocked(c)
		victims = append(victims, c)
	}
	return victims
}

// drain removes every handle from the cache and returns those that were
// open and unreferenced; used by Close after the rpc server stopped.
func (cc *chunkCache) drain() []*chunk {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var out []*chunk
	for e := cc.mu.lru.Front(); e != nil; {
		c := e.Value.(*chunk)
		e = e.Next()
		cc.dropLocked(c)
		if c.refs == 0 && c.openErr == nil {
			out = append(out, c)
		}
	}
	return out
}
