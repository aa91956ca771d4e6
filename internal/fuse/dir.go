package fuse

import (
	"sync"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/rpc"
)

// Directory offsets. The kernel resumes a listing at the offset of the
// last entry it consumed. The metadata service's cursor is a name, so each
// handle numbers the entries it emits with its own counter and remembers
// the name behind each recent offset:
//
//	offset 1 → after ".", 2 → after "..", n ≥ 3 → after names[n]
//
// A listing under concurrent change neither repeats nor skips an entry that
// exists throughout, because every page continues after a name. A seek back
// to an offset older than maxRemembered entries answers EINVAL.
const (
	offDot        = 1
	offDotDot     = 2
	firstEntryOff = 3
	maxRemembered = 16384
	fetchPlain    = 1024 // entries per metadata call for readdir
	fetchPlus     = 256  // for readdirplus (entries carry attributes)
)

// dirHandle is one open directory stream.
type dirHandle struct {
	ino uint64

	mu      sync.Mutex
	nextOff uint64            // offset the next emitted entry gets
	names   map[uint64]string // offset → name of the entry emitted there
	order   []uint64          // offsets in names, oldest first
	// buf holds fetched entries following the name cursor; plus says
	// whether they carry attributes; eof that nothing follows them.
	cursor string
	buf    []rpc.DirEntry
	plus   bool
	eof    bool
	valid  bool
}

func (fs *fileSystem) OpenDir(cancel <-chan struct{}, in *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	a, err := fs.c.GetAttr(fs.ctx(), in.NodeId)
	if err != nil {
		return fs.errno("opendir", in.NodeId, err)
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return gofuse.ENOTDIR
	}
	fh := fs.nextFh.Add(1)
	fs.dirs.Store(fh, &dirHandle{ino: in.NodeId, nextOff: firstEntryOff, names: map[uint64]string{}})
	out.Fh = fh
	return gofuse.OK
}

func (fs *fileSystem) ReleaseDir(in *gofuse.ReleaseIn) { fs.dirs.Delete(in.Fh) }

func (fs *fileSystem) ReadDir(cancel <-chan struct{}, in *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	return fs.readDir(in, out, false)
}

func (fs *fileSystem) ReadDirPlus(cancel <-chan struct{}, in *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	return fs.readDir(in, out, true)
}

func (fs *fileSystem) readDir(in *gofuse.ReadIn, out *gofuse.DirEntryList, plus bool) gofuse.Status {
	v, ok := fs.dirs.Load(in.Fh)
	if !ok {
		return gofuse.EBADF
	}
	d := v.(*dirHandle)
	d.mu.Lock()
	defer d.mu.Unlock()

	add := func(e gofuse.DirEntry, a *rpc.Attr) bool {
		if !plus {
			return out.AddDirEntry(e)
		}
		eo := out.AddDirLookupEntry(e)
		if eo == nil {
			return false
		}
		if a != nil && a.Ino != 0 {
			fs.fillEntry(a, eo)
		}
		return true
	}

	off := in.Offset
	var after string
	switch {
	case off == 0:
		if !add(gofuse.DirEntry{Name: ".", Ino: d.ino, Mode: syscall.S_IFDIR, Off: offDot}, nil) {
			return gofuse.OK
		}
		fallthrough
	case off == offDot:
		if !add(gofuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Off: offDotDot}, nil) {
			return gofuse.OK
		}
		after = ""
	case off == offDotDot:
		after = ""
	default:
		name, ok := d.names[off]
		if !ok {
			fs.log.Debug("readdir at an offset no longer remembered", "ino", d.ino, "off", off)
			return gofuse.Status(syscall.EINVAL)
		}
		after = name
	}
	if !d.valid || d.cursor != after || (plus && !d.plus) {
		d.buf, d.cursor, d.eof, d.valid, d.plus = nil, after, false, true, plus
	}
	for {
		if len(d.buf) == 0 {
			if d.eof {
				return gofuse.OK
			}
			limit := fetchPlain
			if plus {
				limit = fetchPlus
			}
			ents, eof, err := fs.c.ReadDir(fs.ctx(), d.ino, d.cursor, limit, plus)
			if err != nil {
				d.valid = false
				return fs.errno("readdir", d.ino, err)
			}
			d.buf, d.eof, d.plus = ents, eof || len(ents) == 0, plus
			if len(d.buf) == 0 {
				return gofuse.OK
			}
		}
		e := &d.buf[0]
		de := gofuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Mode, Off: d.nextOff}
		var a *rpc.Attr
		if plus {
			a = &e.Attr
		}
		if !add(de, a) {
			return gofuse.OK
		}
		d.remember(d.nextOff, e.Name)
		d.nextOff++
		d.cursor = e.Name
		d.buf = d.buf[1:]
	}
}

func (d *dirHandle) remember(off uint64, name string) {
	d.names[off] = name
	d.order = append(d.order, off)
	if len(d.order) > maxRemembered {
		drop := len(d.order) - maxRemembered/2
		for _, o := range d.order[:drop] {
			delete(d.names, o)
		}
		d.order = append(d.order[:0], d.order[drop:]...)
	}
}
