package meta

import (
	"context"
	"syscall"
	"time"

	"sync"

	"github.com/stratafs/strata/internal/rpc"
)

// lockWait bounds how long a SetLk with Wait blocks before EAGAIN; the
// client repeats, so no request blocks forever.
const lockWait = time.Second

const eof = ^uint64(0)

// heldLock is one granted lock. Start and End are inclusive.
type heldLock struct {
	client, owner uint64
	start, end    uint64
	typ           uint32
	pid           uint32
}

func (l *heldLock) sameOwner(client, owner uint64) bool {
	return l.client == client && l.owner == owner
}

func overlaps(a, b *heldLock) bool { return a.start <= b.end && b.start <= a.end }

func conflicts(a, b *heldLock) bool {
	return !a.sameOwner(b.client, b.owner) && overlaps(a, b) && (a.typ == rpc.LockWrite || b.typ == rpc.LockWrite)
}

// fileLocks holds one inode's locks: POSIX/OFD record locks and flock locks
// are separate tables that never conflict with each other (Linux).
type fileLocks struct {
	records []heldLock
	flocks  []heldLock
	// changed is closed (and replaced) whenever a lock is released, waking
	// waiters.
	changed chan struct{}
}

// lockTable is the leader's in-memory lock state. Locks are not replicated:
// a new leader starts with none, and clients re-acquire (documented in
// doc.go).
type lockTable struct {
	mu struct {
		sync.Mutex
		files    map[uint64]*fileLocks          // by inode
		byClient map[uint64]map[uint64]struct{} // client → inodes it holds locks on
	}
}

func newLockTable() *lockTable {
	t := &lockTable{}
	t.mu.files = map[uint64]*fileLocks{}
	t.mu.byClient = map[uint64]map[uint64]struct{}{}
	return t
}

func (t *lockTable) fileLocked(ino uint64) *fileLocks {
	fl := t.mu.files[ino]
	if fl == nil {
		fl = &fileLocks{changed: make(chan struct{})}
		t.mu.files[ino] = fl
	}
	return fl
}

func reqLock(r *rpc.LockReq) heldLock {
	l := heldLock{client: r.ClientID, owner: r.Owner, start: r.Start, end: r.End, typ: r.Type, pid: r.Pid}
	if r.Flock {
		l.start, l.end = 0, eof
	}
	return l
}

func checkLockReq(r *rpc.LockReq) error {
	if r.Type > rpc.LockUnlock {
		return rpc.Errorf(syscall.EINVAL, "lock type %d", r.Type)
	}
	if !r.Flock && r.End < r.Start {
		return rpc.Errorf(syscall.EINVAL, "lock range %d..%d is empty", r.Start, r.End)
	}
	return nil
}

// get answers F_GETLK: the conflicting lock that starts lowest, or
// Type=LockUnlock.
func (t *lockTable) get(r *rpc.LockReq) (*rpc.LockResp, error) {
	if err := checkLockReq(r); err != nil {
		return nil, err
	}
	want := reqLock(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	if fl := t.mu.files[r.Ino]; fl != nil && r.Type != rpc.LockUnlock {
		list := fl.records
		if r.Flock {
			list = fl.flocks
		}
		var first *heldLock // the conflicting lock that starts lowest
		for i := range list {
			if conflicts(&list[i], &want) && (first == nil || list[i].start < first.start) {
				first = &list[i]
			}
		}
		if first != nil {
			return &rpc.LockResp{Start: first.start, End: first.end, Type: first.typ, Pid: first.pid}, nil
		}
	}
	return &rpc.LockResp{Type: rpc.LockUnlock}, nil
}

// set answers F_SETLK/F_SETLKW/flock: EAGAIN on conflict, after waiting up
// to lockWait when r.Wait.
func (t *lockTable) set(ctx context.Context, r *rpc.LockReq) error {
	if err := checkLockReq(r); err != nil {
		return err
	}
	want := reqLock(r)
	deadline := time.NewTimer(lockWait)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		fl := t.fileLocked(r.Ino)
		list := &fl.records
		if r.Flock {
			list = &fl.flocks
		}
		var conflict *heldLock
		if want.typ != rpc.LockUnlock {
			for i := range *list {
				if conflicts(&(*list)[i], &want) {
					conflict = &(*list)[i]
					break
				}
			}
		}
		if conflict == nil {
			released := t.replaceLocked(list, want)
			if released {
				close(fl.changed)
				fl.changed = make(chan struct{})
			}
			t.indexLocked(r.ClientID, r.Ino, fl)
			t.mu.Unlock()
			return nil
		}
		c := *conflict
		changed := fl.changed
		t.mu.Unlock()
		if !r.Wait {
			return rpc.Errorf(syscall.EAGAIN, "inode %d range %d..%d is locked by client %d pid %d", r.Ino, c.start, c.end, c.client, c.pid)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return rpc.Errorf(syscall.EAGAIN, "inode %d range %d..%d still locked by client %d pid %d after %v", r.Ino, c.start, c.end, c.client, c.pid, lockWait)
		case <-ctx.Done():
			return rpc.Errorf(syscall.EINTR, "lock wait interrupted: %v", ctx.Err())
		}
	}
}

