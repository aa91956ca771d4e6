package fuse

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/mountinfo"
)

// fsType is the file system type our mounts show in /proc/self/mountinfo
// (FUSE prefixes the Name of the mount options).
const fsType = "fuse.strata"

// PrepareMountPoint makes dir (absolute, clean) ready to mount on,
// creating it if missing and create is set.
// A Strata mount whose daemon died (kill -9, a crash) leaves dir
// disconnected: every access fails with ENOTCONN, which would make the
// next start fail with an obscure "file exists". Such a stale Strata mount
// is detached; a live Strata mount, or a disconnected mount of another
// file system, is refused with what to do instead.
func PrepareMountPoint(dir string, create bool) error {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r // the table lists where mounts really are
	}
	top, ok, err := topMount(dir)
	if err != nil {
		return err
	}
	if ok {
		_, statErr := os.Stat(dir)
		stale := errors.Is(statErr, syscall.ENOTCONN)
		switch {
		case stale && top == fsType:
			if err := detach(dir); err != nil {
				return fmt.Errorf("mount point %s is a stale Strata mount (its daemon is gone) and removing it failed: %w; run: fusermount3 -uz %s", dir, err, dir)
			}
			slog.Warn("removed the stale mount of a Strata that stopped without unmounting", "mountpoint", dir)
		case stale:
			return fmt.Errorf("mount point %s is a disconnected %s mount: unmount it first (fusermount3 -uz %s)", dir, top, dir)
		case top == fsType:
			return fmt.Errorf("mount point %s is already a Strata mount: stop the strata serving it, or unmount it (fusermount3 -u %s)", dir, dir)
		}
	}
	if !create {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create mount point: %w", err)
	}
	return nil
}

// topMount returns the type of the uppermost file system mounted exactly
// at dir (an absolute, clean path), if any.
func topMount(dir string) (fstype string, ok bool, err error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return "", false, err
	}
	for _, m := range ms {
		if m.Point == dir {
			fstype, ok = m.FSType, true // later lines lie over earlier ones
		}
	}
	return fstype, ok, nil
}

// detach lazily unmounts dir: directly as root, else through fusermount3.
func detach(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	if err == nil || !errors.Is(err, unix.EPERM) {
		return err
	}
	out, err := exec.Command("fusermount3", "-uz", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fusermount3 -uz: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
