package store

import (
	"sync"
	"sync/atomic"
)

// Sums of hot sidecar chunks kept in memory.
//
// A read of a chunk with a sidecar costs two preads: the data, then the
// blocks' stored sums from the sidecar (4 bytes per 4 KiB block). For 4 KiB
// random reads the second one is as many system calls as the first. So a
// handle keeps the sidecar's sums of the 1 MiB regions it recently read, a
// page of 1 KiB per region, and a read verifies its data against the page
// instead of reading the sidecar again. The data itself is always read from
// the data file and always verified: a block corrupted on disk (or changed
// behind the server) still answers EIO; only a damaged sidecar of a block
// whose sums are in memory goes unnoticed by reads until the page leaves
// memory (a scrub reads the sidecar, never the pages).
//
// Invariant: a page holds the sums of its region's blocks as the sidecar
// holds them (through the page cache), zeros past the sidecar's end. It is
// filled only by a reader that holds its region's stripe lock (shared) and
// read the sidecar under it; every change of a stored sum of a sidecar
// chunk (writeSums, zeroSumRange, truncateSums) holds the changed blocks'
// region locks exclusively and drops their pages before it unlocks. So no
// page read before a change survives it, and no reader fills a page while
// a change of its region is under way. Inline chunks (inlinesums.go) keep
// their sums in memory already and have no pages.
//
// Memory: at most sumPagesPerChunk pages a handle (1 GiB of data) and
// sumCacheBytes a process; pages go with their handle (closeFiles), and a
// fill that finds the budget spent reads into the caller's buffer only.

const (
	sumPageBlocks    = (1 << regionShift) >> blockShift // blocks of a region: 256
	sumPageBytes     = 4 * sumPageBlocks                // 1 KiB
	sumPagesPerChunk = 1024
	sumCacheBytes    = 64 << 20
)

// sumCacheUsed counts the bytes of pages of every open handle of the
// process.
var sumCacheUsed atomic.Int64

type sumPage [sumPageBytes]byte

// sumPages is a handle's cache of sidecar sums, by region.
type sumPages struct {
	mu sync.Mutex
	m  map[int64]*sumPage
}

func (p *sumPages) get(region int64) *sumPage {
	p.mu.Lock()
	pg := p.m[region]
	p.mu.Unlock()
	return pg
}

// put keeps pg as region's page if the budgets allow.
func (p *sumPages) put(region int64, pg *sumPage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.m[region]; ok {
		return // another reader filled it meanwhile (the same bytes)
	}
	if len(p.m) >= sumPagesPerChunk {
		for r := range p.m { // an arbitrary one makes room
			delete(p.m, r)
			break
		}
	} else if sumCacheUsed.Add(sumPageBytes) > sumCacheBytes {
		sumCacheUsed.Add(-sumPageBytes)
		return
	}
	if p.m == nil {
		p.m = make(map[int64]*sumPage)
	}
	p.m[region] = pg
}

// drop forgets the pages of the regions of blocks [b0, b1); b1 < 0: to the
// end.
func (p *sumPages) drop(b0, b1 int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) == 0 {
		return
	}
	r0 := b0 / sumPageBlocks
	if b1 >= 0 && (b1-1)/sumPageBlocks-r0 < int64(len(p.m)) {
		for r := r0; r <= (b1-1)/sumPageBlocks; r++ {
			if _, ok := p.m[r]; ok {
				delete(p.m, r)
				sumCacheUsed.Add(-sumPageBytes)
			}
		}
		return
	}
	for r := range p.m {
		if r >= r0 && (b1 < 0 || r <= (b1-1)/sumPageBlocks) {
			delete(p.m, r)
			sumCacheUsed.Add(-sumPageBytes)
		}
	}
}

// dropAll forgets every page (the handle closes).
func (p *sumPages) dropAll() {
	p.mu.Lock()
	sumCacheUsed.Add(-int64(len(p.m)) * sumPageBytes)
	p.m = nil
	p.mu.Unlock()
}

// readSumsCached is readSums for a reader that holds the region locks of
// blocks [b0, b0+len(dst)/4) (shared or exclusive): a sidecar chunk's sums
// come from the handle's pages, which a miss fills from the sidecar.
func (c *chunk) readSumsCached(dst []byte, b0 int64) (int, error) {
	if c.inl.Load() != nil {
		return c.readSums(dst, b0)
	}
	b1 := b0 + int64(len(dst))/4
	for b := b0; b < b1; {
		r := b / sumPageBlocks
		i := b - r*sumPageBlocks
		n := min(b1-b, sumPageBlocks-i)
		pg := c.pages.get(r)
		if pg == nil {
			pg = new(sumPage)
			k, err := preadFull(c.sumFd, pg[:], sumOff(r*sumPageBlocks))
			if err != nil {
				return 0, err
			}
			clear(pg[k:])
			c.pages.put(r, pg)
		}
		copy(dst[4*(b-b0):], pg[4*i:4*(i+n)])
		b += n
	}
	return len(dst), nil
}
