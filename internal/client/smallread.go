package client

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Opening a small file for reading overlaps the open's attribute read
// with the data read. Close-to-open needs the open to ask the metadata
// service (a close on another mount that finished before the open began
// must be seen), so an open is one metadata round trip however recent
// the lookup was; but the lookup already told the file's layout and size.
// When a lookup answered them moments ago, Open starts reading the whole
// file from the stores at once, in parallel with its GetAttr, and hands
// the bytes to the handle's read-ahead window if the answer agrees (same
// size, mtime and layout as the lookup said before the read started, no
// write of this client since). The first READ is then answered from
// memory: open + read wait for max(metadata, storage) round trips instead
// of their sum. A disagreeing answer drops it. The read starts after the
// open began, which is fresh enough for this open, but not for the
// kernel's page cache: the bytes become its pages under the attributes of
// the open's answer, and later opens keep those pages while the
// attributes stay (FOPEN_KEEP_CACHE). So the answer must show that no
// write was committed since the lookup: a write that closed while the
// read was under way, with a value of the same length, would otherwise
// leave the older bytes cached under its newer mtime. A file opened and
// not read costs one small storage read.

// smallReadBytes is the largest file read at open.
const smallReadBytes = 64 << 10

// recentMax bounds the lookups remembered; beyond it, memory starts over.
const recentMax = 4096

// recentLookups remembers the layout and size of small regular files that
// lookups answered, for Open to start their read (take removes an entry:
// one open uses it).
type recentLookups struct {
	mu sync.Mutex
	m  map[uint64]recentLookup
}

type recentLookup struct {
	size   uint64
	mtime  int64
	layout layout.Layout
	at     time.Time
}

// put remembers a's layout and size if a is a small non-empty regular file.
func (r *recentLookups) put(a *rpc.Attr) {
	if a.Mode&syscall.S_IFMT != syscall.S_IFREG || a.Size == 0 || a.Size > smallReadBytes || len(a.Layout.Targets) == 0 || a.Inline {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) >= recentMax {
		r.m = make(map[uint64]recentLookup)
	}
	r.m[a.Ino] = recentLookup{size: a.Size, mtime: a.Mtime, layout: a.Layout, at: time.Now()}
}

func (r *recentLookups) take(ino uint64, ttl time.Duration) (recentLookup, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.m[ino]
	if !ok {
		return recentLookup{}, false
	}
	delete(r.m, ino)
	return l, time.Since(l.at) <= ttl
}

// openRead is a read started by Open before its attributes came back.
type openRead struct {
	c      *Client
	b      *raBlock
	mtime  int64 // the lookup's: no write committed since if the open's agrees
	layout layout.Layout
}

// startOpenRead starts reading ino whole if a lookup told its layout and
// size within the attribute timeout and the open is a buffered read-only
// one of a file this client does not hold open (nil otherwise).
func (c *Client) startOpenRead(ino uint64, flags int) *openRead {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_DIRECT != 0 || c.cfg.ReadAheadBytes == 0 {
		return nil
	}
	l, ok := c.looked.take(ino, c.cfg.DirAttrTTL)
	if !ok || c.openInode(ino) != nil {
		return nil
	}
	if !c.budget.tryAcquire(raBlockBytes, c.budget.max/4) { // as a read-ahead block
		return nil
	}
	n := int64(l.size)
	r := &openRead{c: c, b: &raBlock{n: n, buf: make([]byte, n), done: make(chan struct{}), refs: 1}, mtime: l.mtime, layout: l.layout}
	tmp := &inode{c: c, ino: ino, layout: l.layout} // readRange reads ino and layout only
	transport.Go(func() {
		ctx, cancel := withDeadline(transport.OnCaller(context.Background()), time.Now().Add(c.cfg.IOTimeout))
		r.b.err = c.readRange(ctx, tmp, r.b.buf, 0, true)
		cancel()
		c.m.bytesRA.Add(float64(n))
		close(r.b.done)
	})
	return r
}

// adopt gives the read to f's read-ahead window when f's attributes agree
// with the lookup's (size, mtime and layout, and no write, truncate or
// punch of this client since the inode was set up); otherwise, or when the
// open failed (f nil), the read is dropped.
func (r *openRead) adopt(f *File) {
	if f == nil { // the open failed
		go func() {
			<-r.b.done
			r.c.budget.release(raBlockBytes)
		}()
		return
	}
	in := f.in
	in.mu.Lock()
	gen := in.mu.gen
	ok := gen == 0 && in.mu.inline == nil && in.mu.size == uint64(r.b.n) && f.attr.Mtime == r.mtime && !in.mu.dirty && len(in.mu.inflight) == 0 && !in.hasPendingLocked() &&
		in.layout.StripeSize == r.layout.StripeSize && in.layout.StripeCount == r.layout.StripeCount &&
		slices.Equal(in.layout.Targets, r.layout.Targets)
	in.mu.Unlock()
	f.ra.mu.Lock()
	defer f.ra.mu.Unlock()
	if !ok {
		f.ra.unrefLocked(r.b)
		return
	}
	r.b.gen = gen
	f.ra.blocks = append(f.ra.blocks, r.b)
	f.c.m.op("open_read")
}
