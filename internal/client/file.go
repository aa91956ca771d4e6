package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/rpc"
)

// File is an open handle of a regular file. Its methods are safe for
// concurrent use (the FUSE kernel module sends concurrent reads and writes
// on one handle).
type File struct {
	c      *Client
	in     *inode
	flags  int
	direct bool // O_DIRECT: no write-behind, no read-ahead
	sync   bool // O_SYNC/O_DSYNC: every write durable before it returns
	attr   rpc.Attr
	ra     readahead
	// owners are the lock owners that took locks through this handle
	// (or are asking for one): a loss of one of their locks after the
	// first request fails the handle (lockErr). handle numbers this open
	// in the service's lock table from its first lock request on (0:
	// none yet); Release drops what was taken through it.
	owners struct {
		sync.Mutex
		m      map[uint64]*handleOwner
		handle uint64
	}

	mu struct {
		sync.Mutex
		released bool
	}
}

// Open opens regular file ino. flags are open(2) flags: O_DIRECT disables
// buffering, O_SYNC/O_DSYNC make every write durable, O_TRUNC truncates.
// The attributes are read fresh from the metadata service (close-to-open);
// a small file a lookup just described is read meanwhile (smallread.go).
func (c *Client) Open(ctx context.Context, ino uint64, flags int) (*File, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	c.deleg.before(ctx, ino)
	tok := c.beginOpen()
	rd := c.startOpenRead(ino, flags) // a small file's data, in parallel (smallread.go)
	var resp rpc.AttrResp
	since := c.sizeSeq.Load()
	failpoint.Hit("client/open-before-getattr")
	req := rpc.GetAttrReq{Ino: ino}
	if c.cfg.InlineBytes > 0 {
		// The bytes of an inline file come with its attributes; its
		// first write has the service move them to the chunks
		// (dropInline), so an open for writing that reads only (the NFS
		// gateway's) leaves them.
		req.Flags = rpc.GetAttrData
	}
	err := c.metaCall(ctx, rpc.MGetAttr, &req, &resp)
	if err == nil && resp.Attr.Inline && req.Flags == 0 {
		// Another client's inline file, on a client that keeps none
		// itself (and so did not ask, in case the service predates
		// inline data): its bytes are not on its targets, ask for them.
		req.Flags = rpc.GetAttrData
		resp = rpc.AttrResp{}
		err = c.metaCall(ctx, rpc.MGetAttr, &req, &resp)
	}
	var f *File
	if err == nil {
		f, err = c.openAttrData(ctx, &resp.Attr, resp.Data, req.Flags != 0, since, flags, tok)
	} else {
		c.endOpen(tok)
		err = metaErr(c, "open", err)
	}
	if rd != nil {
		rd.adopt(f) // f nil: dropped
	}
	return f, err
}

// beginOpen records an open or create under way (see Client.mu.opening);
// openAttr or endOpen ends it.
func (c *Client) beginOpen() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.nextTok++
	c.mu.opening[c.mu.nextTok] = c.metaNow.Load()
	return c.mu.nextTok
}

func (c *Client) endOpen(tok uint64) {
	c.mu.Lock()
	delete(c.mu.opening, tok)
	c.mu.Unlock()
}

// CreateOpen creates a regular file and opens it with flags, in one
// metadata round trip.
func (c *Client) CreateOpen(ctx context.Context, parent uint64, name string, mode, uid, gid uint32, flags int) (*File, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	tok := c.beginOpen()
	since := c.sizeSeq.Load()
	if err := checkName(name); err != nil {
		c.endOpen(tok)
		return nil, err
	}
	writing := c.cfg.InlineBytes > 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY
	if a, _, ok := c.deleg.createLocal(parent, name, mode, uid, gid, writing); ok {
		// Answered here under the directory's create delegation
		// (createq.go): the file's fsync and close wait for its flush.
		f, err := c.openAttr(ctx, &a, since, flags&^syscall.O_TRUNC, tok, false)
		if err != nil {
			return nil, err
		}
		c.xattrs.none(a.Ino, c.cfg.DirAttrTTL)
		c.m.op("create_local")
		return f, nil
	}
	a, ch, err := c.createIdx(ctx, &rpc.CreateReq{Parent: parent, Name: name, Mode: syscall.S_IFREG | mode&07777, Uid: uid, Gid: gid})
	if err != nil {
		c.endOpen(tok)
		return nil, err
	}
	f, err := c.openAttr(ctx, &a, since, flags&^syscall.O_TRUNC, tok, false)
	if err != nil {
		return nil, err
	}
	f.in.noteMetaIndex(ch.Index, ch.Term, c.metaChanged.Load()) // close must make the creation durable
	c.xattrs.none(a.Ino, c.cfg.DirAttrTTL)                      // a new file has no xattrs
	return f, nil
}

