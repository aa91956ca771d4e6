package meta

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/lockrange"
	"github.com/stratafs/strata/internal/rpc"
)

// lockWait bounds how long a SetLk with Wait blocks before EAGAIN; the
// client repeats, so no request blocks forever.
const lockWait = time.Second

// fileLocks holds one inode's locks: POSIX/OFD record locks and flock locks
// are separate tables that never conflict with each other (Linux).
type fileLocks struct {
	records []lockrange.Lock
	flocks  []lockrange.Lock
	// changed is closed (and replaced) whenever a lock is released, waking
	// waiters.
	changed chan struct{}
}

// lockTable is the leader's in-memory lock state. Locks are not in the
// replicated state: a lock is taken and released far more often than it
// must survive a restart, and a raft commit (with its sync) per fcntl would
// make lock-heavy I/O (MPI-IO's data sieving) crawl. Instead the clients
// keep what they hold and give it back after a restart:
//
// # Reclaim
//
// The table has an epoch, a random number drawn whenever the table starts
// empty (startGrace, when this node takes office). Clients learn it from
// every grant and heartbeat answer; a client whose locks were granted
// under another epoch re-sends them with LockReq.Reclaim and then reports
// the new epoch in a heartbeat. For up to the grace period after taking
// office, while sessions that existed before have not reported, only
// reclaims and unlocks are granted: a new lock (or a GetLk) waits for the
// grace period to end, so that no other client can take a lock somebody
// still holds. A reclaim that conflicts (impossible unless two clients
// believed they held conflicting locks) is refused: that lock is lost.
type lockTable struct {
	log   *slog.Logger
	clock clock.Clock // the grace period's and lock waits' time
	// verify, when set, confirms that this node still leads (raft's read
	// lease): a request that waited (a conflict, the grace period) asks
	// it again before it is granted, since the handler's check is as old
	// as the request.
	verify func() error
	mu     struct {
		sync.Mutex
		files    map[uint64]*fileLocks          // by inode
		byClient map[uint64]map[uint64]struct{} // client → inodes it holds locks on
		epoch    uint64                         // see Reclaim; never 0
		// pending are the sessions that may still reclaim; graceOver is
		// closed when the grace period ends (pending empty or time up).
		pending   map[uint64]struct{}
		graceOver chan struct{}
		// deposed: leadership was lost (reset) and no term of office has
		// started since (startGrace). The waiters that reset wakes find the
		// table empty: they must answer "not the leader", not grant.
		deposed bool
	}
}

// notLeaderErr is a lock request's answer on a node that stopped leading
// while the request waited.
func notLeaderErr() error {
	return rpc.NotLeader("", "this metadata voter stopped leading while the lock request waited; ask the new leader")
}

func newLockTable(log *slog.Logger, clk clock.Clock) *lockTable {
	t := &lockTable{log: log, clock: clock.OrReal(clk)}
	t.mu.files = map[uint64]*fileLocks{}
	t.mu.byClient = map[uint64]map[uint64]struct{}{}
	t.mu.epoch = newLockEpoch()
	t.mu.graceOver = make(chan struct{})
	close(t.mu.graceOver)
	return t
}

func newLockEpoch() uint64 { return rand.Uint64() | 1 }

// epoch is the current lock epoch.
func (t *lockTable) epoch() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.epoch
}

// startGrace empties the table under a new epoch and holds back new locks
// until every one of clients has reclaimed (reported the new epoch) or d
// has passed.
func (t *lockTable) startGrace(clients []uint64, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resetLocked()
	t.mu.deposed = false
	t.mu.epoch = newLockEpoch()
	t.mu.pending = map[uint64]struct{}{}
	for _, c := range clients {
		t.mu.pending[c] = struct{}{}
	}
	over := make(chan struct{})
	t.mu.graceOver = over
	if len(clients) == 0 || d <= 0 {
		t.endGraceLocked()
		return
	}
	t.log.Info("lock grace period: new locks wait until these sessions reclaim theirs", "sessions", len(clients), "at_most", d)
	t.clock.AfterFunc(d, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, in := t.inGraceLocked(); in && t.mu.graceOver == over { // this grace period, still on
			t.log.Warn("lock grace period over: time is up; sessions that have not reclaimed may lose their locks to others", "sessions_not_reclaimed", len(t.mu.pending))
			t.endGraceLocked()
		}
	})
}

