package peers

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Leftovers of a crashed run. Daemons inside our network namespaces are
// found through the namespaces (killNamespace); the ones that run in the
// host's namespace — `strata passthrough` and `strata up` — are found by
// their command lines, which name paths that only this package uses: the
// work directory's passthrough-src, passthrough-mnt, strata-data and
// strata-mnt. A process is a leftover only if one of its arguments is
// exactly one of those paths, so nothing else on the machine matches.

// hostDaemonPaths are the arguments that mark our host daemons.
func hostDaemonPaths(dir string) []string {
	return []string{
		filepath.Join(dir, "passthrough-src"), filepath.Join(dir, "passthrough-mnt"),
		filepath.Join(dir, "strata-data"), filepath.Join(dir, "strata-mnt"),
		filepath.Join(dir, "strata-meta3-data"), filepath.Join(dir, "strata-meta3-mnt"),
		filepath.Join(dir, "strata-ha-data"), filepath.Join(dir, "strata-ha-mnt"),
		filepath.Join(dir, "strata-mirror-data"), filepath.Join(dir, "strata-mirror-mnt"),
	}
}

// leftoverPIDs scans procRoot (/proc) for processes whose command line
// holds one of our paths, excluding self.
func leftoverPIDs(procRoot, dir string, self int) []int {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	marks := hostDaemonPaths(dir)
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if argvHasAny(bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0}), marks) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func argvHasAny(argv [][]byte, marks []string) bool {
	for _, a := range argv {
		for _, m := range marks {
			if string(a) == m {
				return true
			}
		}
	}
	return false
}

// stopLeftovers sends SIGTERM to our leftover host daemons (they unmount
// themselves), waits up to grace, then SIGKILLs the rest.
func stopLeftovers(dir string, grace time.Duration, logf func(string, ...any)) {
	pids := leftoverPIDs("/proc", dir, os.Getpid())
	if len(pids) == 0 {
		return
	}
	logf("cleanup: stopping leftover daemons %v of an earlier run", pids)
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && len(leftoverPIDs("/proc", dir, os.Getpid())) > 0 {
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range leftoverPIDs("/proc", dir, os.Getpid()) {
		logf("cleanup: killing %d", p)
		syscall.Kill(p, syscall.SIGKILL)
	}
}
