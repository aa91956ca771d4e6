package client

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/lockrange"
	"github.com/stratafs/strata/internal/rpc"
)

// Lock describes a POSIX record lock, OFD lock or flock (Flock) request.
// Owner identifies the lock owner within this client (process or open file
// description); End is inclusive, ^uint64(0) = to end of file. Handle is
// the open the lock is taken through (File.SetLk sets it; 0: none), whose
// close drops it (see lockrange.DropHandle).
type Lock struct {
	Ino    uint64
	Owner  uint64
	Start  uint64
	End    uint64
	Type   uint32 // rpc.LockRead, rpc.LockWrite, rpc.LockUnlock
	Pid    uint32
	Flock  bool
	Handle uint64
}

// heldKey names one lock table of a file: record locks or flock locks.
type heldKey struct {
	ino   uint64
	flock bool
}

// heldLocks is what this client holds, as the service granted it, so that
// the locks can be reclaimed from a restarted service (see meta's lock
// table: Reclaim). The service grants under an epoch; when an answer shows
// another epoch than the one the held locks were granted under, the client
// sends every held lock again with Reclaim and then reports the new epoch
// in a heartbeat, which lets the service end its grace period.
//
// Lock calls hold rw for reading across the call and the bookkeeping, a
// reclaim holds it for writing: a reclaim never races an unlock (which
// would bring back, on the service, a lock the application released).
type heldLocks struct {
	rw sync.RWMutex
	// handles numbers the opens that take locks (File.owners.handle).
	handles atomic.Uint64
	mu      struct {
		sync.Mutex
		held  map[heldKey][]lockrange.Lock // Client is 0; Owner, range, type as granted
		epoch uint64                       // the epoch every held lock is registered under
	}
}

func (c *Client) lockReq(l Lock, wait bool) *rpc.LockReq {
	return &rpc.LockReq{ClientID: c.clientID.Load(), Ino: l.Ino, Owner: l.Owner, Start: l.Start, End: l.End,
		Type: l.Type, Pid: l.Pid, Flock: l.Flock, Wait: wait, Handle: l.Handle}
}

// GetLk returns the first lock conflicting with l, or one with Type
// rpc.LockUnlock when there is none.
func (c *Client) GetLk(ctx context.Context, l Lock) (rpc.LockResp, error) {
	c.deleg.before(ctx, l.Ino)
	for {
		var resp rpc.LockResp
		err := c.metaCall(ctx, rpc.MGetLk, c.lockReq(l, false), &resp)
		if err == nil {
			return resp, nil
		}
		if !errIs(err, syscall.EBUSY) {
			return resp, metaErr(c, "getlk", err)
		}
		if err := c.awaitLockGrace(ctx); err != nil {
			return resp, err
		}
	}
}

// SetLk takes or releases a lock. Without wait a conflict answers EAGAIN.
// With wait it asks the service again and again (each ask waits a bounded
// time there) until the lock is granted, an error other than EAGAIN
// occurs, or cancel is closed (EINTR). An unlock is forgotten here even
// when the service cannot be told: the application has let go, and a
// reclaim must not bring the lock back.
//
// While a restarted service waits for its clients to reclaim their locks
// (EBUSY), SetLk reclaims this client's own and asks again, wait or not:
// the application sees the answer it would have had without the restart.
func (c *Client) SetLk(ctx context.Context, l Lock, wait bool, cancel <-chan struct{}) error {
	c.deleg.before(ctx, l.Ino)
	for {
		c.locks.rw.RLock()
		var grant rpc.LockGrant
		err := c.metaCall(ctx, rpc.MSetLk, c.lockReq(l, wait), &grant)
		stale := false
		if err == nil || l.Type == rpc.LockUnlock {
			stale = c.noteLock(l, grant.Epoch, err == nil)
		}
		c.locks.rw.RUnlock()
		if stale {
			c.reclaimLocks(ctx, grant.Epoch)
		}
		switch {
		case err == nil:
			c.m.op("lock")
			return nil
		case errIs(err, syscall.EBUSY):
			if err := c.awaitLockGrace(ctx); err != nil {
				return err
			}
		case !wait || !errIs(err, syscall.EAGAIN):
			return metaErr(c, "setlk", err)
		}
		select {
		case <-cancel:
			return fmt.Errorf("waiting for lock on inode %d: %w", l.Ino, syscall.EINTR)
		case <-ctx.Done():
			return fmt.Errorf("waiting for lock on inode %d: %w", l.Ino, syscall.EINTR)
		default:
		}
	}
}

