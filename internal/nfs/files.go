package nfs

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratafs/strata/internal/client"
)

// openFiles keeps the client.File of every file READ or WRITE touched
// recently: NFS has no open and close, and opening a file for each call
// would cost a metadata round trip per READ and defeat write-behind.
//
// A file is released after idleTimeout without calls (its buffered writes
// flushed to the stores and its size committed, Release), or at Close. A
// file with UNSTABLE writes not yet committed is fsync'ed before its
// release, so that its data never waits on an idle gateway's memory longer
// than idleTimeout.
//
// Locking: mu guards the map and each entry's refs, lastUse and unstable.
type openFiles struct {
	c           *client.Client
	log         *slog.Logger
	idleTimeout time.Duration
	maxFiles    int
	mu          struct {
		sync.Mutex
		m map[uint64]*openFile
	}
	stop chan struct{}
	done chan struct{}
	// aheads counts the read-ahead pieces held (readahead.go); wg waits
	// for their reads at close.
	aheads atomic.Int64
	wg     sync.WaitGroup
}

type openFile struct {
	f        *client.File
	refs     int       // calls using f now (and a read-ahead reading)
	lastUse  time.Time // last call's end
	unstable bool      // UNSTABLE writes not committed since
	amu      sync.Mutex
	next     int64  // the offset after the last READ (amu)
	reading  int    // READs of the file under way (amu)
	ahead    *ahead // the piece read ahead of the next READ (amu)
}

func newOpenFiles(c *client.Client, log *slog.Logger, idle time.Duration, maxFiles int) *openFiles {
	o := &openFiles{c: c, log: log, idleTimeout: idle, maxFiles: maxFiles, stop: make(chan struct{}), done: make(chan struct{})}
	o.mu.m = map[uint64]*openFile{}
	go o.reaper()
	return o
}

// get returns ino's open file, opening it if needed; put must follow.
func (o *openFiles) get(ctx context.Context, ino uint64) (*openFile, error) {
	o.mu.Lock()
	if of := o.mu.m[ino]; of != nil {
		of.refs++
		o.mu.Unlock()
		return of, nil
	}
	o.mu.Unlock()
	f, err := o.c.Open(ctx, ino, os.O_RDWR)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	if of := o.mu.m[ino]; of != nil { // opened meanwhile by another call
		of.refs++
		o.mu.Unlock()
		f.Release(ctx)
		return of, nil
	}
	of := &openFile{f: f, refs: 1}
	o.mu.m[ino] = of
	o.mu.Unlock()
	return of, nil
}

// put ends a call's use of of; unstable marks it as holding UNSTABLE
// writes.
func (o *openFiles) put(of *openFile, unstable bool) {
	o.mu.Lock()
	of.refs--
	of.lastUse = time.Now()
	if unstable {
		of.unstable = true
	}
	o.mu.Unlock()
}

// committed notes that of's writes up to now are durable.
func (o *openFiles) committed(of *openFile) {
	o.mu.Lock()
	of.unstable = false
	o.mu.Unlock()
}

// forget releases ino's file now if no call uses it (it was removed).
func (o *openFiles) forget(ino uint64) {
	o.mu.Lock()
	of := o.mu.m[ino]
	if of != nil && of.refs == 0 {
		delete(o.mu.m, ino)
	} else {
		of = nil
	}
	o.mu.Unlock()
	if of != nil {
		of.unstable = false // nothing to make durable of a removed file
		o.release(of)
	}
}

// reaper releases idle files, and the oldest beyond maxFiles.
func (o *openFiles) reaper() {
	defer close(o.done)
	tick := time.NewTicker(o.idleTimeout / 4)
	defer tick.Stop()
	for {
		select {
		case <-o.stop:
			o.releaseAll()
			return
		case <-tick.C:
			o.releaseIdle(time.Now().Add(-o.idleTimeout))
		}
	}
}

func (o *openFiles) releaseIdle(before time.Time) {
	var idle []*openFile
	o.mu.Lock()
	n := len(o.mu.m)
	for ino, of := range o.mu.m {
		if of.refs == 0 && (of.lastUse.Before(before) || n > o.maxFiles) {
			delete(o.mu.m, ino)
			idle = append(idle, of)
			n--
		}
	}
	o.mu.Unlock()
	for _, of := range idle {
		o.release(of)
	}
}

func (o *openFiles) release(of *openFile) {
	o.dropAheadOf(of)
	ctx := context.Background()
	if of.unstable {
		if err := of.f.Fsync(ctx); err != nil {
			o.log.Warn("nfs: fsync of an idle file with unstable writes", "ino", of.f.Ino(), "err", err)
		}
	}
	if err := of.f.Release(ctx); err != nil {
		o.log.Warn("nfs: releasing an idle file", "ino", of.f.Ino(), "err", err)
	}
}

func (o *openFiles) releaseAll() {
	o.mu.Lock()
	all := o.mu.m
	o.mu.m = map[uint64]*openFile{}
	o.mu.Unlock()
	for _, of := range all {
		o.release(of)
	}
}

// close releases every file and stops the reaper, once the read-ahead
// pieces' reads have ended.
func (o *openFiles) close() {
	o.wg.Wait()
	close(o.stop)
	<-o.done
}
