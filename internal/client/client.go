package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("client: closed")

// Client is a session with one Strata cluster. It is safe for concurrent
// use; one Client serves a whole mount (or gateway, or benchmark process).
type Client struct {
	cfg  Config
	log  *slog.Logger
	meta *transport.Multi // the metadata voters; calls go to the leader
	m    *metrics

	clientID atomic.Uint64 // current session id; changes when the session is reopened
	// metaNow is the metadata service's time in its last heartbeat
	// answer: the next heartbeat's open-file list is made after it.
	metaNow atomic.Int64
	seq     atomic.Uint64 // ReqHeader.Seq source
	// gateway, when set, makes each heartbeat carry an NFS gateway's
	// report (SetGatewayReport); gatewayRefused: the service is older
	// and refused it, so heartbeats go without.
	gateway        atomic.Pointer[func() *rpc.GatewayReport]
	gatewayRefused atomic.Bool
	leaseMs        atomic.Uint32
	// noSyncStat: a storage server answered SSyncStat with ENOSYS (an
	// older version); syncs and space reports are two calls from then on.
	noSyncStat atomic.Bool
	// noWriteSpace (tests): take storage servers' write answers as an
	// older server's, without the chunk's space (WriteResp.HasAlloc).
	noWriteSpace atomic.Bool
	// sizeSeq orders this client's changes of file sizes in metadata
	// (size commits, truncates) against the metadata answers it merges:
	// an answer to a call begun before such a change of an open file
	// predates it (inode.merge).
	sizeSeq atomic.Uint64

	// Namespace changes are answered before they are durable (see
	// meta.Config.StrictSync); metaChanged counts this client's calls that
	// may have made one, metaDurable the count a durable answer or an
	// MSync barrier covered. Fsync and close barrier when they differ.
	metaChanged atomic.Uint64
	metaDurable atomic.Uint64
	// durable is the highest raft index the metadata service said is
	// durable (MSync answers), with the term it said so in: a created
	// file's close barriers on the index and term its create answered
	// with (ChangeResp), and needs no call when a report of the same term
	// covers it.
	durable struct {
		sync.Mutex
		idx, term uint64
	}
	// changes holds the entries (raft index and term, rpc.Stamp) this
	// client's changes were answered from and no barrier has checked yet:
	// the highest index of each term. A barrier (SyncMeta) asks MSync to
	// check them, so that a change a metadata machine crash lost fails the
	// fsync instead of passing it. unstamped: a change since the last
	// barrier came without one (it failed, or its outcome is unknown); the
	// barrier then waits for everything, unchecked. metaChanged is raised
	// under the same lock, so a barrier sees every stamp of the changes it
	// counts.
	changes struct {
		sync.Mutex
		pend      []rpc.Stamp
		unstamped bool
	}

	budget *budget // write-behind (and read-ahead) memory
	// recent remembers the last large buffered writes (handle, time): a
	// large write goes through only when another handle wrote lately
	// (Config.WriteThroughBytes).
	recent struct {
		sync.Mutex
		w [4]recentWrite
		i int
	}
	dirs *dirCache

	targets targetMap
	groups  groupMap // mirror groups (groups.go)

	mu struct {
		sync.Mutex
		inodes map[uint64]*inode // open inodes, refcounted by handles
		// unsent holds the open inodes not yet listed in a heartbeat
		// (reportOpen); an inode closed before that leaves it.
		unsent map[uint64]struct{}
		closed bool
		// opening holds, per open or create under way, metaNow when it
		// started: until its inode is in inodes, a heartbeat's list may
		// lack it, so the list is dated no later than that.
		opening map[uint64]int64
		nextTok uint64
		// owed keeps, per inode no longer open here, what its fsync
		// still owes (fsyncOwed); owedOver and owedOverData cover the
		// records dropped beyond maxOwed.
		owed         map[uint64]fsyncOwed
		owedOver     uint64
		owedOverData bool
	}
	locks     heldLocks     // locks this client holds (reclaimed after a service restart)
	sessionMu sync.Mutex    // serialises session reopening
	kick      chan struct{} // asks the heartbeat loop to report open inodes soon
	atimes    atimeBatch    // access times not sent yet (atime.go)
	xattrs    xattrMisses   // xattrs known to be absent (xattrcache.go)
	looked    recentLookups // small files lookups described, for Open's read (smallread.go)
	deleg     *delegations  // create delegations (delegq.go)

	ctx      context.Context // cancelled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup // background goroutines
	metricsL net.Listener
}

