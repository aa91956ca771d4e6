package nfs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// Program numbers and versions of the lock manager and the status monitor
// (Open Group XNFS, Version 3W, chapters 10 and 11).
const (
	nlmProgram = 100021
	nlmVersion = 4
	nsmProgram = 100024
	nsmVersion = 1
)

// NLM procedure numbers the gateway calls: GRANTED, and the _RES
// procedures that answer the asynchronous _MSG calls.
const (
	nlmProcGranted    = 5
	nlmProcTestRes    = 11
	nlmProcLockRes    = 12
	nlmProcCancelRes  = 13
	nlmProcUnlockRes  = 14
	nlmProcGrantedRes = 15
	pmapProcGetport   = 3
)

// maxNLMResults bounds the _RES calls under way; beyond, an answer is
// dropped (the client sends its _MSG call again).
const maxNLMResults = 64

// Bounds of the lock manager's memory: locks tracked per host for
// FREE_ALL and SM_NOTIFY, and blocked requests waiting for a lock.
const (
	maxNLMHeld   = 1 << 20
	maxNLMBlocks = 4096
)

// nlmProcNames label the NLM procedures in strata_nfs_ops_total (prefix
// nlm_); nsmProcNames the status monitor's (prefix nsm_).
var (
	nlmProcNames = [...]string{"null", "test", "lock", "cancel", "unlock", "granted", "test_msg", "lock_msg",
		"cancel_msg", "unlock_msg", "granted_msg", "test_res", "lock_res", "cancel_res", "unlock_res", "granted_res",
		20: "share", 21: "unshare", 22: "nm_lock", 23: "free_all"}
	nsmProcNames = [...]string{"null", "stat", "mon", "unmon", "unmon_all", "simu_crash", "notify"}
)

// nlmLockKey is a lock owner's locks on one file, as tracked per host.
type nlmLockKey struct{ ino, owner uint64 }

// nlmBlockKey names a blocked LOCK request: a client that asks again (it
// polls while blocked) or cancels names the same.
type nlmBlockKey struct {
	ino, owner, start, end uint64
	exclusive              bool
}

// nlmBlock is a blocked LOCK request that a goroutine waits out: once the
// lock is taken, the client is told by an NLM GRANTED callback.
type nlmBlock struct {
	key    nlmBlockKey
	host   string
	args   xdr.Nlm4_testargs // for GRANTED: the client's lock, a new cookie
	remote netip.Addr        // where the client's NLM service is (its host)
	local  netip.Addr        // the address the client called (the callback comes from it)
	cancel chan struct{}     // closed by CANCEL, FREE_ALL or Close
	done   chan struct{}     // closed when the waiter ended
	// under nlm.mu: the lock was taken (the callback may be under way),
	// and whether CANCEL came first.
	granted   bool
	cancelled bool
	told      bool // a poll was answered GRANTED: the client holds it
}

// nlm is the gateway's lock manager (NLM v4) and its minimal status
// monitor (NSM v1): NLM locks are the client library's POSIX locks, so
// they exclude (and are excluded by) the fcntl locks of FUSE mounts.
//
// Lock owners: NLM names one by (caller_name, svid, oh); the gateway's
// client library owner is a hash of the three (ownerOf), the same on every
// gateway (a pair's standby, a restart).
//
// Goroutines: one per blocked LOCK request (waitBlock), bounded by
// maxNLMBlocks, ended by CANCEL, FREE_ALL, SM_NOTIFY or Close.
type nlm struct {
	s           *Server
	c           *client.Client
	log         *slog.Logger
	graceEnd    atomic.Int64 // unix ns: only reclaims are granted until then
	grace       time.Duration
	state       int32  // the NSM state number: odd, new at every start
	portmapPort uint16 // where a client's port mapper listens
	name        string // the gateway's name in its SM_NOTIFY calls
	stateDir    string // where the monitored host list is kept ("": nowhere)
	ctx         context.Context
	stop        context.CancelFunc
	wg          sync.WaitGroup
	results     chan struct{}        // semaphore of maxNLMResults
	monMu       sync.Mutex           // serialises the list's changes and saves
	monitored   map[string]monitored // under monMu: the hosts that may hold locks
	pending     map[string]bool      // under monMu: listed before the start, not locked since
	mu          struct {
		sync.Mutex
		hosts  map[string]map[nlmLockKey]struct{} // by caller_name: what it may hold
		held   int                                // entries in hosts
		blocks map[nlmBlockKey]*nlmBlock
	}
}

