package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// groupMap is the client's copy of the mirror groups (docs/design/0014):
// for a layout slot whose id has rpc.GroupBit, which server holds the
// group's primary and secondary copy, the group's state and epoch. It is
// refreshed with the target map (refreshLoop, New) and on demand, when a
// store answers ESTALE or EAGAIN for a group chunk or its server cannot be
// reached (groupCall). Refreshes run one at a time; a caller that saw an
// error waits for a refresh that started after it (refreshAfter), so a
// burst of failing calls after a switch costs one MListGroups. A map
// older (rpc.MapVersion) than the one installed is not installed
// (docs/design/0014 § Group map versions).
type groupMap struct {
	c *Client
	// list asks the metadata service for every group (MListGroups through
	// metaCall), and the map's version. Tests of routing against a
	// service that has no groups yet replace it with their own source of
	// the map.
	list func(ctx context.Context) ([]rpc.GroupInfo, rpc.MapVersion, error)
	// started counts refreshes begun (holding refreshing).
	started atomic.Uint64
	// refreshing is held (a token in it) by the refresh under way: a
	// lock that a waiter can give up on when its context ends, so that a
	// refresh stuck on an unreachable metadata service does not stretch
	// the bounded wait of the calls behind it.
	refreshing chan struct{}
	mu         struct {
		sync.RWMutex
		byID map[uint32]rpc.GroupInfo // by group number, without GroupBit
		// from is the number (started) of the refresh whose answer
		// byID is; 0 before the first.
		from uint64
		// gate holds byID's map version and refuses older maps.
		gate        rpc.MapGate
		lastRefresh time.Time
		// unreachable: copies (target ids) a read could not reach, until
		// when reads of an in-sync group prefer the other copy (the
		// service degrades the group within its failover timeout; until
		// then each read would wait on the dead copy first).
		unreachable map[uint32]time.Time
	}
}

// avoidFor is how long reads prefer the other copy of an in-sync group
// after one of them found a copy unreachable: about the metadata
// service's failover timeout, after which the map says what happened.
const avoidFor = 3 * time.Second

func (g *groupMap) init(c *Client) {
	g.c = c
	g.mu.byID = map[uint32]rpc.GroupInfo{}
	g.mu.unreachable = map[uint32]time.Time{}
	g.refreshing = make(chan struct{}, 1)
	g.list = func(ctx context.Context) ([]rpc.GroupInfo, rpc.MapVersion, error) {
		var resp rpc.ListGroupsResp
		err := c.metaCall(ctx, rpc.MListGroups, &rpc.Empty{}, &resp)
		if errors.Is(err, syscall.ENOSYS) {
			return nil, 0, nil // a service without mirror groups
		}
		if err != nil {
			return nil, 0, fmt.Errorf("list mirror groups: %w", err)
		}
		return resp.Groups, resp.Version, nil
	}
}

// Groups returns the cached mirror groups by group number (without
// rpc.GroupBit).
func (c *Client) Groups() map[uint32]rpc.GroupInfo {
	c.groups.mu.RLock()
	defer c.groups.mu.RUnlock()
	out := make(map[uint32]rpc.GroupInfo, len(c.groups.mu.byID))
	for k, v := range c.groups.mu.byID {
		out[k] = v
	}
	return out
}

// mark is what a caller notes before it acts on the map: a later
// refreshAfter(mark) returns only a map fetched after that moment.
func (g *groupMap) mark() uint64 { return g.started.Load() }

// refresh fetches the map now (after any refresh under way).
func (g *groupMap) refresh(ctx context.Context) error {
	if err := g.lockRefresh(ctx); err != nil {
		return err
	}
	defer g.unlockRefresh()
	return g.refreshLocked(ctx)
}

// lockRefresh waits for the refresh under way, if any, to end (or ctx).
func (g *groupMap) lockRefresh(ctx context.Context) error {
	select {
	case g.refreshing <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the mirror group map: %w", ctx.Err())
	}
}

func (g *groupMap) unlockRefresh() { <-g.refreshing }

func (g *groupMap) refreshLocked(ctx context.Context) error {
	n := g.started.Add(1)
	groups, version, err := g.list(ctx)
	if err != nil {
		return err
	}
	g.install(groups, version, n)
	return nil
}