// TmpfileOpen makes a regular file in no directory (open(2) with
// O_TMPFILE in directory parent) and opens it with flags. The file has no
// links: its data lives while it is open here and is reaped after the last
// close, unless Link gives it a name first.
func (c *Client) TmpfileOpen(ctx context.Context, parent uint64, mode, uid, gid uint32, flags int) (*File, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	// The open is under way before the file exists, so this client's
	// open-file lists are dated no later than the file's creation until the
	// file is in the open set: the reaper cannot take it in between.
	tok := c.beginOpen()
	since := c.sizeSeq.Load()
	var resp rpc.ChangeResp
	req := &rpc.CreateReq{Hdr: c.hdr(), Parent: parent, Mode: syscall.S_IFREG | mode&07777, Uid: uid, Gid: gid}
	if err := c.metaCall(ctx, rpc.MTmpfile, req, &resp); err != nil {
		c.endOpen(tok)
		return nil, metaErr(c, "tmpfile", err)
	}
	c.m.op("tmpfile")
	f, err := c.openAttr(ctx, &resp.Attr, since, flags&^(syscall.O_TRUNC|syscall.O_CREAT|syscall.O_EXCL), tok, true)
	if err != nil {
		return nil, err
	}
	f.in.noteMetaIndex(resp.Index, resp.Term, c.metaChanged.Load())
	c.xattrs.none(resp.Attr.Ino, c.cfg.DirAttrTTL)
	return f, nil
}

// openAttr opens the file a describes (answered to a call begun when
// sizeSeq was since) and ends the open tok (beginOpen) in the same step as
// the inode joins the open set. tmpfile: a describes a file TmpfileOpen
// just made, which has no links by design.
func (c *Client) openAttr(ctx context.Context, ap *rpc.Attr, since uint64, flags int, tok uint64, tmpfile bool) (*File, error) {
	return c.openAttrs(ctx, ap, nil, false, since, flags, tok, tmpfile)
}

// openAttrData is openAttr for the answer of Open's GetAttr: asked says it
// asked for inline data (rpc.GetAttrData), which data is.
func (c *Client) openAttrData(ctx context.Context, ap *rpc.Attr, data []byte, asked bool, since uint64, flags int, tok uint64) (*File, error) {
	return c.openAttrs(ctx, ap, data, asked, since, flags, tok, false)
}

func (c *Client) openAttrs(ctx context.Context, ap *rpc.Attr, data []byte, asked bool, since uint64, flags int, tok uint64, tmpfile bool) (*File, error) {
	a := *ap
	c.atimes.merge(&a)
	ino := a.Ino
	var err error
	switch {
	case a.Mode&syscall.S_IFMT == syscall.S_IFDIR:
		err = fmt.Errorf("open inode %d: %w", ino, syscall.EISDIR)
	case a.Mode&syscall.S_IFMT != syscall.S_IFREG:
		err = fmt.Errorf("open inode %d of type %o: %w", ino, a.Mode&syscall.S_IFMT, syscall.EINVAL)
	case len(a.Layout.Targets) == 0 || a.Layout.StripeSize == 0:
		err = fmt.Errorf("open inode %d: file has no layout: %w", ino, syscall.EIO)
	}
	if err != nil {
		c.endOpen(tok)
		return nil, err
	}
	c.mu.Lock()
	delete(c.mu.opening, tok)
	in := c.mu.inodes[ino]
	if in == nil && a.Nlink == 0 && !tmpfile {
		// Unlinked by another client before this open reached the
		// service, and not open here: its data may be reaped any
		// moment, as the open files this client reported did not list
		// it. The name was gone before the open: as if it never was.
		c.mu.Unlock()
		return nil, fmt.Errorf("open inode %d: unlinked by another client: %w", ino, syscall.ENOENT)
	}
	if in == nil {
		in = newInode(c, &a)
		c.takeOwedLocked(in)
		c.mu.inodes[ino] = in
		c.mu.unsent[ino] = struct{}{}
		c.kickHeartbeat()
	}
	in.refs++
	c.mu.Unlock()
	in.merge(&a, since)
	if asked {
		in.noteOpenInline(&a, data)
	}
	f := &File{c: c, in: in, flags: flags, attr: a,
		direct: flags&syscall.O_DIRECT != 0,
		sync:   flags&(syscall.O_SYNC|syscall.O_DSYNC) != 0,
	}
	f.ra.init(f)
	if flags&syscall.O_TRUNC != 0 { // as Linux, whatever the access mode
		// The times change even when the file is empty (POSIX); the
		// chunks are cut only when there is something to cut.
		req := rpc.SetAttrReq{Valid: rpc.SetMtimeNow}
		if a.Size > 0 {
			req.Valid |= rpc.SetSize
		}
		na, err := c.SetAttr(ctx, ino, req)
		if err != nil {
			f.Release(ctx)
			return nil, err
		}
		f.attr = na
	}
	c.m.op("open")
	return f, nil
}

// Attr returns the attributes read at open (merged with this client's
// uncommitted writes at that time).
func (f *File) Attr() rpc.Attr { return f.attr }

