package meta

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// Inline data leaves its inode here (docs/design/0017). A file's data is
// kept with its inode only while nobody writes it: an open for writing
// (GetAttr with rpc.GetAttrWrite) first has the leader write the inline
// bytes to the file's chunks, synced, and then propose opUninline, which
// drops them from the inode if it still holds the same bytes (same length,
// same ctime: no truncate since). Only then is the open answered, so every
// write to the chunks comes after the bytes it may overwrite. Spills of one
// inode are serialised by the leader (spills.lock); two leaders' spills can
// only overlap across a leader change, and they write the same bytes.

// spillLocks serialises the spills of each inode on this leader.
type spillLocks struct {
	mu sync.Mutex
	m  map[uint64]*spillLock
}

type spillLock struct {
	mu   sync.Mutex
	refs int
}

func (l *spillLocks) lock(ino uint64) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[uint64]*spillLock)
	}
	x := l.m[ino]
	if x == nil {
		x = &spillLock{}
		l.m[ino] = x
	}
	x.refs++
	l.mu.Unlock()
	x.mu.Lock()
	return func() {
		x.mu.Unlock()
		l.mu.Lock()
		if x.refs--; x.refs == 0 {
			delete(l.m, ino)
		}
		l.mu.Unlock()
	}
}

// spillTries bounds the spills of one open that a concurrent truncate
// makes stale.
const spillTries = 5

// spill moves ino's inline data, if it has any, to its chunks.
func (s *Service) spill(ctx context.Context, ino uint64) error {
	unlock := s.spills.lock(ino)
	defer unlock()
	for try := 0; try < spillTries; try++ {
		in, err := s.readInode(ino)
		if err != nil {
			return err
		}
		if !in.IsInline() {
			return nil
		}
		data := append([]byte{}, in.Inline...)
		ctime := in.Ctime
		l := in.Layout
		l.Targets = append([]uint32{}, l.Targets...)
		alloc, err := s.writeInline(ctx, ino, l, data)
		if err != nil {
			return rpc.Errorf(syscall.EIO, "inode %d: moving its inline data to its targets: %v", ino, err)
		}
		res, err := s.propose(&command{Op: opUninline, Now: s.now(), Ino: ino, Ctime: ctime, Size: uint64(len(data)), Alloc: alloc})
		if err != nil {
			return err
		}
		err = res.err()
		if err == nil {
			s.m.spills.Inc()
			return nil
		}
		if rpc.ErrnoOf(err) != syscall.EAGAIN {
			return err
		}
		// Truncated while the bytes were written: again, with what the
		// inode holds now (the chunks' extra bytes are overwritten or cut
		// by the truncate below).
	}
	return rpc.Errorf(syscall.EAGAIN, "inode %d: its inline data changed under %d attempts to move it to its targets", ino, spillTries)
}

// writeInline makes the chunks of file ino (layout l) hold data from
// offset 0: each chunk is first cut to its part of data (a chunk an
// earlier attempt left, before a truncate made the data shorter, loses its
// tail), then written, synced. It returns the chunks' space.
func (s *Service) writeInline(ctx context.Context, ino uint64, l layout.Layout, data []byte) ([]slotAlloc, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var alloc []slotAlloc
	for _, e := range l.Split(0, int64(len(data))) {
		tid := l.Targets[e.Slot]
		chunk := rpc.ChunkID{Target: tid, Ino: ino}
		var addr string
		var err error
		if layout.IsGroup(tid) {
			addr, chunk.Epoch, err = s.groupPrimaryAddr(tid &^ layout.GroupBit)
		} else {
			addr, err = s.targetAddr(tid)
		}
		if err == nil && addr == "" {
			err = fmt.Errorf("target %d is not registered", tid)
		}
		if err != nil {
			return nil, err
		}
		cut := &rpc.TruncateReq{Chunk: chunk, Size: uint64(l.ChunkSize(int64(len(data)), e.Slot))}
		if err := s.peer(addr).Call(ctx, rpc.STruncate, cut, nil); err != nil {
			return nil, fmt.Errorf("cut the chunk on target %d (%s): %w", tid, addr, err)
		}
		var resp rpc.WriteResp
		req := &rpc.WriteReq{Chunk: chunk, Off: uint64(e.ChunkOff), Sync: true, Data: data[e.FileOff : e.FileOff+e.Len]}
		if err := s.peer(addr).Call(ctx, rpc.SWrite, req, &resp); err != nil {
			return nil, fmt.Errorf("write to target %d (%s): %w", tid, addr, err)
		}
		if resp.HasAlloc {
			alloc = append(alloc, slotAlloc{Slot: uint32(e.Slot), Bytes: resp.Alloc})
		}
	}
	return alloc, nil
}

// uninline applies opUninline: the inode's inline data, if it is still the
// bytes the leader wrote to the chunks (same length and ctime), is dropped;
// EAGAIN if it changed meanwhile.
func (x *opCtx) uninline(c *command) (*answer, error) {
	in, err := x.inode(c.Ino)
	if err != nil {
		return nil, err
	}
	if !in.IsInline() {
		return x.attrBody(c.Ino, in)
	}
	if uint64(len(in.Inline)) != c.Size || in.Ctime != c.Ctime {
		return nil, rpc.Errorf(syscall.EAGAIN, "inode %d: inline data changed while it was moved", c.Ino)
	}
	in.Inline = nil
	in.Alloc = withAllocs(nil, len(in.Layout.Targets), c.Alloc)
	x.mark(c.Ino)
	return x.attrBody(c.Ino, in)
}

// getAttrFlags answers GetAttr's flags for an inline file: with GetAttrWrite
// its data is moved out first, with GetAttrData its bytes are answered.
func (s *Service) getAttrFlags(ctx context.Context, r *rpc.GetAttrReq) (rpc.Message, error) {
	if r.Flags&rpc.GetAttrWrite != 0 {
		in, err := s.readInode(r.Ino)
		if err != nil {
			return nil, err
		}
		if in.IsInline() {
			if err := s.spill(ctx, r.Ino); err != nil {
				return nil, err
			}
		}
	}
	in, err := s.readInode(r.Ino)
	if err != nil {
		return nil, err
	}
	resp := &rpc.AttrResp{Attr: toAttr(r.Ino, in)}
	if r.Flags&rpc.GetAttrData != 0 && in.IsInline() {
		resp.Data = append([]byte{}, in.Inline...)
	}
	return resp, nil
}
