package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A process stuck in uninterruptible sleep (state D) on the mount is the
// failure an HA file system exists to prevent: a job that cannot even be
// killed. After each trial, once the cluster is whole again, the threads
// of the chaos process (its load's workers issue the mount's system calls)
// and of its descendants are sampled; a thread found in state D in every
// sample over a window is reported stuck. A thread that waits briefly for
// I/O (an fsync) is in D in some samples, not in all.

// The sampling window after a trial: 9 samples 0.5 s apart (4 s, within
// the shortest load time between trials, --min-gap's default 3 s... 6 s:
// the next gap is shortened by the window).
const (
	stuckSamples = 9
	stuckEvery   = 500 * time.Millisecond
)

// dTask is a thread in state D: its process, thread id, command and where
// in the kernel it waits (wchan, when readable).
type dTask struct {
	pid, tid int
	comm     string
	state    string // D, or S waiting for a FUSE answer
	wchan    string
	switches uint64 // voluntary plus involuntary context switches so far
}

func (t dTask) String() string {
	s := fmt.Sprintf("pid %d thread %d (%s) in %s state", t.pid, t.tid, t.comm, t.state)
	if t.wchan != "" && t.wchan != "0" {
		s += " at " + t.wchan
	}
	return s
}

// statFields parses a /proc stat line: the command (between the first
// '(' and the last ')', which may itself hold spaces and parentheses) and
// the fields after it (state first, then ppid).
func statFields(line string) (comm string, rest []string, ok bool) {
	i, j := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if i < 0 || j < i {
		return "", nil, false
	}
	rest = strings.Fields(line[j+1:])
	return line[i+1 : j], rest, len(rest) >= 2
}

// descendants lists root and every process below it, from proc (a /proc).
func descendants(proc string, root int) ([]int, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		_, rest, ok := statFields(string(b))
		if !ok {
			continue
		}
		if ppid, err := strconv.Atoi(rest[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out, nil
}

// fuseWait reports whether wchan is where a thread waits for a FUSE
// daemon's answer.
// (fuse_dev_do_read, a FUSE daemon's wait for requests, is not: the
// mounts are children of the chaos process.) The kernel's other waits on
// FUSE (page writeback, locks) are uninterruptible: state D.
func fuseWait(wchan string) bool {
	return wchan == "request_wait_answer"
}

// dTasks lists the threads of pids in state D or waiting for a FUSE
// answer.
func dTasks(proc string, pids []int) []dTask {
	var out []dTask
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid), "task")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
			if err != nil {
				continue
			}
			comm, rest, ok := statFields(string(b))
			if !ok || rest[0] != "D" && rest[0] != "S" {
				continue
			}
			wb, _ := os.ReadFile(filepath.Join(dir, e.Name(), "wchan"))
			w := strings.TrimSpace(string(wb))
			if rest[0] == "S" && !fuseWait(w) {
				continue // idle: a futex, a poll
			}
			st, _ := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
			out = append(out, dTask{pid: pid, tid: tid, comm: comm, state: rest[0], wchan: w, switches: ctxtSwitches(string(st))})
		}
	}
	return out
}

// ctxtSwitches sums a /proc status file's context switch counts.
func ctxtSwitches(status string) uint64 {
	var n uint64
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
			x, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			n += x
		}
	}
	return n
}

// stillStuck keeps the tasks of stuck that are in now, in D state, with
// no context switch since.
func stillStuck(stuck, now []dTask) []dTask {
	return slices.DeleteFunc(stuck, func(t dTask) bool {
		return !slices.ContainsFunc(now, func(u dTask) bool { return u.pid == t.pid && u.tid == t.tid && u.switches == t.switches })
	})
}

// stuckTasks samples the threads of root and its descendants samples
// times, every apart, and returns those in state D in every sample with
// no context switch in between.
func stuckTasks(proc string, root, samples int, every time.Duration) ([]dTask, error) {
	var stuck []dTask
	for i := range samples {
		if i > 0 {
			time.Sleep(every)
		}
		pids, err := descendants(proc, root)
		if err != nil {
			return nil, err
		}
		now := dTasks(proc, pids)
		if i == 0 {
			stuck = now
		} else {
			stuck = stillStuck(stuck, now)
		}
		if len(stuck) == 0 {
			return nil, nil
		}
	}
	return stuck, nil
}
