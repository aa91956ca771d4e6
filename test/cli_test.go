package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/testutil"
)

// run runs the strata binary in dir and returns its combined output and
// exit status.
func run(t *testing.T, bin, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "STRATA_META=", "STRATA_KEY_FILE=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("strata %v: %v", args, err)
		}
		return string(out), ee.ExitCode()
	}
	return string(out), 0
}

// TestStatusFindsTheClusterWithoutFlags: strata status works from inside
// the mount and from any other directory while one strata up runs; the
// mount's source names the metadata address; a clean stop says so last.
func TestStatusFindsTheClusterWithoutFlags(t *testing.T) {
	u := newUpRun(t)
	sub := filepath.Join(u.mnt, "deep", "er")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{sub, t.TempDir(), "/"} {
		out, code := run(t, u.bin, dir, "status")
		if code != 0 || !strings.Contains(out, "health ok") {
			t.Fatalf("strata status in %s: exit %d\n%s", dir, code, out)
		}
	}
	out, code := run(t, u.bin, sub, "status", "--json")
	var st struct {
		Meta struct {
			Leader string `json:"leader"`
			Term   uint64 `json:"term"`
			Voters []struct {
				Address, State string
			} `json:"voters"`
		} `json:"meta"`
		Capacity struct {
			SizeBytes   uint64  `json:"size_bytes"`
			AvailBytes  uint64  `json:"avail_bytes"`
			UsedPercent float64 `json:"used_percent"`
		} `json:"capacity"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Meta.Leader == "" || st.Meta.Term == 0 || len(st.Meta.Voters) != 1 || st.Capacity.SizeBytes == 0 {
		t.Fatalf("strata status --json: exit %d, %v: %+v\n%s", code, err, st, out)
	}
	// The capacity is df's on the mount (free space moves: within a few points).
	var fs syscall.Statfs_t
	if err := syscall.Statfs(u.mnt, &fs); err != nil {
		t.Fatal(err)
	}
	used, avail := float64(fs.Blocks-fs.Bfree), float64(fs.Bavail)
	if df := 100 * used / (used + avail); st.Capacity.UsedPercent < df-3 || st.Capacity.UsedPercent > df+3 {
		t.Fatalf("strata status says %.1f%% used, df on the mount %.1f%%", st.Capacity.UsedPercent, df)
	}
	m, ok, err := mountinfo.OnStrata(u.mnt)
	if err != nil || !ok {
		t.Fatalf("%s is not seen as a Strata mount: %v", u.mnt, err)
	}
	if a, ok := m.MetaAddr(); !ok || a != st.Meta.Leader {
		t.Fatalf("mount source %q does not name the metadata service %s", m.Source, st.Meta.Leader)
	}
	if err := u.P.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, u.P.Tail(20))
	}
	if last := u.P.Tail(1); !strings.Contains(last, "stopped cleanly") {
		t.Fatalf("the last line of a clean stop is %q", last)
	}
	out, code = run(t, u.bin, t.TempDir(), "status")
	if code != 2 || !strings.Contains(out, "no strata up is running") {
		t.Fatalf("strata status after the stop: exit %d\n%s", code, out)
	}
}

// TestStripeSetKeepsTheOtherField: --count alone keeps the directory's
// stripe size, --size alone its count.
func TestStripeSetKeepsTheOtherField(t *testing.T) {
	u := newUpRun(t)
	dir := filepath.Join(u.mnt, "ckpt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	get := func() (size, count uint32) {
		out, code := run(t, u.bin, u.dir, "stripe", "get", "--json", dir)
		var l struct {
			StripeSize  uint32 `json:"stripe_size"`
			StripeCount uint32 `json:"stripe_count"`
		}
		if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil {
			t.Fatalf("stripe get: exit %d %v\n%s", code, err, out)
		}
		return l.StripeSize, l.StripeCount
	}
	set := func(args ...string) {
		if out, code := run(t, u.bin, u.dir, append(append([]string{"stripe", "set"}, args...), dir)...); code != 0 {
			t.Fatalf("stripe set %v: exit %d\n%s", args, code, out)
		}
	}
	set("--count", "2", "--size", "4M")
	set("--count", "3")
	if size, count := get(); size != 4<<20 || count != 3 {
		t.Fatalf("after --count 3: size %d, count %d (want 4 MiB kept, 3)", size, count)
	}
	set("--size", "2M")
	if size, count := get(); size != 2<<20 || count != 3 {
		t.Fatalf("after --size 2M: size %d, count %d (want 2 MiB, 3 kept)", size, count)
	}
}

// TestRefusedMountPointNamesItsHolder: a second strata up on a mount point
// another one serves refuses, names that process, and leaves no lock file.
func TestRefusedMountPointNamesItsHolder(t *testing.T) {
	u := newUpRun(t)
	other := filepath.Join(t.TempDir(), "data")
	out, code := run(t, u.bin, u.dir, "up", "--data", other, "--mount", u.mnt)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("pid %d", u.P.Pid())) {
		t.Fatalf("second strata up on %s: exit %d, want 1 and the first one's pid %d named:\n%s", u.mnt, code, u.P.Pid(), out)
	}
	if _, err := os.Stat(filepath.Join(other, "strata.lock")); err == nil {
		t.Fatal("the refused strata up left its lock file")
	}
}

// TestBenchLimitMeasuresTheDiskUnderStrata: on the mount of a local strata
// up, the raw limit is the disk under it (its data directory), said so;
// bench-results/ lands where --out says.
func TestBenchLimitMeasuresTheDiskUnderStrata(t *testing.T) {
	u := newUpRun(t)
	out := t.TempDir()
	res, code := run(t, u.bin, u.dir, "bench", "--quick", "--workloads", "meta", "--threads", "1", "--files-per-dir", "20",
		"--dirs-per-thread", "1", "--fio-size", "4M", "--out", out, u.mnt)
	if code != 0 {
		t.Fatalf("strata bench: exit %d\n%s", code, res)
	}
	if !strings.Contains(res, "raw limit: fio measures "+u.data) || !strings.Contains(res, "the disk under the Strata mount") {
		t.Fatalf("bench does not say it measures the disk under the mount (%s):\n%s", u.data, res)
	}
	if testutil.IsMounted(u.mnt) && strings.Contains(res, "raw limit: fio measures "+u.mnt) {
		t.Fatalf("bench measured the mount itself:\n%s", res)
	}
}

// TestRemovedFilesWaitingToBeFreed: right after an rm of many files
// `strata status` counts them as waiting to be freed (the reaper frees
// chunks in the background), and stopping the cluster before it has says
// so in one line, not a line per file.
func TestRemovedFilesWaitingToBeFreed(t *testing.T) {
	u := newUpRun(t)
	dir := filepath.Join(u.mnt, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	data := bytes.Repeat([]byte("x"), 3901)
	for i := 0; i < n; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	// The reaper waits 15 s after the leader's start (--orphan-grace's
	// default) and for the mount's next open-files report: the files are
	// still waiting here unless this machine is very slow.
	out, code := run(t, u.bin, u.mnt, "status", "--json")
	var st struct {
		Files *uint64 `json:"free_pending_files"`
		Bytes *uint64 `json:"free_pending_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Files == nil || st.Bytes == nil {
		t.Fatalf("strata status --json: exit %d, %v\n%s", code, err, out)
	}
	if *st.Files == n && *st.Bytes < n*3901 {
		t.Errorf("%d files waiting with %d bytes, want at least %d", *st.Files, *st.Bytes, n*3901)
	}
	waiting := *st.Files
	if err := u.P.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, u.P.Tail(30))
	}
	log, err := os.ReadFile(u.P.Log)
	if err != nil {
		t.Fatal(err)
	}
	if warns := strings.Count(string(log), "level=WARN"); warns > 10 {
		t.Errorf("%d warnings at a stop with removed files waiting:\n%s", warns, u.P.Tail(40))
	}
	if waiting == 0 {
		t.Skipf("the reaper freed every file before the stop (slow machine?): nothing left to sum up")
	}
	if k := strings.Count(string(log), "wait for their chunks to be freed"); k != 1 {
		t.Errorf("%d summary lines at the stop with %d files waiting, want 1:\n%s", k, waiting, u.P.Tail(40))
	}
}
