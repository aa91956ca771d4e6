package client

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/transport"
)

// raBlockBytes is the unit of read-ahead: aligned 1 MiB pieces of the file.
const raBlockBytes = 1 << 20

// raBlock is one prefetched piece of a file.
type raBlock struct {
	off  int64
	n    int64
	buf  []byte
	gen  uint64        // inode generation when the prefetch started
	done chan struct{} // closed when buf/err are valid
	err  error
	refs int // list + readers; guarded by readahead.mu
}

// readahead detects a sequential reader of one handle and keeps the next
// ReadAheadBytes of the file prefetched, in parallel over the stripes, in
// a bounded window of raBlocks. Any write, truncate or punch of the inode
// through this client bumps the inode generation, which makes every
// prefetched block stale; blocks overlapping buffered writes are never
// prefetched.
type readahead struct {
	f  *File
	mu sync.Mutex
	// next is the offset after the last read; seq counts reads in a row
	// that continued (near) it. blocks is sorted by offset.
	next   int64
	seq    int
	blocks []*raBlock
}

func (ra *readahead) init(f *File) { ra.f = f }

// read fills p from offset off (the caller clamped it to size) using the
// window, and moves the window. With zeroCopy, when window blocks cover
// the range, it answers them (referenced, in ReadData.held) instead of
// copying them into p; otherwise it returns a ReadData without held.
func (ra *readahead) read(ctx context.Context, p []byte, off, size int64, gen uint64, zeroCopy bool) (ReadData, error) {
	c := ra.f.c
	end := off + int64(len(p))
	ra.mu.Lock()
	near := off >= ra.next-2*raBlockBytes && off <= ra.next+c.cfg.ReadAheadBytes
	if near {
		ra.seq++
	} else {
		ra.seq = 0
	}
	if end > ra.next || !near {
		ra.next = end
	}
	// Evict stale blocks and blocks well behind the reader.
	keep := ra.blocks[:0]
	for _, b := range ra.blocks {
		if b.gen != gen || b.off+b.n <= off-raBlockBytes || !near {
			ra.unrefLocked(b)
			continue
		}
		keep = append(keep, b)
	}
	clear(ra.blocks[len(keep):])
	ra.blocks = keep
	// Blocks covering [off, end), if they cover it completely.
	var use []*raBlock
	pos := off
	for _, b := range ra.blocks {
		if b.off <= pos && pos < b.off+b.n {
			use = append(use, b)
			pos = b.off + b.n
			if pos >= end {
				break
			}
		}
	}
	if pos < end {
		use = nil
	}
	for _, b := range use {
		b.refs++
	}
	if ra.seq >= 1 || off == 0 {
		ra.prefetchLocked(end, size, gen)
	}
	ra.mu.Unlock()

	if use != nil {
		ok := true
		var bufs [][]byte
		if zeroCopy {
			bufs = make([][]byte, 0, len(use))
		}
		for _, b := range use {
			done, err := c.waitBlock(ctx, b)
			if err != nil {
				ra.mu.Lock()
				for _, b := range use {
					ra.unrefLocked(b)
				}
				ra.mu.Unlock()
				return ReadData{}, err
			}
			if !done || b.err != nil {
				ok = false
				break
			}
			lo := max(off, b.off)
			hi := min(end, b.off+b.n)
			if zeroCopy {
				bufs = append(bufs, b.buf[lo-b.off:hi-b.off])
			} else {
				copy(p[lo-off:hi-off], b.buf[lo-b.off:hi-b.off])
			}
		}
		if ok && zeroCopy {
			c.m.raHits.Inc()
			return ReadData{Bufs: bufs, ra: ra, held: use}, nil // Release unrefs
		}
		ra.mu.Lock()
		for _, b := range use {
			ra.unrefLocked(b)
		}
		ra.mu.Unlock()
		if ok {
			c.m.raHits.Inc()
			return ReadData{}, nil
		}
	}
	return ReadData{}, c.readRange(ctx, ra.f.in, p, off, false)
}

// prefetchLocked starts blocks so that [from, from+ReadAheadBytes) (up to
// size) is covered, as far as the memory budget allows. Nothing when from
// is at the end: the first block starts at a block boundary at or below
// from, so a read that reached the end of a file smaller than a block
// would fetch again the bytes it is reading (a second storage read per
// small file).
func (ra *readahead) prefetchLocked(from, size int64, gen uint64) {
	if from >= size {
		return
	}
	c := ra.f.c
	in := ra.f.in
	limit := min(from+c.cfg.ReadAheadBytes, size)
	start := from / raBlockBytes * raBlockBytes
	if n := len(ra.blocks); n > 0 {
		if last := ra.blocks[n-1]; last.off+last.n > start {
			start = last.off + last.n
		}
	}
	for off := start; off < limit; off += raBlockBytes {
		n := min(int64(raBlockBytes), size-off)
		if !c.budget.tryAcquire(raBlockBytes, c.budget.max/4) {
			return
		}
		in.mu.Lock()
		clean := in.mu.gen == gen && len(in.mu.inflight) == 0 && !in.hasPendingLocked()
		in.mu.Unlock()
		if !clean {
			c.budget.release(raBlockBytes)
			return
		}
		b := &raBlock{off: off, n: n, buf: getBuf()[:n], gen: gen, done: make(chan struct{}), refs: 1}
		ra.blocks = append(ra.blocks, b)
		transport.Go(func() {
			ctx, cancel := context.WithTimeout(transport.OnCaller(context.Background()), c.cfg.IOTimeout)
			b.err = c.readRange(ctx, in, b.buf, b.off, true)
			cancel()
			c.m.bytesRA.Add(float64(b.n))
			close(b.done)
		})
	}
}

// waitBlock waits until b's read finished, for ctx and at most IOTimeout:
// the read runs an in-process store's handler on its own goroutine
// (transport.OnCaller), which a stuck disk would hold, so the bound of the
// wait is the reader's. done is false when ctx ended first; a read that
// did not finish in time is EIO, as a store call that timed out.
func (c *Client) waitBlock(ctx context.Context, b *raBlock) (done bool, err error) {
	select {
	case <-b.done:
		return true, nil
	default:
	}
	t := time.NewTimer(c.cfg.IOTimeout)
	defer t.Stop()
	select {
	case <-b.done:
		return true, nil
	case <-ctx.Done():
		return false, nil
	case <-t.C:
		return false, fmt.Errorf("read-ahead of %d bytes at %d not answered within %v: %w", b.n, b.off, c.cfg.IOTimeout, syscall.EIO)
	}
}

// unrefLocked drops one reference; the last one frees the block once its
// read has finished.
func (ra *readahead) unrefLocked(b *raBlock) {
	b.refs--
	if b.refs > 0 {
		return
	}
	c := ra.f.c
	go func() {
		<-b.done
		if b.err == nil {
			putBuf(b.buf)
		} // else a store may still be reading into it (Direct): the GC takes it
		c.budget.release(raBlockBytes)
	}()
}

// drop frees the whole window (on release).
func (ra *readahead) drop() {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for _, b := range ra.blocks {
		ra.unrefLocked(b)
	}
	ra.blocks = nil
}