// replaceLocked sets the owner's lock state over [want.start, want.end] to
// want.typ (LockUnlock removes): the owner's overlapping locks are cut
// around the range (a lock spanning it splits in two), then the new lock
// is merged with the owner's adjacent or overlapping locks of the same
// type. It reports whether any lock was removed or weakened, which may
// wake waiters.
func (t *lockTable) replaceLocked(list *[]heldLock, want heldLock) (released bool) {
	out := (*list)[:0:0]
	for _, l := range *list {
		if !l.sameOwner(want.client, want.owner) || !overlaps(&l, &want) {
			out = append(out, l)
			continue
		}
		if l.typ == rpc.LockWrite && want.typ != rpc.LockWrite || want.typ == rpc.LockUnlock {
			released = true
		}
		if l.start < want.start {
			left := l
			left.end = want.start - 1
			out = append(out, left)
		}
		if l.end > want.end {
			right := l
			right.start = want.end + 1
			out = append(out, right)
		}
	}
	if want.typ != rpc.LockUnlock {
		merged := out[:0]
		for _, l := range out {
			adjacent := l.sameOwner(want.client, want.owner) && l.typ == want.typ &&
				(overlaps(&l, &want) || (l.end != eof && l.end+1 == want.start) || (want.end != eof && want.end+1 == l.start))
			if adjacent {
				want.start = min(want.start, l.start)
				want.end = max(want.end, l.end)
				continue
			}
			merged = append(merged, l)
		}
		out = append(merged, want)
	}
	*list = out
	return released
}

func (t *lockTable) indexLocked(client, ino uint64, fl *fileLocks) {
	has := false
	for _, list := range [][]heldLock{fl.records, fl.flocks} {
		for i := range list {
			if list[i].client == client {
				has = true
			}
		}
	}
	inos := t.mu.byClient[client]
	if has {
		if inos == nil {
			inos = map[uint64]struct{}{}
			t.mu.byClient[client] = inos
		}
		inos[ino] = struct{}{}
	} else if inos != nil {
		delete(inos, ino)
		if len(inos) == 0 {
			delete(t.mu.byClient, client)
		}
	}
	if len(fl.records) == 0 && len(fl.flocks) == 0 {
		delete(t.mu.files, ino) // waiters hold the old channel; it is closed on release
	}
}

// releaseClient drops every lock of a client (session closed or expired).
func (t *lockTable) releaseClient(client uint64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for ino := range t.mu.byClient[client] {
		fl := t.mu.files[ino]
		if fl == nil {
			continue
		}
		keep := func(list []heldLock) []heldLock {
			out := list[:0]
			for _, l := range list {
				if l.client != client {
					out = append(out, l)
				} else {
					n++
				}
			}
			return out
		}
		fl.records = keep(fl.records)
		fl.flocks = keep(fl.flocks)
		close(fl.changed)
		fl.changed = make(chan struct{})
		if len(fl.records) == 0 && len(fl.flocks) == 0 {
			delete(t.mu.files, ino)
		}
	}
	delete(t.mu.byClient, client)
	return n
}

// reset drops all locks (leadership lost), waking every waiter.
func (t *lockTable) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, fl := range t.mu.files {
		close(fl.changed)
	}
	t.mu.files = map[uint64]*fileLocks{}
	t.mu.byClient = map[uint64]map[uint64]struct{}{}
}