// New validates cfg, opens a session with the metadata service and loads
// the target map. It fails if the metadata service does not answer within
// cfg.IOTimeout.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	cfg.MetaAddrs, _ = cfg.MetaList() // checked by Validate
	cfg.MetaAddr = strings.Join(cfg.MetaAddrs, ",")
	c := &Client{
		cfg:    cfg,
		log:    slog.Default().With("pkg", "client"),
		budget: newBudget(cfg.WriteBehindBytes),
		dirs:   newDirCache(cfg.DirAttrTTL),
		m:      newMetrics(),
	}
	c.meta = transport.NewMulti(cfg.MetaAddrs, transport.MultiConfig{
		ClientConfig: transport.ClientConfig{
			Key:         cfg.ClusterKey,
			TLS:         cfg.TLS,
			Conns:       cfg.MetaConns,
			DialTimeout: min(3*time.Second, cfg.IOTimeout),
			CallTimeout: cfg.IOTimeout,
		},
		AttemptTimeout: metaAttemptTimeout,
		// A new leader holds back new locks until every session reclaimed
		// its own (or a lease passed): renew the session there at once.
		OnLeaderChange: func(old, cur string) { c.kickHeartbeat() },
	})
	c.targets.init(c)
	c.groups.init(c)
	c.mu.inodes = map[uint64]*inode{}
	c.mu.opening = map[uint64]int64{}
	c.mu.owed = map[uint64]fsyncOwed{}
	c.mu.unsent = map[uint64]struct{}{}
	c.kick = make(chan struct{}, 1)
	c.atimes.init()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := c.openSession(ctx); err != nil {
		c.meta.Close()
		c.cancel()
		return nil, err
	}
	if err := c.targets.refresh(ctx); err != nil {
		c.log.Warn("initial target list failed; will retry", "err", err)
	}
	if err := c.groups.refresh(ctx); err != nil {
		c.log.Warn("initial mirror group list failed; will retry", "err", err)
	}
	if cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("metrics listen on %s: %w", cfg.MetricsAddr, err)
		}
		c.metricsL = ln
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(c.m.reg, promhttp.HandlerOpts{}))
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			_ = http.Serve(ln, mux)
		}()
	}
	c.deleg = newDelegations(c)
	c.wg.Add(3)
	go c.heartbeatLoop()
	go c.targets.refreshLoop()
	go c.atimeLoop()
	return c, nil
}

// Config returns the effective configuration.
func (c *Client) Config() Config { return c.cfg }

// ClientID is the current session id (it changes if the session had to be
// reopened after expiry).
func (c *Client) ClientID() uint64 { return c.clientID.Load() }

// Close drains nothing: callers release their files first. It ends the
// session (releasing its locks), stops background goroutines and closes
// connections.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.closed = true
	c.mu.Unlock()
	c.deleg.closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), min(c.cfg.IOTimeout, 5*time.Second))
	if err := c.FlushAtimes(ctx); err != nil {
		c.log.Warn("access times of the last second not sent at unmount", "err", err)
	}
	c.cancel()
	err := c.meta.Call(ctx, rpc.MSessionClose, &rpc.SessionCloseReq{ClientID: c.clientID.Load()}, nil)
	cancel()
	if err != nil {
		c.log.Debug("session close failed", "err", err)
	}
	if c.metricsL != nil {
		c.metricsL.Close()
	}
	c.wg.Wait()
	c.targets.close()
	c.meta.Close()
	return nil
}