// newNLM starts the lock manager; with a state directory, it loads the
// hosts monitored before the restart, to be told by start.
func newNLM(s *Server, cfg *Config) (*nlm, map[string]monitored, error) {
	n := &nlm{s: s, c: s.c, log: s.log, grace: cfg.NLMGrace,
		state: int32(time.Now().Unix()) | 1, portmapPort: cfg.NLMPortmapPort, name: cfg.NLMName,
		stateDir: cfg.NLMStateDir, monitored: map[string]monitored{}, results: make(chan struct{}, maxNLMResults)}
	if n.name == "" {
		n.name, _ = os.Hostname()
	}
	var before map[string]monitored
	if n.stateDir != "" {
		var err error
		if before, err = loadMonitored(n.stateDir); err != nil {
			return nil, nil, err
		}
		// Kept until told (notifyAll), so that a gateway dying again
		// meanwhile tells them at its next start.
		maps.Copy(n.monitored, before)
		n.pending = map[string]bool{}
		for h := range before {
			n.pending[h] = true
		}
	}
	n.graceEnd.Store(time.Now().Add(cfg.NLMGrace).UnixNano())
	n.ctx, n.stop = context.WithCancel(context.Background())
	n.mu.hosts = map[string]map[nlmLockKey]struct{}{}
	n.mu.blocks = map[nlmBlockKey]*nlmBlock{}
	if cfg.NLMGrace > 0 {
		n.log.Info("nfs: NLM grace period: only lock reclaims are granted until it ends", "grace", cfg.NLMGrace,
			"hosts_to_notify", len(before))
	}
	return n, before, nil
}

// close ends the blocked requests' waits and waits for them.
func (n *nlm) close() {
	n.stop()
	// Goroutines are added under mu after checking ctx: none after this.
	n.mu.Lock()
	n.mu.Unlock()
	n.wg.Wait()
}

func (n *nlm) program() *oncrpc.Program {
	return &oncrpc.Program{Prog: nlmProgram, Vers: nlmVersion, Name: "nlm", Procs: []oncrpc.Proc{
		0:  nullProc,
		1:  serve(xdr.XDR_Nlm4_testargs, xdr.XDR_Nlm4_testres, n.test),
		2:  serve(xdr.XDR_Nlm4_lockargs, xdr.XDR_Nlm4_res, n.lock),
		3:  serve(xdr.XDR_Nlm4_cancargs, xdr.XDR_Nlm4_res, n.cancel),
		4:  serve(xdr.XDR_Nlm4_unlockargs, xdr.XDR_Nlm4_res, n.unlock),
		5:  serve(xdr.XDR_Nlm4_testargs, xdr.XDR_Nlm4_res, n.granted),
		6:  msgProc(n, xdr.XDR_Nlm4_testargs, xdr.XDR_Nlm4_testres, n.test, nlmProcTestRes),
		7:  msgProc(n, xdr.XDR_Nlm4_lockargs, xdr.XDR_Nlm4_res, n.lock, nlmProcLockRes),
		8:  msgProc(n, xdr.XDR_Nlm4_cancargs, xdr.XDR_Nlm4_res, n.cancel, nlmProcCancelRes),
		9:  msgProc(n, xdr.XDR_Nlm4_unlockargs, xdr.XDR_Nlm4_res, n.unlock, nlmProcUnlockRes),
		10: msgProc(n, xdr.XDR_Nlm4_testargs, xdr.XDR_Nlm4_res, n.granted, nlmProcGrantedRes),
		11: serveVoid(xdr.XDR_Nlm4_testres, ignoreRes[xdr.Nlm4_testres]),
		12: serveVoid(xdr.XDR_Nlm4_res, ignoreRes[xdr.Nlm4_res]),
		13: serveVoid(xdr.XDR_Nlm4_res, ignoreRes[xdr.Nlm4_res]),
		14: serveVoid(xdr.XDR_Nlm4_res, ignoreRes[xdr.Nlm4_res]),
		15: serveVoid(xdr.XDR_Nlm4_res, ignoreRes[xdr.Nlm4_res]),
		20: serve(xdr.XDR_Nlm4_shareargs, xdr.XDR_Nlm4_shareres, n.share),
		21: serve(xdr.XDR_Nlm4_shareargs, xdr.XDR_Nlm4_shareres, n.share),
		22: serve(xdr.XDR_Nlm4_lockargs, xdr.XDR_Nlm4_res, n.nmLock),
		23: serveVoid(xdr.XDR_Nlm4_notify, n.freeAll),
	}}
}

