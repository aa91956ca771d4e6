package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/testutil"
)

// startUp starts `strata up --data data --mount mnt` (its log in dir) and
// waits until the file system is mounted.
func startUp(t *testing.T, bin, dir, data, mnt string, extra ...string) *testutil.Proc {
	t.Helper()
	p := testutil.StartProc(t, dir, "up", nil, bin, append([]string{"up", "--data", data, "--mount", mnt}, extra...)...)
	if err := testutil.WaitFor(30*time.Second, func() error {
		if p.Exited() {
			return errors.New("strata up exited:\n" + p.Tail(30))
		}
		if !testutil.IsMounted(mnt) {
			return errors.New("not mounted")
		}
		return nil
	}); err != nil {
		p.Kill()
		testutil.ForceUnmount(mnt)
		t.Fatal(err)
	}
	return p
}

// upRun is a strata up started by newUpRun in a directory of its own; the
// test's cleanup kills whatever P is then and unmounts.
type upRun struct {
	bin, dir, data, mnt string
	P                   *testutil.Proc
}

func newUpRun(t *testing.T) *upRun {
	testutil.RequireFUSE(t)
	u := &upRun{bin: testutil.Binary(t), dir: t.TempDir()}
	u.data, u.mnt = filepath.Join(u.dir, "data"), filepath.Join(u.dir, "mnt")
	u.P = startUp(t, u.bin, u.dir, u.data, u.mnt)
	t.Cleanup(func() { u.P.Kill(); testutil.ForceUnmount(u.mnt) })
	return u
}

