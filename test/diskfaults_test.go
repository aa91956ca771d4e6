package test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/faultfs"
	"github.com/stratafs/strata/internal/testutil"
)

// diskWriteFsync writes data to a new file and fsyncs it, returning the first
// error (the file is closed either way), bounded: a failing disk must give
// an error, not a hang.
func diskWriteFsync(t *testing.T, path string, data []byte) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			ch <- err
			return
		}
		_, err = f.Write(data)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		ch <- err
	}()
	select {
	case err := <-ch:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("write and fsync of %s hung on a failing disk", path)
		return nil
	}
}

// TestStoreOnFailingDisk: a storage server whose target is on a disk that
// fails (a fault file system): in each failing mode a write and fsync
// through a mount gets the disk's error — EIO for a failing write or
// fsync, ENOSPC for a full disk, EROFS for a read-only one — promptly, and
// once the disk is well again writes work.
func TestStoreOnFailingDisk(t *testing.T) {
	disk := testutil.MountFaultFS(t, t.TempDir(), "disk")
	target := filepath.Join(disk.Dir, "t0")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1,
		TargetDirs: [][]string{{target}}, MountArgs: []string{"--io-timeout", "3s"}})
	mnt := c.Mount(0)
	data := make([]byte, 256<<10)
	if err := diskWriteFsync(t, filepath.Join(mnt, "ok1"), data); err != nil {
		t.Fatalf("healthy disk: %v", err)
	}
	for _, tc := range []struct {
		mode faultfs.Mode
		want syscall.Errno
	}{{faultfs.EIOFsync, syscall.EIO}, {faultfs.EIOWrite, syscall.EIO}, {faultfs.Full, syscall.ENOSPC}, {faultfs.ReadOnly, syscall.EROFS}} {
		m := tc.mode
		disk.SetMode(t, m)
		start := time.Now()
		err := diskWriteFsync(t, filepath.Join(mnt, "during-"+string(m)), data)
		if !errors.Is(err, tc.want) {
			t.Errorf("write and fsync with the store's disk in mode %s: want %v, got %v", m, tc.want, err)
		}
		t.Logf("%s: %v after %v", m, err, time.Since(start).Round(time.Millisecond))
		disk.SetMode(t, faultfs.OK)
		if err := diskWriteFsync(t, filepath.Join(mnt, "after-"+string(m)), data); err != nil {
			t.Errorf("after %s cleared: %v", m, err)
		}
	}
}

// TestMetaOnFailingDisk: a metadata service whose data directory is on a
// disk whose fsync fails. Mutations are answered once in the raft log's
// page cache (DeferSync) and made durable by the log's syncer, so the
// failure shows where durability is asked for: an fsync on a mount gets
// EIO at once; the service then stops serving (it loses leadership, and
// the engine under the raft log stops the process: fail-stop), so later
// operations get EIO after the mount's bound instead of hanging.
func TestMetaOnFailingDisk(t *testing.T) {
	disk := testutil.MountFaultFS(t, t.TempDir(), "disk")
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1,
		MetaArgs: []string{"--data", filepath.Join(disk.Dir, "meta")}, MountArgs: []string{"--io-timeout", "5s"}})
	mnt := c.Mount(0)
	if err := os.Mkdir(filepath.Join(mnt, "before"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	// bounded runs op in the background and returns a channel with its
	// error, reporting the time it took.
	bounded := func(what string, op func() error) chan error {
		start := time.Now()
		ch := make(chan error, 1)
		go func() {
			err := op()
			t.Logf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
			ch <- err
		}()
		return ch
	}
	wait := func(what string, ch chan error, d time.Duration) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(d):
			t.Fatalf("%s hung (> %v) with the metadata disk failing fsync", what, d)
			return nil
		}
	}
	disk.SetMode(t, faultfs.EIOFsync)
	if err := wait("fsync", bounded("fsync", f.Sync), 15*time.Second); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync with the metadata disk failing fsync: want EIO, got %v", err)
	}
	// The mount gives up on an unreachable metadata service after
	// --io-timeout.
	closed := bounded("close", f.Close)
	if err := wait("mkdir", bounded("mkdir", func() error { return os.Mkdir(filepath.Join(mnt, "after"), 0o755) }), 90*time.Second); err == nil {
		t.Error("mkdir succeeded after the metadata service failed to sync its log")
	}
	wait("close", closed, 90*time.Second)
	if err := testutil.WaitFor(10*time.Second, func() error {
		if !c.Meta.Exited() {
			return errors.New("still running")
		}
		return nil
	}); err != nil {
		t.Logf("the metadata service did not stop: %v", err)
	}
}

// TestMetaOnHungDisk: a metadata service whose disk stops completing
// fsyncs (hang-fsync): an fsync and a mkdir on a mount fail with EIO after
// the mount's --io-timeout instead of hanging with the disk; once the disk
// answers again the mount works.
func TestMetaOnHungDisk(t *testing.T) {
	disk := testutil.MountFaultFS(t, t.TempDir(), "disk")
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1,
		MetaArgs: []string{"--data", filepath.Join(disk.Dir, "meta")}, MountArgs: []string{"--io-timeout", "5s"}})
	mnt := c.Mount(0)
	f, err := os.Create(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	disk.SetMode(t, faultfs.HangSync)
	for _, op := range []struct {
		name string
		run  func() error
	}{
		{"fsync", f.Sync},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(mnt, "d"), 0o755) }},
	} {
		start := time.Now()
		ch := make(chan error, 1)
		go func() { ch <- op.run() }()
		select {
		case err := <-ch:
			t.Logf("%s: %v after %v", op.name, err, time.Since(start).Round(time.Millisecond))
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("%s with the metadata disk hung: want EIO, got %v", op.name, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s hung with the metadata disk (--io-timeout is 5 s)", op.name)
		}
	}
	disk.SetMode(t, faultfs.OK)
	if err := testutil.WaitFor(30*time.Second, func() error {
		return os.MkdirAll(filepath.Join(mnt, "after"), 0o755)
	}); err != nil {
		t.Errorf("after the disk answers again: %v", err)
	}
}