// Ino is the file's inode number.
func (f *File) Ino() uint64 { return f.in.ino }

// Size is this client's view of the file size: the size at open, grown by
// writes through this client, set by truncates.
func (f *File) Size() uint64 {
	f.in.mu.Lock()
	defer f.in.mu.Unlock()
	return f.in.mu.size
}

// Committed returns the attributes the metadata service answered to this
// client's last open or size commit of the file.
func (f *File) Committed() rpc.Attr {
	f.in.mu.Lock()
	defer f.in.mu.Unlock()
	return f.in.mu.attr
}

// ReadAt reads up to len(p) bytes at off. It returns fewer bytes only at the
// end of the file (then with a nil error: callers treat n < len(p) as EOF).
// Holes read as zeros.
func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	d, err := f.read(ctx, p, off, false, false)
	return d.n, err
}

// ReadAtOwned is ReadAt into a buffer that the caller drops, never reuses,
// after a failure (a store may still be writing into it then): an
// in-process store reads the bytes straight into p (rpc.ReadResp.Direct)
// instead of into a buffer of its own copied into p. The NFS gateway's
// READs, whose buffers come from a pool.
func (f *File) ReadAtOwned(ctx context.Context, p []byte, off int64) (int, error) {
	d, err := f.read(ctx, p, off, false, true)
	return d.n, err
}

// ReadData is the answer of ReadBuffers: the bytes read, in order, in Bufs,
// which may alias the handle's read-ahead buffers. They stay valid and
// unchanged until Release, which must be called exactly once (and is
// cheap when Bufs is the caller's own buffer).
type ReadData struct {
	Bufs [][]byte
	n    int
	ra   *readahead
	held []*raBlock // read-ahead blocks Bufs aliases, referenced until Release
}

// Len is the number of bytes read.
func (d *ReadData) Len() int { return d.n }

// Release gives back the read-ahead buffers the answer aliases.
func (d *ReadData) Release() {
	if d.ra != nil && len(d.held) > 0 {
		d.ra.mu.Lock()
		for _, b := range d.held {
			d.ra.unrefLocked(b)
		}
		d.ra.mu.Unlock()
	}
	d.Bufs, d.held, d.ra = nil, nil, nil
}

// ReadBuffers reads like ReadAt (same sizes, errors and semantics), but
// when prefetched read-ahead blocks hold the whole range it answers them
// instead of copying them into p; otherwise the bytes are read into p and
// Bufs is p[:n]. The FUSE layer hands Bufs to the kernel and releases them
// after the reply, which saves one copy per byte on sequential reads.
func (f *File) ReadBuffers(ctx context.Context, p []byte, off int64) (ReadData, error) {
	return f.read(ctx, p, off, true, false)
}

// read is ReadAt and, with zeroCopy, ReadBuffers; owned: ReadAtOwned.
func (f *File) read(ctx context.Context, p []byte, off int64, zeroCopy, owned bool) (ReadData, error) {
	if off < 0 {
		return ReadData{}, syscall.EINVAL
	}
	if err := f.lockErr(); err != nil {
		return ReadData{}, err
	}
	in := f.in
	for try := 0; ; try++ {
		in.resize.RLock()
		in.mu.Lock()
		if !in.mu.inlineStale {
			break
		}
		in.mu.Unlock()
		in.resize.RUnlock()
		// Inline bytes an answer showed stale are fetched again first
		// (inline.go); the file has no chunks to read them from.
		if try == maxInlineRefetch {
			return ReadData{}, fmt.Errorf("read of inode %d: its inline data changed %d times while read: %w", in.ino, try, syscall.EAGAIN)
		}
		if err := f.c.refetchInline(ctx, in); err != nil {
			return ReadData{}, err
		}
	}
	defer in.resize.RUnlock()
	size := int64(in.mu.size)
	if off >= size {
		in.mu.Unlock()
		return ReadData{}, nil
	}
	n := int64(len(p))
	if off+n > size {
		n = size - off
	}
	p = p[:n]
	if in.readInlineLocked(p, off) {
		in.mu.Unlock()
		f.c.m.opRead.Inc()
		f.c.m.bytesRead.Add(float64(n))
		if f.flags&syscall.O_NOATIME == 0 {
			f.c.touchAtime(in)
		}
		return ReadData{Bufs: [][]byte{p}, n: int(n)}, nil
	}
	in.waitRangeLocked(off, n)
	gen := in.mu.gen
	in.mu.Unlock()
	f.c.m.opRead.Inc()
	f.c.m.bytesRead.Add(float64(n))
	var err error
	var d ReadData
	if f.direct || f.c.cfg.ReadAheadBytes == 0 {
		err = f.c.readRange(ctx, in, p, off, owned)
	} else {
		d, err = f.ra.read(ctx, p, off, size, gen, zeroCopy)
	}
	if err != nil {
		return ReadData{}, err
	}
	if d.held == nil {
		d.Bufs = [][]byte{p}
	}
	d.n = int(n)
	if f.flags&syscall.O_NOATIME == 0 {
		f.c.touchAtime(in)
	}
	return d, nil
}

