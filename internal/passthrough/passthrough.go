// Package passthrough is a minimal FUSE loopback file system whose file
// data goes through the daemon: the baseline "user-space FUSE ceiling" that
// Strata's own mount is judged against (see shared/peer-baselines.md).
//
// # Why not plain fs.NewLoopbackRoot
//
// go-fuse's loopback file handle implements fs.FilePassthroughFder. As root
// on a kernel with FUSE passthrough (Linux >= 6.9) the kernel is then handed
// the backing file and reads and writes it without asking the daemon, so
// the mount measures the local disk, not a user-space data path. A striped
// network file system cannot do that, so the baseline must not either:
// every file handle here is a File, which forwards the data operations of
// the loopback file but deliberately does not implement PassthroughFd.
//
// # Pitfalls
//
// Read still returns the loopback's fuse.ReadResultFd, which the server
// splices from the backing file into /dev/fuse: the bytes pass through the
// daemon's pipe, one FUSE READ round trip per request, which is the cost
// being measured.
package passthrough

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// fileOps is every capability of fs.LoopbackFile except
// fs.FilePassthroughFder. Embedding this interface (not the concrete type)
// promotes exactly these methods.
type fileOps interface {
	fs.FileHandle
	fs.FileReleaser
	fs.FileGetattrer
	fs.FileReader
	fs.FileWriter
	fs.FileGetlker
	fs.FileSetlker
	fs.FileSetlkwer
	fs.FileLseeker
	fs.FileFlusher
	fs.FileFsyncer
	fs.FileSetattrer
	fs.FileAllocater
}

// File is a loopback file handle without kernel passthrough.
type File struct {
	fileOps
}

var _ fs.FileReader = (*File)(nil)

// NewFile wraps a loopback file handle.
func NewFile(lf *fs.LoopbackFile) *File { return &File{fileOps: lf} }

// Options configure a mount.
type Options struct {
	// AllowOther admits all users and lets the kernel check permissions
	// (allow_other + default_permissions); only root may set it.
	AllowOther bool
	// MaxWriteBytes is the largest FUSE read/write request (default 1 MiB).
	MaxWriteBytes int
	// Name is the file system type after "fuse." (default "strata-passthrough").
	Name string
	// WrapFile, if set, replaces the default File for every opened file.
	// Tests use it to build faulty file systems; the returned handle must
	// not implement fs.FilePassthroughFder.
	WrapFile func(lf *fs.LoopbackFile) fs.FileHandle
	// Debug logs every FUSE request.
	Debug bool
}

// node is a loopback node whose Open and Create hand out Files.
type node struct {
	*fs.LoopbackNode
	opts *Options
}

var (
	_ fs.NodeOpener  = (*node)(nil)
	_ fs.NodeCreater = (*node)(nil)
)

func (o *Options) wrap(fh fs.FileHandle) fs.FileHandle {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		// Never hand the kernel a passthrough-capable handle.
		if _, pt := fh.(fs.FilePassthroughFder); pt {
			panic(fmt.Sprintf("passthrough: unexpected file handle %T", fh))
		}
		return fh
	}
	if o.WrapFile != nil {
		return o.WrapFile(lf)
	}
	return NewFile(lf)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.opts.wrap(fh), fl, 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, n.opts.wrap(fh), fl, 0
}

// NewRoot returns the root of a loopback over src whose files are Files.
func NewRoot(src string, opts *Options) (fs.InodeEmbedder, error) {
	if opts == nil {
		opts = &Options{}
	}
	r, err := fs.NewLoopbackRoot(src)
	if err != nil {
		return nil, err
	}
	lr := r.(*fs.LoopbackNode).RootData
	// Every node the loopback creates from now on is a node.
	lr.NewNode = func(rd *fs.LoopbackRoot, parent *fs.Inode, name string, st *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: &fs.LoopbackNode{RootData: rd}, opts: opts}
	}
	root := &node{LoopbackNode: r.(*fs.LoopbackNode), opts: opts}
	lr.RootNode = root
	return root, nil
}

// Mount mounts the loopback of src at mnt and returns the running server;
// the caller unmounts it (server.Unmount) and waits (server.Wait).
func Mount(src, mnt string, opts *Options) (*fuse.Server, error) {
	if opts == nil {
		opts = &Options{}
	}
	root, err := NewRoot(src, opts)
	if err != nil {
		return nil, err
	}
	maxWrite := opts.MaxWriteBytes
	if maxWrite == 0 {
		maxWrite = 1 << 20
	}
	name := opts.Name
	if name == "" {
		name = "strata-passthrough"
	}
	timeout := time.Second
	mo := fuse.MountOptions{
		FsName:       src,
		Name:         name,
		MaxWrite:     maxWrite,
		MaxReadAhead: maxWrite,
		Debug:        opts.Debug,
	}
	if opts.AllowOther {
		mo.AllowOther = true
		mo.Options = append(mo.Options, "default_permissions")
	}
	return fs.Mount(mnt, root, &fs.Options{
		MountOptions: mo,
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
	})
}