func (t *lockTable) endGraceLocked() {
	select {
	case <-t.mu.graceOver:
	default:
		close(t.mu.graceOver)
	}
	t.mu.pending = nil
}

// inGraceLocked reports whether new locks are held back; over is closed when
// that ends.
func (t *lockTable) inGraceLocked() (over <-chan struct{}, in bool) {
	select {
	case <-t.mu.graceOver:
		return nil, false
	default:
		return t.mu.graceOver, true
	}
}

// reclaimed notes that client holds all its locks under epoch (its
// heartbeat said so); the grace period ends once every pending client has.
func (t *lockTable) reclaimed(client, epoch uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if epoch == t.mu.epoch {
		t.doneLocked(client)
	}
}

func (t *lockTable) doneLocked(client uint64) {
	if _, ok := t.mu.pending[client]; !ok {
		return
	}
	delete(t.mu.pending, client)
	if len(t.mu.pending) == 0 {
		t.log.Info("lock grace period over: every session has reclaimed its locks")
		t.endGraceLocked()
	}
}

// waitGrace returns nil once new locks may be granted. During the grace
// period it answers EBUSY ("ask again"; the client repeats, never showing
// it to the application): at once when client itself has not reclaimed
// yet (it must do that first, and cannot while its request waits), else
// after waiting up to lockWait for the period to end.
func (t *lockTable) waitGrace(ctx context.Context, client uint64) error {
	t.mu.Lock()
	over, in := t.inGraceLocked()
	_, pending := t.mu.pending[client]
	t.mu.Unlock()
	if !in {
		return nil
	}
	if pending {
		return rpc.Errorf(syscall.EBUSY, "locks are being reclaimed after a metadata service restart: reclaim this session's locks (report the lock epoch), then ask again")
	}
	tm := t.clock.NewTimer(lockWait)
	defer tm.Stop()
	select {
	case <-over:
		return nil
	case <-tm.C():
		return rpc.Errorf(syscall.EBUSY, "locks are being reclaimed after a metadata service restart; ask again")
	case <-ctx.Done():
		return rpc.Errorf(syscall.EINTR, "lock wait interrupted: %v", ctx.Err())
	}
}

func (t *lockTable) fileLocked(ino uint64) *fileLocks {
	fl := t.mu.files[ino]
	if fl == nil {
		fl = &fileLocks{changed: make(chan struct{})}
		t.mu.files[ino] = fl
	}
	return fl
}

func reqLock(r *rpc.LockReq) lockrange.Lock {
	l := lockrange.Lock{Client: r.ClientID, Owner: r.Owner, Start: r.Start, End: r.End, Type: r.Type, Pid: r.Pid, Handle: r.Handle}
	if r.Flock {
		l.Start, l.End = 0, lockrange.EOF
	}
	return l
}

func checkLockReq(r *rpc.LockReq) error {
	if r.Type > rpc.LockUnlock {
		return rpc.Errorf(syscall.EINVAL, "lock type %d", r.Type)
	}
	if r.CloseHandle && (r.Type != rpc.LockUnlock || r.Handle == 0) {
		return rpc.Errorf(syscall.EINVAL, "closing handle %d: type %d (want an unlock of a named handle)", r.Handle, r.Type)
	}
	if !r.Flock && !r.CloseHandle && r.End < r.Start {
		return rpc.Errorf(syscall.EINVAL, "lock range %d..%d is empty", r.Start, r.End)
	}
	return nil
}