// readRange reads [off, off+len(p)) from the stores, one call per slot in
// parallel; short chunks and holes read as zeros. owned says that p is the
// caller's for good and is dropped, never reused, after a failure: then an
// in-process store may read straight into it (rpc.ReadResp.Direct).
func (c *Client) readRange(ctx context.Context, in *inode, p []byte, off int64, owned bool) error {
	rs := slotRanges(&in.layout, off, int64(len(p)))
	if len(rs) == 1 {
		return c.readSlot(ctx, in, &rs[0], p, off, owned)
	}
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.readSlot(ctx, in, &rs[i], p, off, owned)
		}()
	}
	wg.Wait()
	return firstErr(errs)
}

// readSlot reads one slot's part of a range and scatters it into p (which
// starts at file offset base).
func (c *Client) readSlot(ctx context.Context, in *inode, r *slotRange, p []byte, base int64, owned bool) error {
	target := in.layout.Targets[r.slot]
	// A mirror group's copies share the reads by inode and group: a chunk
	// is read from one copy (spreadKey).
	spread := spreadKey(in.ino, target)
	var resp rpc.ReadResp
	// The answer is copied once, by the transport, into Into: straight
	// into p when the slot's part is contiguous there, else into a
	// scratch buffer scattered below.
	if len(r.ext) == 1 {
		e := r.ext[0]
		dst := p[e.FileOff-base : e.FileOff-base+e.Len]
		resp.Into = dst
		resp.Direct = owned
		req := &rpc.ReadReq{Chunk: rpc.ChunkID{Target: target, Ino: in.ino}, Off: uint64(r.chunkOff), Len: uint32(r.n)}
		if err := c.chunkCall(ctx, "read", &req.Chunk, spread, rpc.SRead, req, &resp); err != nil {
			return err
		}
		clear(dst[len(resp.Data):])
		return nil
	}
	var scratch []byte
	if r.n <= maxWbufBytes {
		scratch = getBuf()[:r.n]
		defer putBuf(scratch)
	} else {
		scratch = make([]byte, r.n)
	}
	resp.Into = scratch
	req := &rpc.ReadReq{Chunk: rpc.ChunkID{Target: target, Ino: in.ino}, Off: uint64(r.chunkOff), Len: uint32(r.n)}
	if err := c.chunkCall(ctx, "read", &req.Chunk, spread, rpc.SRead, req, &resp); err != nil {
		return err
	}
	data := resp.Data
	for _, e := range r.ext {
		dst := p[e.FileOff-base : e.FileOff-base+e.Len]
		src := e.ChunkOff - r.chunkOff
		k := 0
		if src < int64(len(data)) {
			k = copy(dst, data[src:])
		}
		clear(dst[k:])
	}
	return nil
}

