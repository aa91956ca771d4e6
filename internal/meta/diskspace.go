package meta

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rpc"
)

// DefaultDiskReserve is the free space the metadata disk keeps: the store
// needs room to flush its memtables and compact, and without it writes
// stall (they would hang, not fail).
const DefaultDiskReserve = 256 << 20

// diskSpace watches the free space of the data directory's file system.
type diskSpace struct {
	dir     string
	reserve atomic.Uint64
	free    atomic.Uint64 // bytes available to us at the last look
	at      atomic.Int64  // unix ns of the last look (0: none yet)
}

func newDiskSpace(dir string, reserve int64) *diskSpace {
	switch {
	case reserve == 0:
		reserve = DefaultDiskReserve
	case reserve < 0:
		reserve = 0
	}
	d := &diskSpace{dir: dir}
	d.reserve.Store(uint64(reserve))
	return d
}

// refresh reads the free space, at most every diskCheckEvery.
func (d *diskSpace) refresh(now time.Time) {
	if last := d.at.Load(); last != 0 && now.Sub(time.Unix(0, last)) < diskCheckEvery {
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.dir, &st); err != nil {
		return // keep the last figure; the store reports its own failures
	}
	d.free.Store(st.Bavail * uint64(st.Bsize))
	d.at.Store(now.UnixNano())
}

// diskCheckEvery bounds how often a mutation looks at the free space.
const diskCheckEvery = time.Second

// low describes the shortage, or is "" while above the reserve.
func (d *diskSpace) low(now time.Time) string {
	reserve := d.reserve.Load()
	if reserve == 0 {
		return ""
	}
	d.refresh(now)
	if d.at.Load() == 0 {
		return ""
	}
	if free := d.free.Load(); free < reserve {
		return fmt.Sprintf("metadata disk of %s has %d MiB free, below its reserve of %d MiB", d.dir, free>>20, reserve>>20)
	}
	return ""
}

// grows reports whether an operation adds to the namespace's size (those
// are refused on a full metadata disk; removals, which free space, and
// the service's own bookkeeping are not).
func (c *command) grows() bool {
	switch c.Op {
	case opCreate, opTmpfile, opLink, opRename, opSetXattr, opSetDirLayout, opCreateBatch, opReserveInos:
		return true
	}
	return false
}

// checkDisk refuses a growing command while the metadata disk is below its
// reserve, with ENOSPC saying so.
func (s *Service) checkDisk(c *command) error {
	if !c.grows() {
		return nil
	}
	if why := s.disk.low(time.Now()); why != "" {
		return rpc.Errorf(syscall.ENOSPC, "%s: free space there (removing files frees metadata too)", why)
	}
	return nil
}