func (c *Client) closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.closed
}

// hdr returns a fresh request header.
func (c *Client) hdr() rpc.ReqHeader {
	return rpc.ReqHeader{ClientID: c.clientID.Load(), Seq: c.seq.Add(1)}
}

func (c *Client) openSession(ctx context.Context) error {
	var resp rpc.SessionOpenResp
	req := &rpc.SessionOpenReq{Host: c.cfg.Host, MountPoint: c.cfg.MountPoint, Pid: uint32(os.Getpid())}
	if err := c.metaCall(ctx, rpc.MSessionOpen, req, &resp); err != nil {
		return fmt.Errorf("open session with %s: %w", c.cfg.MetaAddr, err)
	}
	if resp.LeaseMs == 0 {
		resp.LeaseMs = 15000
	}
	c.clientID.Store(resp.ClientID)
	c.leaseMs.Store(resp.LeaseMs)
	return nil
}

// metaAttemptTimeout bounds one attempt of a metadata call at one voter
// while there are others to try (transport.MultiConfig.AttemptTimeout): a
// leader that hangs with its sockets open, or whose host dropped off the
// network, costs this long before the call goes to another voter. Above
// the longest a leader takes to answer: a lock wait (meta's lockWait, 1 s)
// or a log sync under load.
const metaAttemptTimeout = 3 * time.Second

