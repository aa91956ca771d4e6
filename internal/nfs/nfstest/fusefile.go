package nfstest

import (
	"bytes"
	"slices"
	"sync"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// maxUncommitted bounds the UNSTABLE bytes an open file keeps for a
// resend before it COMMITs (the kernel's dirty-page limits).
const maxUncommitted = 64 << 20

// openFile is an open file: the opener's credential, used for its READ,
// WRITE and COMMIT calls (the kernel client's open context), and the
// UNSTABLE writes not committed yet, kept to be sent again if the COMMIT's
// verifier shows the server lost them.
type openFile struct {
	n    *node
	cred *xdr.Authsys_parms

	mu      sync.Mutex
	pending []extent
	bytes   int
	verf    xdr.Writeverf3 // the first write's since the last commit
	hasVerf bool
	mixed   bool // a write since the last commit answered another verifier
}

type extent struct {
	off  uint64
	data []byte
}

// dirHandle is an open directory: its entries, read whole at the first
// READDIR from offset 0.
type dirHandle struct {
	n       *node
	cred    *xdr.Authsys_parms
	mu      sync.Mutex
	entries []gofuse.DirEntry
	read    bool
}

func (fs *nfsFS) newFile(n *node, cred *xdr.Authsys_parms) uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.nextFh++
	fs.files[fs.nextFh] = &openFile{n: n, cred: cred}
	n.opens++
	return fs.nextFh
}

func (fs *nfsFS) file(fh uint64) *openFile {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.files[fh]
}

func (fs *nfsFS) Create(_ <-chan struct{}, in *gofuse.CreateIn, name string, out *gofuse.CreateOut) gofuse.Status {
	dir := fs.node(in.NodeId)
	if dir == nil {
		return gofuse.ENOENT
	}
	args := xdr.CREATE3args{Where: xdr.Diropargs3{Dir: fhOf(dir.fh), Name: name}}
	args.How.Mode = xdr.UNCHECKED
	if in.Flags&syscall.O_EXCL != 0 {
		args.How.Mode = xdr.GUARDED
	}
	sa := args.How.Obj_attributes()
	sa.Mode.Set_it = true
	*sa.Mode.Mode() = in.Mode & 0o7777
	if in.Flags&syscall.O_TRUNC != 0 {
		sa.Size.Set_it = true
		*sa.Size.Size() = 0
	}
	cred := credOf(&in.InHeader)
	var res xdr.CREATE3res
	err := fs.call(cred, ProcCreate, &args, &res)
	if st := fstatus("CREATE", err, res.Status); !st.Ok() {
		return st
	}
	ok := res.Resok()
	if st := fs.entry(cred, dir, name, &ok.Obj, &ok.Obj_attributes, &out.EntryOut); !st.Ok() {
		return st
	}
	n := fs.node(out.NodeId)
	if n == nil {
		return gofuse.EIO
	}
	// No ACCESS for the creator: its open is part of the create, as on
	// any file system (a file created 0444 opens for writing).
	out.OpenOut = gofuse.OpenOut{Fh: fs.newFile(n, cred)}
	return gofuse.OK
}

// openAccess is what an open with flags needs (Linux's nfs_may_open).
func openAccess(flags uint32) uint32 {
	var want uint32
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		want = xdr.ACCESS3_READ
	case syscall.O_WRONLY:
		want = xdr.ACCESS3_MODIFY
	default:
		want = xdr.ACCESS3_READ | xdr.ACCESS3_MODIFY
	}
	if flags&syscall.O_TRUNC != 0 {
		want |= xdr.ACCESS3_MODIFY
	}
	return want
}

func (fs *nfsFS) Open(_ <-chan struct{}, in *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	n := fs.node(in.NodeId)
	if n == nil {
		return gofuse.ENOENT
	}
	cred := credOf(&in.InHeader)
	if st := fs.access(cred, n, openAccess(in.Flags)); !st.Ok() {
		return st
	}
	// Close-to-open: fresh attributes at every open; the cached pages
	// stay only if nobody else changed the file since the last open.
	if _, st := fs.getattr(cred, n); !st.Ok() {
		return st
	}
	fs.mu.Lock()
	if !n.changed {
		out.OpenFlags |= gofuse.FOPEN_KEEP_CACHE
	}
	n.changed = false
	fs.mu.Unlock()
	out.Fh = fs.newFile(n, cred)
	return gofuse.OK
}