// waitRead waits (30 s) until file f of the running strata up reads
// want, failing early if that strata up exited.
func (u *upRun) waitRead(f, want string) error {
	return testutil.WaitFor(30*time.Second, func() error {
		if u.P.Exited() {
			return errors.New("strata up exited:\n" + u.P.Tail(20))
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if string(b) != want {
			return fmt.Errorf("read %q", b)
		}
		return nil
	})
}

// TestUpServesAndRestarts drives `strata up` the way the README does: start
// it, use the mount, stop it with SIGTERM (it must unmount and exit 0), start
// it again on the same data directory and find the same files.
func TestUpServesAndRestarts(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	start := func() *testutil.Proc { return startUp(t, bin, dir, data, mnt) }
	p := start()
	t.Cleanup(func() { p.Kill(); testutil.ForceUnmount(mnt) })

	content := bytes.Repeat([]byte("strata up "), 300000) // 3 MB over several stripes
	if err := os.MkdirAll(filepath.Join(mnt, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "a", "b", "f"), content, 0o640); err != nil {
		t.Fatal(err)
	}
	// status sees the cluster through the cluster file in --data.
	out, err := exec.Command(bin, "status", "--data", data).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "target") && !strings.Contains(string(out), "TARGET") || !strings.Contains(string(out), "health ok") {
		t.Fatalf("strata status: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), " up\n") + strings.Count(string(out), " up "); n < 4 {
		t.Logf("status output:\n%s", out)
	}
	// A lock taken through the mount shows in `status --locks` with the
	// mount that holds it, and goes when released.
	lf, err := os.Open(filepath.Join(mnt, "a", "b", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(bin, "status", "--data", data, "--locks").CombinedOutput()
	if err != nil || !strings.Contains(string(out), mnt) || !regexp.MustCompile(`(?m)^\d+\s+flock\s+write\s+0-EOF\s+\d+`).Match(out) || !strings.Contains(string(out), "locks: 1 held") {
		t.Fatalf("strata status --locks with one flock held: %v\n%s", err, out)
	}
	lf.Close() // releases the flock
	if err := testutil.WaitFor(10*time.Second, func() error {
		out, err := exec.Command(bin, "status", "--data", data, "--json").CombinedOutput()
		if err != nil {
			return fmt.Errorf("strata status --json: %v\n%s", err, out)
		}
		var st struct {
			Locks struct {
				Held int `json:"held"`
			} `json:"locks"`
			Clients []struct {
				MountPoint string `json:"mount_point"`
			} `json:"clients"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			return fmt.Errorf("status JSON: %v\n%s", err, out)
		}
		if st.Locks.Held != 0 || len(st.Clients) != 1 || st.Clients[0].MountPoint != mnt {
			return fmt.Errorf("after close: %d locks, clients %+v (want 0 locks, one client at %s)", st.Locks.Held, st.Clients, mnt)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// df on the mount: the four targets share the disk under --data,
	// which counts once (within a few percent: free space moves).
	var disk, fs syscall.Statfs_t
	if err := syscall.Statfs(data, &disk); err != nil {
		t.Fatal(err)
	}
	if err := testutil.WaitFor(10*time.Second, func() error {
		if err := syscall.Statfs(mnt, &fs); err != nil {
			return err
		}
		want := float64(disk.Blocks) * float64(disk.Frsize)
		got := float64(fs.Blocks) * float64(fs.Frsize)
		if got < 0.95*want || got > 1.05*want {
			return fmt.Errorf("statfs of the mount: %.0f bytes, the disk under it has %.0f (targets sharing it counted several times?)", got, want)
		}
		// Used (size - free) as on the disk: free includes root's reserve.
		wantUsed := want - float64(disk.Bfree)*float64(disk.Frsize)
		gotUsed := got - float64(fs.Bfree)*float64(fs.Frsize)
		if d := gotUsed - wantUsed; d > 0.05*want || d < -0.05*want {
			return fmt.Errorf("used on the mount %.0f bytes, on the disk %.0f", gotUsed, wantUsed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Tail(30))
	}
	if testutil.IsMounted(mnt) {
		t.Fatal("still mounted after strata up exited")
	}
	p = start()
	got, err := os.ReadFile(filepath.Join(mnt, "a", "b", "f"))
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("after restart: err=%v, %d bytes (want %d)", err, len(got), len(content))
	}
	st, err := os.Stat(filepath.Join(mnt, "a", "b", "f"))
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("mode after restart: %v %v", st.Mode(), err)
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("second SIGTERM: %v", err)
	}
}

// TestStripeSetGet sets a directory layout and checks that a new file really
// spans that many targets, each holding its share of the bytes.
func TestStripeSetGet(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2})
	mnt := c.Mount(0)
	dir := filepath.Join(mnt, "ckpt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		out, err := exec.Command(c.Bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("strata %v: %v\n%s", args, err, out)
		}
		return out
	}
	run("stripe", "set", "--count", "4", "--size", "4M", dir)
	var dl struct {
		StripeSize  uint32   `json:"stripe_size"`
		StripeCount uint32   `json:"stripe_count"`
		Targets     []uint32 `json:"targets"`
	}
	if err := json.Unmarshal(run("stripe", "get", "--json", dir), &dl); err != nil || dl.StripeCount != 4 || dl.StripeSize != 4<<20 {
		t.Fatalf("dir layout: %+v %v", dl, err)
	}
	f := filepath.Join(dir, "file.0")
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var fl struct {
		StripeSize  uint32   `json:"stripe_size"`
		StripeCount uint32   `json:"stripe_count"`
		Targets     []uint32 `json:"targets"`
	}
	if err := json.Unmarshal(run("stripe", "get", "--json", f), &fl); err != nil {
		t.Fatal(err)
	}
	if fl.StripeCount != 4 || fl.StripeSize != 4<<20 || len(fl.Targets) != 4 {
		t.Fatalf("file layout: %+v", fl)
	}
	seen := map[uint32]bool{}
	for _, id := range fl.Targets {
		seen[id] = true
	}
	if len(seen) != 4 {
		t.Fatalf("targets not distinct: %v", fl.Targets)
	}
	// The largest file of its layout is told too (statfs and pathconf cannot).
	var lim struct {
		MaxFileBytes int64 `json:"max_file_bytes"`
	}
	want := layout.Layout{StripeSize: 4 << 20, StripeCount: 4}.MaxFileSize()
	if err := json.Unmarshal(run("stripe", "get", "--json", f), &lim); err != nil || lim.MaxFileBytes != want {
		t.Fatalf("max_file_bytes of a 4 × 4 MiB file: %d, %v; want %d", lim.MaxFileBytes, err, want)
	}
	// Each of the 4 target directories holds 4 MiB of this file.
	for i := 0; i < 2; i++ {
		for j := 0; j < 2; j++ {
			tdir := filepath.Join(c.Dir, fmt.Sprintf("store%d", i), fmt.Sprintf("t%d", j))
			if biggest := largestFile(t, tdir); biggest < 4<<20 {
				t.Errorf("target %s: largest file %d bytes, want ≥ 4 MiB", tdir, biggest)
			}
		}
	}
	got, err := os.ReadFile(f)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	// Human output and errors.
	if out := run("stripe", "get", f); !strings.Contains(string(out), "stripe_count: 4") || !strings.Contains(string(out), "max_file_size: 64 TiB") {
		t.Fatalf("human output: %s", out)
	}
	out, err := exec.Command(c.Bin, "stripe", "get", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not on a Strata mount") {
		t.Fatalf("stripe get on a local dir: %v %s", err, out)
	}
	out, err = exec.Command(c.Bin, "stripe", "set", "--count", "9", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "more than the targets registered") {
		t.Fatalf("stripe count 9 over 4 targets: %v %s (want a refusal naming the targets)", err, out)
	}
}

func largestFile(t *testing.T, dir string) int64 {
	var max int64
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() && info.Size() > max {
			max = info.Size()
		}
		return nil
	})
	return max
}

// errStillRunning: runBounded killed the command at its bound.
var errStillRunning = errors.New("still running at the time bound; killed")

// runBounded runs bin with args and returns its combined output, killing
// it after d (errStillRunning).
func runBounded(d time.Duration, bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
		return string(out), err
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		return string(out), errStillRunning
	}
}

// TestBadFlagsExitNonZero: wrong configuration gets a clear message and a
// non-zero exit, never a half-started daemon.
func TestBadFlagsExitNonZero(t *testing.T) {
	bin := testutil.Binary(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stopped := t.TempDir() // a local cluster's data directory while no strata up runs
	if err := os.WriteFile(filepath.Join(stopped, "cluster.key"), []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"meta", "--listen", "127.0.0.1:0"}, "data"},
		{[]string{"status", "--data", stopped}, "no strata up is running"},
		{[]string{"meta", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--disk-reserve", "lots"}, "disk-reserve"},
		{[]string{"up", "--data", t.TempDir(), "--mount", t.TempDir(), "--meta-disk-reserve", "-5"}, "meta-disk-reserve"},
		{[]string{"stripe", "set", "--size", "8G", "/tmp"}, "multiple of 64 kib"},
		{[]string{"store", "--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0"}, "target"},
		{[]string{"store", "--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--target", "/nonexistent/strata/x"}, "nonexistent"},
		{[]string{"up", "--stores", "0"}, "stores"},
		{[]string{"up", "--data", t.TempDir(), "--mount", t.TempDir(), "--nfs", "--nfs-export", "/=rw,fast"}, "unknown option \"fast\""},
		{[]string{"up", "--data", t.TempDir(), "--mount", t.TempDir(), "--nfs-export", "/=rw,clients=*"}, "only with --nfs"},
		{[]string{"stripe", "set", "--count", "-1", "/tmp"}, "count"},
		{[]string{"stripe", "set", "--size", "4Q", "/tmp"}, "size"},
		{[]string{"stripe", "set", "--size", "3K", "/tmp"}, "multiple of 64 kib"},
		{[]string{"stripe", "set", "--count", "300", "/tmp"}, "at most 256 targets"},
		{[]string{"mount", "--meta", "127.0.0.1:1"}, "arg"},
		{[]string{"nosuchcommand"}, "unknown command"},
		{[]string{"meta", "--data", t.TempDir(), "--listen", "not-an-address"}, "listen"},
		{[]string{"meta", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--sync-delay", "-1s"}, "sync delay"},
		{[]string{"up", "--data", t.TempDir(), "--mount", t.TempDir(), "--write-through-bytes", "-1"}, "write-through"},
		{[]string{"mount", "--meta", "127.0.0.1:1", "--key-file", keyFile, "--write-through-bytes", "-1", t.TempDir()}, "write-through"},
		{[]string{"up", "--data", t.TempDir(), "--mount", t.TempDir(), "--kernel-read-ahead-bytes", "-4096"}, "kernel-read-ahead"},
		{[]string{"mount", "--meta", "127.0.0.1:1", "--key-file", keyFile, "--kernel-read-ahead-bytes", "-1", t.TempDir()}, "kernel-read-ahead"},
		// Create delegations are on by default and off under strict;
		// asked for under strict, refused.
		{[]string{"up", "--data", t.TempDir(), "--mount", t.TempDir(), "--sync-policy", "strict", "--create-delegation"}, "not for --sync-policy strict"},
		{[]string{"mount", "--meta", "127.0.0.1:1", "--key-file", keyFile, "--sync-policy", "strict", "--create-delegation", t.TempDir()}, "not for sync policy"},
	}
	for _, c := range cases {
		out, err := runBounded(20*time.Second, bin, c.args...)
		if errors.Is(err, errStillRunning) {
			t.Errorf("strata %v: %v", c.args, err)
			continue
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("strata %v: want non-zero exit, got %v\n%s", c.args, err, out)
			continue
		}
		if !strings.Contains(strings.ToLower(string(out)), c.want) {
			t.Errorf("strata %v: message %q does not mention %q", c.args, out, c.want)
		}
	}
}

// TestNameTooLong: 255-byte names work, 256-byte names get ENAMETOOLONG.
func TestNameTooLong(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{})
	mnt := c.Mount(0)
	ok := filepath.Join(mnt, strings.Repeat("n", 255))
	if err := os.WriteFile(ok, []byte("x"), 0o644); err != nil {
		t.Fatalf("255-byte name: %v", err)
	}
	long := filepath.Join(mnt, strings.Repeat("n", 256))
	for _, op := range []func() error{
		func() error { return os.WriteFile(long, nil, 0o644) },
		func() error { return os.Mkdir(long, 0o755) },
		func() error { return os.Symlink("x", long) },
		func() error { return os.Rename(ok, long) },
		func() error { return os.Link(ok, long) },
	} {
		if err := op(); !errors.Is(err, syscall.ENAMETOOLONG) {
			t.Errorf("want ENAMETOOLONG, got %v", err)
		}
	}
	if _, err := os.Stat(ok); err != nil {
		t.Fatalf("original lost: %v", err)
	}
}

// TestUpAfterKillAndTwice: a strata up killed with -9 leaves its mount
// disconnected; the next start on the same directories removes that stale
// mount and serves the files. While one runs, a second on its data
// directory, or on its mount point, refuses and says why.
func TestUpAfterKillAndTwice(t *testing.T) {
	u := newUpRun(t)
	bin, dir, data, mnt := u.bin, u.dir, u.data, u.mnt
	f := filepath.Join(mnt, "kept")
	if err := os.WriteFile(f, []byte("before the crash"), 0o644); err != nil {
		t.Fatal(err)
	}
	u.P.Kill()
	// The connection is cut when the last reference to the daemon's
	// /dev/fuse file goes, which another process looking at the dead
	// one's descriptors (a parallel test's /proc scan) may hold a moment
	// longer than the process lives.
	if err := testutil.WaitFor(5*time.Second, func() error {
		if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
			return fmt.Errorf("after kill -9 the mount point answers %v, want ENOTCONN (a stale mount)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	u.P = testutil.StartProc(t, dir, "up-again", nil, bin, "up", "--data", data, "--mount", mnt)
	if err := u.waitRead(f, "before the crash"); err != nil {
		t.Fatalf("restart over the stale mount: %v", err)
	}
	if log, _ := os.ReadFile(u.P.Log); !bytes.Contains(log, []byte("removed the stale mount")) {
		t.Fatalf("the restart does not say it removed the stale mount:\n%s", u.P.Tail(20))
	}

	out, err := runBounded(30*time.Second, bin, "up", "--data", data, "--mount", filepath.Join(dir, "mnt2"))
	if err == nil || !strings.Contains(out, fmt.Sprintf("in use by another strata (pid %d)", u.P.Pid())) {
		t.Fatalf("second strata up on the same data directory: %v\n%s", err, out)
	}
	out, err = runBounded(30*time.Second, bin, "up", "--data", filepath.Join(dir, "data2"), "--mount", mnt)
	if err == nil || !strings.Contains(out, "already a Strata mount") {
		t.Fatalf("second strata up on the same mount point: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(f); err != nil || string(b) != "before the crash" {
		t.Fatalf("the first mount after the refused starts: %q, %v", b, err)
	}
}

// TestMetaDataDirInUse: a second metadata service on a data directory in
// use refuses to start and names the process that has it.
func TestMetaDataDirInUse(t *testing.T) {
	bin := testutil.Binary(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "meta")
	p := testutil.StartProc(t, dir, "meta", nil, bin, "meta", "--data", data, "--listen", "127.0.0.1:0")
	t.Cleanup(p.Kill)
	if err := testutil.WaitFor(30*time.Second, func() error {
		if p.Exited() {
			return errors.New("strata meta exited:\n" + p.Tail(20))
		}
		if log, _ := os.ReadFile(p.Log); !bytes.Contains(log, []byte("serving on")) {
			return errors.New("not serving yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	out, err := runBounded(30*time.Second, bin, "meta", "--data", data, "--listen", "127.0.0.1:0")
	if err == nil || !strings.Contains(out, fmt.Sprintf("in use by another strata (pid %d)", p.Pid())) {
		t.Fatalf("second strata meta on the same data directory: %v\n%s", err, out)
	}
	if p.Exited() {
		t.Fatalf("the first metadata service stopped:\n%s", p.Tail(20))
	}
}

// TestUpStopsWithBusyMount: stopped while a process works in the mount,
// strata up still stops within a bound: it detaches the mount lazily and
// exits non-zero naming the process, rather than hanging or leaving a
// disconnected mount behind.
func TestUpStopsWithBusyMount(t *testing.T) {
	u := newUpRun(t)
	sleeper := exec.Command("sleep", "120")
	sleeper.Dir = u.mnt
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	err := u.P.Stop(60 * time.Second)
	log, _ := os.ReadFile(u.P.Log)
	if err == nil || strings.Contains(err.Error(), "did not stop") {
		t.Fatalf("stop with a busy mount: %v, want a non-zero exit within the bound\n%s", err, u.P.Tail(20))
	}
	if want := fmt.Sprintf("in use by pid %d (sleep)", sleeper.Process.Pid); !bytes.Contains(log, []byte(want)) {
		t.Fatalf("the exit does not name the process using the mount (%q):\n%s", want, u.P.Tail(20))
	}
	if testutil.IsMounted(u.mnt) {
		t.Fatalf("%s is still in the mount table after strata up stopped", u.mnt)
	}
}

// TestUpRefusesTargetsOfAnotherFileSystem: storage directories that served
// one file system, started under a new metadata service (a new data
// directory holding copies of them), are refused, naming the target —
// rather than serving a new namespace whose new files would read the old
// file system's bytes where they have holes (checked: with them accepted,
// a new file extended by truncate read the old file's content).
func TestUpRefusesTargetsOfAnotherFileSystem(t *testing.T) {
	u := newUpRun(t)
	if err := os.WriteFile(filepath.Join(u.mnt, "old"), bytes.Repeat([]byte("OLDDATA!"), 400000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := u.P.Stop(60 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, u.P.Tail(20))
	}
	data2 := filepath.Join(u.dir, "data2")
	if err := os.MkdirAll(data2, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"store0", "store1"} {
		if out, err := exec.Command("cp", "-a", filepath.Join(u.data, s), data2).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	out, err := runBounded(60*time.Second, u.bin, "up", "--data", data2, "--mount", u.mnt)
	if err == nil || errors.Is(err, errStillRunning) || !strings.Contains(out, "of another Strata file system") || !strings.Contains(out, data2) {
		t.Fatalf("strata up over another file system's targets: %v\n%s", err, out)
	}
	if testutil.IsMounted(u.mnt) {
		t.Fatalf("%s is mounted after the refused start", u.mnt)
	}
}

// TestUpAfterMetadataRestoredFromOlderCopy: the metadata directory is put
// back to a copy taken before a file was written. The restored service
// would hand that file's inode number to the next new file, whose holes
// would then read the forgotten file's chunks; the targets' inode
// ceilings make it skip those numbers, so a new sparse file reads zeros.
// `strata fsck` then finds the forgotten file's chunks and removes them,
// and the files the metadata knows keep their data.
func TestUpAfterMetadataRestoredFromOlderCopy(t *testing.T) {
	u := newUpRun(t)
	kept := bytes.Repeat([]byte("kept data "), 250000)
	if err := os.WriteFile(filepath.Join(u.mnt, "kept"), kept, 0o644); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		t.Helper()
		if err := u.P.Stop(60 * time.Second); err != nil {
			t.Fatalf("stop: %v\n%s", err, u.P.Tail(20))
		}
	}
	stop()
	meta, backup := filepath.Join(u.data, "meta"), filepath.Join(u.dir, "meta-backup")
	if out, err := exec.Command("cp", "-a", meta, backup).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	u.P = startUp(t, u.bin, u.dir, u.data, u.mnt)
	forgotten := filepath.Join(u.mnt, "forgotten")
	if err := os.WriteFile(forgotten, bytes.Repeat([]byte("OLDDATA!"), 400000), 0o644); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(forgotten, &st); err != nil {
		t.Fatal(err)
	}
	oldIno := st.Ino
	stop()
	if err := os.RemoveAll(meta); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, meta); err != nil {
		t.Fatal(err)
	}
	u.P = startUp(t, u.bin, u.dir, u.data, u.mnt)
	if _, err := os.Stat(forgotten); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the restored metadata knows the file written after the copy: %v", err)
	}
	fresh := filepath.Join(u.mnt, "fresh")
	f, err := os.Create(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(3200000); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(fresh, &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino == oldIno {
		t.Fatalf("the new file got the forgotten file's inode number %d", oldIno)
	}
	got, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(got, func(r rune) bool { return r != 0 }); i >= 0 || len(got) != 3200000 {
		t.Fatalf("new sparse file (inode %d; the forgotten one was %d): %d bytes, non-zero from offset %d: %q",
			st.Ino, oldIno, len(got), i, got[i:min(i+16, len(got))])
	}

	// The forgotten file's 4 chunks (3.2 MB in 1 MiB stripes) are orphans.
	fsck := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(u.bin, append([]string{"fsck", "--data", u.data}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("strata fsck %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := fsck("--progress")
	if !strings.Contains(out, "4 orphan chunks found; run again with --remove-orphans") {
		t.Fatalf("fsck after the restore:\n%s", out)
	}
	// --progress: a line per target as it is done (stderr), whose orphans
	// add up to the report's.
	lines := regexp.MustCompile(`(?m)^fsck: target \d+ \(.+ on .+\), [1-4] of 4: \d+ chunks, (\d+) orphans, 0 removed`).FindAllStringSubmatch(out, -1)
	orphans := 0
	for _, l := range lines {
		n, _ := strconv.Atoi(l[1])
		orphans += n
	}
	if len(lines) != 4 || orphans != 4 {
		t.Fatalf("fsck --progress: %d target lines counting %d orphans, want 4 and 4:\n%s", len(lines), orphans, out)
	}
	// Without a terminal and without --progress: no progress lines.
	if out := fsck("--remove-orphans"); !strings.Contains(out, "4 orphan chunks found, 4 removed") || strings.Contains(out, "fsck: target") {
		t.Fatalf("fsck --remove-orphans:\n%s", out)
	}
	if out := fsck(); !strings.Contains(out, "no orphan chunks") {
		t.Fatalf("fsck after the removal:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(u.mnt, "kept")); err != nil || !bytes.Equal(b, kept) {
		t.Fatalf("the file written before the copy after fsck: %v (%d bytes, want %d)", err, len(b), len(kept))
	}
}

// TestFsckWhileWriting: `strata fsck --remove-orphans` running while files
// are created and written removes nothing of theirs: only inode numbers
// handed out before a check starts are judged, and those are known.
func TestFsckWhileWriting(t *testing.T) {
	u := newUpRun(t)
	const files = 300
	content := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("file %d ", i)), 40000+i) }
	done := make(chan error, 1)
	go func() {
		for i := 0; i < files; i++ {
			if err := os.WriteFile(filepath.Join(u.mnt, fmt.Sprintf("f%d", i)), content(i), 0o644); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var writeErr error
	checks := 0
	for deadline := time.Now().Add(2 * time.Minute); ; checks++ {
		out, err := exec.Command(u.bin, "fsck", "--data", u.data, "--remove-orphans").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "no orphan chunks") {
			t.Fatalf("fsck %d while writing: %v\n%s", checks, err, out)
		}
		select {
		case writeErr = <-done:
		default:
			if time.Now().Before(deadline) {
				continue
			}
			t.Fatal("the writer did not finish within 2 minutes")
		}
		break
	}
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	t.Logf("%d checks ran while the files were written", checks+1)
	for i := 0; i < files; i++ {
		b, err := os.ReadFile(filepath.Join(u.mnt, fmt.Sprintf("f%d", i)))
		if err != nil || !bytes.Equal(b, content(i)) {
			t.Fatalf("f%d after fsck: %v (%d bytes, want %d)", i, err, len(b), len(content(i)))
		}
	}
}

// TestMirrorPlacementE2E: on real processes, strata mirror create --auto
// pairs the targets across the storage servers, strata stripe set
// --mirror marks a directory, and a file made there (and in a new
// subdirectory) gets a layout of mirror groups, while others keep
// targets; status --json lists the groups with the servers' --listen
// addresses. (No data is written: the stores' side of groups is tested
// with them.)
func TestMirrorPlacementE2E(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2})
	mnt := c.Mount(0)
	run := func(args ...string) []byte {
		out, err := exec.Command(c.Bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("strata %v: %v\n%s", args, err, out)
		}
		return out
	}
	flags := []string{"--meta", c.MetaAddr, "--key-file", c.KeyFile}
	if out := run(append([]string{"mirror", "create", "--auto"}, flags...)...); !strings.Contains(string(out), "created 2 mirror group(s)") {
		t.Fatalf("mirror create --auto: %s", out)
	}
	var st struct {
		Groups []struct {
			ID              uint32 `json:"id"`
			PrimaryServer   string `json:"primary_server"`
			SecondaryServer string `json:"secondary_server"`
			State           string `json:"state"`
			Epoch           uint64 `json:"epoch"`
		} `json:"mirror_groups"`
		Servers []struct {
			Address string `json:"address"`
		} `json:"servers"`
	}
	if err := json.Unmarshal(run(append([]string{"status", "--json"}, flags...)...), &st); err != nil {
		t.Fatal(err)
	}
	listen := map[string]bool{}
	for _, s := range st.Servers {
		listen[s.Address] = true
	}
	if len(st.Groups) != 2 {
		t.Fatalf("mirror_groups: %+v", st.Groups)
	}
	for _, g := range st.Groups {
		if g.State != "in_sync" || g.Epoch != 1 || g.PrimaryServer == g.SecondaryServer || !listen[g.PrimaryServer] || !listen[g.SecondaryServer] {
			t.Fatalf("group %+v (servers %v)", g, listen)
		}
	}
	dir := filepath.Join(mnt, "results")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run("stripe", "set", "--mirror", dir)
	if err := os.Mkdir(filepath.Join(dir, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	groupsOf := func(path string) []uint32 {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var l struct {
			Targets []uint32 `json:"targets"`
		}
		if err := json.Unmarshal(run("stripe", "get", "--json", path), &l); err != nil {
			t.Fatal(err)
		}
		var groups []uint32
		for _, id := range l.Targets {
			if layout.IsGroup(id) {
				groups = append(groups, id&^layout.GroupBit)
			}
		}
		if len(groups) != 0 && len(groups) != len(l.Targets) {
			t.Fatalf("%s: targets %v mix groups and targets", path, l.Targets)
		}
		return groups
	}
	if g := groupsOf(filepath.Join(dir, "f")); len(g) != 2 {
		t.Fatalf("a file in the mirrored directory is on groups %v, want both", g)
	}
	if g := groupsOf(filepath.Join(dir, "new", "f")); len(g) != 2 {
		t.Fatalf("a file in a new subdirectory is on groups %v, want both", g)
	}
	if g := groupsOf(filepath.Join(mnt, "plain")); len(g) != 0 {
		t.Fatalf("a file outside is on groups %v", g)
	}
	if out := run("stripe", "get", filepath.Join(dir, "f")); !strings.Contains(string(out), "mirror groups:") {
		t.Fatalf("stripe get of a mirrored file: %s", out)
	}
	// A directory's mirror mark shows in stripe get (text and JSON); a
	// file has none.
	markOf := func(path string) *bool {
		var l struct {
			Mirror *bool `json:"mirror"`
		}
		if err := json.Unmarshal(run("stripe", "get", "--json", path), &l); err != nil {
			t.Fatal(err)
		}
		return l.Mirror
	}
	for path, want := range map[string]bool{dir: true, filepath.Join(dir, "new"): true, mnt: false} {
		if m := markOf(path); m == nil || *m != want {
			t.Fatalf("stripe get --json %s: mirror %v, want %v", path, m, want)
		}
	}
	if m := markOf(filepath.Join(dir, "f")); m != nil {
		t.Fatalf("stripe get --json of a file says mirror %v", *m)
	}
	if out := run("stripe", "get", dir); !strings.Contains(string(out), "mirror:       on") {
		t.Fatalf("stripe get of a mirrored directory: %s", out)
	}
	run("stripe", "set", "--mirror=false", filepath.Join(dir, "new"))
	if out := run("stripe", "get", filepath.Join(dir, "new")); !strings.Contains(string(out), "mirror:       off") {
		t.Fatalf("stripe get after stripe set --mirror=false: %s", out)
	}
}

// TestUpRestartRightAfterKill: a strata up started again at once after
// kill -9 of the last one — its mount point's attributes still cached by
// the kernel, the dead daemon's connection perhaps not yet cut — detaches
// the stale mount and serves the files (the stat of the mount point alone
// can answer from the cache; statfs always asks the daemon).
func TestUpRestartRightAfterKill(t *testing.T) {
	u := newUpRun(t)
	f := filepath.Join(u.mnt, "kept")
	if err := os.WriteFile(f, []byte("before the crash"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(u.mnt); err != nil {
		t.Fatal(err)
	}
	u.P.Kill()
	u.P = testutil.StartProc(t, u.dir, "up-again", nil, u.bin, "up", "--data", u.data, "--mount", u.mnt)
	if err := u.waitRead(f, "before the crash"); err != nil {
		t.Fatalf("restart right after kill -9: %v", err)
	}
}
