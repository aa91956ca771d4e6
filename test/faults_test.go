package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
	"golang.org/x/sys/unix"
)

func fileTargets(t *testing.T, bin, path string) []uint32 {
	t.Helper()
	out, err := exec.Command(bin, "stripe", "get", "--json", path).CombinedOutput()
	if err != nil {
		t.Fatalf("stripe get %s: %v %s", path, err, out)
	}
	var l struct {
		Targets []uint32 `json:"targets"`
	}
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatal(err)
	}
	return l.Targets
}

// TestDeadStoreGivesBoundedEIO: with one storage server killed, I/O to files
// striped over it fails with EIO after the configured wait, and files on the
// surviving server keep working; the mount never hangs.
func TestDeadStoreGivesBoundedEIO(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 1, MountArgs: []string{"--io-timeout", "3s"}})
	mnt := c.Mount(0)
	st, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	serverOf := map[uint32]uint32{}
	for _, tg := range st.Targets {
		serverOf[tg.ID] = tg.ServerID
	}
	// Store 0 is the first registered server; find its id from its targets' paths.
	var deadServer uint32
	for _, tg := range st.Targets {
		if filepath.Base(filepath.Dir(tg.Path)) == "store0" {
			deadServer = tg.ServerID
		}
	}
	if err := os.Mkdir(filepath.Join(mnt, "one"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(c.Bin, "stripe", "set", "--count", "1", filepath.Join(mnt, "one")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	// Files with count 1 land round-robin: keep one on each server.
	var onDead, onLive string
	data := bytes.Repeat([]byte("x"), 256<<10)
	for i := 0; i < 8 && (onDead == "" || onLive == ""); i++ {
		p := filepath.Join(mnt, "one", fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if serverOf[fileTargets(t, c.Bin, p)[0]] == deadServer {
			onDead = p
		} else {
			onLive = p
		}
	}
	if onDead == "" || onLive == "" {
		t.Fatal("could not place files on both servers")
	}
	// A wide file spans both servers.
	wide := filepath.Join(mnt, "wide")
	if err := os.WriteFile(wide, bytes.Repeat([]byte("y"), 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Stores[0].Kill()
	dropCaches()

	start := time.Now()
	_, err = os.ReadFile(onDead)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("read of file on dead server: want EIO, got %v", err)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Errorf("EIO took %v; the wait must be bounded by the io timeout", d)
	}
	if _, err := os.ReadFile(wide); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of wide file: want EIO, got %v", err)
	}
	got, err := os.ReadFile(onLive)
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("file on live server: %v", err)
	}
	// Metadata keeps working too.
	if err := os.WriteFile(filepath.Join(mnt, "after"), nil, 0o644); err != nil {
		t.Errorf("create after store loss: %v", err)
	}
	// fsck checks the live targets and says which it could not.
	if out, err := exec.Command(c.Bin, "fsck", "--meta", c.MetaAddr, "--key-file", c.KeyFile).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "no orphan chunks") || !strings.Contains(string(out), "1 targets not checked") ||
		!strings.Contains(string(out), "store0") {
		t.Errorf("strata fsck with a store down: %v\n%s", err, out)
	}
	// The server comes back: the file is readable again.
	c.StartStore(0)
	if err := testutil.WaitFor(30*time.Second, func() error {
		b, err := os.ReadFile(onDead)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, data) {
			return errors.New("content differs")
		}
		return nil
	}); err != nil {
		t.Errorf("after store restart: %v", err)
	}
}

func dropCaches() {
	syscall.Sync()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

// TestMetaRestartSurvivedByMount: a running mount keeps working across a
// metadata-service restart (kill -9 and start again on the same data).
func TestMetaRestartSurvivedByMount(t *testing.T) {
	// A short orphan grace: the restarted service's reaper starts at once
	// and must still leave the nameless file the mount holds open.
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 2, MetaArgs: []string{"--orphan-grace", "500ms"}})
	mnt := c.Mount(0)
	if err := os.WriteFile(filepath.Join(mnt, "before"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.OpenFile(mnt, unix.O_TMPFILE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	nameless := bytes.Repeat([]byte("kept while open "), 1<<16)
	if _, err := tmp.Write(nameless); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Sync(); err != nil {
		t.Fatal(err)
	}
	c.Meta.Kill()
	// An operation issued while the service is down waits and then succeeds.
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(mnt, "during"), []byte("world"), 0o644) }()
	time.Sleep(500 * time.Millisecond)
	c.StartMeta()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("create during restart: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("create during restart hung")
	}
	for name, want := range map[string]string{"before": "hello", "during": "world"} {
		b, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q %v", name, b, err)
		}
	}
	if err := os.Mkdir(filepath.Join(mnt, "after"), 0o755); err != nil {
		t.Errorf("mkdir after restart: %v", err)
	}
	// Several reaper passes later, the open O_TMPFILE file still has its
	// data and can be named.
	time.Sleep(4 * time.Second)
	named := filepath.Join(mnt, "named-after-restart")
	if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", tmp.Fd()), unix.AT_FDCWD, named, unix.AT_SYMLINK_FOLLOW); err != nil {
		t.Fatalf("linkat of the open tmpfile after the restart: %v", err)
	}
	tmp.Close()
	if b, err := os.ReadFile(named); err != nil || !bytes.Equal(b, nameless) {
		t.Fatalf("tmpfile named after the restart reads %d bytes, %v; want its %d bytes", len(b), err, len(nameless))
	}
}