// get answers F_GETLK: the conflicting lock that starts lowest, or
// Type=LockUnlock. During the grace period it first waits for the
// reclaims, which may bring back conflicting locks.
func (t *lockTable) get(ctx context.Context, r *rpc.LockReq) (*rpc.LockResp, error) {
	if err := checkLockReq(r); err != nil {
		return nil, err
	}
	if r.Type != rpc.LockUnlock {
		if err := t.waitGrace(ctx, r.ClientID); err != nil {
			return nil, err
		}
	}
	want := reqLock(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.deposed {
		return nil, notLeaderErr()
	}
	if fl := t.mu.files[r.Ino]; fl != nil && r.Type != rpc.LockUnlock {
		list := fl.records
		if r.Flock {
			list = fl.flocks
		}
		var first *lockrange.Lock // the conflicting lock that starts lowest
		for i := range list {
			if lockrange.Conflicts(&list[i], &want) && (first == nil || list[i].Start < first.Start) {
				first = &list[i]
			}
		}
		if first != nil {
			return &rpc.LockResp{Start: first.Start, End: first.End, Type: first.Type, Pid: first.Pid}, nil
		}
	}
	return &rpc.LockResp{Type: rpc.LockUnlock}, nil
}

// set answers F_SETLK/F_SETLKW/flock: EAGAIN on conflict, after waiting up
// to lockWait from the first conflict when r.Wait. It returns the epoch the lock was granted under.
// A new lock during the grace period gets EBUSY (waitGrace); unlocks and
// reclaims pass. With r.CloseHandle it drops what the client took through
// r.Handle (closeHandle).
func (t *lockTable) set(ctx context.Context, r *rpc.LockReq) (uint64, error) {
	if err := checkLockReq(r); err != nil {
		return 0, err
	}
	if r.CloseHandle {
		return t.closeHandle(r.ClientID, r.Ino, r.Handle), nil
	}
	want := reqLock(r)
	var deadline clock.Timer // from the first conflict waited on
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for waited := false; ; waited = true {
		if !r.Reclaim && want.Type != rpc.LockUnlock {
			if err := t.waitGrace(ctx, r.ClientID); err != nil {
				return 0, err
			}
		}
		if waited && t.verify != nil {
			if err := t.verify(); err != nil {
				return 0, notLeaderErr()
			}
		}
		t.mu.Lock()
		if t.mu.deposed {
			t.mu.Unlock()
			return 0, notLeaderErr()
		}
		if _, in := t.inGraceLocked(); in && !r.Reclaim && want.Type != rpc.LockUnlock {
			t.mu.Unlock()
			continue // a new grace period began meanwhile
		}
		fl := t.fileLocked(r.Ino)
		list := &fl.records
		if r.Flock {
			list = &fl.flocks
		}
		var conflict *lockrange.Lock
		if want.Type != rpc.LockUnlock {
			for i := range *list {
				if lockrange.Conflicts(&(*list)[i], &want) {
					conflict = &(*list)[i]
					break
				}
			}
		}
		if conflict == nil {
			var released bool
			*list, released = lockrange.Replace(*list, want)
			if released {
				close(fl.changed)
				fl.changed = make(chan struct{})
			}
			t.indexLocked(r.ClientID, r.Ino, fl)
			epoch := t.mu.epoch
			t.mu.Unlock()
			return epoch, nil
		}
		c := *conflict
		changed := fl.changed
		t.mu.Unlock()
		if r.Reclaim {
			return 0, rpc.Errorf(syscall.EAGAIN, "reclaim of inode %d range %d..%d refused: client %d pid %d holds a conflicting lock (the lock is lost)", r.Ino, want.Start, want.End, c.Client, c.Pid)
		}
		if !r.Wait {
			return 0, rpc.Errorf(syscall.EAGAIN, "inode %d range %d..%d is locked by client %d pid %d", r.Ino, c.Start, c.End, c.Client, c.Pid)
		}
		if deadline == nil {
			deadline = t.clock.NewTimer(lockWait)
		}
		select {
		case <-changed:
		case <-deadline.C():
			return 0, rpc.Errorf(syscall.EAGAIN, "inode %d range %d..%d still locked by client %d pid %d after %v", r.Ino, c.Start, c.End, c.Client, c.Pid, lockWait)
		case <-ctx.Done():
			return 0, rpc.Errorf(syscall.EINTR, "lock wait interrupted: %v", ctx.Err())
		}
	}
}

// closeHandle drops every lock (record lock or flock, any owner) that
// client took on ino through its open handle, which was closed: the OFD
// locks and flocks of that open file description. Locks of the same owner
// taken through another open stay (see lockrange.DropHandle). It returns
// the current epoch.
func (t *lockTable) closeHandle(client, ino, handle uint64) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if fl := t.mu.files[ino]; fl != nil {
		var r1, r2 bool
		fl.records, r1 = lockrange.DropHandle(fl.records, client, handle)
		fl.flocks, r2 = lockrange.DropHandle(fl.flocks, client, handle)
		if r1 || r2 {
			close(fl.changed)
			fl.changed = make(chan struct{})
		}
		t.indexLocked(client, ino, fl)
	}
	return t.mu.epoch
}

