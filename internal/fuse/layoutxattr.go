package fuse

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/layout"
)

// layoutXattr (layout.XattrName) is how `strata stripe` reads a file's
// layout (JSON, layout.Xattr) and sets a directory's default. It is not
// listed by listxattr. For a regular file it also carries the largest size
// the file can have (layout.MaxFileSize): FUSE has no other way to say it
// (statfs has no field for it, and pathconf's _PC_FILESIZEBITS is answered
// by the C library from the file system type without asking the mount).
const layoutXattr = layout.XattrName

func (fs *fileSystem) getLayoutXattr(ino uint64, dest []byte) (uint32, gofuse.Status) {
	a, err := fs.c.GetAttr(fs.ctx(), ino)
	if err != nil {
		return 0, fs.errno("get layout", ino, err)
	}
	l := layout.Xattr{StripeSize: a.Layout.StripeSize, StripeCount: a.Layout.StripeCount, Targets: a.Layout.Targets}
	if l.Targets == nil {
		l.Targets = []uint32{}
	}
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		l.MaxFileBytes = a.Layout.MaxFileSize()
	}
	v, _ := json.Marshal(l)
	if len(dest) < len(v) {
		return uint32(len(v)), gofuse.ERANGE
	}
	return uint32(copy(dest, v)), gofuse.OK
}

func (fs *fileSystem) setLayoutXattr(ino uint64, value []byte) gofuse.Status {
	var count, size uint64
	for _, kv := range strings.Split(strings.TrimSpace(string(value)), ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		if !ok || err != nil {
			return fs.errno("set layout", ino, fmt.Errorf("bad layout %q: %w", value, syscall.EINVAL))
		}
		switch strings.TrimSpace(k) {
		case "stripe_count":
			count = n
		case "stripe_size":
			size = n
		default:
			return fs.errno("set layout", ino, fmt.Errorf("bad layout key %q: %w", k, syscall.EINVAL))
		}
	}
	_, err := fs.c.SetDirLayout(fs.ctx(), ino, uint32(size), uint32(count))
	return fs.errno("set layout", ino, err)
}
