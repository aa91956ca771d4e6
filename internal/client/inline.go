package client

import (
	"context"

	"github.com/stratafs/strata/internal/rpc"
)

// Inline data (docs/design/0017): a small file this client creates under a
// create delegation, writes and closes before its create was sent, keeps
// its bytes with its inode. The close takes the bytes out of write-behind
// into the queued create (foldInline): no chunk file, no store call, and
// under the sync policy one metadata log sync for the file's creation,
// size and data. An open's GetAttr asks for the bytes (rpc.GetAttrData):
// a read is then answered from memory. The first write, punch or
// truncate-and-write of a handle holding inline data calls dropInline:
// while the create is still queued here the bytes go back into
// write-behind; otherwise the service moves them to the file's chunks
// (rpc.GetAttrWrite) before any byte of this client reaches a chunk, so
// writes never meet inline data at the service.

// foldInline hands the data of in — being closed, written only into
// write-behind since its create was answered here — to its still queued
// create, with its size and mtime. false: the create was sent already, or
// the file is larger than max or a stripe, or some of its bytes went to a
// store (then fold as usual).
func (d *delegations) foldInline(in *inode, max int) bool {
	if d == nil || max <= 0 || d.npend.Load() == 0 {
		return false
	}
	in.resize.Lock() // no write of the file under way: writes hold it shared
	defer in.resize.Unlock()
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.pending[in.ino]
	if q == nil || q.sent {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	size := in.mu.size
	if !in.mu.dirty || in.mu.touched || len(in.mu.inflight) > 0 || in.mu.err != nil ||
		size > uint64(max) || size > uint64(in.layout.StripeSize) {
		return false
	}
	data := make([]byte, size)
	copy(data, in.mu.inline)
	for s, w := range in.mu.pending {
		if w == nil {
			continue
		}
		if s != 0 || w.end() > int64(size) { // within one stripe every byte is slot 0's
			return false
		}
		copy(data[w.chunkOff:], w.buf)
	}
	for s, w := range in.mu.pending {
		if w == nil {
			continue
		}
		in.mu.pending[s] = nil
		if w.budgeted {
			in.c.budget.release(int64(len(w.buf)))
		}
		if w.pooled {
			putBuf(w.buf)
		}
	}
	q.bc.Written, q.bc.Size, q.bc.Mtime, q.bc.Alloc, q.bc.Inline = true, size, in.mu.mtime, nil, data
	in.mu.inline, in.mu.inlineCtime, in.mu.inlineStale = data, in.mu.mtime, false
	in.mu.dirty = false
	in.mu.gen++
	in.mu.sizeAt = in.c.sizeSeq.Add(1)
	in.mu.attr.Size, in.mu.attr.Mtime, in.mu.attr.Ctime = size, in.mu.mtime, in.mu.mtime
	in.c.m.op("create_inline")
	return true
}

// heldInline reports whether in's data is inline as this client knows it
// (held here, or to be fetched again).
func (in *inode) heldInline() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.mu.inline != nil || in.mu.inlineStale
}

// refetchInline fetches the inline bytes of in again after an answer
// showed they changed (inode.merge); a file no longer inline reads from
// its chunks from then on.
func (c *Client) refetchInline(ctx context.Context, in *inode) error {
	in.mu.Lock()
	stale := in.mu.inlineStale
	in.mu.Unlock()
	if !stale {
		return nil
	}
	var resp rpc.AttrResp
	since := c.sizeSeq.Load()
	if err := c.metaCall(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: in.ino, Flags: rpc.GetAttrData}, &resp); err != nil {
		return metaErr(c, "read inline data", err)
	}
	in.noteOpenInline(&resp.Attr, resp.Data)
	in.merge(&resp.Attr, since)
	return nil
}

// dropInline makes in an ordinary file before this client changes its
// bytes: data folded into a create still queued here goes back into
// write-behind (the create is sent as an empty file, and the next close
// commits the size); otherwise the service moves the data to the chunks.
func (c *Client) dropInline(ctx context.Context, in *inode) error {
	in.resize.Lock()
	defer in.resize.Unlock()
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	if d := c.deleg; d != nil {
		d.mu.Lock()
		q := d.pending[in.ino]
		if q != nil && !q.sent && q.bc.Inline != nil {
			in.mu.Lock()
			data := q.bc.Inline
			q.bc.Written, q.bc.Size, q.bc.Mtime, q.bc.Alloc, q.bc.Inline = false, 0, 0, nil, nil
			in.mu.inline = nil
			if len(data) > 0 {
				in.mu.pending[0] = &wbuf{slot: 0, chunkOff: 0, buf: data}
			}
			in.mu.dirty = true
			in.mu.gen++
			in.mu.Unlock()
			d.mu.Unlock()
			c.m.op("inline_unfolded")
			return nil
		}
		d.mu.Unlock()
	}
	if !in.heldInline() {
		return nil
	}
	c.deleg.before(ctx, in.ino) // a create on its way: answered first
	var resp rpc.AttrResp
	if err := c.metaCall(ctx, rpc.MGetAttr, &rpc.GetAttrReq{Ino: in.ino, Flags: rpc.GetAttrData | rpc.GetAttrWrite}, &resp); err != nil {
		return metaErr(c, "move inline data out", err)
	}
	in.mu.Lock()
	in.mu.inline, in.mu.inlineStale = nil, false
	in.mu.gen++
	in.mu.Unlock()
	return nil
}

// noteOpenInline records what an open's answer said of the file's data
// (a with data, asked with rpc.GetAttrData): kept inline, or not (any
// inline bytes held here from an earlier open are stale then).
func (in *inode) noteOpenInline(a *rpc.Attr, data []byte) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case a.Inline && data != nil:
		if in.mu.inline == nil || string(in.mu.inline) != string(data) {
			in.mu.gen++
		}
		in.mu.inline, in.mu.inlineCtime, in.mu.inlineStale = data, a.Ctime, false
	case in.mu.inline != nil || in.mu.inlineStale:
		in.mu.inline, in.mu.inlineStale = nil, false
		in.mu.gen++
	}
}

// cutInlineLocked applies a size change of this client, answered with
// ctime, to inline data.
func (in *inode) cutInlineLocked(size uint64, ctime int64) {
	if in.mu.inline == nil {
		return
	}
	if uint64(len(in.mu.inline)) > size {
		in.mu.inline = in.mu.inline[:size:size] // never written in place: sharing is safe
	}
	in.mu.inlineCtime = ctime
}

// maxInlineRefetch bounds the fetches of one read whose inline bytes keep
// changing under it.
const maxInlineRefetch = 10

// readInlineLocked answers a read of [off, off+len(p)) of an inline file
// (the caller cut p at the size): bytes past the data are zeros. false: in
// holds no inline data.
func (in *inode) readInlineLocked(p []byte, off int64) bool {
	data := in.mu.inline
	if data == nil {
		return false
	}
	k := 0
	if off < int64(len(data)) {
		k = copy(p, data[off:])
	}
	clear(p[k:])
	return true
}