func (n *nlm) nsmProgram() *oncrpc.Program {
	return &oncrpc.Program{Prog: nsmProgram, Vers: nsmVersion, Name: "nsm", Procs: []oncrpc.Proc{
		0: nullProc,
		1: serve(xdr.XDR_Sm_name, xdr.XDR_Sm_stat_res, n.smStat),
		2: serve(xdr.XDR_Mon, xdr.XDR_Sm_stat_res, n.smMon),
		3: serve(xdr.XDR_Mon_id, xdr.XDR_Sm_stat, n.smUnmon),
		4: serve(xdr.XDR_My_id, xdr.XDR_Sm_stat, n.smUnmonAll),
		6: serveVoid(xdr.XDR_Stat_chge, n.smNotify),
	}}
}

// msgProc serves an asynchronous _MSG procedure: the call is answered
// void at once (after fn ran), and fn's result goes back to the caller's
// NLM service as the _RES call resProc. The result may refer to the
// call's record, which is the call's own (oncrpc reads each into a new
// buffer) and outlives it.
func msgProc[A, R any, PA, PR xdr.XdrType](n *nlm, argx func(*A) PA, resx func(*R) PR, fn func(context.Context, *oncrpc.Call, *A) *R, resProc uint32) oncrpc.Proc {
	return serveVoid(argx, func(ctx context.Context, call *oncrpc.Call, a *A) {
		n.sendResult(call, resProc, resx(fn(ctx, call, a)))
	})
}

// ignoreRes serves a _RES procedure: the gateway sends no _MSG calls, so
// no answer is awaited.
func ignoreRes[R any](context.Context, *oncrpc.Call, *R) {}

// sendResult calls resProc with res on the caller's NLM service, on a
// goroutine (bounded: beyond maxNLMResults the result is dropped).
func (n *nlm) sendResult(call *oncrpc.Call, resProc uint32, res xdr.XdrType) {
	select {
	case n.results <- struct{}{}:
	default:
		n.log.Warn("nlm: too many asynchronous results under way; dropping one", "remote", call.Remote, "proc", resProc)
		return
	}
	n.mu.Lock()
	closed := n.ctx.Err() != nil
	if !closed {
		n.wg.Add(1)
	}
	n.mu.Unlock()
	if closed {
		<-n.results
		return
	}
	go func() {
		defer func() { <-n.results; n.wg.Done() }()
		c, err := n.dialService(call.Local.Addr(), call.Remote.Addr(), nlmProgram, nlmVersion)
		if err == nil {
			err = c.Call(nlmProgram, nlmVersion, resProc, res, nil)
			c.Close()
		}
		if err != nil {
			n.log.Info("nlm: could not send an asynchronous result", "remote", call.Remote, "proc", resProc, "err", err)
		}
	}()
}

func (n *nlm) inGrace() bool { return time.Now().UnixNano() < n.graceEnd.Load() }

// beginGrace starts a grace period of the configured length again: the
// gateway of an HA pair that has just become the active one (its clients
// reclaim the locks they held through the other).
func (n *nlm) beginGrace() {
	if n.grace <= 0 {
		return
	}
	n.graceEnd.Store(time.Now().Add(n.grace).UnixNano())
	n.log.Info("nfs: NLM grace period after becoming the HA pair's active gateway: only lock reclaims are granted until it ends", "grace", n.grace)
}

