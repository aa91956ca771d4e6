package nfs

import (
	"context"
	"time"
)

// The gateway's read-ahead: a READ that continues the file's last one
// exactly (a sequential reader: the NFS client asks for the next piece as
// soon as it has the last) starts reading the next piece of the same size
// while its own answer is sent, so that the stores' work on it overlaps
// the answer's way to the client and the client's next call. One piece per
// file, at most maxAheads in the gateway, pieces of minAheadBytes or more
// only (random 4 KiB reads never prefetch), and only while the READ is the
// file's only one in flight (a client with several in flight reads ahead
// by itself, as the kernel's does).
//
// What it may answer stays what a READ at that moment would: a piece is
// dropped by every WRITE of the file through the gateway, by every
// attribute answer about the file that the metadata service gave it
// (GETATTR, ACCESS, LOOKUP, SETATTR, READDIRPLUS: an NFS client's
// close-to-open revalidation, after which it must read what was written
// before), and when it is older than Config.AttrTimeout, the staleness
// the gateway's READ already allows for a change made elsewhere.
// (The client library's own read-ahead stays off in the gateway: it
// prefetches a window for any read near the last, random ones too, and
// knows nothing of the NFS client's revalidations.)

const (
	minAheadBytes = 256 << 10
	maxAheads     = 64 // 64 MiB of pieces at most
)

// ahead is a piece read before it was asked.
type ahead struct {
	off   int64
	want  int     // bytes asked
	buf   *[]byte // from readBufs
	n     int     // bytes read, valid after done
	err   error   // valid after done
	start time.Time
	done  chan struct{}
}

// readData reads count bytes at off of ino for a READ: from the piece the
// last READ started when it is this one, else from the stores; then it
// starts the next piece if the READ continued the last one. release gives
// the data's buffer back once the answer is sent (nil after a failure:
// a store may still be reading into it).
func (s *Server) readData(ctx context.Context, ino uint64, off int64, count int) (data []byte, release func(), err error) {
	of, err := s.files.get(ctx, ino)
	if err != nil {
		return nil, nil, staleIfGone(err)
	}
	defer s.files.put(of, false)
	now := time.Now()
	of.amu.Lock()
	seq := off == of.next
	a := of.ahead
	of.ahead = nil
	of.reading++
	of.amu.Unlock()
	defer func() {
		of.amu.Lock()
		of.reading--
		of.amu.Unlock()
	}()
	var buf *[]byte
	if a != nil {
		if a.off == off && a.want == count && now.Sub(a.start) <= s.cfg.AttrTimeout {
			select {
			case <-a.done:
				if a.err == nil {
					s.files.aheads.Add(-1)
					buf, data = a.buf, (*a.buf)[:a.n]
					s.metrics.readAhead.Inc()
				} else {
					s.files.aheads.Add(-1) // its buffer is dropped: a store may write into it
				}
			case <-ctx.Done():
				s.files.dropAhead(a)
				return nil, nil, ctx.Err()
			}
		} else {
			s.files.dropAhead(a)
		}
	}
	if buf == nil {
		buf = readBufs.Get().(*[]byte)
		n, err := of.f.ReadAtOwned(ctx, (*buf)[:count], off)
		if err != nil && !isEOF(err) {
			return nil, nil, err
		}
		data = (*buf)[:n]
	}
	of.amu.Lock()
	of.next = off + int64(len(data))
	// A client with several READs of the file in flight reads ahead
	// itself (a kernel client's read-ahead): a piece would be read twice.
	alone := of.reading == 1
	of.amu.Unlock()
	if seq && alone && len(data) == count && count >= minAheadBytes && s.cfg.AttrTimeout > 0 {
		s.files.startAhead(of, off+int64(count), count)
	}
	return data, func() { readBufs.Put(buf) }, nil
}

// startAhead reads count bytes at off of of's file in the background, as
// of's piece, unless maxAheads are held.
func (o *openFiles) startAhead(of *openFile, off int64, count int) {
	if o.aheads.Add(1) > maxAheads {
		o.aheads.Add(-1)
		return
	}
	a := &ahead{off: off, want: count, buf: readBufs.Get().(*[]byte), start: time.Now(), done: make(chan struct{})}
	o.mu.Lock()
	of.refs++ // not released while it reads
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		a.n, a.err = of.f.ReadAtOwned(context.Background(), (*a.buf)[:count], off)
		if isEOF(a.err) {
			a.err = nil
		}
		close(a.done)
		o.put(of, false)
	}()
	o.setAhead(of, a)
}

// dropAhead forgets a piece nobody will use, its buffer given back once
// its read has ended.
func (o *openFiles) dropAhead(a *ahead) {
	go func() {
		<-a.done
		if a.err == nil {
			readBufs.Put(a.buf)
		}
		o.aheads.Add(-1)
	}()
}

// setAhead makes a (nil: none) of's piece, dropping the one it had.
func (o *openFiles) setAhead(of *openFile, a *ahead) {
	of.amu.Lock()
	old := of.ahead
	of.ahead = a
	of.amu.Unlock()
	if old != nil {
		o.dropAhead(old)
	}
}

// dropAheadOf drops of's piece (a write of the file).
func (o *openFiles) dropAheadOf(of *openFile) { o.setAhead(of, nil) }

// dropAheadIno drops ino's piece, if the file is open (an attribute answer
// about it: the NFS client may have revalidated).
func (o *openFiles) dropAheadIno(ino uint64) {
	o.mu.Lock()
	of := o.mu.m[ino]
	o.mu.Unlock()
	if of != nil {
		o.dropAheadOf(of)
	}
}
