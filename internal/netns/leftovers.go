package netns

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// OwnedPrefix is the namespace prefix of a Net owned by process pid under
// base: base+pid+"-". Leftovers finds the Nets of dead owners by it.
func OwnedPrefix(base string, pid int) string { return fmt.Sprintf("%s%d-", base, pid) }

// Leftovers lists the namespaces named OwnedPrefix(base, pid)+… whose
// owner pid no longer runs: what a run that died without Close left.
// (A PID reused by another process hides its leftovers until that one
// ends; they are never taken for someone else's.)
func Leftovers(base string) []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), base)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
			continue // the owner runs
		}
		out = append(out, e.Name())
	}
	return out
}

// PIDs lists the processes running in namespace ns (ip netns pids).
func PIDs(ns string) []int {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil && p != os.Getpid() {
			pids = append(pids, p)
		}
	}
	return pids
}

// RemoveLeftovers removes what Leftovers(base) lists: it stops the
// processes in each namespace (SIGCONT and SIGTERM, then SIGKILL after
// grace; nothing else runs in a namespace a Net made), calls before with
// each PID first (nil: not called), then deletes the namespace. It
// returns the namespaces removed and the first error.
func RemoveLeftovers(base string, grace time.Duration, before func(pid int)) ([]string, error) {
	var removed []string
	var first error
	for _, ns := range Leftovers(base) {
		pids := PIDs(ns)
		for _, p := range pids {
			if before != nil {
				before(p)
			}
			syscall.Kill(p, syscall.SIGCONT)
			syscall.Kill(p, syscall.SIGTERM)
		}
		deadline := time.Now().Add(grace)
		for len(PIDs(ns)) > 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		for _, p := range PIDs(ns) {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if err := ip("netns", "del", ns); err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		removed = append(removed, ns)
	}
	return removed, first
}