// ownerOf is the client library's lock owner for an NLM owner.
func ownerOf(host string, svid int32, oh []byte) uint64 {
	h := sha256.New()
	h.Write([]byte("strata nlm owner\x00"))
	h.Write(binary.BigEndian.AppendUint32([]byte(host), uint32(svid)))
	h.Write(oh)
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// rangeOf turns NLM's offset and length (0: to the end, however the file
// grows) into an inclusive range.
func rangeOf(off, length uint64) (start, end uint64) {
	if length == 0 || off+length-1 < off {
		return off, ^uint64(0)
	}
	return off, off + length - 1
}

// lockOf resolves an NLM lock's file handle for the caller and returns the
// client library's lock (Type left to the caller) and the inode's export.
func (n *nlm) lockOf(call *oncrpc.Call, l *xdr.Nlm4_lock, exclusive bool) (client.Lock, *Export, xdr.Nlm4_stats) {
	t, err := n.s.resolve(call, &xdr.Nfs_fh3{Data: l.Fh})
	if err != nil {
		var st errStatus
		if errors.As(err, &st) && xdr.Nfsstat3(st) == xdr.NFS3ERR_ACCES {
			n.log.Debug("nlm: caller not allowed by the export", "remote", call.Remote)
			return client.Lock{}, nil, xdr.NLM4_FAILED
		}
		return client.Lock{}, nil, xdr.NLM4_STALE_FH
	}
	start, end := rangeOf(l.L_offset, l.L_len)
	typ := rpc.LockRead
	if exclusive {
		typ = rpc.LockWrite
	}
	return client.Lock{Ino: t.ino, Owner: ownerOf(l.Caller_name, l.Svid, l.Oh), Start: start, End: end,
		Type: typ, Pid: uint32(l.Svid)}, t.exp, xdr.NLM4_GRANTED
}

// statOf maps a lock call's error to an NLM status.
func (n *nlm) statOf(op string, l client.Lock, err error) xdr.Nlm4_stats {
	switch en := rpc.ErrnoOf(err); {
	case err == nil:
		return xdr.NLM4_GRANTED
	case en == syscall.EAGAIN, en == syscall.EINTR:
		return xdr.NLM4_DENIED
	case en == syscall.EDEADLK:
		return xdr.NLM4_DEADLCK
	case en == syscall.ENOLCK:
		return xdr.NLM4_DENIED_NOLOCKS
	case en == syscall.ENOENT, en == syscall.ESTALE:
		return xdr.NLM4_STALE_FH
	case en == syscall.EFBIG, en == syscall.EOVERFLOW:
		return xdr.NLM4_FBIG
	default:
		n.log.Warn("nlm: lock call failed", "op", op, "ino", l.Ino, "err", err)
		return xdr.NLM4_FAILED
	}
}

func (n *nlm) test(ctx context.Context, call *oncrpc.Call, a *xdr.Nlm4_testargs) *xdr.Nlm4_testres {
	res := &xdr.Nlm4_testres{Cookie: a.Cookie}
	if n.inGrace() {
		res.Stat.Stat = xdr.NLM4_DENIED_GRACE_PERIOD
		return res
	}
	l, _, st := n.lockOf(call, &a.Alock, a.Exclusive)
	if st != xdr.NLM4_GRANTED {
		res.Stat.Stat = st
		return res
	}
	got, err := n.c.GetLk(ctx, l)
	if err != nil {
		res.Stat.Stat = n.statOf("test", l, err)
		return res
	}
	if got.Type == rpc.LockUnlock {
		res.Stat.Stat = xdr.NLM4_GRANTED
		return res
	}
	res.Stat.Stat = xdr.NLM4_DENIED
	h := res.Stat.Holder()
	h.Exclusive = got.Type == rpc.LockWrite
	h.Svid = int32(got.Pid)
	h.L_offset = got.Start
	if got.End != ^uint64(0) {
		h.L_len = got.End - got.Start + 1
	}
	return res
}

func (n *nlm) lock(ctx context.Context, call *oncrpc.Call, a *xdr.Nlm4_lockargs) *xdr.Nlm4_res {
	return &xdr.Nlm4_res{Cookie: a.Cookie, Stat: xdr.Nlm4_stat{Stat: n.lockStat(ctx, call, a, a.Block)}}
}

// nmLock is LOCK for a client that runs no status monitor: never blocking.
func (n *nlm) nmLock(ctx context.Context, call *oncrpc.Call, a *xdr.Nlm4_lockargs) *xdr.Nlm4_res {
	return &xdr.Nlm4_res{Cookie: a.Cookie, Stat: xdr.Nlm4_stat{Stat: n.lockStat(ctx, call, a, false)}}
}

// reclaimWait bounds how long a reclaim waits for a conflicting lock to
// go: the locks a failed gateway held through its own session stay in the
// metadata service until that session's lease runs out.
const reclaimWait = 20 * time.Second

func (n *nlm) lockStat(ctx context.Context, call *oncrpc.Call, a *xdr.Nlm4_lockargs, block bool) xdr.Nlm4_stats {
	grace := n.inGrace()
	if grace && !a.Reclaim {
		return xdr.NLM4_DENIED_GRACE_PERIOD
	}
	l, _, st := n.lockOf(call, &a.Alock, a.Exclusive)
	if st != xdr.NLM4_GRANTED {
		return st
	}
	key := nlmBlockKey{ino: l.Ino, owner: l.Owner, start: l.Start, end: l.End, exclusive: a.Exclusive}
	n.mu.Lock()
	if b := n.mu.blocks[key]; b != nil {
		// The client asks again while blocked (it polls): the waiter
		// goes on and its GRANTED callback tells the client — unless the
		// lock is taken already: then this answer tells it (a client
		// whose callbacks a firewall drops gets its lock at its next
		// poll), and the callback's outcome no longer matters.
		st := xdr.NLM4_BLOCKED
		if b.granted && !b.cancelled {
			b.told = true
			st = xdr.NLM4_GRANTED
		}
		n.mu.Unlock()
		return st
	}
	if !n.monitor(a.Alock.Caller_name, call.Remote.Addr(), call.Local.Addr()) {
		return xdr.NLM4_DENIED_NOLOCKS
	}
	hk := nlmLockKey{l.Ino, l.Owner}
	ok, added := n.trackLocked(a.Alock.Caller_name, hk)
	n.mu.Unlock()
	if !ok {
		n.log.Warn("nlm: too many locks tracked; refusing", "max", maxNLMHeld)
		return xdr.NLM4_DENIED_NOLOCKS
	}
	var err error
	if grace && a.Reclaim {
		// In the grace period nobody else takes new locks: a conflict is
		// the failed gateway's session still holding this lock, until
		// its lease ends.
		rctx, cancel := context.WithTimeout(ctx, min(reclaimWait, time.Until(time.Unix(0, n.graceEnd.Load()))+time.Second))
		err = n.c.SetLk(rctx, l, true, nil)
		cancel()
	} else {
		err = n.c.SetLk(ctx, l, false, nil)
	}
	st = n.statOf("lock", l, err)
	if st == xdr.NLM4_DENIED && block {
		st = n.startBlock(call, a, l, key)
	}
	if added && st != xdr.NLM4_GRANTED && st != xdr.NLM4_BLOCKED {
		// Nothing taken: forget the entry this request made (a host
		// trying in vain must not fill the table).
		n.mu.Lock()
		n.untrackLocked(a.Alock.Caller_name, hk)
		n.mu.Unlock()
	}
	return st
}

// trackLocked notes that host may hold locks of k (for FREE_ALL and
// SM_NOTIFY): ok false when the table is full, added when k is new.
func (n *nlm) trackLocked(host string, k nlmLockKey) (ok, added bool) {
	m := n.mu.hosts[host]
	if _, ok := m[k]; ok {
		return true, false
	}
	if n.mu.held >= maxNLMHeld {
		return false, false
	}
	if m == nil {
		m = map[nlmLockKey]struct{}{}
		n.mu.hosts[host] = m
	}
	m[k] = struct{}{}
	n.mu.held++
	return true, true
}

// startBlock starts waiting for a lock the client may wait for: BLOCKED
// now, an NLM GRANTED callback once the lock is taken.
func (n *nlm) startBlock(call *oncrpc.Call, a *xdr.Nlm4_lockargs, l client.Lock, key nlmBlockKey) xdr.Nlm4_stats {
	b := &nlmBlock{key: key, host: a.Alock.Caller_name, remote: call.Remote.Addr(), local: call.Local.Addr(),
		cancel: make(chan struct{}), done: make(chan struct{})}
	// The arguments are slices of the call's record: copied, they outlive it.
	b.args = xdr.Nlm4_testargs{Cookie: strconv.AppendUint([]byte("strata-granted-"), uint64(time.Now().UnixNano()), 10),
		Exclusive: a.Exclusive, Alock: a.Alock}
	b.args.Alock.Fh = append([]byte(nil), a.Alock.Fh...)
	b.args.Alock.Oh = append([]byte(nil), a.Alock.Oh...)
	n.mu.Lock()
	if n.mu.blocks[key] != nil {
		n.mu.Unlock()
		return xdr.NLM4_BLOCKED
	}
	if len(n.mu.blocks) >= maxNLMBlocks {
		n.mu.Unlock()
		n.log.Warn("nlm: too many blocked lock requests; refusing", "max", maxNLMBlocks)
		return xdr.NLM4_DENIED_NOLOCKS
	}
	if n.ctx.Err() != nil {
		n.mu.Unlock()
		return xdr.NLM4_DENIED_NOLOCKS
	}
	n.mu.blocks[key] = b
	n.wg.Add(1)
	n.mu.Unlock()
	go n.waitBlock(b, l)
	return xdr.NLM4_BLOCKED
}

// waitBlock waits for b's lock, then tells the client (GRANTED). A lock
// the client does not take (cancelled meanwhile, the callback refused or
// undeliverable) is released again.
func (n *nlm) waitBlock(b *nlmBlock, l client.Lock) {
	defer n.wg.Done()
	defer close(b.done)
	stop := make(chan struct{})
	go func() {
		select {
		case <-b.cancel:
		case <-n.ctx.Done():
		}
		close(stop)
	}()
	err := n.c.SetLk(n.ctx, l, true, stop)
	n.mu.Lock()
	cancelled := b.cancelled
	if err != nil || cancelled {
		n.forgetBlock(b)
		n.mu.Unlock()
		if err == nil {
			n.release(l) // granted as the cancel came
		}
		if err != nil && !cancelled && n.ctx.Err() == nil {
			n.log.Warn("nlm: waiting for a blocked lock failed", "ino", l.Ino, "host", b.host, "err", err)
		}
		return
	}
	b.granted = true
	n.mu.Unlock()
	st, err := n.callGranted(b)
	n.mu.Lock()
	cancelled, told := b.cancelled, b.told
	n.forgetBlock(b)
	n.mu.Unlock()
	if !told && (err != nil || st != xdr.NLM4_GRANTED || cancelled) {
		n.log.Info("nlm: a blocked lock was granted but the client did not take it; released", "ino", l.Ino, "host", b.host,
			"remote", b.remote, "status", st, "cancelled", cancelled, "err", err)
		n.release(l)
	}
}

// forgetBlock drops b from the blocked requests unless another request
// of the same key replaced it there (mu held).
func (n *nlm) forgetBlock(b *nlmBlock) {
	if n.mu.blocks[b.key] == b {
		delete(n.mu.blocks, b.key)
	}
}

// unlocked forgets the granted blocked requests that l (an unlock) ends:
// the client took the lock (it unlocks it), so the waiter must not release
// it later, and a new request of the same range must not be answered from
// the old grant (mu held).
func (n *nlm) unlocked(l client.Lock) {
	for k, b := range n.mu.blocks {
		if k.ino == l.Ino && k.owner == l.Owner && b.granted && k.start >= l.Start && k.end <= l.End {
			b.told = true
			delete(n.mu.blocks, k)
		}
	}
}

// release unlocks l's range for its owner.
func (n *nlm) release(l client.Lock) {
	l.Type = rpc.LockUnlock
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.c.SetLk(ctx, l, false, nil); err != nil {
		n.log.Warn("nlm: releasing a lock", "ino", l.Ino, "err", err)
	}
}

// callbackTries bounds the GRANTED callback's attempts (1, 2, 4, 8 s apart).
const callbackTries = 5

// callGranted tells b's client that its lock is granted: NLM GRANTED to
// the client host's NLM service, whose port its port mapper gives, from
// the address the client called (the client matches the callback to its
// server by address).
func (n *nlm) callGranted(b *nlmBlock) (xdr.Nlm4_stats, error) {
	var err error
	pause := time.Second
	for try := 0; try < callbackTries; try++ {
		if try > 0 {
			select {
			case <-time.After(pause):
				pause *= 2
			case <-b.cancel:
				return xdr.NLM4_DENIED, errors.New("cancelled")
			case <-n.ctx.Done():
				return xdr.NLM4_DENIED, n.ctx.Err()
			}
			n.mu.Lock()
			told := b.told
			n.mu.Unlock()
			if told {
				return xdr.NLM4_GRANTED, nil // a poll learnt it
			}
		}
		var res xdr.Nlm4_res
		if err = n.callClient(b.local, b.remote, &b.args, &res); err == nil {
			return res.Stat.Stat, nil
		}
		n.log.Debug("nlm: GRANTED callback failed", "remote", b.remote, "try", try+1, "err", err)
	}
	return xdr.NLM4_DENIED, err
}

// callClient calls GRANTED on remote's NLM service.
func (n *nlm) callClient(local, remote netip.Addr, args *xdr.Nlm4_testargs, res *xdr.Nlm4_res) error {
	c, err := n.dialService(local, remote, nlmProgram, nlmVersion)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(nlmProgram, nlmVersion, nlmProcGranted, args, res)
}

// dialService asks the port mapper of remote where (prog, vers) listens
// over TCP and connects there, from local when valid.
func (n *nlm) dialService(local, remote netip.Addr, prog, vers uint32) (*oncrpc.Client, error) {
	pm, err := dialFrom(local, netip.AddrPortFrom(remote, n.portmapPort))
	if err != nil {
		return nil, fmt.Errorf("port mapper of %s: %w", remote, err)
	}
	var port uint32
	err = pm.Call(pmapProg, 2, pmapProcGetport, &xdr.Mapping{Prog: prog, Vers: vers, Prot: xdr.IPPROTO_TCP}, xdr.XDR_uint32(&port))
	pm.Close()
	if err != nil {
		return nil, fmt.Errorf("port mapper of %s: GETPORT: %w", remote, err)
	}
	if port == 0 || port > 65535 {
		return nil, fmt.Errorf("program %d v%d over TCP not registered on %s (port %d)", prog, vers, remote, port)
	}
	c, err := dialFrom(local, netip.AddrPortFrom(remote, uint16(port)))
	if err != nil {
		return nil, fmt.Errorf("program %d v%d on %s: %w", prog, vers, remote, err)
	}
	return c, nil
}

// dialFrom connects to addr from the local address (port chosen), with
// AUTH_NONE and a short timeout.
func dialFrom(local netip.Addr, addr netip.AddrPort) (*oncrpc.Client, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if local.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
	}
	conn, err := d.Dial("tcp", addr.String())
	if err != nil {
		return nil, err
	}
	c := oncrpc.NewClient(conn, nil)
	c.Timeout = 10 * time.Second
	return c, nil
}

