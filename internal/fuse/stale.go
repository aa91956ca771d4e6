package fuse

import (
	"sync"
	"time"
)

// staleRetry is how long after an OPEN answered ESTALE the same caller's
// next one counts as the kernel's retry (open(2) retries at once).
const staleRetry = time.Second

// staleOpens remembers, per calling thread, when an OPEN of a removed
// inode was last answered ESTALE (fileops.go Open).
type staleOpens struct {
	mu sync.Mutex
	m  map[uint32]time.Time
}

// staleAgain reports whether pid's previous OPEN was answered ESTALE
// within staleRetry (its retry now: answer ENOENT), else notes this one.
func (fs *fileSystem) staleAgain(pid uint32) bool {
	s := &fs.stale
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.m[pid]; ok && now.Sub(at) < staleRetry {
		delete(s.m, pid)
		return true
	}
	if s.m == nil || len(s.m) >= 1024 { // callers whose retry found no name
		for p, at := range s.m {
			if now.Sub(at) >= staleRetry {
				delete(s.m, p)
			}
		}
		if s.m == nil {
			s.m = map[uint32]time.Time{}
		}
	}
	s.m[pid] = now
	return false
}
