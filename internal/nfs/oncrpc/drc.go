package oncrpc

import (
	"container/list"
	"hash/crc32"
	"net/netip"
	"sync"
	"time"
)

// The duplicate request cache (DRC).
//
// A client that lost its connection (a network blip, a gateway that
// stalled) sends its outstanding calls again, with the same xid, on a new
// one. For most procedures that is harmless, but a non-idempotent one run
// twice answers the retransmission with the outcome of the second run: a
// REMOVE that worked gets NFS3ERR_NOENT, an exclusive CREATE NFS3ERR_EXIST,
// a RENAME NFS3ERR_NOENT — errors the application sees although its call
// succeeded. The server therefore keeps the replies of the procedures a
// Program marks Cached, keyed by the caller's address (without the port:
// a client may reconnect from another), the xid, the program, version and
// procedure, and a checksum and length of the arguments (a client reusing
// an xid for another call must not get the old reply):
//
//   - a call whose entry holds a reply gets that reply again, not run;
//   - a call whose entry is in progress (the first is still running) is
//     dropped: the client retransmits again later and then finds the reply;
//   - otherwise the call runs and its reply is kept.
//
// Entries live drcTTL and at most Config.DRCEntries of them are kept, the
// oldest dropped first; a reply larger than drcMaxReply is not kept (the
// Cached procedures answer a few hundred bytes). As knfsd's, the cache is
// in memory: a restarted gateway, or the other gateway of an HA pair, does
// not have it.

// drcTTL is how long a reply is kept: longer than a client's retransmission
// timeouts (Linux: timeo=600 deciseconds over TCP, doubling with retries).
const drcTTL = 3 * time.Minute

// drcMaxReply bounds a kept reply.
const drcMaxReply = 4096

// drcSumBytes is how much of the arguments the checksum covers (as knfsd:
// enough to tell calls apart, cheap for a WRITE-sized record).
const drcSumBytes = 256

type drcKey struct {
	addr             netip.Addr
	xid              uint32
	prog, vers, proc uint32
	sum              uint32
	argLen           int
}

type drcEntry struct {
	key   drcKey
	at    time.Time
	done  bool
	reply []byte // the whole record, record mark included (same xid)
	elem  *list.Element
}

// drc is the duplicate request cache.
type drc struct {
	max int
	mu  sync.Mutex
	m   map[drcKey]*drcEntry
	lru *list.List // of *drcEntry, oldest at the front
	// hits, drops: replies sent again, retransmissions dropped while
	// their first call ran (tests, logs).
	hits, drops uint64
}

func newDRC(max int) *drc {
	return &drc{max: max, m: map[drcKey]*drcEntry{}, lru: list.New()}
}

func drcKeyOf(call *Call, args []byte) drcKey {
	return drcKey{addr: call.Remote.Addr().Unmap(), xid: call.Xid, prog: call.Prog, vers: call.Vers, proc: call.Proc,
		sum: crc32.ChecksumIEEE(args[:min(len(args), drcSumBytes)]), argLen: len(args)}
}

// drcVerdict is what to do with a call.
type drcVerdict int

const (
	drcRun    drcVerdict = iota // new: run it, then put its reply
	drcReplay                   // answered before: send the reply kept
	drcDrop                     // its first transmission still runs
)

// begin looks k up at now: a kept reply to send again, a call in progress
// (drop this one), or a new entry in progress (run it).
func (c *drc) begin(k drcKey, now time.Time) (drcVerdict, []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	if e := c.m[k]; e != nil {
		if !e.done {
			c.drops++
			return drcDrop, nil
		}
		c.hits++
		return drcReplay, e.reply
	}
	e := &drcEntry{key: k, at: now}
	e.elem = c.lru.PushBack(e)
	c.m[k] = e
	for c.lru.Len() > c.max {
		c.remove(c.lru.Front().Value.(*drcEntry))
	}
	return drcRun, nil
}

// finish keeps reply (a whole record) for k; a nil or oversized reply
// drops the entry, so that a retransmission runs again.
func (c *drc) finish(k drcKey, reply []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	if e == nil {
		return // evicted meanwhile
	}
	if reply == nil || len(reply) > drcMaxReply {
		c.remove(e)
		return
	}
	e.reply = append([]byte(nil), reply...)
	e.done = true
}

// expire drops the entries older than drcTTL (mu held).
func (c *drc) expire(now time.Time) {
	for f := c.lru.Front(); f != nil; f = c.lru.Front() {
		e := f.Value.(*drcEntry)
		if now.Sub(e.at) < drcTTL {
			return
		}
		c.remove(e)
	}
}

func (c *drc) remove(e *drcEntry) {
	c.lru.Remove(e.elem)
	delete(c.m, e.key)
}

// stats answers the hits and drops so far.
func (c *drc) stats() (hits, drops uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.drops
}
