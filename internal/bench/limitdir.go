package bench

import (
	"fmt"

	"github.com/stratafs/strata/internal/mountinfo"
)

// LimitDir chooses the directory whose raw limit fio measures for a run
// on path, and says what it is. fio on a Strata mount would measure Strata
// itself, not the disk under it: for a mount of a strata up on this machine
// it measures the up's data directory, which holds the targets; for
// another Strata mount (its targets on other machines) it measures the
// mount, and says so. explicit (--limit-dir) wins.
func LimitDir(path, explicit string) (dir, what string) {
	if explicit != "" {
		return explicit, "the directory given with --limit-dir"
	}
	m, ok, err := mountinfo.OnStrata(path)
	if err != nil || !ok {
		return path, "the benchmarked directory's own disk"
	}
	if r, ok := mountinfo.RecordFor(m.Point); ok && r.Data != "" {
		return r.Data, fmt.Sprintf("the disk under the Strata mount %s: the data directory of its strata up (pid %d), which holds the targets", m.Point, r.Pid)
	}
	return path, fmt.Sprintf("the Strata mount %s itself (its targets are not on this machine; pass --limit-dir DIR on a target's disk to measure the disk)", m.Point)
}
