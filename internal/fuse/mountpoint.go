package fuse

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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
		stale := disconnected(dir)
		if !stale && top == fsType && mountinfo.Holder(dir) == "" {
			// No running strata says it serves dir: its daemon may have
			// just died, and the kernel cuts the connection only when
			// the last reference to its /dev/fuse file goes (another
			// process looking at the dead one's descriptors holds it a
			// moment longer). Look again for a few seconds.
			deadline := time.Now().Add(5 * time.Second)
			for !stale && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				stale = disconnected(dir)
			}
		}
		switch {
		case stale && top == fsType:
			if err := detach(dir); err != nil {
				return fmt.Errorf("mount point %s is a stale Strata mount (its daemon is gone) and removing it failed: %w; run: fusermount3 -uz %s", dir, err, dir)
			}
			slog.Warn("removed the stale mount of a Strata that stopped without unmounting", "mountpoint", dir)
		case stale:
			return fmt.Errorf("mount point %s is a disconnected %s mount: unmount it first (fusermount3 -uz %s)", dir, top, dir)
		case top == fsType:
			holder := "the strata serving it"
			if h := mountinfo.Holder(dir); h != "" {
				holder = "the strata serving it, " + h
			}
			return fmt.Errorf("mount point %s is already a Strata mount: stop %s, or unmount it (fusermount3 -u %s)", dir, holder, dir)
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

// disconnected reports whether the FUSE mount at dir has lost its daemon:
// a stat or a statfs of it fails with ENOTCONN. The stat alone is not
// enough: the kernel answers it from the root's cached attributes while
// they are valid, dead daemon or not; a statfs always asks the daemon. A
// statfs that does not return within 2 s (a daemon that hangs) counts as
// connected: a mount that is alive but stuck is not detached.
func disconnected(dir string) bool {
	if _, err := os.Stat(dir); errors.Is(err, syscall.ENOTCONN) {
		return true
	}
	done := make(chan error, 1)
	go func() {
		var st syscall.Statfs_t
		done <- syscall.Statfs(dir, &st)
	}()
	select {
	case err := <-done:
		return errors.Is(err, syscall.ENOTCONN)
	case <-time.After(2 * time.Second):
		return false
	}
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

// ErrBusy: the mount could not be unmounted because processes use it.
var ErrBusy = errors.New("mount point busy")

// Stop unmounts like Unmount; when processes keep the mount busy it
// detaches it lazily instead (it leaves the namespace at once; the
// processes still in it lose access once this daemon exits) and returns
// an error wrapping ErrBusy that names them. It does not wait for the
// serving loop then: that ends only when the last user lets go.
func (m *Mounted) Stop() error {
	err := m.Unmount()
	if err == nil || !isBusy(err) {
		return err
	}
	dir := m.dir
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs // /proc shows absolute paths
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			dir = r
		}
	}
	users := mountUsers(dir)
	if derr := detach(m.dir); derr != nil {
		return fmt.Errorf("unmount %s: %w (in use by %s), and detaching it failed: %v", m.dir, ErrBusy, describeUsers(users), derr)
	}
	return fmt.Errorf("%s was in use by %s: %w; detached it lazily, and they lose access to it as this daemon stops", m.dir, describeUsers(users), ErrBusy)
}

func isBusy(err error) bool {
	return errors.Is(err, syscall.EBUSY) || strings.Contains(err.Error(), "busy")
}

// mountUser is a process with its working directory, root or an open
// file under a mount.
type mountUser struct {
	pid  int
	comm string
}

// mountUsers lists the processes using dir (bounded: the first 20).
func mountUsers(dir string) []mountUser {
	procs, _ := os.ReadDir("/proc")
	var out []mountUser
	under := func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	self := os.Getpid()
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		base := filepath.Join("/proc", e.Name())
		uses := false
		for _, l := range []string{"cwd", "root"} {
			if p, err := os.Readlink(filepath.Join(base, l)); err == nil && under(p) {
				uses = true
			}
		}
		if !uses {
			fds, _ := os.ReadDir(filepath.Join(base, "fd"))
			for _, fd := range fds {
				if p, err := os.Readlink(filepath.Join(base, "fd", fd.Name())); err == nil && under(p) {
					uses = true
					break
				}
			}
		}
		if uses {
			comm, _ := os.ReadFile(filepath.Join(base, "comm"))
			out = append(out, mountUser{pid: pid, comm: strings.TrimSpace(string(comm))})
			if len(out) == 20 {
				break
			}
		}
	}
	return out
}

func describeUsers(us []mountUser) string {
	if len(us) == 0 {
		return "processes not listed here (another mount namespace?)"
	}
	parts := make([]string, len(us))
	for i, u := range us {
		parts[i] = fmt.Sprintf("pid %d (%s)", u.pid, u.comm)
	}
	return strings.Join(parts, ", ")
}