// install makes groups, of map version version, the map, as fetched by
// refresh number n: unless an answer fetched later (n) or read from a
// newer state of the service (version) is installed already. Either way
// the refresh counts as done (from): the map is at least that new.
func (g *groupMap) install(groups []rpc.GroupInfo, version rpc.MapVersion, n uint64) {
	byID := make(map[uint32]rpc.GroupInfo, len(groups))
	for _, gi := range groups {
		byID[gi.ID&^rpc.GroupBit] = gi
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if n < g.mu.from {
		return // an older answer than the one installed
	}
	g.mu.from = n
	g.mu.lastRefresh = time.Now()
	installed := g.mu.gate.Version
	ok, wentBack := g.mu.gate.Admit(version, time.Now())
	if !ok {
		g.c.log.Debug("mirror group map older than the one installed: not installed", "installed", installed, "answered", version)
		return
	}
	if wentBack {
		g.c.log.Warn("the metadata service's mirror group map went back in version: taking it (was its state restored from an older copy?)",
			"installed", installed, "answered", version)
	}
	g.mu.byID = byID
}

// refreshAfter returns once the map was fetched by a refresh that began
// after mark was taken: at once if one has ended meanwhile, else after the
// refresh under way (if it began after mark) or a new one.
func (g *groupMap) refreshAfter(ctx context.Context, mark uint64) error {
	if err := g.lockRefresh(ctx); err != nil {
		return err
	}
	defer g.unlockRefresh()
	g.mu.RLock()
	from := g.mu.from
	g.mu.RUnlock()
	if from > mark {
		return nil
	}
	return g.refreshLocked(ctx)
}

// maybeRefresh refreshes unless that happened less than minAge ago.
func (g *groupMap) maybeRefresh(ctx context.Context, minAge time.Duration) {
	g.mu.RLock()
	age := time.Since(g.mu.lastRefresh)
	g.mu.RUnlock()
	if age < minAge {
		return
	}
	if err := g.refresh(ctx); err != nil {
		g.c.log.Debug("mirror group refresh failed", "err", err)
	}
}

// epoch is group id's epoch in the map (false: not in it).
func (g *groupMap) epoch(id uint32) (uint64, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	gi, ok := g.mu.byID[id&^rpc.GroupBit]
	return gi.Epoch, ok
}

// groupRoute is where one attempt at a group's chunk goes.
type groupRoute struct {
	copy  uint32 // target id of the copy asked
	addr  string // its server's data address
	epoch uint64
	// both: the group is in sync, so a read may go to either copy; other
	// is then the copy not asked.
	both  bool
	other uint32
}

// route picks the copy of group id (a layout id with GroupBit) for a
// request: mutations, and every request while the group is not in sync,
// go to the primary; a read of an in-sync group goes to the copy that
// spread picks (its lowest bit: by inode and group, spreadKey, so that the
// reads of mirrored files keep both copies' disks busy), or to the other one
// when that is avoid (the copy that just failed) or was found unreachable
// lately (noteUnreachable). false: the group is not in the map.
func (g *groupMap) route(id uint32, read bool, spread uint64, avoid uint32) (groupRoute, bool) {
	g.mu.RLock()
	gi, ok := g.mu.byID[id&^rpc.GroupBit]
	var sick [2]bool
	if ok && read && len(g.mu.unreachable) > 0 {
		now := time.Now()
		sick[0] = now.Before(g.mu.unreachable[gi.Primary])
		sick[1] = now.Before(g.mu.unreachable[gi.Secondary])
	}
	g.mu.RUnlock()
	if !ok {
		return groupRoute{}, false
	}
	r := groupRoute{copy: gi.Primary, addr: gi.PrimaryAddr, epoch: gi.Epoch}
	if read && gi.State == rpc.GroupInSync && gi.Secondary != gi.Primary {
		r.both = true
		r.other = gi.Secondary
		first, second := gi.Primary, gi.Secondary
		if spread&1 == 1 {
			first, second = second, first
		}
		if sick[0] != sick[1] && (first == gi.Primary) == sick[0] {
			first, second = second, first
		}
		if first == avoid {
			first, second = second, first
		}
		r.copy, r.other = first, second
		if r.copy == gi.Secondary {
			r.addr = gi.SecondaryAddr
		}
	}
	if r.addr == "" { // a service that did not say: the target map knows
		g.c.targets.mu.RLock()
		r.addr = g.c.targets.mu.byID[r.copy].Addr
		g.c.targets.mu.RUnlock()
	}
	return r, true
}

// noteUnreachable records that a read could not reach copy target.
func (g *groupMap) noteUnreachable(target uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for t, until := range g.mu.unreachable {
		if now.After(until) {
			delete(g.mu.unreachable, t)
		}
	}
	g.mu.unreachable[target] = now.Add(avoidFor)
}

// spreadKey is the key route uses to choose among in-sync copies: the
// parity of inode + group number. A whole chunk is read from one copy, so
// that each copy's chunk file is read front to back — a copy asked for
// every other stripe row (the first design) had the kernel's read-ahead on
// its store read the rows the other copy serves too: with the 8 MiB
// read-ahead of a common disk, a sequential read of a mirrored file read
// 1.4-1.6 times its size from disk, in twice the I/Os of an unmirrored one.
// Copies alternate along a file's groups (its slots), and a group's chunks
// alternate between its copies over consecutive inodes (files created one
// after the other): the layouts of such files rotate over the groups, and a
// key of inode + slot would then give each group the same copy in every
// file.
func spreadKey(ino uint64, group uint32) uint64 {
	return ino + uint64(group&^rpc.GroupBit)
}

// readMethod reports whether a storage method only reads a chunk, so
// either in-sync copy may answer it. SChunkStat is not one: the space a
// size commit reports is the primary's, as SSyncStat answers it.
func readMethod(m rpc.Method) bool { return m == rpc.SRead || m == rpc.SSeek }

// Group calls keep an eye on the map while they wait: a call unanswered
// for groupWatchAfter re-reads the map at most every groupWatchEvery and
// is given up (and sent again) when the group's epoch moved — a hung
// primary's replacement serves it then. A slow call whose group did not
// switch is left alone.
const (
	groupWatchAfter = time.Second
	groupWatchEvery = 500 * time.Millisecond
	// groupBackoffMax caps the wait between attempts at a group's chunk:
	// a switch is a matter of seconds, and every wait past it is stall.
	groupBackoffMax = 200 * time.Millisecond
)

// groupCall is storeCall for a chunk of mirror group chunk.Target. It
// sends the request with the group's epoch to the copy route picks, and
// when the store answers ESTALE or EAGAIN, or the server cannot be
// reached, it re-reads the group map and sends the same request again
// (every storage request is idempotent: a write puts the same bytes at the
// same offset), with short backoff, until IOTimeout has passed since the
// first attempt; a read that a copy of an in-sync group answers EIO (a
// checksum mismatch) goes to the other copy before it fails. The final
// error is a *TargetError naming the group and the copy's server, whose
// Errno is never ESTALE or EAGAIN (EIO instead): no data operation passes
// those to the kernel.
func (c *Client) groupCall(ctx context.Context, op string, chunk *rpc.ChunkID, spread uint64, m rpc.Method, req, resp rpc.Message) error {
	deadline := time.Now().Add(c.cfg.IOTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	id := chunk.Target
	read := readMethod(m)
	g := &c.groups
	backoff := 20 * time.Millisecond
	var (
		rt       groupRoute
		avoid    uint32 // the copy that failed last (reads of an in-sync group)
		otherEIO bool   // a copy answered EIO and the other was asked
		lastErr  error
	)
	for attempt := 0; ; attempt++ {
		var ok bool
		var err error
		rt, ok = g.route(id, read, spread, avoid)
		switch {
		case !ok:
			err = fmt.Errorf("%w: mirror group %d is not in the group map", errNoRoute, id&^rpc.GroupBit)
		case rt.addr == "":
			err = fmt.Errorf("%w: the server of target %d (group %d) is unknown", errNoRoute, rt.copy, id&^rpc.GroupBit)
		default:
			chunk.Epoch = rt.epoch
			err = c.watchedCall(ctx, c.targets.connTo(rt.addr), id, rt.epoch, m, req, resp)
			c.m.call("store", m)
		}
		if err == nil {
			return nil
		}
		lastErr = err
		seen := g.mark()
		errno := rpc.ErrnoOf(err)
		unreachable := errors.Is(err, transport.ErrUnavailable) || errors.Is(err, errNoRoute)
		switch {
		case read && rt.both && errno == syscall.EIO && !unreachable && !otherEIO:
			// A bad block on this copy: the other one has it.
			c.log.Warn("read of a mirrored chunk failed on one copy; reading the other", "op", op,
				"group", id&^rpc.GroupBit, "target", rt.copy, "server", rt.addr, "err", err)
			otherEIO, avoid = true, rt.copy
			c.m.groupRetries.WithLabelValues("copy").Inc()
			continue
		case unreachable || errno == syscall.ESTALE || errno == syscall.EAGAIN:
		default:
			return c.groupErr(op, id, rt, errno, err, attempt+1)
		}
		if ctx.Err() != nil || time.Until(deadline) <= 0 {
			return c.groupErr(op, id, rt, syscall.EIO, lastErr, attempt+1)
		}
		switch {
		case errors.Is(err, errMoved):
			c.m.groupRetries.WithLabelValues("unreachable").Inc()
			continue // the watch fetched the new map: go at once
		case unreachable:
			c.m.groupRetries.WithLabelValues("unreachable").Inc()
		case errno == syscall.ESTALE:
			c.m.groupRetries.WithLabelValues("stale").Inc()
		default:
			c.m.groupRetries.WithLabelValues("again").Inc()
		}
		if read && rt.both && unreachable {
			g.noteUnreachable(rt.copy)
			avoid = rt.copy // the other copy, while the group is still in sync
			if attempt == 0 {
				continue // at once
			}
		}
		if read && rt.both && errno == syscall.EAGAIN {
			// This copy cannot serve the read now (a secondary's chunk
			// left unsure by an unclean stop until its primary has it
			// re-copied; a primary between leases): the next attempt
			// asks the other copy, whose own admission decides.
			avoid = rt.copy
		}
		if errno == syscall.ESTALE && ok {
			// A newer epoch than ours exists: fetch it, and go at once
			// if it came.
			if rerr := g.refreshAfter(ctx, seen); rerr == nil {
				if e, ok := g.epoch(id); ok && e != rt.epoch {
					continue
				}
			}
		}
		select {
		case <-time.After(min(backoff, time.Until(deadline))):
		case <-ctx.Done():
		}
		backoff = min(backoff*2, groupBackoffMax)
		if err := g.refreshAfter(ctx, seen); err != nil {
			c.log.Debug("mirror group refresh failed", "err", err)
		}
	}
}

// errNoRoute marks an attempt that found no server to send to (the group
// or its copy's server not known yet): retried like an unreachable server.
var errNoRoute = errors.New("no route to mirror group")

// errMoved marks an attempt given up because the group switched while it
// waited (watchedCall).
var errMoved = errors.New("the group switched to a new epoch while the call waited")

// groupErr is the final error of a group call after attempts attempts,
// counted and logged.
func (c *Client) groupErr(op string, id uint32, rt groupRoute, errno syscall.Errno, err error, attempts int) error {
	if errno == syscall.ESTALE || errno == syscall.EAGAIN || errno == 0 {
		errno = syscall.EIO
	}
	if en := rpc.ErrnoOf(err); en == syscall.ESTALE || en == syscall.EAGAIN {
		// The cause's text only: nothing that asks the error for an errno
		// (errors.Is, rpc.ErrnoOf) may find the store's answer in it.
		err = errors.New(err.Error())
	}
	c.m.storeErrs.WithLabelValues(fmt.Sprintf("g%d", id&^rpc.GroupBit)).Inc()
	if errno != syscall.ENOSPC {
		c.log.Warn("storage call to a mirror group failed", "op", op, "group", id&^rpc.GroupBit,
			"target", rt.copy, "server", rt.addr, "errno", errno, "attempts", attempts, "err", err)
	}
	return &TargetError{Op: op, Target: id, Copy: rt.copy, Addr: rt.addr, Errno: errno, Err: err}
}

// watchedCall is one attempt of a group call on cl. A call to a server in
// another process that is still unanswered after groupWatchAfter watches
// the group map, and is given up (transport.ErrUnavailable) once the
// group's epoch is no longer epoch: a hung primary was replaced and its
// successor will answer. Calls served in this process are not watched: a
// hang there is the whole process's, and an in-process read may be
// writing straight into the caller's buffer (rpc.ReadResp.Direct), which
// an abandoned attempt must not do behind a retry's back.
func (c *Client) watchedCall(ctx context.Context, cl *transport.Client, id uint32, epoch uint64, m rpc.Method, req, resp rpc.Message) error {
	if cl.ServedInProcess() {
		return cl.Call(ctx, m, req, resp)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var moved atomic.Bool
	t := time.AfterFunc(groupWatchAfter, func() {
		for actx.Err() == nil {
			c.groups.maybeRefresh(actx, groupWatchEvery)
			if e, ok := c.groups.epoch(id); ok && e != epoch {
				moved.Store(true)
				cancel()
				return
			}
			select {
			case <-actx.Done():
			case <-time.After(groupWatchEvery):
			}
		}
	})
	err := cl.Call(actx, m, req, resp)
	t.Stop()
	if err != nil && moved.Load() {
		return fmt.Errorf("%w: %w: group %d: %v", transport.ErrUnavailable, errMoved, id&^rpc.GroupBit, err)
	}
	return err
}
