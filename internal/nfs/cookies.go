package nfs

import "sync"

// Readdir cookies. The metadata service pages a directory by name (the
// entries after a given name); NFS pages by a 64-bit cookie per entry. The
// gateway keeps the names of the pages it answered in a ring of
// cookieBatches pages (each of at most as many names as its READDIR's
// count could take: tens of megabytes at the most):
//
//	cookie = page id << 12 | (index in the page + 1)
//
// so a client resuming from any entry of a recent page resumes after that
// name. A cookie of a page the ring dropped, or from before the gateway's
// restart (the cookie verifier is the gateway's verifier), is
// NFS3ERR_BAD_COOKIE: the client starts the listing again. Pages hold at
// most maxDirEntries (< 4096) entries.
const (
	cookieBatches   = 4096
	cookieIndexBits = 12
)

type cookieTable struct {
	mu struct {
		sync.Mutex
		next  uint64       // the next page id (from 1)
		pages []cookiePage // ring, by id % len
	}
}

type cookiePage struct {
	id    uint64
	dir   uint64
	names []string
}

func newCookieTable(n int) *cookieTable {
	t := &cookieTable{}
	t.mu.next = 1
	t.mu.pages = make([]cookiePage, n)
	return t
}

// add records a page of dir's entries and returns their cookies.
func (t *cookieTable) add(dir uint64, names []string) []uint64 {
	cookies := make([]uint64, len(names))
	if len(names) == 0 {
		return cookies
	}
	t.mu.Lock()
	id := t.mu.next
	t.mu.next++
	t.mu.pages[id%uint64(len(t.mu.pages))] = cookiePage{id: id, dir: dir, names: names}
	t.mu.Unlock()
	for i := range cookies {
		cookies[i] = id<<cookieIndexBits | uint64(i+1)
	}
	return cookies
}

// name is the entry a cookie of dir stands for.
func (t *cookieTable) name(dir, cookie uint64) (string, bool) {
	id, idx := cookie>>cookieIndexBits, cookie&(1<<cookieIndexBits-1)
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &t.mu.pages[id%uint64(len(t.mu.pages))]
	if p.id != id || p.dir != dir || idx == 0 || int(idx) > len(p.names) {
		return "", false
	}
	return p.names[idx-1], true
}