func (n *nlm) cancel(ctx context.Context, call *oncrpc.Call, a *xdr.Nlm4_cancargs) *xdr.Nlm4_res {
	res := &xdr.Nlm4_res{Cookie: a.Cookie}
	l, _, st := n.lockOf(call, &a.Alock, a.Exclusive)
	if st != xdr.NLM4_GRANTED {
		res.Stat.Stat = st
		return res
	}
	key := nlmBlockKey{ino: l.Ino, owner: l.Owner, start: l.Start, end: l.End, exclusive: a.Exclusive}
	n.mu.Lock()
	b := n.mu.blocks[key]
	if b != nil && !b.cancelled {
		b.cancelled = true
		close(b.cancel)
	}
	n.mu.Unlock()
	if b != nil {
		// The waiter releases a lock granted meanwhile; answered once it
		// has, so that the client's next request finds it gone.
		select {
		case <-b.done:
		case <-ctx.Done():
		}
	}
	res.Stat.Stat = xdr.NLM4_GRANTED
	return res
}

func (n *nlm) unlock(ctx context.Context, call *oncrpc.Call, a *xdr.Nlm4_unlockargs) *xdr.Nlm4_res {
	res := &xdr.Nlm4_res{Cookie: a.Cookie}
	l, _, st := n.lockOf(call, &a.Alock, false)
	if st != xdr.NLM4_GRANTED {
		res.Stat.Stat = st
		return res
	}
	l.Type = rpc.LockUnlock
	if err := n.unlockFlushed(ctx, l); err != nil {
		res.Stat.Stat = n.statOf("unlock", l, err)
		return res
	}
	n.mu.Lock()
	// A blocked request granted by callback is forgotten by its waiter
	// only once the callback's answer came: the client may unlock, and
	// ask again, before that.
	n.unlocked(l)
	if l.Start == 0 && l.End == ^uint64(0) {
		n.untrackLocked(a.Alock.Caller_name, nlmLockKey{l.Ino, l.Owner})
	}
	n.mu.Unlock()
	res.Stat.Stat = xdr.NLM4_GRANTED
	return res
}

