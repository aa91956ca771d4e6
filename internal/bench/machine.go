package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/mountinfo"
)

// Machine describes where a run happened; every result file carries it.
type Machine struct {
	Hostname    string `json:"hostname"`
	Cores       int    `json:"cores"`
	MemoryBytes int64  `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"go_version"`
	Date        string `json:"date"` // RFC 3339, UTC
	// FSType and Path of the benchmarked path (peer runs record them per result).
	Path   string `json:"path,omitempty"`
	FSType string `json:"fstype,omitempty"`
	// Root says whether the harness ran as root; CachesDropped whether the
	// page cache was dropped between phases (only root can).
	Root          bool `json:"root"`
	CachesDropped bool `json:"caches_dropped"`
}

// Limit is the raw limit of the backing storage, measured with fio.
type Limit struct {
	Tool      string `json:"tool"` // "fio-3.33"
	Directory string `json:"directory"`
	// Measured says what Directory is: the benchmarked path's disk, the
	// disk under a Strata mount, or the mount itself.
	Measured      string  `json:"measured,omitempty"`
	SeqWriteMiBps float64 `json:"seq_write_mib_s"`
	SeqReadMiBps  float64 `json:"seq_read_mib_s"`
	RandWriteIOPS float64 `json:"rand_write_iops"`
	RandReadIOPS  float64 `json:"rand_read_iops"`
	// Pattern describes the fio jobs, e.g. "4 jobs x 256M, bs=1M, psync, end_fsync".
	Pattern string   `json:"pattern"`
	Notes   []string `json:"notes,omitempty"`
}

// CurrentMachine collects the machine facts for path.
func CurrentMachine(path string) Machine {
	m := Machine{
		Cores:     runtime.NumCPU(),
		GoVersion: runtime.Version(),
		Date:      time.Now().UTC().Format(time.RFC3339),
		Path:      path,
		FSType:    FSType(path),
		Root:      os.Geteuid() == 0,
	}
	m.Hostname, _ = os.Hostname()
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		m.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	return m
}

// FSType returns the file system type of the mount holding path, as
// /proc/self/mountinfo names it ("ext4", "fuse.strata", "fuse.glusterfs"),
// or "" when unknown.
func FSType(path string) string {
	mp := mountOf(path)
	if mp == nil {
		return ""
	}
	return mp.fstype
}

// OnStrata reports whether path lives on a Strata FUSE mount.
func OnStrata(path string) bool {
	t := FSType(path)
	return t == "fuse.strata" || t == "strata"
}

type mountInfo struct {
	point  string
	fstype string
	source string
}

// mountOf finds the longest mount point that is a prefix of path.
func mountOf(path string) *mountInfo {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	ms, err := mountinfo.Read()
	if err != nil {
		return nil
	}
	var best *mountInfo
	for _, m := range ms {
		if !isUnder(abs, m.Point) {
			continue
		}
		if best == nil || len(m.Point) >= len(best.point) {
			best = &mountInfo{point: m.Point, fstype: m.FSType, source: m.Source}
		}
	}
	return best
}

func isUnder(path, dir string) bool {
	if dir == "/" {
		return true
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}
