package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// TargetError is a failed call to a storage target. It matches its Errno
// with errors.Is (EIO for an unreachable server, or what the server
// answered: ENOSPC, EIO for a checksum mismatch, …) and says which target
// and server caused it. For a mirror group's chunk, Target is the layout's
// id (rpc.GroupBit | group) and Copy the target of the copy asked last.
type TargetError struct {
	Op     string
	Target uint32
	Copy   uint32
	Addr   string
	Errno  syscall.Errno
	Err    error // the cause
}

func (e *TargetError) Error() string {
	if rpc.IsGroup(e.Target) {
		return fmt.Sprintf("%s on mirror group %d (target %d, server %s): %v", e.Op, e.Target&^rpc.GroupBit, e.Copy, e.Addr, e.Err)
	}
	return fmt.Sprintf("%s on target %d (server %s): %v", e.Op, e.Target, e.Addr, e.Err)
}

func (e *TargetError) Unwrap() []error { return []error{e.Errno, e.Err} }

// targetMap routes target ids to storage servers. It owns one transport.Client
// per server address (pooled connections).
type targetMap struct {
	c  *Client
	mu struct {
		sync.RWMutex
		byID        map[uint32]rpc.TargetInfo
		conns       map[string]*transport.Client
		lastRefresh time.Time
	}
	refreshMu sync.Mutex // one MListTargets at a time
}

func (t *targetMap) init(c *Client) {
	t.c = c
	t.mu.byID = map[uint32]rpc.TargetInfo{}
	t.mu.conns = map[string]*transport.Client{}
}

func (t *targetMap) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cl := range t.mu.conns {
		cl.Close()
	}
	t.mu.conns = map[string]*transport.Client{}
}

// Targets returns the cached target map (id → info).
func (c *Client) Targets() map[uint32]rpc.TargetInfo {
	c.targets.mu.RLock()
	defer c.targets.mu.RUnlock()
	out := make(map[uint32]rpc.TargetInfo, len(c.targets.mu.byID))
	for k, v := range c.targets.mu.byID {
		out[k] = v
	}
	return out
}

// refresh reloads the target map from the metadata service.
func (t *targetMap) refresh(ctx context.Context) error {
	t.refreshMu.Lock()
	defer t.refreshMu.Unlock()
	var resp rpc.ListTargetsResp
	if err := t.c.metaCall(ctx, rpc.MListTargets, &rpc.Empty{}, &resp); err != nil {
		return fmt.Errorf("list targets: %w", err)
	}
	byID := make(map[uint32]rpc.TargetInfo, len(resp.Targets))
	for _, ti := range resp.Targets {
		byID[ti.ID] = ti
	}
	t.mu.Lock()
	t.mu.byID = byID
	t.mu.lastRefresh = time.Now()
	t.mu.Unlock()
	return nil
}

// maybeRefresh refreshes unless that happened less than minAge ago.
func (t *targetMap) maybeRefresh(ctx context.Context, minAge time.Duration) {
	t.mu.RLock()
	age := time.Since(t.mu.lastRefresh)
	t.mu.RUnlock()
	if age < minAge {
		return
	}
	if err := t.refresh(ctx); err != nil {
		t.c.log.Debug("target refresh failed", "err", err)
	}
}

func (t *targetMap) refreshLoop() {
	defer t.c.wg.Done()
	tick := time.NewTicker(t.c.cfg.TargetRefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.c.ctx.Done():
			return
		case <-tick.C:
			t.maybeRefresh(t.c.ctx, t.c.cfg.TargetRefreshInterval/2)
			t.c.groups.maybeRefresh(t.c.ctx, t.c.cfg.TargetRefreshInterval/2)
		}
	}
}

// conn returns the rpc client of target id's server.
func (t *targetMap) conn(ctx context.Context, id uint32) (*transport.Client, string, error) {
	for pass := 0; pass < 2; pass++ {
		t.mu.RLock()
		ti, ok := t.mu.byID[id]
		t.mu.RUnlock()
		if ok {
			return t.connTo(ti.Addr), ti.Addr, nil
		}
		if pass == 0 {
			t.maybeRefresh(ctx, 200*time.Millisecond)
		}
	}
	return nil, "", fmt.Errorf("%w: target %d is not registered", transport.ErrUnavailable, id)
}

// connTo returns the rpc client of the storage server at addr.
func (t *targetMap) connTo(addr string) *transport.Client {
	t.mu.RLock()
	cl := t.mu.conns[addr]
	t.mu.RUnlock()
	if cl != nil {
		return cl
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cl = t.mu.conns[addr]
	if cl == nil {
		cl = transport.NewClient(addr, transport.ClientConfig{
			Key:         t.c.cfg.ClusterKey,
			TLS:         t.c.cfg.TLS,
			Conns:       t.c.cfg.ConnsPerServer,
			DialTimeout: min(3*time.Second, t.c.cfg.IOTimeout),
			CallTimeout: t.c.cfg.IOTimeout,
		})
		t.mu.conns[addr] = cl
	}
	return cl
}

// storeCall calls method m about chunk (a field of req) on its target's
// server. Every storage method is
// idempotent (writes at an offset, truncates, punches, syncs, reads), so
// transport failures are retried with backoff — refreshing the target map
// in case the server came back at another address — until IOTimeout; then
// the call fails with EIO and a log line naming target and server. A
// chunk of a mirror group goes through groupCall, which sets chunk.Epoch.
func (c *Client) storeCall(ctx context.Context, op string, chunk *rpc.ChunkID, m rpc.Method, req, resp rpc.Message) error {
	return c.chunkCall(ctx, op, chunk, 0, m, req, resp)
}

// chunkCall is storeCall with the key that spreads a mirror group's reads
// over its copies (spreadKey; unused for other chunks and requests).
func (c *Client) chunkCall(ctx context.Context, op string, chunk *rpc.ChunkID, spread uint64, m rpc.Method, req, resp rpc.Message) error {
	if rpc.IsGroup(chunk.Target) {
		return c.groupCall(ctx, op, chunk, spread, m, req, resp)
	}
	target := chunk.Target
	deadline := time.Now().Add(c.cfg.IOTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := withDeadline(ctx, deadline)
	defer cancel()
	backoff := 20 * time.Millisecond
	var addr string
	for attempt := 0; ; attempt++ {
		cl, a, err := c.targets.conn(ctx, target)
		if err == nil {
			addr = a
			err = cl.Call(ctx, m, req, resp)
			c.m.call("store", m)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, transport.ErrUnavailable) {
			te := &TargetError{Op: op, Target: target, Addr: addr, Errno: rpc.ErrnoOf(err), Err: err}
			c.m.storeErrs.WithLabelValues(strconv.Itoa(int(target))).Inc()
			if te.Errno != syscall.ENOSPC {
				c.log.Warn("storage call failed", "op", op, "target", target, "server", addr, "err", err)
			}
			return te
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			c.m.storeErrs.WithLabelValues(strconv.Itoa(int(target))).Inc()
			c.log.Warn("storage server unreachable; failing with EIO", "op", op, "target", target, "server", addr,
				"waited", c.cfg.IOTimeout, "attempts", attempt+1, "err", err)
			return &TargetError{Op: op, Target: target, Addr: addr, Errno: syscall.EIO, Err: err}
		}
		select {
		case <-time.After(min(backoff, left)):
		case <-ctx.Done():
		}
		backoff = min(backoff*2, 500*time.Millisecond)
		c.targets.maybeRefresh(ctx, 500*time.Millisecond)
	}
}