// unlockFlushed unlocks l; when the gateway holds the file open, through
// it, so that what was written under the lock reaches the stores before
// another client can take the lock and read (as a FUSE unlock does).
func (n *nlm) unlockFlushed(ctx context.Context, l client.Lock) error {
	o := n.s.files
	o.mu.Lock()
	of := o.mu.m[l.Ino]
	if of != nil {
		of.refs++
	}
	o.mu.Unlock()
	if of == nil {
		return n.c.SetLk(ctx, l, false, nil)
	}
	defer o.put(of, false)
	return of.f.SetLk(ctx, l, false, nil)
}

func (n *nlm) untrackLocked(host string, k nlmLockKey) {
	m := n.mu.hosts[host]
	if _, ok := m[k]; !ok {
		return
	}
	delete(m, k)
	n.mu.held--
	if len(m) == 0 {
		delete(n.mu.hosts, host)
	}
}

// granted is the server side of GRANTED: the gateway is no NLM client and
// waits for no lock, so none is expected.
func (n *nlm) granted(_ context.Context, _ *oncrpc.Call, a *xdr.Nlm4_testargs) *xdr.Nlm4_res {
	return &xdr.Nlm4_res{Cookie: a.Cookie, Stat: xdr.Nlm4_stat{Stat: xdr.NLM4_DENIED}}
}

