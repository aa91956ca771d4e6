package faultfs_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/faultfs"
	"github.com/stratafs/strata/internal/testutil"
)

// mount mounts a fault file system in this process and returns its mount
// point and switch, with the control socket served too.
func mount(t *testing.T) (string, *faultfs.FS, string) {
	t.Helper()
	testutil.RequireFUSE(t)
	dir := t.TempDir()
	src, mnt := filepath.Join(dir, "src"), filepath.Join(dir, "mnt")
	os.Mkdir(src, 0o755)
	os.Mkdir(mnt, 0o755)
	srv, f, err := faultfs.Mount(src, mnt, false)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "ctl")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go faultfs.Serve(ln, f)
	t.Cleanup(func() {
		ln.Close()
		if err := srv.Unmount(); err != nil {
			testutil.ForceUnmount(mnt)
		}
	})
	return mnt, f, sock
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: want %v, got %v", what, want, err)
	}
}

// openClose opens and at once closes path: a file left open on a mount
// this process serves would hang the process's exit (its flush waits for
// a server that is gone).
func openClose(path string, flags int) error {
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func writeSync(path string, data string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		return err
	}
	return f.Sync()
}

// TestModes: each mode fails the operations it names with its errno, and
// leaves the others working; mode ok undoes it. Switched through the
// control socket, as the test harness does.
func TestModes(t *testing.T) {
	mnt, _, sock := mount(t)
	set := func(m faultfs.Mode) {
		t.Helper()
		if got, err := faultfs.Send(sock, m); err != nil || got != m {
			t.Fatalf("switch to %s: %v %v", m, got, err)
		}
	}
	p := filepath.Join(mnt, "f")
	if err := writeSync(p, "hello"); err != nil {
		t.Fatalf("mode ok: %v", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}

	set(faultfs.EIOWrite)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("eio-write: open: %v", err)
	}
	_, err = f.WriteString("x")
	wantErrno(t, "eio-write: write", err, syscall.EIO)
	if err := f.Sync(); err != nil {
		t.Errorf("eio-write: fsync: %v", err)
	}
	f.Close()
	if b, err := os.ReadFile(p); err != nil || string(b) != "hello" {
		t.Errorf("eio-write: read: %q %v", b, err)
	}

	set(faultfs.EIOFsync)
	f, err = os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(" world"); err != nil {
		t.Errorf("eio-fsync: write: %v", err)
	}
	wantErrno(t, "eio-fsync: fsync", f.Sync(), syscall.EIO)
	wantErrno(t, "eio-fsync: fdatasync", syscall.Fdatasync(int(f.Fd())), syscall.EIO)
	f.Close()
	d, err := os.Open(filepath.Join(mnt, "d"))
	if err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "eio-fsync: fsync of a directory", d.Sync(), syscall.EIO)
	d.Close()

	set(faultfs.ReadOnly)
	wantErrno(t, "erofs: open for writing", openClose(p, os.O_WRONLY), syscall.EROFS)
	wantErrno(t, "erofs: create", openClose(filepath.Join(mnt, "new"), os.O_CREATE|os.O_WRONLY), syscall.EROFS)
	wantErrno(t, "erofs: mkdir", os.Mkdir(filepath.Join(mnt, "d2"), 0o755), syscall.EROFS)
	wantErrno(t, "erofs: rename", os.Rename(p, p+".2"), syscall.EROFS)
	if b, err := os.ReadFile(p); err != nil || string(b) != "hello world" {
		t.Errorf("erofs: read: %q %v", b, err)
	}

	set(faultfs.Full)
	f, err = os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("!")
	wantErrno(t, "enospc: write", err, syscall.ENOSPC)
	f.Close()
	wantErrno(t, "enospc: create", openClose(filepath.Join(mnt, "new"), os.O_CREATE|os.O_WRONLY), syscall.ENOSPC)
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil || st.Bavail != 0 {
		t.Errorf("enospc: statfs: %d blocks available, %v", st.Bavail, err)
	}
	if err := os.Remove(filepath.Join(mnt, "d")); err != nil {
		t.Errorf("enospc: rmdir: %v", err)
	}

	set(faultfs.EIO)
	_, err = os.Stat(filepath.Join(mnt, "never-looked-up"))
	wantErrno(t, "eio: lookup", err, syscall.EIO)
	wantErrno(t, "eio: open", openClose(p, os.O_RDONLY), syscall.EIO)

	set(faultfs.OK)
	if err := writeSync(p, "again"); err != nil {
		t.Errorf("back to ok: %v", err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "again" {
		t.Errorf("back to ok: read %q %v", b, err)
	}
	if _, err := faultfs.Send(sock, "bogus"); err == nil {
		t.Error("an unknown mode was accepted")
	}
}

// TestHangModes: in hang-fsync an fsync waits (writes do not) and goes on
// once the mode changes; in hang every operation waits.
func TestHangModes(t *testing.T) {
	mnt, f, _ := mount(t)
	p := filepath.Join(mnt, "f")
	if err := writeSync(p, "x"); err != nil {
		t.Fatal(err)
	}
	// held runs op and checks that it is still waiting after a while, then
	// switches to ok and checks that it finishes without error.
	held := func(m faultfs.Mode, what string, op func() error) {
		t.Helper()
		if err := f.SetMode(m); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- op() }()
		select {
		case err := <-done:
			t.Fatalf("%s: %s returned (%v) instead of waiting", m, what, err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := f.SetMode(faultfs.OK); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %s after the switch to ok: %v", m, what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: %s still waits after the switch to ok", m, what)
		}
	}
	fh, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := f.SetMode(faultfs.HangSync); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString("y"); err != nil {
		t.Fatalf("hang-fsync: write: %v", err)
	}
	held(faultfs.HangSync, "fsync", fh.Sync)
	held(faultfs.Hang, "lookup", func() error {
		_, err := os.Stat(filepath.Join(mnt, "never-looked-up"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	})
}

// TestSlowMode: in slow:DURATION a write's fsync waits the delay and then
// succeeds; a switch back to ok ends a wait early; bad durations are
// refused.
func TestSlowMode(t *testing.T) {
	mnt, f, _ := mount(t)
	p := filepath.Join(mnt, "f")
	if err := f.SetMode(faultfs.Slow(300 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := writeSync(p, "slow"); err != nil {
		t.Fatalf("slow: write and fsync: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("slow:300ms: write and fsync took %v", d)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "slow" {
		t.Fatalf("slow: read back %q, %v", b, err)
	}
	if err := f.SetMode(faultfs.Slow(time.Hour / 60)); err != nil { // 1m: the longest
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- writeSync(p, "again") }()
	time.Sleep(200 * time.Millisecond)
	if err := f.SetMode(faultfs.OK); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after the switch to ok: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a slow write still waits after the switch to ok")
	}
	for _, bad := range []faultfs.Mode{"slow:", "slow:-1s", "slow:2m", "slow:fast"} {
		if err := f.SetMode(bad); err == nil {
			t.Errorf("mode %q accepted", bad)
		}
	}
}