// metaCall calls the metadata service: c.meta sends the call to the
// leader among the voters, following leader hints and retrying calls that
// failed in transport (transport.ErrUnavailable: a voter is down or
// restarting) or were answered ENOTCONN (not the leader; a leader is being
// elected) until cfg.IOTimeout has passed; the loop here backs off and
// tries again should c.meta give up earlier. A mutating request carries
// its ReqHeader unchanged through the retries, so the service applies it
// at most once (the duplicate-request table is replicated state, so a
// retry that reaches a new leader is answered from it). ctx can only
// shorten the wait.
func (c *Client) metaCall(ctx context.Context, m rpc.Method, req, resp rpc.Message) error {
	deadline := time.Now().Add(c.cfg.IOTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	backoff := 20 * time.Millisecond
	changed := c.metaChanged.Load()
	for attempt := 0; ; attempt++ {
		cctx, cancel := withDeadline(ctx, deadline)
		err := c.meta.Call(cctx, m, req, resp)
		cancel()
		if err == nil || !retryableMeta(err) {
			switch {
			case answeredBeforeDurable(m, req):
				c.noteChange(err, resp)
				if err != nil && !changeRefused(err) {
					// The change may have been made; what it did to
					// the directories is unknown (a success says it:
					// dirCache).
					c.dirs.reset()
				}
			case err == nil && answeredDurable(m, req):
				c.noteDurable(changed) // the log is sequential: earlier changes are durable too
			}
			c.m.metaOps.Inc()
			c.m.call("meta", m)
			if err != nil {
				c.m.metaErrors.Inc()
			}
			return err
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			c.m.metaErrors.Inc()
			c.log.Warn("metadata service unreachable", "addr", c.cfg.MetaAddr, "method", m, "attempts", attempt+1, "err", err)
			return err
		}
		if attempt == 0 {
			c.log.Debug("metadata call failed; retrying", "addr", c.cfg.MetaAddr, "method", m, "err", err)
		}
		sleep := min(backoff, left)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return err
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// changeRefused reports whether err is the metadata service refusing a change
// for what it asked (the state machine's checks, or the disk reserve): the
// namespace is as it was.
func changeRefused(err error) bool {
	switch rpc.ErrnoOf(err) {
	case syscall.EEXIST, syscall.ENOENT, syscall.ENOTEMPTY, syscall.ENOTDIR, syscall.EISDIR, syscall.EINVAL,
		syscall.EPERM, syscall.EMLINK, syscall.ENAMETOOLONG, syscall.ENOSPC, syscall.ENODATA, syscall.ERANGE, syscall.E2BIG:
		return true
	}
	return false
}

// answeredBeforeDurable reports whether the metadata service may answer m
// before the change is on stable storage (meta's command.answerBeforeDurable):
// namespace changes, and size commits sent as deferred (the async close).
func answeredBeforeDurable(m rpc.Method, req rpc.Message) bool {
	switch m {
	case rpc.MCreate, rpc.MTmpfile, rpc.MSetAttr, rpc.MUnlink, rpc.MRmdir, rpc.MRename, rpc.MLink,
		rpc.MSetXattr, rpc.MRemoveXattr, rpc.MSetDirLayout, rpc.MReturnDelegation:
		return true
	case rpc.MCommitSize:
		return isDeferredCommit(req)
	case rpc.MCreateBatch:
		return !isDurableBatch(req)
	}
	return false
}

func isDurableBatch(req rpc.Message) bool {
	r, ok := req.(*rpc.CreateBatchReq)
	return ok && r.Durable
}

func isDeferredCommit(req rpc.Message) bool {
	r, ok := req.(*rpc.CommitSizeReq)
	return ok && r.Deferred
}

// answeredDurable reports whether the answer to m comes only once m's
// change — and so every change applied before it — is on stable storage
// (an MSync for one index only covers up to that index).
func answeredDurable(m rpc.Method, req rpc.Message) bool {
	if m == rpc.MSync {
		r, ok := req.(*rpc.SyncReq)
		return ok && r.Index == 0
	}
	return m == rpc.MCommitSize && !isDeferredCommit(req) || m == rpc.MCreateBatch && isDurableBatch(req)
}

func (c *Client) noteDurable(n uint64) { storeMax(&c.metaDurable, n) }

func storeMax(v *atomic.Uint64, n uint64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// syncMetaIndex returns once the metadata log is durable up to raft index
// idx, which holds the create of a file this client made in term: EIO if
// the metadata service lost that entry (it restarted after a crash before
// the entry was durable).
func (c *Client) syncMetaIndex(ctx context.Context, idx, term uint64) error {
	if idx == 0 {
		return nil
	}
	if err := c.syncEntry(ctx, idx, term); err != nil {
		return metaErr(c, "sync", err)
	}
	return nil
}

// syncEntry asks MSync to check the entry (idx, term) and wait until the
// log is durable up to it, unless a durable report of the same term
// already covers it (within a term a leader's log only grows). The error
// is the call's own: EIO when the service lost the entry.
func (c *Client) syncEntry(ctx context.Context, idx, term uint64) error {
	c.durable.Lock()
	covered := c.durable.idx >= idx && c.durable.term == term
	c.durable.Unlock()
	if covered {
		return nil
	}
	var resp rpc.SyncResp
	if err := c.metaCall(ctx, rpc.MSync, &rpc.SyncReq{Index: idx, Term: term}, &resp); err != nil {
		return err
	}
	c.noteDurableIndex(resp)
	return nil
}

// noteDurableIndex records an MSync answer: a newer term replaces the
// record, the same term raises it, an older one is stale.
func (c *Client) noteDurableIndex(r rpc.SyncResp) {
	c.durable.Lock()
	defer c.durable.Unlock()
	switch {
	case r.Term > c.durable.term:
		c.durable.idx, c.durable.term = r.Durable, r.Term
	case r.Term == c.durable.term:
		c.durable.idx = max(c.durable.idx, r.Durable)
	}
}

// maxPendingStamps bounds the unchecked stamps kept (one per raft term);
// beyond it the next barrier is an unchecked one.
const maxPendingStamps = 8

// noteChange counts a change the service may have answered before it was
// durable, with its stamp when the answer carried one.
func (c *Client) noteChange(err error, resp rpc.Message) {
	var st rpc.Stamp
	if s, ok := resp.(interface{ ChangeStamp() rpc.Stamp }); ok && err == nil {
		st = s.ChangeStamp()
	}
	c.changes.Lock()
	defer c.changes.Unlock()
	c.metaChanged.Add(1)
	if st.Index == 0 || st.Term == 0 {
		c.changes.unstamped = true
		return
	}
	p := c.changes.pend
	for i := range p {
		if p[i].Term == st.Term {
			p[i].Index = max(p[i].Index, st.Index)
			return
		}
	}
	if len(p) >= maxPendingStamps {
		c.changes.unstamped = true
		return
	}
	c.changes.pend = append(p, st)
}

// SyncMeta returns once every namespace change this client made is on the
// metadata service's stable storage (a no-op when an earlier barrier or
// durable answer already covered them): fsync of a directory, and the end
// of fsync and close of a file. It fails with EIO when the service lost a
// change it had answered (a metadata machine crash before the change was
// durable).
func (c *Client) SyncMeta(ctx context.Context) error {
	ferr := c.deleg.flushAll(ctx) // the creates answered here first
	if err := c.FlushAtimes(ctx); err != nil {
		c.log.Debug("access times not sent at a barrier", "err", err)
	}
	if err := c.syncMetaUpTo(ctx, c.metaChanged.Load()); err != nil {
		return err
	}
	return ferr
}

// syncMetaUpTo is SyncMeta for the client's changes counted up to seq.
//
// While stamps wait to be checked it always asks the service: a durable
// answer (a size commit, an unchecked barrier) vouches for what the
// service holds now, not for a change it lost in a crash before, so it
// cannot stand in for the check.
func (c *Client) syncMetaUpTo(ctx context.Context, seq uint64) error {
	if seq == 0 {
		return nil
	}
	c.changes.Lock()
	count := c.metaChanged.Load()
	pend := append([]rpc.Stamp(nil), c.changes.pend...)
	unstamped := c.changes.unstamped
	c.changes.Unlock()
	if len(pend) == 0 && c.metaDurable.Load() >= seq {
		return nil
	}
	// The log holds every stamped change if it holds the highest entry of
	// each term (raft's logs match on every entry before one they share),
	// and is durable up to them once durable up to those.
	for _, st := range pend {
		if err := c.syncEntry(ctx, st.Index, st.Term); err != nil {
			if errors.Is(err, syscall.EIO) {
				c.checkedUpTo(0, pend) // reported once: later barriers do not fail for it again
			}
			return metaErr(c, "sync", err)
		}
	}
	if unstamped || len(pend) == 0 {
		// Changes without a stamp: wait for everything applied, unchecked.
		var resp rpc.SyncResp
		if err := c.metaCall(ctx, rpc.MSync, &rpc.SyncReq{}, &resp); err != nil {
			return metaErr(c, "sync", err)
		}
		c.noteDurableIndex(resp)
	} else {
		c.noteDurable(count)
	}
	c.checkedUpTo(count, pend)
	return nil
}

// checkedUpTo drops the stamps a barrier checked (those still as it saw
// them); with seq the current change count, also the unstamped mark.
func (c *Client) checkedUpTo(seq uint64, checked []rpc.Stamp) {
	c.changes.Lock()
	defer c.changes.Unlock()
	keep := c.changes.pend[:0]
	for _, p := range c.changes.pend {
		if !slices.Contains(checked, p) {
			keep = append(keep, p)
		}
	}
	c.changes.pend = keep
	if seq != 0 && c.metaChanged.Load() == seq {
		c.changes.unstamped = false
		c.changes.pend = c.changes.pend[:0]
	}
}

// retryableMeta reports whether a metadata call failed without being
// applied for sure and may be repeated with the same header: transport
// trouble, or ENOTCONN — the node is not (yet) the leader, e.g. during an
// election after a restart (meta.ErrNotLeader).
func retryableMeta(err error) bool { return transport.Retryable(err) }

// heartbeatLoop renews the session every lease/3 and reports open inodes.
// It owns session renewal: on ESTALE (the service forgot the session, e.g.
// after it expired) it opens a new one. A kick (a newly opened inode)
// makes it report within kickDelay, so that an unlink elsewhere does not
// let the service reap a file this client holds open; kicks are coalesced.
func (c *Client) heartbeatLoop() {
	defer c.wg.Done()
	const kickDelay = 50 * time.Millisecond
	// A heartbeat itself follows the leader among the voters and waits
	// for one to be elected (c.meta), up to IOTimeout; one that failed
	// even so is tried again soon rather than a third of a lease later: a
	// restarted service, or a new leader, holds back new locks until every
	// client has reclaimed its own, which happens in the first heartbeat
	// it answers. Calls answered by a new leader kick a heartbeat at once
	// (New: OnLeaderChange).
	const retryInterval = 500 * time.Millisecond
	failed := false
	for {
		interval := time.Duration(c.leaseMs.Load()) * time.Millisecond / 3
		if interval <= 0 {
			interval = time.Second
		}
		if failed {
			interval = min(interval, retryInterval)
		}
		timer := time.NewTimer(interval)
		select {
		case <-c.ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-c.kick:
			timer.Stop()
			select {
			case <-time.After(kickDelay):
			case <-c.ctx.Done():
				return
			}
		}
		err := c.heartbeat(c.ctx)
		if err != nil && c.ctx.Err() == nil && !failed {
			c.log.Warn("session heartbeat failed; retrying every "+retryInterval.String(), "addr", c.cfg.MetaAddr, "err", err)
		}
		if err == nil && failed {
			c.log.Info("session heartbeat answered again", "addr", c.cfg.MetaAddr)
		}
		failed = err != nil
	}
}

// kickHeartbeat makes the heartbeat loop send one soon (kicks coalesce).
func (c *Client) kickHeartbeat() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// SetGatewayReport makes every heartbeat carry f's report: an NFS
// gateway's address, exports, clients and calls, for strata status.
func (c *Client) SetGatewayReport(f func() *rpc.GatewayReport) {
	if f == nil {
		c.gateway.Store(nil)
		return
	}
	c.gateway.Store(&f)
}

// heartbeat sends one heartbeat now.
func (c *Client) heartbeat(ctx context.Context) error {
	listedAfter := c.metaNow.Load() // read before the list is made
	c.mu.Lock()
	for _, start := range c.mu.opening {
		listedAfter = min(listedAfter, start)
	}
	open := make([]uint64, 0, len(c.mu.inodes))
	for ino := range c.mu.inodes {
		open = append(open, ino)
	}
	clear(c.mu.unsent)
	c.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, c.cfg.IOTimeout)
	defer cancel()
	req := &rpc.SessionHeartbeatReq{ClientID: c.clientID.Load(), OpenInodes: open, LockEpoch: c.lockEpoch(), ListedAfter: listedAfter}
	if f := c.gateway.Load(); f != nil && !c.gatewayRefused.Load() {
		req.Gateway = (*f)()
	}
	var resp rpc.SessionHeartbeatResp
	err := c.meta.Call(cctx, rpc.MSessionHeartbeat, req, &resp)
	if req.Gateway != nil && errors.Is(err, syscall.EINVAL) {
		c.gatewayRefused.Store(true)
		c.log.Warn("the metadata service does not take NFS gateway reports (an older release): strata status will not show this gateway's exports and calls", "err", err)
		req.Gateway = nil
		err = c.meta.Call(cctx, rpc.MSessionHeartbeat, req, &resp)
	}
	if err == nil && resp.Now > 0 {
		c.metaNow.Store(resp.Now)
	}
	if errors.Is(err, syscall.ESTALE) {
		return c.reopenSession(ctx, c.clientID.Load())
	}
	if err != nil {
		c.markUnsent()
		return err
	}
	if resp.LockEpoch != 0 && resp.LockEpoch != req.LockEpoch && c.reclaimLocks(cctx, resp.LockEpoch) {
		// Tell the service at once that this client is done reclaiming:
		// until every client is, new locks wait.
		req.LockEpoch = resp.LockEpoch
		err = c.meta.Call(cctx, rpc.MSessionHeartbeat, req, &resp)
	}
	return err
}

// reopenSession replaces an expired session (old) with a new one and
// reports the open inodes to it. Locks of the old session are gone.
func (c *Client) reopenSession(ctx context.Context, old uint64) error {
	c.sessionMu.Lock()
	defer c.sessionMu.Unlock()
	if c.clientID.Load() != old {
		return nil // someone else already did
	}
	c.log.Warn("session expired on the metadata service; opening a new one (locks held by this client are lost; files open under them now fail with EIO)", "old_client_id", old, "locks", c.forgetLocks())
	if err := c.openSession(ctx); err != nil {
		return err
	}
	c.markUnsent()
	return c.heartbeat(ctx)
}

// markUnsent counts every open inode as not reported (the last list did
// not reach the service).
func (c *Client) markUnsent() {
	c.mu.Lock()
	for ino := range c.mu.inodes {
		c.mu.unsent[ino] = struct{}{}
	}
	c.mu.Unlock()
}

// reportOpen makes sure the metadata service knows every inode this client
// holds open before an operation that could orphan one of them. It returns
// the context for that operation's call: the report and the call share one
// IOTimeout, so that a service without a leader fails the operation after
// IOTimeout, not twice that (a heartbeat waits for a leader too).
func (c *Client) reportOpen(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.IOTimeout)
	c.mu.Lock()
	sent := len(c.mu.unsent) == 0
	c.mu.Unlock()
	if sent {
		return ctx, cancel // a file opened and closed since the last list needs no report
	}
	if err := c.heartbeat(ctx); err != nil {
		c.log.Debug("open-inode report failed", "err", err)
	}
	return ctx, cancel
}

// budget is a counting semaphore of bytes (write-behind memory).
type budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	avail int64
	max   int64
}

func newBudget(n int64) *budget {
	b := &budget{avail: n, max: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// acquire takes n bytes, waiting while they are not available. A request
// larger than the whole budget waits for the whole budget.
func (b *budget) acquire(n int64) {
	if n > b.max {
		n = b.max
	}
	b.mu.Lock()
	for b.avail < n {
		b.cond.Wait()
	}
	b.avail -= n
	b.mu.Unlock()
}

// tryAcquire takes n bytes only if at least keep more stay free.
func (b *budget) tryAcquire(n, keep int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.avail-n < keep {
		return false
	}
	b.avail -= n
	return true
}

func (b *budget) release(n int64) {
	if n > b.max {
		n = b.max
	}
	b.mu.Lock()
	b.avail += n
	b.mu.Unlock()
	b.cond.Broadcast()
}

type recentWrite struct {
	f  *File
	at int64 // nowNs
}

// concurrentWriter notes a large write by f at now and reports whether
// another handle made one within the last concurrentWindow.
func (c *Client) concurrentWriter(f *File, now int64) bool {
	c.recent.Lock()
	defer c.recent.Unlock()
	other := false
	for _, w := range c.recent.w {
		if w.f != nil && w.f != f && now-w.at < int64(concurrentWindow) {
			other = true
			break
		}
	}
	c.recent.w[c.recent.i] = recentWrite{f, now}
	c.recent.i = (c.recent.i + 1) % len(c.recent.w)
	return other
}

// concurrentWindow: two handles writing large pieces within this time of
// each other count as concurrent writers.
const concurrentWindow = 20 * time.Millisecond