// share answers SHARE and UNSHARE (DOS share reservations) granted, as
// knfsd does for clients that do not conflict; they are not enforced (see
// docs/design/0015), but a client in the grace period must reclaim.
func (n *nlm) share(_ context.Context, call *oncrpc.Call, a *xdr.Nlm4_shareargs) *xdr.Nlm4_shareres {
	res := &xdr.Nlm4_shareres{Cookie: a.Cookie, Stat: xdr.NLM4_GRANTED}
	if call.Proc == 20 && n.inGrace() && !a.Reclaim {
		res.Stat = xdr.NLM4_DENIED_GRACE_PERIOD
		return res
	}
	if _, err := n.s.resolve(call, &xdr.Nfs_fh3{Data: a.Share.Fh}); err != nil {
		res.Stat = xdr.NLM4_STALE_FH
	}
	return res
}

// allowed reports whether a caller may speak for hosts (FREE_ALL,
// SM_NOTIFY): an address some export lets in.
func (n *nlm) allowed(call *oncrpc.Call) bool {
	for _, e := range n.s.exports {
		if e.allows(call.Remote) {
			return true
		}
	}
	return false
}

// freeAll is FREE_ALL: the client host restarted (its status monitor told
// its lock manager, which tells the servers): its locks go.
func (n *nlm) freeAll(_ context.Context, call *oncrpc.Call, a *xdr.Nlm4_notify) {
	if !n.allowed(call) {
		n.log.Warn("nlm: FREE_ALL from an address no export allows; ignored", "remote", call.Remote, "host", a.Name)
		return
	}
	n.freeHost(a.Name, "FREE_ALL")
}