// WriteAt writes p at off. Buffered handles copy p into write-behind
// buffers and return at once (blocking only while the client's
// write-behind budget is used up); the data reaches the stores in the
// background, and a failure is reported by the next WriteAt, Flush, Fsync
// or Release. O_DIRECT and O_SYNC handles write through before returning,
// and so do large buffered writes (Config.WriteThroughBytes), which are
// then not made durable before the next fsync or close. Nothing is written
// at or past the largest size of the file's layout (layout.MaxFileSize): a
// write that starts there fails with EFBIG, one that crosses it is cut
// short at it (as write(2) does at a file size limit).
func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if len(p) == 0 {
		return 0, nil
	}
	in := f.in
	if limit := in.layout.MaxFileSize(); int64(len(p)) > limit-off {
		if off >= limit {
			return 0, fmt.Errorf("write at %d of inode %d: the largest file of its layout is %d bytes: %w", off, in.ino, limit, syscall.EFBIG)
		}
		p = p[:limit-off]
	}
	if err := f.lockErr(); err != nil {
		return 0, err
	}
	for {
		in.resize.RLock()
		if !in.heldInline() {
			break
		}
		in.resize.RUnlock()
		if err := f.c.dropInline(ctx, in); err != nil {
			return 0, err
		}
	}
	defer in.resize.RUnlock()
	n := int64(len(p))
	f.c.m.opWrite.Inc()
	rs := slotRanges(&in.layout, off, n)
	// A large buffered write goes through when other handles write too:
	// concurrent writers keep the stores busy by themselves, and the copy
	// into write-behind would only burn memory bandwidth. A lone writer
	// keeps write-behind, which overlaps its next write with the stores'
	// work on this one.
	now := nowNs()
	large := !f.direct && !f.sync && f.c.cfg.WriteThroughBytes > 0 && n >= f.c.cfg.WriteThroughBytes &&
		contiguousSlots(rs) && f.c.concurrentWriter(f, now)
	through := f.direct || f.sync || large
	if !through {
		f.c.budget.acquire(n)
	}
	in.mu.Lock()
	if err := in.mu.err; err != nil && (!through || large) {
		in.mu.Unlock()
		if !through {
			f.c.budget.release(n)
		}
		return 0, err
	}
	var mine []*wbuf
	for i := range rs {
		r := &rs[i]
		if through {
			w := &wbuf{slot: r.slot, chunkOff: r.chunkOff, sync: f.sync, sticky: large}
			if len(r.ext) == 1 {
				w.buf = p[r.ext[0].FileOff-off:][:r.n] // caller's memory: we wait below
			} else {
				w.buf = gather(make([]byte, 0, r.n), r, p, off)
			}
			// Buffered data of other handles for these bytes goes first.
			if pw := in.mu.pending[r.slot]; pw != nil && pw.overlaps(r.slot, w.chunkOff, w.end()) {
				in.mu.pending[r.slot] = nil
				in.submitLocked(pw)
			}
			in.submitLocked(w)
			mine = append(mine, w)
			continue
		}
		pw := in.mu.pending[r.slot]
		if pw != nil && (pw.end() != r.chunkOff || len(pw.buf)+int(r.n) > maxWbufBytes) {
			in.mu.pending[r.slot] = nil
			in.submitLocked(pw)
			pw = nil
		}
		if pw == nil {
			pw = &wbuf{slot: r.slot, chunkOff: r.chunkOff, budgeted: true}
			switch {
			case r.n >= maxWbufBytes/4:
				pw.buf, pw.pooled = getBuf(), true
			case r.n <= smallWbufBytes:
				pw.buf, pw.pooled = getSmallBuf(), true
			default:
				pw.buf = make([]byte, 0, r.n)
			}
		}
		pw.buf = gather(pw.buf, r, p, off)
		if len(pw.buf) >= maxWbufBytes {
			in.mu.pending[r.slot] = nil
			in.submitLocked(pw)
		} else {
			in.mu.pending[r.slot] = pw
		}
	}
	if end := uint64(off + n); end > in.mu.size {
		in.mu.size = end
	}
	in.mu.mtime = now
	in.mu.dirty = true
	in.mu.gen++
	in.mu.Unlock()
	if !through {
		return int(n), nil
	}
	for _, w := range mine {
		<-w.done
	}
	for _, w := range mine {
		if w.err != nil {
			return 0, w.err
		}
	}
	if f.sync {
		if err := in.commit(ctx, nil); err != nil {
			return 0, err
		}
	}
	return int(n), nil
}

// contiguousSlots reports that every slot's part of a range is one piece
// of the caller's buffer (written through without a gather copy).
func contiguousSlots(rs []slotRange) bool {
	for i := range rs {
		if len(rs[i].ext) != 1 {
			return false
		}
	}
	return true
}

// gather appends the bytes of r's extents (taken from p, which starts at
// file offset base) to buf.
func gather(buf []byte, r *slotRange, p []byte, base int64) []byte {
	for _, e := range r.ext {
		buf = append(buf, p[e.FileOff-base:e.FileOff-base+e.Len]...)
	}
	return buf
}

// Flush is called on every close of a file descriptor. It drains
// write-behind to the stores and commits size and mtime. Under the sync
// policy it first has the stores put what the file's handles wrote on
// stable storage, and the size commit is then a durable one (it covers
// every metadata change applied before it, the file's create included);
// under strict it is Fsync, which also waits for the file's own namespace
// changes when no commit covered them; under async the stores are not
// asked to sync and the size commit is deferred: answered once applied,
// with no metadata log sync to wait for (the file's fsync, through this
// handle or a later one of this client, waits for and checks it).
func (f *File) Flush(ctx context.Context) error {
	if f.c.cfg.SyncPolicy == SyncPolicyStrict {
		return f.Fsync(ctx)
	}
	f.c.m.op("flush")
	in := f.in
	f.c.deleg.closing(in.ino)
	if f.c.cfg.SyncPolicy == SyncPolicyAsync {
		if f.c.deleg.foldInline(in, f.c.cfg.InlineBytes) {
			// The file's data rides its queued create (inline.go).
			return f.lockErr()
		}
		if err := in.drain(ctx); err != nil {
			return err
		}
		if err := in.takeErr(); err != nil {
			return err
		}
		if f.c.deleg.fold(in, nil) {
			// The file's create, answered here, is still queued and
			// now carries its size: nothing to wait for (createq.go).
			return f.lockErr()
		}
		if err := f.c.deleg.created(ctx, in, false); err != nil {
			return err
		}
		if err := in.commitDeferred(ctx); err != nil {
			return err
		}
		return f.lockErr()
	}
	if f.c.deleg.foldInline(in, f.c.cfg.InlineBytes) {
		// Data, size and creation in one entry: wait for it to be
		// durable (one log sync for the batch).
		return f.syncFolded(ctx)
	}
	if err := in.drainSynced(ctx); err != nil {
		return err
	}
	if err := in.takeErr(); err != nil {
		return err
	}
	alloc, err := in.syncTargets(ctx)
	if err != nil {
		return err
	}
	if f.c.deleg.fold(in, alloc) {
		// The size rides the queued create: wait for it, then for its
		// entry to be durable (one log sync for the batch).
		return f.syncFolded(ctx)
	}
	if err := f.c.deleg.created(ctx, in, false); err != nil { // the durable commit covers it
		return err
	}
	if err := in.commit(ctx, alloc); err != nil {
		return err
	}
	return f.lockErr()
}