func (fs *nfsFS) Read(_ <-chan struct{}, in *gofuse.ReadIn, buf []byte) (gofuse.ReadResult, gofuse.Status) {
	f := fs.file(in.Fh)
	if f == nil {
		return nil, gofuse.EBADF
	}
	want := min(int(in.Size), len(buf))
	got := 0
	for got < want {
		var res xdr.READ3res
		n := min(uint32(want-got), fs.rtmax)
		err := fs.call(f.cred, ProcRead, &xdr.READ3args{File: fhOf(f.n.fh), Offset: in.Offset + uint64(got), Count: n}, &res)
		if st := fstatus("READ", err, res.Status); !st.Ok() {
			return nil, st
		}
		ok := res.Resok()
		fs.saw(f.n, &ok.File_attributes, false)
		got += copy(buf[got:want], ok.Data)
		if ok.Eof || len(ok.Data) == 0 {
			break
		}
	}
	return gofuse.ReadResultData(buf[:got]), gofuse.OK
}

func (fs *nfsFS) Write(_ <-chan struct{}, in *gofuse.WriteIn, data []byte) (uint32, gofuse.Status) {
	f := fs.file(in.Fh)
	if f == nil {
		return 0, gofuse.EBADF
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bytes+len(data) > maxUncommitted {
		if st := fs.commitLocked(f); !st.Ok() {
			return 0, st
		}
	}
	off := in.Offset
	if st := fs.writeLocked(f, off, data); !st.Ok() {
		return 0, st
	}
	f.pending = append(f.pending, extent{off, bytes.Clone(data)})
	f.bytes += len(data)
	return uint32(len(data)), gofuse.OK
}

// writeLocked sends data at off as UNSTABLE writes of at most wtmax bytes
// and notes their verifiers.
func (fs *nfsFS) writeLocked(f *openFile, off uint64, data []byte) gofuse.Status {
	for len(data) > 0 {
		n := min(len(data), int(fs.wtmax))
		var res xdr.WRITE3res
		err := fs.call(f.cred, ProcWrite, &xdr.WRITE3args{File: fhOf(f.n.fh), Offset: off, Count: uint32(n),
			Stable: xdr.UNSTABLE, Data: data[:n]}, &res)
		if st := fstatus("WRITE", err, res.Status); !st.Ok() {
			return st
		}
		ok := res.Resok()
		fs.saw(f.n, &ok.File_wcc.After, true)
		if !f.hasVerf {
			f.verf, f.hasVerf = ok.Verf, true
		} else if ok.Verf != f.verf {
			f.mixed = true
		}
		if ok.Count == 0 {
			return gofuse.EIO
		}
		off += uint64(ok.Count)
		data = data[ok.Count:]
	}
	return gofuse.OK
}

// commitLocked COMMITs the file's UNSTABLE writes; when the verifier is
// not the one the writes answered (the server restarted and may have
// lost them), it sends them again and commits again, at most three times.
func (fs *nfsFS) commitLocked(f *openFile) gofuse.Status {
	for attempt := 0; len(f.pending) > 0; attempt++ {
		var res xdr.COMMIT3res
		err := fs.call(f.cred, ProcCommit, &xdr.COMMIT3args{File: fhOf(f.n.fh)}, &res)
		if st := fstatus("COMMIT", err, res.Status); !st.Ok() {
			return st
		}
		ok := res.Resok()
		fs.saw(f.n, &ok.File_wcc.After, true)
		if ok.Verf == f.verf && !f.mixed {
			f.pending, f.bytes, f.hasVerf = nil, 0, false
			return gofuse.OK
		}
		if attempt == 2 {
			return gofuse.EIO
		}
		resend := slices.Clone(f.pending)
		f.bytes, f.mixed, f.hasVerf = 0, false, false
		f.pending = f.pending[:0]
		for _, e := range resend {
			if st := fs.writeLocked(f, e.off, e.data); !st.Ok() {
				return st
			}
			f.pending = append(f.pending, e)
			f.bytes += len(e.data)
		}
	}
	return gofuse.OK
}

func (fs *nfsFS) commit(fh uint64) gofuse.Status {
	f := fs.file(fh)
	if f == nil {
		return gofuse.EBADF
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return fs.commitLocked(f)
}

// Flush is close(2): close-to-open commits what was written.
func (fs *nfsFS) Flush(_ <-chan struct{}, in *gofuse.FlushIn) gofuse.Status { return fs.commit(in.Fh) }

func (fs *nfsFS) Fsync(_ <-chan struct{}, in *gofuse.FsyncIn) gofuse.Status { return fs.commit(in.Fh) }

// Release is the last close of an open file: a silly-renamed file goes
// with the last open of its inode.
func (fs *nfsFS) Release(_ <-chan struct{}, in *gofuse.ReleaseIn) {
	f := fs.file(in.Fh)
	if f == nil {
		return
	}
	fs.commit(in.Fh) // writes of an mmap may come after the last flush
	fs.mu.Lock()
	delete(fs.files, in.Fh)
	n := f.n
	n.opens--
	var silly *sillyName
	if n.opens == 0 && n.silly != nil {
		silly, n.silly = n.silly, nil
	}
	if n.opens == 0 && n.lookups == 0 {
		delete(fs.nodes, n.id)
		if fs.byFileid[n.fileid] == n {
			delete(fs.byFileid, n.fileid)
		}
	}
	fs.mu.Unlock()
	if silly != nil {
		var res xdr.REMOVE3res
		err := fs.call(silly.cred, ProcRemove, &xdr.REMOVE3args{Object: xdr.Diropargs3{Dir: fhOf(silly.dir), Name: silly.name}}, &res)
		fstatus("REMOVE (silly)", err, res.Status)
	}
}

func (fs *nfsFS) OpenDir(_ <-chan struct{}, in *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	n := fs.node(in.NodeId)
	if n == nil {
		return gofuse.ENOENT
	}
	cred := credOf(&in.InHeader)
	if st := fs.access(cred, n, xdr.ACCESS3_READ); !st.Ok() {
		return st
	}
	fs.mu.Lock()
	fs.nextFh++
	fs.dirs[fs.nextFh] = &dirHandle{n: n, cred: cred}
	out.Fh = fs.nextFh
	fs.mu.Unlock()
	return gofuse.OK
}

// list reads the whole directory with READDIRPLUS (a listing that loses
// its cookie starts over, at most a few times).
func (fs *nfsFS) list(d *dirHandle) gofuse.Status {
	const maxCalls = 100000
	d.entries = append(d.entries[:0], gofuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR}, gofuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR})
	var cookie uint64
	var verf xdr.Cookieverf3
	restarts := 0
	for calls := 0; calls < maxCalls; calls++ {
		var res xdr.READDIRPLUS3res
		err := fs.call(d.cred, ProcReaddirplus, &xdr.READDIRPLUS3args{Dir: fhOf(d.n.fh), Cookie: cookie, Cookieverf: verf,
			Dircount: 32 << 10, Maxcount: 256 << 10}, &res)
		if err == nil && res.Status == xdr.NFS3ERR_BAD_COOKIE && restarts < 3 {
			restarts++
			d.entries, cookie, verf = d.entries[:2], 0, xdr.Cookieverf3{}
			continue
		}
		if st := fstatus("READDIRPLUS", err, res.Status); !st.Ok() {
			return st
		}
		ok := res.Resok()
		fs.saw(d.n, &ok.Dir_attributes, false)
		verf = ok.Cookieverf
		for e := ok.Reply.Entries; e != nil; e = e.Nextentry {
			var mode uint32
			if e.Name_attributes.Attributes_follow {
				var a gofuse.Attr
				attrOf(e.Name_attributes.Attributes(), &a, 0)
				mode = a.Mode
			}
			d.entries = append(d.entries, gofuse.DirEntry{Name: e.Name, Ino: uint64(e.Fileid), Mode: mode})
			cookie = uint64(e.Cookie)
		}
		if ok.Reply.Eof {
			return gofuse.OK
		}
		if ok.Reply.Entries == nil {
			return gofuse.EIO // no progress and no end
		}
	}
	return gofuse.EIO
}

func (fs *nfsFS) ReadDir(_ <-chan struct{}, in *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	fs.mu.Lock()
	d := fs.dirs[in.Fh]
	fs.mu.Unlock()
	if d == nil {
		return gofuse.EBADF
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.Offset == 0 || !d.read { // opendir or rewinddir: read it now
		if st := fs.list(d); !st.Ok() {
			return st
		}
		d.read = true
	}
	for i := int(in.Offset); i < len(d.entries); i++ {
		e := d.entries[i]
		e.Off = uint64(i + 1)
		if !out.AddDirEntry(e) {
			break
		}
	}
	return gofuse.OK
}

func (fs *nfsFS) ReleaseDir(in *gofuse.ReleaseIn) {
	fs.mu.Lock()
	delete(fs.dirs, in.Fh)
	fs.mu.Unlock()
}

// FsyncDir: the export is sync, every namespace change was durable when
// answered.
func (fs *nfsFS) FsyncDir(_ <-chan struct{}, _ *gofuse.FsyncIn) gofuse.Status { return gofuse.OK }
