package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/faultfs"
)

// FaultFS is a disk that fails on demand under a test's directory: a
// `strata faultfs` process serving a loopback of Source at Dir, switched
// between faultfs modes (EIO on write or fsync, read-only, full, hung) by
// SetMode while it stays mounted.
type FaultFS struct {
	Dir     string // the mount point: put a daemon's data directory here
	Source  string // the backing directory
	Control string // the control socket
	Proc    *Proc
}

// MountFaultFS mounts a fault file system (mode ok) at dir/name over
// dir/name.src and unmounts it at test cleanup. Mount it before starting
// the daemons that use it, so that at cleanup they stop first. It skips
// the test where FUSE cannot work.
func MountFaultFS(t testing.TB, dir, name string) *FaultFS {
	t.Helper()
	RequireFUSE(t)
	f := &FaultFS{Dir: filepath.Join(dir, name), Source: filepath.Join(dir, name+".src"), Control: filepath.Join(dir, name+".ctl")}
	for _, d := range []string{f.Dir, f.Source} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.Proc = StartProc(t, dir, name+"-faultfs", nil, Binary(t), "faultfs", "--source", f.Source, "--control", f.Control, f.Dir)
	t.Cleanup(func() {
		_, _ = faultfs.Send(f.Control, faultfs.OK) // let held operations go
		_ = f.Proc.Stop(10 * time.Second)
		ForceUnmount(f.Dir)
	})
	if err := WaitFor(20*time.Second, func() error {
		if f.Proc.Exited() {
			return errors.New("strata faultfs exited:\n" + f.Proc.Tail(20))
		}
		if !IsMounted(f.Dir) {
			return errors.New("not mounted yet")
		}
		_, err := faultfs.Send(f.Control, "")
		return err
	}); err != nil {
		t.Fatalf("fault file system at %s: %v", f.Dir, err)
	}
	return f
}

// SetMode switches the fault file system's mode; operations that start
// after it returns see the new mode.
func (f *FaultFS) SetMode(t testing.TB, m faultfs.Mode) {
	t.Helper()
	got, err := faultfs.Send(f.Control, m)
	if err != nil {
		t.Fatal(err)
	}
	if got != m {
		t.Fatalf("fault file system: asked for mode %s, got %s", m, got)
	}
}