// syncFolded waits for the queued create that a close folded the file's
// size (and maybe data) into, then for its entry to be durable.
func (f *File) syncFolded(ctx context.Context) error {
	in := f.in
	if err := f.c.deleg.created(ctx, in, true); err != nil {
		return err
	}
	in.mu.Lock()
	idx, term, idxSeq := in.mu.metaIndex, in.mu.metaTerm, in.mu.metaIndexSeq
	in.mu.Unlock()
	if idx != 0 && f.c.metaDurable.Load() < idxSeq {
		if err := f.c.syncMetaIndex(ctx, idx, term); err != nil {
			return err
		}
	}
	return f.lockErr()
}

// Seek answers lseek's SEEK_DATA (data) or SEEK_HOLE (!data): the first
// byte of data, or of a hole, at or after off. Holes are the ranges no
// write reached and punched ranges, as the targets' chunk files keep them;
// the end of the file starts one. ENXIO when off is at or past the end, or
// for SEEK_DATA when only holes follow. Writes buffered here are sent
// first, so that what this client wrote counts.
func (f *File) Seek(ctx context.Context, off int64, data bool) (int64, error) {
	if off < 0 {
		return 0, fmt.Errorf("seek to %d: %w", off, syscall.EINVAL)
	}
	in := f.in
	if err := in.drain(ctx); err != nil {
		return 0, err
	}
	size := int64(f.Size())
	if off >= size {
		return 0, fmt.Errorf("seek from %d in a file of %d bytes: %w", off, size, syscall.ENXIO)
	}
	f.c.m.op("seek")
	if in.heldInline() { // no chunks: all data, then the hole at the end
		if data {
			return off, nil
		}
		return size, nil
	}
	// Each chunk is asked from the first of its bytes at or after off; the
	// file's answer is the nearest of theirs (the striping is monotonic in
	// each chunk).
	l := in.layout
	type answer struct {
		off   int64
		found bool
		err   error
	}
	answers := make([]answer, len(l.Targets))
	slots := make([]int, len(l.Targets))
	for i := range slots {
		slots[i] = i
	}
	in.eachSlot(slots, func(slot int, target uint32) {
		var resp rpc.SeekResp
		req := &rpc.SeekReq{Chunk: rpc.ChunkID{Target: target, Ino: in.ino}, Off: uint64(l.ChunkFrom(off, slot)), Data: data}
		err := f.c.chunkCall(ctx, "seek", &req.Chunk, spreadKey(in.ino, target), rpc.SSeek, req, &resp)
		answers[slot] = answer{off: l.FileOff(slot, int64(resp.Off)), found: resp.Found, err: err}
	})
	best := size // a hole starts at the end
	for _, a := range answers {
		if a.err != nil {
			return 0, a.err
		}
		if a.found && a.off < best {
			best = a.off
		}
	}
	if data && best >= size {
		return 0, fmt.Errorf("no data after %d in a file of %d bytes: %w", off, size, syscall.ENXIO)
	}
	return best, nil
}

// copyPiece is how much CopyRange moves per step.
const copyPiece = 1 << 20

// CopyRange copies up to n bytes from src at srcOff to dst at dstOff
// through this client, without the data crossing into the kernel and out
// again (copy_file_range). It stops early at src's end, when cancel is
// closed, or on an error, and returns what was copied; the copy is
// buffered in dst like any write (made durable by its fsync or close). The
// ranges must not overlap within one file (the kernel checks that).
func CopyRange(ctx context.Context, src *File, srcOff int64, dst *File, dstOff, n int64, cancel <-chan struct{}) (int64, error) {
	if srcOff < 0 || dstOff < 0 || n < 0 {
		return 0, fmt.Errorf("copy %d bytes from %d to %d: %w", n, srcOff, dstOff, syscall.EINVAL)
	}
	// What this client buffered for src is on the stores before it is
	// read (its own read path does not look into write-behind).
	if err := src.in.drain(ctx); err != nil {
		return 0, err
	}
	src.c.m.op("copy_file_range")
	buf := getBuf()[:copyPiece]
	defer putBuf(buf)
	var done int64
	for done < n {
		select {
		case <-cancel:
			if done > 0 {
				return done, nil
			}
			return 0, syscall.EINTR
		default:
		}
		want := min(copyPiece, n-done)
		d, err := src.ReadBuffers(ctx, buf[:want], srcOff+done)
		if err != nil {
			return done, err
		}
		got := int64(d.Len())
		for _, b := range d.Bufs {
			k, werr := dst.WriteAt(ctx, b, dstOff+done)
			done += int64(k)
			if werr != nil || k < len(b) { // an error, or cut short at dst's size limit
				d.Release()
				if done > 0 {
					return done, nil
				}
				return 0, werr
			}
		}
		d.Release()
		if got < want {
			break // src ends here
		}
	}
	return done, nil
}

