package fuse

import (
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/client"
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
}

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
	if st, err := os.Stat(mountpoint); err != nil {
		return nil, fmt.Errorf("mount point: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("mount point %s is not a directory", mountpoint)
	}
	fs := newFileSystem(c, opts)
	mo := &gofuse.MountOptions{
		AllowOther:    !opts.NoAllowOther && os.Geteuid() == 0,
		FsName:        "strata",
		Name:          "strata",
		MaxWrite:      1 << 20,
		MaxReadAhead:  1 << 20,
		MaxBackground: opts.MaxBackground,
		EnableLocks:   true,
		DirectMount:   true,
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
	slog.Info("mounted", "mountpoint", mountpoint, "meta", c.Config().MetaAddr)
	return &Mounted{fs: fs, server: srv, dir: mountpoint}, nil
}

// Dir is the mount point.
func (m *Mounted) Dir() string { return m.dir }

// Unmount unmounts the file system (retrying for a few seconds while it is
// busy) and waits for the serving loop to end. Open files are released
// by the kernel as part of the unmount.
func (m *Mounted) Unmount() error {
	var err error
	for i := 0; i < 50; i++ {
		if err = m.server.Unmount(); err == nil {
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
