package client

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Access times are sent in batches: a read that moves a file's atime
// (relatime, touchAtime) only notes (ino, atime) here, and one
// rpc.MSetAtimes request — one raft entry — carries the notes of up to
// atimeBatchMax files to the metadata service, at most atimeInterval after
// the first of them, at once when atimeBatchMax are waiting, and at
// SyncMeta and Close. Until then this client answers its own stats and
// opens with the newer atime (atimes.merge). A crash of the client loses
// the notes not sent yet: at most atimeInterval of access times, which
// relatime keeps approximate anyway. Other mounts see the new atimes once
// sent.
const atimeBatchMax = 256

// atimeInterval is a variable for tests, which set it before making a
// client.
var atimeInterval = time.Second

// atimeBatch holds the access times not sent yet.
type atimeBatch struct {
	mu      sync.Mutex
	pending map[uint64]int64 // ino → atime (ns), the latest noted
	noBatch bool             // the service answered MSetAtimes with ENOSYS: one SetAttr each
	full    chan struct{}    // atimeBatchMax notes wait: send now
	every   time.Duration    // atimeInterval when the client was made
	sendMu  sync.Mutex       // one send at a time, so that batches reach the service in order
}

func (b *atimeBatch) init() {
	b.pending = map[uint64]int64{}
	b.full = make(chan struct{}, 1)
	b.every = atimeInterval
}

// note records that ino was read at atime.
func (b *atimeBatch) note(ino uint64, atime int64) {
	b.mu.Lock()
	if atime > b.pending[ino] {
		b.pending[ino] = atime
	}
	n := len(b.pending)
	b.mu.Unlock()
	if n >= atimeBatchMax {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

// merge answers a with the atime noted for its file when that is newer
// than the service's: this client's reads are visible to it at once.
func (b *atimeBatch) merge(a *rpc.Attr) {
	b.mu.Lock()
	if t, ok := b.pending[a.Ino]; ok && t > a.Atime {
		a.Atime = t
	}
	b.mu.Unlock()
}

// atimeLoop sends the noted access times every atimeInterval, or at once
// when a batch is full, until the client closes.
func (c *Client) atimeLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.atimes.every)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		case <-c.atimes.full:
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.IOTimeout)
		if err := c.FlushAtimes(ctx); err != nil {
			c.log.Debug("sending access times failed; they are dropped", "err", err)
		}
		cancel()
	}
}

// FlushAtimes sends every access time noted so far to the metadata
// service and returns once it applied them. Notes that fail to go are
// dropped (access times are best effort), and the error returned.
func (c *Client) FlushAtimes(ctx context.Context) error {
	b := &c.atimes
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	b.mu.Lock()
	if len(b.pending) == 0 {
		b.mu.Unlock()
		return nil
	}
	sent := make(map[uint64]int64, len(b.pending))
	inos := make([]uint64, 0, len(b.pending))
	atimes := make([]int64, 0, len(b.pending))
	for ino, t := range b.pending {
		sent[ino] = t
		inos = append(inos, ino)
		atimes = append(atimes, t)
	}
	noBatch := b.noBatch
	b.mu.Unlock()
	var err error
	for len(inos) > 0 && err == nil {
		k := min(len(inos), rpc.MaxSetAtimes)
		if noBatch {
			err = c.setAtimesOneByOne(ctx, inos[:k], atimes[:k])
		} else {
			err = c.metaCall(ctx, rpc.MSetAtimes, &rpc.SetAtimesReq{Hdr: c.hdr(), Inos: inos[:k], Atimes: atimes[:k]}, &rpc.Stamp{})
			if rpc.ErrnoOf(err) == syscall.ENOSYS { // an older service
				b.mu.Lock()
				b.noBatch, noBatch = true, true
				b.mu.Unlock()
				err = c.setAtimesOneByOne(ctx, inos[:k], atimes[:k])
			}
		}
		inos, atimes = inos[k:], atimes[k:]
	}
	// Sent (or given up): forget the notes, unless a newer read came since.
	b.mu.Lock()
	for ino, t := range b.pending {
		if t <= sent[ino] {
			delete(b.pending, ino)
		}
	}
	b.mu.Unlock()
	c.m.op("atime_batch")
	if err != nil {
		return metaErr(c, "set access times", err)
	}
	return nil
}

// setAtimesOneByOne sends access times as one SetAttr each (to a service
// without MSetAtimes), keeping each file's ctime.
func (c *Client) setAtimesOneByOne(ctx context.Context, inos []uint64, atimes []int64) error {
	for i, ino := range inos {
		var cur rpc.AttrResp
		if err := c.metaCall(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: ino}, &cur); err != nil {
			if rpc.ErrnoOf(err) == syscall.ENOENT {
				continue
			}
			return err
		}
		if cur.Attr.Atime >= atimes[i] {
			continue
		}
		req := &rpc.SetAttrReq{Hdr: c.hdr(), Ino: ino, Valid: rpc.SetAtime | rpc.SetCtime, Atime: atimes[i], Ctime: cur.Attr.Ctime}
		if err := c.metaCall(ctx, rpc.MSetAttr, req, &rpc.AttrResp{}); err != nil && rpc.ErrnoOf(err) != syscall.ENOENT {
			return err
		}
	}
	return nil
}