// SetLk is Client.SetLk for a lock taken through this handle: a later
// loss of the owner's locks on the file fails the handle (lockErr), and
// Release drops the lock if the owner still holds it then (the OFD locks
// and flocks of an open file description die with it; a process's POSIX
// locks went at its close already).
func (f *File) SetLk(ctx context.Context, l Lock, wait bool, cancel <-chan struct{}) error {
	if l.Type == rpc.LockUnlock {
		// What was written under the lock reaches the stores before
		// another client can take the lock and read (as NFS flushes
		// before an unlock); a write error is reported at fsync or close.
		_ = f.in.drain(ctx)
		return f.c.SetLk(ctx, l, wait, cancel)
	}
	// Recorded before the request, so that a loss racing with the grant
	// counts; forgotten again when the request was refused and the owner
	// holds nothing through this handle.
	f.owners.Lock()
	if f.owners.handle == 0 {
		f.owners.handle = f.c.locks.handles.Add(1)
	}
	l.Handle = f.owners.handle
	o := f.owners.m[l.Owner]
	if o == nil {
		if f.owners.m == nil {
			f.owners.m = map[uint64]*handleOwner{}
		}
		o = &handleOwner{since: f.in.lost.count()}
		f.owners.m[l.Owner] = o
	}
	o.asking++
	f.owners.Unlock()
	err := f.c.SetLk(ctx, l, wait, cancel)
	f.owners.Lock()
	o.asking--
	switch {
	case err == nil:
		o.took = true
		// Read-ahead of before the grant may predate what the previous
		// holder wrote on another mount.
		f.in.invalidate()
	case !o.took && o.asking == 0 && refused(err):
		delete(f.owners.m, l.Owner)
	}
	f.owners.Unlock()
	f.mu.Lock()
	released := f.mu.released
	f.mu.Unlock()
	if released && !refused(err) {
		// The handle was closed while the request was under way (an
		// interrupted wait): Release may have dropped the handle's locks
		// before this one was granted.
		if cerr := f.c.closeHandleLocks(ctx, f.in.ino, l.Handle); cerr != nil {
			f.c.log.Warn("dropping a lock granted after its file was closed", "ino", f.in.ino, "err", cerr)
		}
	}
	return err
}

// handleOwner is a lock owner of a handle.
type handleOwner struct {
	since  uint64 // the inode's loss count (lostLocks.n) at its first request
	asking int    // its requests in flight
	took   bool   // one was granted
}

// refused reports whether a lock request's error means that no lock was
// granted (a conflict or a deadlock); after other errors (a timeout, a
// cancelled wait) the service may hold the lock nonetheless.
func refused(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EDEADLK)
}

// lockErr is EIO when a lock that an owner took through this handle was
// lost afterwards (see Client.lockLost): as with NFS, the handle's later
// reads and writes fail rather than run unprotected, and so does its close
// — after writing back what it had buffered. Other handles of the file
// (another process's, or one its owner took no lock through) and handles
// opened after the loss work.
func (f *File) lockErr() error {
	if f.in.lost.count() == 0 {
		return nil
	}
	f.owners.Lock()
	defer f.owners.Unlock()
	lost := false
	for o, ho := range f.owners.m {
		if f.in.lost.since(o) > ho.since {
			lost = true
			break
		}
	}
	if !lost {
		return nil
	}
	return fmt.Errorf("inode %d: a lock this client held on the file was lost while the file was open "+
		"(the metadata service expired this client's session, or gave the lock to another client after a restart): %w", f.in.ino, syscall.EIO)
}

// Fsync drains write-behind, makes every target this client wrote since
// the last sync durable (SSync), and commits size and mtime. It returns the
// first write-behind error not reported yet.
func (f *File) Fsync(ctx context.Context) error {
	f.c.m.op("fsync")
	in := f.in
	if err := f.c.deleg.created(ctx, in, true); err != nil {
		return err
	}
	if err := in.drainSynced(ctx); err != nil {
		return err
	}
	if err := in.takeErr(); err != nil {
		return err
	}
	alloc, err := in.syncTargets(ctx)
	if err != nil {
		return err
	}
	if err := in.commit(ctx, alloc); err != nil {
		return err
	}
	in.mu.Lock()
	seq, idx, term, idxSeq := in.mu.metaSeq, in.mu.metaIndex, in.mu.metaTerm, in.mu.metaIndexSeq
	in.mu.Unlock()
	if err := f.c.syncMetaUpTo(ctx, seq); err != nil { // mode changes…
		return err
	}
	if f.c.metaDurable.Load() < idxSeq { // else a durable answer (the size commit) came after the creation
		if err := f.c.syncMetaIndex(ctx, idx, term); err != nil { // the file's creation
			return err
		}
	}
	return f.lockErr()
}