// indexLocked keeps byClient in step with fl after a change by client, and
// drops fl when it is empty.
func (t *lockTable) indexLocked(client, ino uint64, fl *fileLocks) {
	has := false
	for _, list := range [][]lockrange.Lock{fl.records, fl.flocks} {
		for i := range list {
			if list[i].Client == client {
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

// releaseClient drops every lock of a client (session closed or expired);
// a client that is gone no longer holds up the grace period.
func (t *lockTable) releaseClient(client uint64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.doneLocked(client)
	n := 0
	for ino := range t.mu.byClient[client] {
		fl := t.mu.files[ino]
		if fl == nil {
			continue
		}
		keep := func(list []lockrange.Lock) []lockrange.Lock {
			out := list[:0]
			for _, l := range list {
				if l.Client != client {
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

// reset drops all locks (leadership lost), waking every waiter, which
// answers "not the leader" (deposed) until the next term of office starts
// a new epoch (startGrace).
func (t *lockTable) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resetLocked()
	t.mu.deposed = true
	t.endGraceLocked()
}

func (t *lockTable) resetLocked() {
	for _, fl := range t.mu.files {
		close(fl.changed)
	}
	t.mu.files = map[uint64]*fileLocks{}
	t.mu.byClient = map[uint64]map[uint64]struct{}{}
}

// lockStatus is the lock table as `strata status` shows it.
type lockStatus struct {
	locks    []rpc.LockInfo // by inode, record locks before flocks; at most limit
	total    int
	byClient map[uint64]int // locks held per client
	grace    bool
	pending  int // clients the grace period still waits for
}

// status lists up to limit locks (by inode) and counts them all.
func (t *lockTable) status(limit int) lockStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := lockStatus{byClient: map[uint64]int{}}
	_, st.grace = t.inGraceLocked()
	st.pending = len(t.mu.pending)
	inos := make([]uint64, 0, len(t.mu.files))
	for ino, fl := range t.mu.files {
		inos = append(inos, ino)
		for _, list := range [][]lockrange.Lock{fl.records, fl.flocks} {
			for i := range list {
				st.byClient[list[i].Client]++
				st.total++
			}
		}
	}
	slices.Sort(inos)
	for _, ino := range inos {
		fl := t.mu.files[ino]
		for k, list := range [][]lockrange.Lock{fl.records, fl.flocks} {
			for _, l := range list {
				if len(st.locks) == limit {
					return st
				}
				st.locks = append(st.locks, rpc.LockInfo{Ino: ino, Client: l.Client, Owner: l.Owner, Pid: l.Pid,
					Type: l.Type, Flock: k == 1, Start: l.Start, End: l.End})
			}
		}
	}
	return st
}
