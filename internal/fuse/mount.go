package fuse

import (
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/mountinfo"
)

// Options tunes a mount. The zero value gives the defaults.
type Options struct {
	// EntryTimeout and AttrTimeout are how long the kernel caches names
	// and attributes (default 1 s). Close-to-open consistency does not
	// depend on them: open always asks the metadata service.
	EntryTimeout time.Duration
	AttrTimeout  time.Duration
	// NoAllowOther restricts the mount to the mounting user (default:
	// every user, with the kernel checking permissions).
	NoAllowOther bool
	// Debug logs every FUSE request (very verbose).
	Debug bool
	// MaxBackground is the kernel's limit of background requests
	// (read-ahead, async direct I/O); default 64.
	MaxBackground int
	// KernelReadAhead is the kernel's read-ahead window for the mount
	// (its backing device's read_ahead_kb). The kernel starts every FUSE
	// mount at 128 KiB, which cuts a sequential reader's requests to
	// 128 KiB however large its reads; a window of at least 1 MiB lets it
	// send 1 MiB READs, an eighth of the round trips. Default
	// DefaultKernelReadAhead; negative keeps the kernel's setting. Needs
	// root (a write to /sys/class/bdi); without it the mount keeps 128
	// KiB and logs why.
	KernelReadAhead int64
}

// DefaultKernelReadAhead is Options.KernelReadAhead's default: one full
// 1 MiB request. More buys a sequential reader nothing here (the client's
// own read-ahead, Config.ReadAheadBytes, keeps the stores busy; 1, 2 and
// 4 MiB measured alike) and costs random mmap readers: a page fault reads
// the whole window around it.
const DefaultKernelReadAhead = 1 << 20

// Mounted is a mounted Strata file system (the result of Mount).
type Mounted struct {
	fs     *fileSystem
	server *gofuse.Server
	dir    string
}

// Mount mounts c's file system at mountpoint and serves it in the
// background until Unmount (or an external umount).
func Mount(c *client.Client, mountpoint string, opts Options) (*Mounted, error) {
	if opts.EntryTimeout <= 0 {
		opts.EntryTimeout = time.Second
	}
	if opts.AttrTimeout <= 0 {
		opts.AttrTimeout = time.Second
	}
	if opts.MaxBackground <= 0 {
		opts.MaxBackground = 64
	}
	if opts.KernelReadAhead == 0 {
		opts.KernelReadAhead = DefaultKernelReadAhead
	}
	if st, err := os.Stat(mountpoint); err != nil {
		return nil, fmt.Errorf("mount point: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("mount point %s is not a directory", mountpoint)
	}
	fs := newFileSystem(c, opts)
	mo := &gofuse.MountOptions{
		AllowOther:    !opts.NoAllowOther && os.Geteuid() == 0,
		FsName:        mountinfo.Source(c.Config().MetaAddr), // names the cluster: admin commands find it from a path
		Name:          "strata",
		MaxWrite:      1 << 20,
		MaxReadAhead:  1 << 20,
		MaxBackground: opts.MaxBackground,
		EnableLocks:   true,
		// O_TRUNC comes with the OPEN rather than as a SETATTR after it
		// (fileops.go Open: a truncate racing reads).
		ExtraCapabilities: gofuse.CAP_ATOMIC_O_TRUNC,
		DirectMount:       true,
		// Our READ answers are memory, never a file descriptor, so
		// go-fuse's splice attempt for each of them only costs system
		// calls (a header written into a pipe, then drained) and, for
		// 1 MiB answers that do not fit a pipe, a log line.
		DisableSplice: true,
		Debug:         opts.Debug,
		Options:       []string{"default_permissions"},
		// The kernel sends attributes with their mode as we report it;
		// the umask was applied by the kernel before create (no
		// FUSE_DONT_MASK), so it is never applied twice.
	}
	if !opts.NoAllowOther && os.Geteuid() != 0 {
		mo.AllowOther = true // needs user_allow_other in /etc/fuse.conf
	}
	if opts.Debug {
		mo.Logger = log.New(os.Stderr, "fuse: ", 0)
	}
	srv, err := gofuse.NewServer(fs, mountpoint, mo)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	if opts.KernelReadAhead > 0 {
		if err := setKernelReadAhead(mountpoint, opts.KernelReadAhead); err != nil {
			slog.Warn("sequential reads stay at the kernel's 128 KiB requests", "err", err)
		}
	}
	slog.Info("mounted", "mountpoint", mountpoint, "meta", c.Config().MetaAddr)
	return &Mounted{fs: fs, server: srv, dir: mountpoint}, nil
}

// setKernelReadAhead sets the read-ahead window of the mount at dir: FUSE
// mounts have a backing device info of their own, named by the mount's
// device number.
func setKernelReadAhead(dir string, bytes int64) error {
	p, err := bdiPath(dir)
	if err != nil {
		return err
	}
	kb := max(bytes>>10, 4)
	if err := os.WriteFile(p, []byte(strconv.FormatInt(kb, 10)), 0); err != nil {
		return fmt.Errorf("set the kernel read-ahead of %s to %d KiB: %w", dir, kb, err)
	}
	return nil
}

// bdiPath is the read_ahead_kb file of the mount at dir.
func bdiPath(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("stat mount point: %w", err)
	}
	return fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}

// Dir is the mount point.
func (m *Mounted) Dir() string { return m.dir }

// Unmount unmounts the file system (retrying for a few seconds while it is
// busy) and waits for the serving loop to end. Open files are released
// by the kernel as part of the unmount.
func (m *Mounted) Unmount() error {
	var err error
	// go-fuse retries a busy unmount itself for about half a second;
	// a few seconds in all let files closed a moment ago go.
	for deadline := time.Now().Add(3 * time.Second); ; {
		if err = m.server.Unmount(); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", m.dir, err)
	}
	m.server.Wait()
	m.fs.releaseAll()
	return nil
}

// Wait blocks until the file system is unmounted.
func (m *Mounted) Wait() { m.server.Wait() }