// TestLocksSurviveMetaKill: a flock and an OFD record lock taken through
// one mount still exclude a process on another mount after the metadata
// service was killed (-9) and started again: the service keeps locks in
// memory, and the mounts reclaim them before it grants new ones.
func TestLocksSurviveMetaKill(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1, Mounts: 2})
	p0 := filepath.Join(c.Mount(0), "shared.lock")
	p1 := filepath.Join(c.Mount(1), "shared.lock")
	if err := os.WriteFile(p0, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(p0, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("flock: %v", err)
	}
	rec := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 4096}
	if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLK, &rec); err != nil {
		t.Fatalf("OFD lock: %v", err)
	}
	c.Meta.Kill()
	c.StartMeta()

	other, err := os.OpenFile(p1, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("flock from the other mount after the restart: %v, want EWOULDBLOCK", err)
	}
	probe := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 100, Len: 10}
	if err := unix.FcntlFlock(other.Fd(), unix.F_OFD_SETLK, &probe); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("OFD lock from the other mount after the restart: %v, want EAGAIN", err)
	}
	probe = unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 100, Len: 10}
	if err := unix.FcntlFlock(other.Fd(), unix.F_OFD_GETLK, &probe); err != nil || probe.Type != unix.F_WRLCK || probe.Start != 0 || probe.Len != 4096 {
		t.Fatalf("F_OFD_GETLK after the restart: %+v %v, want the holder's write lock 0..4095", probe, err)
	}
	// The holder lets go; the other mount gets both.
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("flock after the holder released: %v", err)
	}
	// The kernel sends FUSE_RELEASE (which drops the OFD locks of the
	// closed description) after close returns: allow it a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		probe = unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 100, Len: 10}
		err := unix.FcntlFlock(other.Fd(), unix.F_OFD_SETLK, &probe)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			t.Fatalf("OFD lock after the holder closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFullTargetGivesENOSPC: targets on small tmpfs file systems fill up;
// the writer gets ENOSPC and files written earlier stay intact.
func TestFullTargetGivesENOSPC(t *testing.T) {
	testutil.RequireFUSE(t)
	base := t.TempDir()
	var dirs [][]string
	for i := 0; i < 2; i++ {
		d := filepath.Join(base, fmt.Sprintf("tmpfs%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", d, "tmpfs", 0, "size=24m"); err != nil {
			t.Skipf("cannot mount tmpfs: %v", err)
		}
		t.Cleanup(func() { syscall.Unmount(d, syscall.MNT_DETACH) })
		dirs = append(dirs, []string{d})
	}
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 1, TargetDirs: dirs})
	mnt := c.Mount(0)
	keep := bytes.Repeat([]byte("keep me "), 512<<10/8*4) // 2 MiB
	if err := os.WriteFile(filepath.Join(mnt, "keep"), keep, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{1}, 1<<20)
	var werr error
	for i := 0; i < 200 && werr == nil; i++ { // at most 200 MiB into 48 MiB of space
		_, werr = f.Write(chunk)
	}
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("want ENOSPC, got %v", werr)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "keep"))
	if err != nil || !bytes.Equal(got, keep) {
		t.Fatalf("earlier file damaged: %v", err)
	}
	// Space comes back after removing the filler.
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	if err := testutil.WaitFor(30*time.Second, func() error {
		return os.WriteFile(filepath.Join(mnt, "again"), chunk, 0o644)
	}); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
}

// TestUpStopsWhenMetadataStoreFails: the metadata store's directory
// vanishes under a running `strata up` (as with a dead disk). SIGTERM must
// still end it — bounded, not a hang on a flush the engine retries forever
// — with a non-zero exit that names the store, and without flooding the
// log with the engine's retries.
func TestUpStopsWhenMetadataStoreFails(t *testing.T) {
	u := newUpRun(t)
	data, mnt, p := u.data, u.mnt, u.P
	for i := 0; i < 200; i++ {
		if err := os.WriteFile(filepath.Join(mnt, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(filepath.Join(data, "meta", "fsm")); err != nil {
		t.Fatal(err)
	}
	err := p.Stop(60 * time.Second)
	log, _ := os.ReadFile(p.Log)
	if err == nil || bytes.Contains([]byte(err.Error()), []byte("did not stop")) {
		t.Fatalf("stop with the metadata store gone: %v, want a non-zero exit within the bound\n%s", err, p.Tail(20))
	}
	if !bytes.Contains(log, []byte("stopped with errors: metadata service: kv flush")) {
		t.Fatalf("the exit does not name the failing store:\n%s", p.Tail(20))
	}
	if n := bytes.Count(log, []byte("background error")); n > 10 {
		t.Fatalf("%d log lines about the engine's retries, want a handful", n)
	}
}