// Release closes the handle: it flushes like Flush (cheap when nothing is
// dirty), then drops the locks taken through the handle that are still
// held (closeHandleLocks) and read-ahead buffers, and forgets the inode
// when this was its last handle in this client.
func (f *File) Release(ctx context.Context) error {
	f.mu.Lock()
	if f.mu.released {
		f.mu.Unlock()
		return nil
	}
	f.mu.released = true
	f.mu.Unlock()
	err := f.Flush(ctx)
	f.owners.Lock()
	handle := f.owners.handle
	f.owners.Unlock()
	if handle != 0 {
		if lerr := f.c.closeHandleLocks(ctx, f.in.ino, handle); lerr != nil {
			f.c.log.Warn("releasing the locks of a closed file", "ino", f.in.ino, "err", lerr)
		}
	}
	f.ra.drop()
	c := f.c
	c.mu.Lock()
	f.in.refs--
	if f.in.refs == 0 {
		// A write through another path could still be buffered only if a
		// handle was used after release; nothing is lost: Flush drained.
		delete(c.mu.inodes, f.in.ino)
		// Every handle's Flush has returned (each Release flushes
		// before it counts down): what the inode owes is final.
		f.in.mu.Lock()
		owed := f.in.owedLocked()
		f.in.mu.Unlock()
		c.keepOwedLocked(f.in.ino, owed)
		delete(c.mu.unsent, f.in.ino)
	}
	c.mu.Unlock()
	return err
}

// Punch deallocates [off, off+n) (fallocate PUNCH_HOLE|KEEP_SIZE): the
// range reads as zeros; the size does not change.
func (f *File) Punch(ctx context.Context, off, n int64) error {
	if off < 0 || n <= 0 {
		return syscall.EINVAL
	}
	in := f.in
	if in.heldInline() {
		if err := f.c.dropInline(ctx, in); err != nil {
			return err
		}
	}
	if err := in.drain(ctx); err != nil {
		return err
	}
	in.mu.Lock()
	size := int64(in.mu.size)
	in.mu.gen++
	in.mu.touched = true
	in.mu.Unlock()
	if off >= size {
		return nil
	}
	if off+n > size {
		n = size - off
	}
	rs := slotRanges(&in.layout, off, n)
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := in.layout.Targets[rs[i].slot]
			req := &rpc.PunchReq{Chunk: rpc.ChunkID{Target: t, Ino: in.ino}, Off: uint64(rs[i].chunkOff), Len: uint64(rs[i].n)}
			errs[i] = f.c.storeCall(ctx, "punch", &req.Chunk, rpc.SPunch, req, nil)
		}()
	}
	wg.Wait()
	in.mu.Lock()
	in.mu.mtime = nowNs()
	in.mu.dirty = true
	for _, r := range rs {
		in.mu.unsynced[r.slot] = true
		in.markAllocLocked(r.slot)
	}
	in.mu.Unlock()
	f.c.m.op("punch")
	return firstErr(errs)
}

// CheckRange is EFBIG when [off, off+n) reaches past the largest size of
// the file's layout (layout.MaxFileSize), as fallocate(2) answers for any
// mode there.
func (f *File) CheckRange(off, n int64) error {
	if limit := f.in.layout.MaxFileSize(); n > limit-off {
		return fmt.Errorf("range of %d bytes at %d of inode %d: the largest file of its layout is %d bytes: %w", n, off, f.in.ino, limit, syscall.EFBIG)
	}
	return nil
}

// Allocate makes the file at least off+n bytes long (fallocate mode 0).
// Space is not reserved on the targets: chunks grow sparse. EFBIG past the
// largest size of the file's layout.
func (f *File) Allocate(ctx context.Context, off, n int64) error {
	if off < 0 || n <= 0 {
		return syscall.EINVAL
	}
	if err := f.CheckRange(off, n); err != nil {
		return err
	}
	end := uint64(off + n)
	if end <= f.Size() {
		return nil
	}
	_, err := f.c.SetAttr(ctx, f.in.ino, rpc.SetAttrReq{Valid: rpc.SetSize, Size: end})
	return err
}

// touchAtime updates the access time relatime-style: only when atime is
// not newer than mtime or ctime, or older than a day. The update is noted
// for the next batch (atime.go), which sends it within atimeInterval; it
// does not change ctime.
func (c *Client) touchAtime(in *inode) {
	now := nowNs()
	in.mu.Lock()
	a := &in.mu.attr
	need := a.Atime <= a.Mtime || a.Atime <= a.Ctime || now-a.Atime > int64(24*time.Hour)
	if !need {
		in.mu.Unlock()
		return
	}
	a.Atime = now
	in.mu.Unlock()
	c.atimes.note(in.ino, now)
}