// freeHost releases every lock host may hold and ends its blocked
// requests.
func (n *nlm) freeHost(host, why string) {
	n.mu.Lock()
	locks := n.mu.hosts[host]
	delete(n.mu.hosts, host)
	n.mu.held -= len(locks)
	var blocks []*nlmBlock
	for _, b := range n.mu.blocks {
		if b.host == host && !b.cancelled {
			b.cancelled = true
			close(b.cancel)
			blocks = append(blocks, b)
		}
	}
	n.mu.Unlock()
	n.log.Info("nlm: client host restarted: releasing its locks", "host", host, "via", why, "files", len(locks), "blocked", len(blocks))
	n.unmonitor(host)
	for _, b := range blocks {
		<-b.done
	}
	for k := range locks {
		n.release(client.Lock{Ino: k.ino, Owner: k.owner, Start: 0, End: ^uint64(0)})
	}
}

func (n *nlm) smStat(context.Context, *oncrpc.Call, *xdr.Sm_name) *xdr.Sm_stat_res {
	return &xdr.Sm_stat_res{Res_stat: xdr.STAT_SUCC, State: n.state}
}

// smMon: the gateway monitors hosts for nobody else (only its own lock
// manager, which lives in the same process).
func (n *nlm) smMon(context.Context, *oncrpc.Call, *xdr.Mon) *xdr.Sm_stat_res {
	return &xdr.Sm_stat_res{Res_stat: xdr.STAT_FAIL, State: n.state}
}

func (n *nlm) smUnmon(context.Context, *oncrpc.Call, *xdr.Mon_id) *xdr.Sm_stat {
	return &xdr.Sm_stat{State: n.state}
}

func (n *nlm) smUnmonAll(context.Context, *oncrpc.Call, *xdr.My_id) *xdr.Sm_stat {
	return &xdr.Sm_stat{State: n.state}
}

// smNotify is a client host's status monitor telling that the host
// restarted (SM_NOTIFY): what its processes held is gone with them.
func (n *nlm) smNotify(_ context.Context, call *oncrpc.Call, a *xdr.Stat_chge) {
	if !n.allowed(call) {
		n.log.Warn("nsm: SM_NOTIFY from an address no export allows; ignored", "remote", call.Remote, "host", a.Mon_name)
		return
	}
	n.freeHost(a.Mon_name, "SM_NOTIFY")
}