// closeHandleLocks drops the locks (record locks and flocks, of any owner)
// taken through open handle of ino, which is closed: the OFD locks and
// flocks of that open file description. The same owner's locks through
// other opens stay: the kernel names owners by addresses it reuses, so a
// close that arrives late must not release by owner. Like an unlock, it is
// forgotten here even when the service cannot be told.
func (c *Client) closeHandleLocks(ctx context.Context, ino, handle uint64) error {
	c.locks.rw.RLock()
	var grant rpc.LockGrant
	err := c.metaCall(ctx, rpc.MSetLk, &rpc.LockReq{ClientID: c.clientID.Load(), Ino: ino, Type: rpc.LockUnlock,
		Handle: handle, CloseHandle: true}, &grant)
	stale := c.noteHeld(grant.Epoch, err == nil, func(h *heldLocks) {
		for _, flock := range []bool{false, true} {
			k := heldKey{ino: ino, flock: flock}
			list, _ := lockrange.DropHandle(h.mu.held[k], 0, handle)
			h.setLocked(k, list)
		}
	})
	c.locks.rw.RUnlock()
	if stale {
		c.reclaimLocks(ctx, grant.Epoch)
	}
	if err != nil {
		return metaErr(c, "release locks of a closed file", err)
	}
	return nil
}

// awaitLockGrace runs after an EBUSY answer (the service holds back new
// locks while clients reclaim): a heartbeat learns the new lock epoch and
// reclaims this client's locks, so that its next ask is not refused for
// its own sake. It pauses briefly when the heartbeat fails.
func (c *Client) awaitLockGrace(ctx context.Context) error {
	if err := c.heartbeat(ctx); err != nil {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("waiting for the metadata service's lock reclaim: %w", syscall.EINTR)
		}
	}
	return nil
}

// noteLock records a granted (or released) lock and reports whether the
// other held locks were granted under an older epoch than this answer's
// (they need reclaiming).
func (c *Client) noteLock(l Lock, epoch uint64, granted bool) (stale bool) {
	k := heldKey{ino: l.Ino, flock: l.Flock}
	want := lockrange.Lock{Owner: l.Owner, Start: l.Start, End: l.End, Type: l.Type, Pid: l.Pid, Handle: l.Handle}
	return c.noteHeld(epoch, granted, func(h *heldLocks) { h.replaceLocked(k, want) })
}

// noteHeld applies change to the held locks, after a request that the
// service answered (granted) under epoch, and reports whether the other
// held locks need reclaiming (as noteLock).
func (c *Client) noteHeld(epoch uint64, granted bool, change func(*heldLocks)) (stale bool) {
	h := &c.locks
	h.mu.Lock()
	defer h.mu.Unlock()
	others := len(h.mu.held) > 0
	change(h)
	if !granted || epoch == 0 || epoch == h.mu.epoch {
		return false
	}
	if !others {
		h.mu.epoch = epoch // nothing else to carry over
		return false
	}
	return true
}

// replaceLocked applies want (a lock or an unlock) to the held locks of k.
func (h *heldLocks) replaceLocked(k heldKey, want lockrange.Lock) {
	list, _ := lockrange.Replace(h.mu.held[k], want)
	h.setLocked(k, list)
}

// setLocked makes list the held locks of k.
func (h *heldLocks) setLocked(k heldKey, list []lockrange.Lock) {
	switch {
	case len(list) == 0:
		delete(h.mu.held, k)
	case h.mu.held == nil:
		h.mu.held = map[heldKey][]lockrange.Lock{k: list}
	default:
		h.mu.held[k] = list
	}
}

// heldCount is the number of locks (ranges) this client holds.
func (c *Client) heldCount() int {
	c.locks.mu.Lock()
	defer c.locks.mu.Unlock()
	return c.heldCountLocked()
}

// heldCountLocked is heldCount with locks.mu held.
func (c *Client) heldCountLocked() int {
	n := 0
	for _, list := range c.locks.mu.held {
		n += len(list)
	}
	return n
}

