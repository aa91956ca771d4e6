package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// The client's side of create delegations (docs/design/0016, slice 2),
// behind Config.CreateDelegation: when to ask for a delegation, what the
// holder knows about the directory (every name in it), giving it back on
// recall, when idle and at unmount (after flushing what was answered
// here). The creates answered under a held delegation, their queue and
// its flusher are in createq.go.

const (
	// delegAfterCreates is how many consecutive creates by this mount in
	// a directory, with no other operation of this mount seen there in
	// between, make the client ask for the directory's delegation.
	delegAfterCreates = 8
	// delegBackoff is how long a directory refused (EBUSY: another
	// session holds it or works there; E2BIG: too many entries to list)
	// is not asked for again.
	delegBackoff = 10 * time.Second
	// delegIdle: a delegation with no create of this mount for that long
	// is given back.
	delegIdle = 5 * time.Second
	// delegMaxDirs bounds the directories tracked; beyond it the oldest
	// untouched ones without a delegation are forgotten.
	delegMaxDirs = 4096
)

// delegations is one client's delegation state.
type delegations struct {
	c    *Client
	idle time.Duration // delegIdle; tests shorten it
	// flushDelay is flushAfter (tests lengthen it)
	flushDelay time.Duration

	mu       sync.Mutex
	dirs     map[uint64]*dirDeleg
	watching bool // the recall watcher runs
	closed   bool // the client is closing: ask for nothing more
	// pending holds the creates answered here and not yet by the
	// service, by inode number (npend counts them, for a lock-free
	// check); failed the errors of those the service refused, until
	// their file's fsync or close reports them (createq.go).
	pending map[uint64]*queuedCreate
	failed  map[uint64]error
	npend   atomic.Int64
	// refused counts the creates answered here that the service
	// refused since the last barrier (SyncMeta) reported them: a file
	// closed before that (async) learns it nowhere else.
	refused atomic.Int64
	pool    inoPool
}

// dirDeleg is what this client knows of one directory.
type dirDeleg struct {
	creates int       // consecutive creates of this mount here
	last    time.Time // the last create or other operation seen
	until   time.Time // no asking before (refused lately)
	asking  bool      // a Delegate call is under way
	held    bool
	epoch   uint64
	// names are every entry of the directory while held: the grant's
	// listing plus this mount's changes since (the only ones possible).
	names map[string]uint64
	// during holds this mount's changes of the directory's names
	// answered while its delegation was asked for: the grant's listing
	// may predate them (the holder's own calls are not held back by the
	// grant), so they are replayed over it.
	during     []nameChange
	duringLost bool // more changes than during keeps: the grant is given back
	// recalled: being given back; nothing more is answered here.
	recalled bool
	// tmpl is the grant's placement template and rr the files placed
	// with it so far.
	tmpl *template
	rr   uint64
	// queue holds the creates answered here not yet sent, in order;
	// lastQ is the latest create answered here (sent or not); flushing:
	// a flush runs (one at a time); timer sends the queue flushAfter
	// after its first create.
	queue []*queuedCreate
	lastQ *queuedCreate
	// lastSent is the last create of the latest batch taken: batches go
	// one after the other, so its answer comes after every earlier one.
	lastSent *queuedCreate
	flushing bool
	timer    *time.Timer
	// force: a caller waits for the whole queue (before of the
	// directory): creates of files still being written are sent too,
	// in order, until the queue is empty.
	force bool
}

// nameChange is a name that left (ino 0) or arrived in a directory.
type nameChange struct {
	name    string
	ino     uint64
	arrived bool
}

// changeLocked applies a change of this mount to s's names, or records it
// for the grant under way (d.mu held).
func (s *dirDeleg) changeLocked(name string, ino uint64, arrived bool) {
	if name == "" {
		return
	}
	if s.asking {
		if len(s.during) < 4*delegMaxDirs {
			s.during = append(s.during, nameChange{name, ino, arrived})
		} else {
			s.duringLost = true
		}
	}
	if !s.held {
		return
	}
	if arrived {
		s.names[name] = ino
	} else {
		delete(s.names, name)
	}
}

