package fuse

import "sync"

// inodeNotes remembers, per inode, what the adapter last told the kernel
// of a regular file: size and mtime (so that open can tell whether the
// kernel's page cache is still valid, close-to-open) and st_blocks when the
// space is known (so that a close whose size commit changed it can have the
// kernel drop its cached attributes: du right after cp sees the copy's
// space). Entries are small and go when the kernel forgets the inode.
//
// A sharded map of plain values rather than sync.Maps: every LOOKUP and
// GETATTR of a file writes its note, and a sync.Map's store of a new key
// boxes key and value (four allocations for the two notes per lookup of a
// small-file read).
type inodeNotes struct {
	shards [16]struct {
		sync.Mutex
		m map[uint64]inodeNote
	}
}

type inodeNote struct {
	size      uint64
	mtime     int64
	blocks    uint64
	hasAttr   bool // size and mtime were told
	hasBlocks bool
}

type reportedAttr struct {
	size  uint64
	mtime int64
}

func (n *inodeNotes) shard(ino uint64) *struct {
	sync.Mutex
	m map[uint64]inodeNote
} {
	return &n.shards[ino%uint64(len(n.shards))]
}

// tell records what fillAttr told the kernel: size and mtime, and blocks
// when known.
func (n *inodeNotes) tell(ino uint64, r reportedAttr, blocks uint64, blocksKnown bool) {
	s := n.shard(ino)
	s.Lock()
	e := s.m[ino]
	e.size, e.mtime, e.hasAttr = r.size, r.mtime, true
	if blocksKnown {
		e.blocks, e.hasBlocks = blocks, true
	}
	if s.m == nil {
		s.m = make(map[uint64]inodeNote)
	}
	s.m[ino] = e
	s.Unlock()
}

// report records size and mtime told to the kernel; it returns the ones
// told before, if any.
func (n *inodeNotes) report(ino uint64, r reportedAttr) (prev reportedAttr, had bool) {
	s := n.shard(ino)
	s.Lock()
	defer s.Unlock()
	e, ok := s.m[ino]
	if ok && e.hasAttr {
		prev, had = reportedAttr{e.size, e.mtime}, true
		if prev == r {
			return prev, had
		}
	}
	e.size, e.mtime, e.hasAttr = r.size, r.mtime, true
	if s.m == nil {
		s.m = make(map[uint64]inodeNote)
	}
	s.m[ino] = e
	return prev, had
}

// blocksChanged records blocks if the kernel was told other blocks of ino
// before, and reports whether it was.
func (n *inodeNotes) blocksChanged(ino, blocks uint64) bool {
	s := n.shard(ino)
	s.Lock()
	defer s.Unlock()
	e, ok := s.m[ino]
	if !ok || !e.hasBlocks || e.blocks == blocks {
		return false
	}
	e.blocks = blocks
	s.m[ino] = e
	return true
}

// forget drops ino's notes.
func (n *inodeNotes) forget(ino uint64) {
	s := n.shard(ino)
	s.Lock()
	delete(s.m, ino)
	s.Unlock()
}

// count returns how many inodes have size notes and block notes (tests).
func (n *inodeNotes) count() (attrs, blocks int) {
	for i := range n.shards {
		s := &n.shards[i]
		s.Lock()
		for _, e := range s.m {
			if e.hasAttr {
				attrs++
			}
			if e.hasBlocks {
				blocks++
			}
		}
		s.Unlock()
	}
	return attrs, blocks
}