// lockEpoch is the epoch the held locks are registered under.
func (c *Client) lockEpoch() uint64 {
	c.locks.mu.Lock()
	defer c.locks.mu.Unlock()
	return c.locks.mu.epoch
}

// reclaimLocks re-registers every held lock with the service, whose lock
// epoch is now epoch, and reports whether all were taken back. A lock the
// service refuses (another client holds a conflicting one) is lost: it is
// logged and forgotten, and the handles its owner locked through fail from
// then on (lockLost), as with NFS.
func (c *Client) reclaimLocks(ctx context.Context, epoch uint64) bool {
	h := &c.locks
	h.rw.Lock()
	defer h.rw.Unlock()
	h.mu.Lock()
	if h.mu.epoch == epoch {
		h.mu.Unlock()
		return true // another caller did it
	}
	var todo []Lock
	for k, list := range h.mu.held {
		for _, l := range list {
			todo = append(todo, Lock{Ino: k.ino, Owner: l.Owner, Start: l.Start, End: l.End, Type: l.Type, Pid: l.Pid, Flock: k.flock, Handle: l.Handle})
		}
	}
	h.mu.Unlock()
	if len(todo) > 0 {
		c.log.Warn("metadata service lost its lock table (restart or new leader); reclaiming this client's locks", "locks", len(todo))
	}
	newest := epoch
	for _, l := range todo {
		req := c.lockReq(l, false)
		req.Reclaim = true
		var grant rpc.LockGrant
		err := c.metaCall(ctx, rpc.MSetLk, req, &grant)
		switch {
		case err == nil:
			newest = grant.Epoch
		case errIs(err, syscall.EAGAIN):
			c.log.Error("lock lost: another client took it while the metadata service restarted", "ino", l.Ino, "start", l.Start, "end", l.End, "pid", l.Pid, "err", err)
			h.mu.Lock()
			h.replaceLocked(heldKey{ino: l.Ino, flock: l.Flock}, lockrange.Lock{Owner: l.Owner, Start: l.Start, End: l.End, Type: rpc.LockUnlock})
			h.mu.Unlock()
			c.lockLost(l.Ino, l.Owner)
		default:
			c.log.Warn("lock reclaim failed; will retry", "ino", l.Ino, "err", err)
			return false
		}
	}
	if newest != epoch {
		return false // the table was reset again meanwhile: the next answer starts over
	}
	h.mu.Lock()
	h.mu.epoch = epoch
	h.mu.Unlock()
	return true
}

// forgetLocks drops every held lock: the session they belonged to is gone
// (expired), and the service released them. Their owners count as having
// lost them (lockLost).
func (c *Client) forgetLocks() int {
	type lost struct{ ino, owner uint64 }
	c.locks.mu.Lock()
	n := c.heldCountLocked()
	var gone []lost
	for k, list := range c.locks.mu.held {
		for _, l := range list {
			gone = append(gone, lost{k.ino, l.Owner})
		}
	}
	c.locks.mu.held = nil
	c.locks.mu.epoch = 0
	c.locks.mu.Unlock()
	for _, g := range gone {
		c.lockLost(g.ino, g.owner)
	}
	return n
}

// lockLost marks that a lock owner held on ino is gone without the
// application releasing it: the handles the owner took locks through now
// fail their reads, writes and close with EIO (File.lockErr); its other
// handles, other owners' and later opens work. Like the Linux NFS client
// after a failed lock recovery, this tells an application that believed
// itself protected, rather than letting it write unguarded.
func (c *Client) lockLost(ino, owner uint64) {
	c.mu.Lock()
	in := c.mu.inodes[ino]
	c.mu.Unlock()
	if in != nil {
		in.lost.note(owner)
	}
}

// lostLocks records, per lock owner, when the owner last lost a lock on
// one file: the value of a count of such losses that only grows.
type lostLocks struct {
	n  atomic.Uint64 // losses so far; 0: none, the common case, read without the lock
	mu sync.Mutex
	by map[uint64]uint64 // owner → n after its last loss
}

func (l *lostLocks) count() uint64 { return l.n.Load() }

func (l *lostLocks) note(owner uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[uint64]uint64{}
	}
	l.by[owner] = l.n.Add(1)
}

// since is the count after owner's last loss (0: never).
func (l *lostLocks) since(owner uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.by[owner]
}
