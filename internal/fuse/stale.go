package fuse

import (
	"sync"
	"time"
)

// staleRetry is how long after an OPEN answered ESTALE the same caller's
// next stale one of the same inode counts as the kernel's retry (open(2)
// retries at once); staleRetryOther the same for another inode (the
// retry's lookup found the name behind another inode, removed in turn).
// The second is short: a thread whose retry found no name (which sends no
// second OPEN) must not have its next stale open answered ENOENT.
const (
	staleRetry      = time.Second
	staleRetryOther = 50 * time.Millisecond
)

// staleOpens remembers, per calling thread, which removed inode an OPEN
// was last answered ESTALE for, and when (fileops.go Open).
type staleOpens struct {
	mu sync.Mutex
	m  map[uint32]staleOpen
}

type staleOpen struct {
	ino uint64
	at  time.Time
}

// staleAgain reports whether pid's previous OPEN was answered ESTALE
// within staleRetry (of ino) or staleRetryOther (of another inode): the
// kernel's retry, whose lookup found the name still behind the removed
// inode (answered before the removal) or behind another one removed in
// turn, is answered ENOENT. Else it notes this one.
func (fs *fileSystem) staleAgain(pid uint32, ino uint64) bool {
	s := &fs.stale
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.m[pid]; ok && (o.ino == ino && now.Sub(o.at) < staleRetry || now.Sub(o.at) < staleRetryOther) {
		delete(s.m, pid)
		return true
	}
	if s.m == nil || len(s.m) >= 1024 { // callers whose retry found no name
		for p, o := range s.m {
			if now.Sub(o.at) >= staleRetry {
				delete(s.m, p)
			}
		}
		if s.m == nil {
			s.m = map[uint32]staleOpen{}
		}
	}
	s.m[pid] = staleOpen{ino: ino, at: now}
	return false
}