func newDelegations(c *Client) *delegations {
	return &delegations{c: c, idle: delegIdle, flushDelay: flushAfter, dirs: make(map[uint64]*dirDeleg),
		pending: make(map[uint64]*queuedCreate), failed: make(map[uint64]error)}
}

func (d *delegations) on() bool { return d != nil && d.c.cfg.CreateDelegation }

// noteCreate records this mount's create of name (inode ino) in dir and,
// at the delegAfterCreates-th in a row, asks for the delegation in the
// background.
func (d *delegations) noteCreate(dir uint64, name string, ino uint64) {
	if !d.on() {
		return
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.dir(dir, now)
	s.last = now
	s.changeLocked(name, ino, true)
	if s.held {
		return
	}
	s.creates++
	if s.creates < delegAfterCreates || s.asking || now.Before(s.until) || d.closed {
		return
	}
	s.asking = true
	d.c.wg.Add(1)
	go d.ask(dir)
}

// noteOther records another operation of this mount on dir's entries: it
// breaks the run of creates. name left (old) and arrived (with ino) keep
// a held delegation's names true; "" when none.
func (d *delegations) noteOther(dir uint64, left, arrived string, ino uint64) {
	if !d.on() {
		return
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.dirs[dir]
	if !ok {
		return
	}
	s.creates = 0
	s.last = now
	s.changeLocked(left, 0, false)
	s.changeLocked(arrived, ino, true)
}

// noteRename records this mount's rename (an exchange moves no name out
// or in; the moved inode's number is not in the answer: 0, not needed
// for knowing that the name exists).
func (d *delegations) noteRename(oldDir uint64, oldName string, newDir uint64, newName string, flags uint32) {
	if flags&rpc.RenameExchange != 0 {
		oldName, newName = "", ""
	}
	d.noteOther(oldDir, oldName, "", 0)
	d.noteOther(newDir, "", newName, 0)
}

// dir returns dir's state, made if new (d.mu held).
func (d *delegations) dir(dir uint64, now time.Time) *dirDeleg {
	s, ok := d.dirs[dir]
	if ok {
		return s
	}
	if len(d.dirs) >= delegMaxDirs {
		d.forget(now)
	}
	s = &dirDeleg{}
	d.dirs[dir] = s
	return s
}

// forget drops the states of directories neither held nor asked for,
// untouched for delegBackoff (d.mu held); all of them when that frees
// nothing.
func (d *delegations) forget(now time.Time) {
	n := len(d.dirs)
	for _, old := range []bool{true, false} {
		for k, s := range d.dirs {
			if !s.held && !s.asking && !s.flushing && len(s.queue) == 0 && (!old || now.Sub(s.last) > delegBackoff) {
				delete(d.dirs, k)
			}
		}
		if len(d.dirs) < n {
			return
		}
	}
}

// ask asks for dir's delegation (one goroutine per ask, counted in c.wg).
func (d *delegations) ask(dir uint64) {
	defer d.c.wg.Done()
	ctx, cancel := context.WithTimeout(d.c.ctx, min(d.c.cfg.IOTimeout, 5*time.Second))
	resp, err := d.c.Delegate(ctx, dir)
	cancel()
	d.mu.Lock()
	s := d.dirs[dir]
	if s == nil { // forgotten meanwhile (cannot be: asking keeps it)
		s = d.dir(dir, time.Now())
	}
	s.asking = false
	s.creates = 0
	during, lost := s.during, s.duringLost
	s.during, s.duringLost = nil, false
	if err != nil {
		s.until = time.Now().Add(delegBackoff)
		d.mu.Unlock()
		if !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.E2BIG) && d.c.ctx.Err() == nil {
			d.c.log.Debug("create delegation not granted", "dir", dir, "err", err)
		}
		return
	}
	give := d.closed || lost // lost: the listing cannot be brought up to date
	if !give {
		s.held, s.epoch, s.recalled = true, resp.Epoch, false
		s.names = make(map[string]uint64, len(resp.Entries))
		for _, e := range resp.Entries {
			s.names[e.Name] = e.Ino
		}
		for _, ch := range during { // in the order they were answered
			if ch.arrived {
				s.names[ch.name] = ch.ino
			} else {
				delete(s.names, ch.name)
			}
		}
		s.tmpl, s.rr = templateOf(resp), 0
		s.last = time.Now()
		d.refillLocked() // numbers for the creates answered here
		gen, at := d.c.dirs.begin()
		d.c.dirs.note(&resp.Dir, resp.Index, gen, at)
		if !d.watching {
			d.watching = true
			d.c.wg.Add(1)
			go d.watch()
		}
	}
	d.mu.Unlock()
	d.c.m.op("delegate")
	if give { // granted while closing: give it straight back
		d.giveBack(dir, resp.Epoch)
	}
}

// watch is the recall watcher, running while this client holds a
// delegation: it long-polls WaitRecall and gives back what the service
// recalls, and what this mount left idle.
func (d *delegations) watch() {
	defer d.c.wg.Done()
	for i := 0; ; i++ {
		if d.c.ctx.Err() != nil {
			return
		}
		recalled, err := d.c.WaitRecall(d.c.ctx, waitRecallMax)
		if err != nil && d.c.ctx.Err() == nil {
			d.c.log.Debug("waiting for delegation recalls", "err", err)
			select { // do not spin on a failing service
			case <-d.c.ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		now := time.Now()
		d.mu.Lock()
		var back []uint64
		for _, dir := range recalled {
			if s := d.dirs[dir]; s != nil && s.held {
				back = append(back, dir)
			}
		}
		for dir, s := range d.dirs {
			if s.held && now.Sub(s.last) >= d.idle && !contains(back, dir) {
				back = append(back, dir)
			}
		}
		d.mu.Unlock()
		for _, dir := range back {
			d.release(dir)
		}
		d.mu.Lock()
		any := false
		for _, s := range d.dirs {
			any = any || s.held
		}
		if !any {
			d.watching = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
	}
}

func contains(l []uint64, v uint64) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
}

// release stops holding dir's delegation here and gives it back, once
// the creates answered here are flushed: from the recall on nothing more
// is answered here, and this mount's calls about the directory wait for
// the flush (before).
func (d *delegations) release(dir uint64) {
	d.mu.Lock()
	s := d.dirs[dir]
	if s == nil || !s.held || s.recalled {
		d.mu.Unlock()
		return
	}
	s.recalled = true
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d.c.cfg.IOTimeout)
	d.before(ctx, dir)
	cancel()
	d.mu.Lock()
	epoch := s.epoch
	s.held, s.recalled, s.epoch, s.names, s.creates, s.tmpl = false, false, 0, nil, 0, nil
	s.until = time.Now().Add(delegBackoff) // recalled or idle: not at once again
	d.mu.Unlock()
	d.giveBack(dir, epoch)
}

func (d *delegations) giveBack(dir, epoch uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), min(d.c.cfg.IOTimeout, 5*time.Second))
	defer cancel()
	if err := d.c.ReturnDelegation(ctx, dir, epoch); err != nil {
		// The session's end drops it anyway; a recall waits for that.
		d.c.log.Warn("create delegation not given back", "dir", dir, "err", err)
		return
	}
	d.c.m.op("delegation_return")
}

// closeAll gives back every delegation (at unmount, before the session
// closes) and asks for no more.
func (d *delegations) closeAll() {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.closed = true
	var held []uint64
	for dir, s := range d.dirs {
		if s.held {
			held = append(held, dir)
		}
	}
	d.mu.Unlock()
	for _, dir := range held {
		d.release(dir)
	}
}

// Holding reports whether this client holds the create delegation on dir
// (what status and tests show).
func (c *Client) Holding(dir uint64) bool {
	d := c.deleg
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.dirs[dir]
	return s != nil && s.held
}
