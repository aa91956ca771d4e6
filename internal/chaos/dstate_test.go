package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProc writes a /proc-like tree: each task as (pid, tid, ppid, state,
// comm, wchan).
func fakeProc(t *testing.T, tasks ...[6]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, x := range tasks {
		pid, tid, ppid, state, comm, wchan := x[0], x[1], x[2], x[3], x[4], x[5]
		line := fmt.Sprintf("%s (%s) %s %s 1 1 0 -1\n", tid, comm, state, ppid)
		for _, p := range []string{filepath.Join(dir, pid), filepath.Join(dir, pid, "task", tid)} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if pid == tid {
			if err := os.WriteFile(filepath.Join(dir, pid, "stat"), []byte(line), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "task", tid, "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "task", tid, "wchan"), []byte(wchan), 0o644); err != nil {
			t.Fatal(err)
		}
		status := "Name:\tx\nvoluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t2\n"
		if err := os.WriteFile(filepath.Join(dir, pid, "task", tid, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestStuckTasks: the threads of the root and its descendants in D state
// or waiting for a FUSE answer are found (a command with spaces and
// parentheses parsed right); other processes', running and idle threads
// (a FUSE daemon waiting for requests) are not.
func TestStuckTasks(t *testing.T) {
	proc := fakeProc(t,
		[6]string{"100", "100", "1", "S", "strata chaos", "futex_wait_queue"},
		[6]string{"100", "101", "1", "D", "strata chaos", "fuse_wait_on_page_writeback"},
		[6]string{"200", "200", "100", "R", "lock (helper) x", "0"},
		[6]string{"200", "201", "100", "D", "lock (helper) x", "inode_lock"},
		[6]string{"200", "202", "100", "S", "lock (helper) x", "request_wait_answer"},
		[6]string{"300", "300", "200", "D", "grandchild", "0"},
		[6]string{"400", "400", "1", "D", "unrelated", "0"},
		[6]string{"500", "500", "100", "S", "strata mount", "fuse_dev_do_read"},
	)
	got, err := stuckTasks(proc, 100, 3, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range got {
		names = append(names, d.String())
	}
	want := []string{
		"pid 100 thread 101 (strata chaos) in D state at fuse_wait_on_page_writeback",
		"pid 200 thread 201 (lock (helper) x) in D state at inode_lock",
		"pid 200 thread 202 (lock (helper) x) in S state at request_wait_answer",
		"pid 300 thread 300 (grandchild) in D state",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stuck tasks:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
}

// TestStillStuck: a thread that switched between two samples (it went
// from one FUSE request to the next) is not stuck, nor one that left D
// state; one that stayed in the same wait is.
func TestStillStuck(t *testing.T) {
	first := []dTask{{pid: 1, tid: 1, switches: 10}, {pid: 1, tid: 2, switches: 10}, {pid: 1, tid: 3, switches: 7}}
	now := []dTask{{pid: 1, tid: 1, switches: 10}, {pid: 1, tid: 2, switches: 11}}
	got := stillStuck(first, now)
	if len(got) != 1 || got[0].tid != 1 {
		t.Fatalf("still stuck: %+v, want thread 1 only", got)
	}
	if n := ctxtSwitches("Name:\tx\nvoluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t2\n"); n != 42 {
		t.Fatalf("context switches %d, want 42", n)
	}
}

// TestStuckTasksSelf: this test process, sampled for real, has no thread
// stuck in D state.
func TestStuckTasksSelf(t *testing.T) {
	got, err := stuckTasks("/proc", os.Getpid(), 3, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("stuck: %v", got)
	}
}
