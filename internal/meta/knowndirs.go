package meta

import (
	"sync"
	"sync/atomic"
)

// knownDirs remembers inode numbers seen to be directories. An inode's type
// never changes and its number is never given to another inode (NextIno
// only grows), so an entry never goes stale; a removed directory stays in
// the set, which is harmless: nothing can be found in it. The set is
// bounded: when full it starts again empty.
type knownDirs struct {
	m atomic.Pointer[sync.Map]
	n atomic.Int64
}

// knownDirsMax bounds the set (a few MiB).
const knownDirsMax = 1 << 16

func (k *knownDirs) has(ino uint64) bool {
	m := k.m.Load()
	if m == nil {
		return false
	}
	_, ok := m.Load(ino)
	return ok
}

func (k *knownDirs) add(ino uint64) {
	m := k.m.Load()
	if m == nil || k.n.Load() >= knownDirsMax {
		m = new(sync.Map)
		k.m.Store(m)
		k.n.Store(0)
	}
	if _, loaded := m.LoadOrStore(ino, struct{}{}); !loaded {
		k.n.Add(1)
	}
}
