package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// Create delegations (docs/design/0016, slice 2, the service's side).
//
// The replicated state holds who holds a delegation on which directory
// ('D' dir, indexed under the session: 'n' client 'd' dir); the state
// machine mirrors it in memory (delegTable) for the leader's recall gate.
// The leader keeps, in memory only (delegMgr), which delegations it
// recalled, the operations of other sessions under way on delegated (or
// being delegated) directories, and the grants under way. A new leader
// knows none of that: it treats every delegation as recalled (recallAll),
// so holders flush and return them, and any other session's operation on
// such a directory waits as after a recall. Safety never rests on the
// memory: an operation of another session on a directory proceeds only
// when the replicated state says nobody else holds a delegation on it.

// delegTable mirrors the delegation records: directory → delegation. It
// is changed by the applies (note, under fsm.mu) and published at each
// batch commit, after the store has the batch; readers take mu.
type delegTable struct {
	n  atomic.Int64 // delegations held
	mu sync.Mutex
	m  map[uint64]schema.Delegation
	// changed is closed (and replaced) at every publish that changed m.
	changed chan struct{}
	pend    []delegChange // guarded by fsm.mu
}

type delegChange struct {
	dir uint64
	rec schema.Delegation
	del bool
}

// load replaces the table with the store's records.
func (t *delegTable) load(db kv.Reader) error {
	m := map[uint64]schema.Delegation{}
	p := schema.DelegationPrefix()
	it, err := db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return fmt.Errorf("load delegations: %w", err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		dir, err := schema.DecodeDelegationKey(it.Key())
		if err != nil {
			return fmt.Errorf("load delegations: %w", err)
		}
		g, err := schema.DecodeDelegation(it.Value())
		if err != nil {
			return fmt.Errorf("load delegation of directory %d: %w", dir, err)
		}
		m[dir] = g
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("load delegations: %w", err)
	}
	t.mu.Lock()
	t.m, t.pend = m, nil
	t.n.Store(int64(len(m)))
	t.signalLocked()
	t.mu.Unlock()
	return nil
}

func (t *delegTable) signalLocked() {
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

// note records a change made by the batch being applied.
func (t *delegTable) note(dir uint64, rec schema.Delegation, del bool) {
	t.pend = append(t.pend, delegChange{dir: dir, rec: rec, del: del})
}

// publish makes the committed batch's changes visible.
func (t *delegTable) publish() {
	if len(t.pend) == 0 {
		return
	}
	t.mu.Lock()
	for _, c := range t.pend {
		if c.del {
			delete(t.m, c.dir)
		} else {
			t.m[c.dir] = c.rec
		}
	}
	t.n.Store(int64(len(t.m)))
	t.signalLocked()
	t.mu.Unlock()
	t.pend = t.pend[:0]
}

// holder returns the delegation on dir, if any.
func (t *delegTable) holder(dir uint64) (schema.Delegation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, ok := t.m[dir]
	return g, ok
}

// watch returns a channel closed at the next change.
func (t *delegTable) watch() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	return t.changed
}

// all lists the delegations in directory order.
func (t *delegTable) all() []dirDeleg {
	t.mu.Lock()
	out := make([]dirDeleg, 0, len(t.m))
	for dir, g := range t.m {
		out = append(out, dirDeleg{dir: dir, Delegation: g})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b dirDeleg) int { return cmpU64(a.dir, b.dir) })
	return out
}

type dirDeleg struct {
	dir uint64
	schema.Delegation
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// delegation reads the delegation record of dir.
func (x *opCtx) delegation(dir uint64) (schema.Delegation, bool, error) {
	v, err := x.b.Get(schema.DelegationKey(dir))
	if errors.Is(err, kv.ErrNotFound) {
		return schema.Delegation{}, false, nil
	}
	if err != nil {
		return schema.Delegation{}, false, err
	}
	g, err := schema.DecodeDelegation(v)
	if err != nil {
		return schema.Delegation{}, false, rpc.Errorf(syscall.EIO, "delegation of directory %d: %v", dir, err)
	}
	return g, true, nil
}

// delegate applies opDelegate: session c.Hdr.ClientID gets the delegation
// on directory c.Ino unless another session holds it (EBUSY). Asking
// again for one held is no error. The grant's epoch is its raft index.
func (x *opCtx) delegate(c *command) (*answer, error) {
	client := c.Hdr.ClientID
	if err := x.session(client); err != nil {
		return nil, err
	}
	dir, err := x.dir(c.Ino)
	if err != nil {
		return nil, err
	}
	if dir.Nlink == 0 {
		return nil, rpc.Errorf(syscall.ENOENT, "directory %d was removed", c.Ino)
	}
	if dir.Entries > rpc.MaxDelegEntries {
		return nil, rpc.Errorf(syscall.E2BIG, "directory %d has %d entries: only directories of at most %d are delegated", c.Ino, dir.Entries, rpc.MaxDelegEntries)
	}
	g, ok, err := x.delegation(c.Ino)
	if err != nil {
		return nil, err
	}
	if ok {
		if g.Client != client {
			return nil, rpc.Errorf(syscall.EBUSY, "directory %d is delegated to session %d", c.Ino, g.Client)
		}
		return x.stampBody()
	}
	g = schema.Delegation{Client: client, Epoch: x.index, Granted: x.now}
	if err := x.b.Set(schema.DelegationKey(c.Ino), schema.AppendDelegation(nil, g)); err != nil {
		return nil, err
	}
	if err := x.b.Set(schema.SessionDelegKey(client, c.Ino), schema.DelegRef()); err != nil {
		return nil, err
	}
	x.f.delegs.note(c.Ino, g, false)
	return x.stampBody()
}

// returnDeleg applies opReturn: the delegation on c.Ino held by session
// c.Client (granted at c.Epoch, unless 0) ends. Anything else is no
// error: a return sent twice, or after the session's end.
func (x *opCtx) returnDeleg(c *command) (*answer, error) {
	g, ok, err := x.delegation(c.Ino)
	if err != nil {
		return nil, err
	}
	if !ok || g.Client != c.Client || (c.Epoch != 0 && g.Epoch != c.Epoch) {
		return x.stampBody()
	}
	if err := x.b.Delete(schema.DelegationKey(c.Ino)); err != nil {
		return nil, err
	}
	if err := x.b.Delete(schema.SessionDelegKey(c.Client, c.Ino)); err != nil {
		return nil, err
	}
	x.f.delegs.note(c.Ino, schema.Delegation{}, true)
	return x.stampBody()
}

// dropSessionHeld ends everything session client holds besides its
// record and dedupe table: its delegations and its inode ranges (unused
// numbers are never handed out again).
func (x *opCtx) dropSessionHeld(client uint64) error {
	p := schema.SessionDelegPrefix(client)
	it, err := x.b.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return err
	}
	var dirs []uint64
	for ok := it.First(); ok; ok = it.Next() {
		_, dir, err := schema.DecodeSessionDelegKey(it.Key())
		if err != nil {
			it.Close()
			return rpc.Errorf(syscall.EIO, "%v", err)
		}
		dirs = append(dirs, dir)
	}
	err = it.Error()
	it.Close()
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		g, ok, err := x.delegation(dir)
		if err != nil {
			return err
		}
		if ok && g.Client == client {
			if err := x.b.Delete(schema.DelegationKey(dir)); err != nil {
				return err
			}
			x.f.delegs.note(dir, schema.Delegation{}, true)
		}
	}
	hp := schema.SessionHeldPrefix(client)
	return x.b.DeleteRange(hp, kv.PrefixEnd(hp))
}

// delegMgr is the leader's memory of delegations: recalls, the operations
// of sessions under way on directories, grants under way. See the top of
// this file.
type delegMgr struct {
	// fast counts the operations admitted without looking at directories
	// (no delegation held, no grant under way); a grant waits for it to
	// drain after raising granting, which sends every later operation
	// down the slow path.
	fast     atomic.Int64
	granting atomic.Int64

	mu       sync.Mutex
	inflight map[uint64]map[uint64]int       // dir → session → operations under way
	grants   map[uint64]uint64               // dir → session being granted it
	grantEnd chan struct{}                   // closed when a grant ends
	recalled map[uint64]map[uint64]time.Time // holder → dir → when recalled
	notify   map[uint64]chan struct{}        // holder → closed at its next recall
}

func newDelegMgr() *delegMgr {
	return &delegMgr{inflight: map[uint64]map[uint64]int{}, grants: map[uint64]uint64{}, grantEnd: make(chan struct{}),
		recalled: map[uint64]map[uint64]time.Time{}, notify: map[uint64]chan struct{}{}}
}

func (d *delegMgr) fastDone() { d.fast.Add(-1) }

// enterFast admits an operation without looking at its directories when
// no delegation is held and none is being granted.
func (d *delegMgr) enterFast(s *Service) bool {
	if s.fsm.delegs.n.Load() != 0 || d.granting.Load() != 0 {
		return false
	}
	d.fast.Add(1)
	if s.fsm.delegs.n.Load() != 0 || d.granting.Load() != 0 {
		d.fast.Add(-1)
		return false
	}
	return true
}

func noRelease() {}

// gateWaitMax bounds an operation's wait for recalls: a holder that does
// not return a recalled delegation within its lease has it revoked, so
// this is only a backstop.
func gateWaitMax(s *Service) time.Duration { return 3*s.cfg.SessionLease + 10*time.Second }

// gate admits an operation of session caller (0: unknown) on directories
// dirs: at once when nobody else holds a delegation on them, else after
// recalling it and waiting for its return, its session's end, or — after
// the holder's lease — its revocation. The caller runs release when the
// operation is done (applied or failed).
func (d *delegMgr) gate(ctx context.Context, s *Service, caller uint64, dirs ...uint64) (func(), error) {
	if d.enterFast(s) {
		return d.fastDone, nil
	}
	return d.slowGate(ctx, s, caller, dirs)
}

// gateReq is gate for the request of method m, if m works on directories
// a delegation covers: lookup, readdir, getattr and setattr (of the
// directory), the creates, unlink, rmdir, rename, link and the directory
// layout.
func (d *delegMgr) gateReq(ctx context.Context, s *Service, req any) (func(), error) {
	var caller uint64
	var dirs []uint64
	var child func() []uint64 // directories named by entries, looked up only when needed
	switch r := req.(type) {
	case *rpc.LookupReq:
		caller, dirs = r.Client, []uint64{r.Parent}
	case *rpc.ReadDirReq:
		caller, dirs = r.Client, []uint64{r.Dir}
	case *rpc.GetAttrReq:
		caller, dirs = r.Client, []uint64{r.Ino}
	case *rpc.SetAttrReq:
		caller, dirs = r.Hdr.ClientID, []uint64{r.Ino}
	case *rpc.CreateReq:
		caller, dirs = r.Hdr.ClientID, []uint64{r.Parent}
	case *rpc.EntryReq: // unlink, rmdir: the directory removed too
		caller, dirs = r.Hdr.ClientID, []uint64{r.Parent}
		child = func() []uint64 { return s.childDirs(r.Parent, r.Name) }
	case *rpc.RenameReq:
		caller, dirs = r.Hdr.ClientID, []uint64{r.OldParent, r.NewParent}
		child = func() []uint64 {
			return append(s.childDirs(r.OldParent, r.OldName), s.childDirs(r.NewParent, r.NewName)...)
		}
	case *rpc.LinkReq:
		caller, dirs = r.Hdr.ClientID, []uint64{r.NewParent}
	case *rpc.SetDirLayoutReq:
		caller, dirs = r.Hdr.ClientID, []uint64{r.Dir}
	default:
		return noRelease, nil
	}
	if d.enterFast(s) {
		return d.fastDone, nil
	}
	if child != nil {
		dirs = append(dirs, child()...)
	}
	return d.slowGate(ctx, s, caller, dirs)
}

// childDirs is the directory parent/name names, if it names one.
func (s *Service) childDirs(parent uint64, name string) []uint64 {
	de, err := s.fsm.readEntry(schema.DentryKey(parent, name))
	if err != nil || de.Type != modeDir {
		return nil
	}
	return []uint64{de.Ino}
}

func (d *delegMgr) slowGate(ctx context.Context, s *Service, caller uint64, dirs []uint64) (func(), error) {
	lease := s.cfg.SessionLease
	giveUp := time.Now().Add(gateWaitMax(s))
	for {
		if !s.ready.Load() {
			return nil, s.notLeader()
		}
		changed := s.fsm.delegs.watch()
		now := s.cfg.Clock.Now()
		var overdue []dirDeleg
		blocked := false
		var next time.Time // the earliest revocation due
		d.mu.Lock()
		grantEnd := d.grantEnd
		for _, dir := range dirs {
			if g, ok := d.grants[dir]; ok && g != caller {
				blocked = true
			}
			g, ok := s.fsm.delegs.holder(dir)
			if !ok || g.Client == caller {
				continue
			}
			blocked = true
			at := d.recallLocked(s, g.Client, dir, now)
			due := at.Add(lease)
			if !now.Before(due) {
				overdue = append(overdue, dirDeleg{dir: dir, Delegation: g})
			} else if next.IsZero() || due.Before(next) {
				next = due
			}
		}
		if !blocked {
			for _, dir := range dirs {
				m := d.inflight[dir]
				if m == nil {
					m = map[uint64]int{}
					d.inflight[dir] = m
				}
				m[caller]++
			}
			d.mu.Unlock()
			return func() { d.leave(caller, dirs) }, nil
		}
		d.mu.Unlock()
		for _, o := range overdue {
			if err := d.revoke(s, o); err != nil {
				return nil, err
			}
		}
		if len(overdue) > 0 {
			continue
		}
		if time.Now().After(giveUp) {
			return nil, rpc.Errorf(syscall.EAGAIN, "directory delegation not returned within %v", gateWaitMax(s))
		}
		// Wake at a change of the delegations, the end of a grant, the
		// next revocation due, or to look at leadership again.
		poll := 100 * time.Millisecond
		if !next.IsZero() {
			poll = min(poll, max(next.Sub(now), time.Millisecond))
		}
		t := time.NewTimer(poll)
		select {
		case <-changed:
		case <-grantEnd:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, rpc.Errorf(syscall.EINTR, "waiting for a directory delegation's return: %v", ctx.Err())
		}
		t.Stop()
	}
}

// leave ends an operation admitted by slowGate.
func (d *delegMgr) leave(caller uint64, dirs []uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dir := range dirs {
		m := d.inflight[dir]
		if m[caller]--; m[caller] <= 0 {
			delete(m, caller)
		}
		if len(m) == 0 {
			delete(d.inflight, dir)
		}
	}
}

// recallLocked marks holder's delegation on dir recalled (once) and wakes
// the holder's MWaitRecall; it returns when it was first recalled.
func (d *delegMgr) recallLocked(s *Service, holder, dir uint64, now time.Time) time.Time {
	m := d.recalled[holder]
	if m == nil {
		m = map[uint64]time.Time{}
		d.recalled[holder] = m
	}
	if at, ok := m[dir]; ok {
		return at
	}
	m[dir] = now
	d.wakeLocked(holder)
	s.log.Info("directory delegation recalled", "dir", dir, "holder", holder)
	return now
}

func (d *delegMgr) wakeLocked(holder uint64) {
	if ch, ok := d.notify[holder]; ok {
		close(ch)
		delete(d.notify, holder)
	}
}

// revoke ends a recalled delegation its holder did not return within its
// lease (the holder's session still renews it: a stuck or buggy client).
// Its queued creates then meet the names others made (EEXIST).
func (d *delegMgr) revoke(s *Service, g dirDeleg) error {
	s.log.Warn("directory delegation not returned within a session lease after its recall: revoked",
		"dir", g.dir, "holder", g.Client, "lease", s.cfg.SessionLease)
	res, err := s.propose(&command{Op: opReturn, Now: s.now(), Ino: g.dir, Client: g.Client, Epoch: g.Epoch})
	if err != nil {
		return err
	}
	if err := res.err(); err != nil {
		return err
	}
	d.returned(g.Client, g.dir)
	return nil
}

// returned forgets the recall of a delegation that ended.
func (d *delegMgr) returned(holder, dir uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.recalled[holder]; m != nil {
		delete(m, dir)
		if len(m) == 0 {
			delete(d.recalled, holder)
		}
	}
}

// forget drops what the leader remembers of a session that ended.
func (d *delegMgr) forget(holder uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.recalled, holder)
	d.wakeLocked(holder)
}

// recallAll starts a leadership: every delegation counts as recalled,
// since this leader does not know which operations of other sessions the
// last one held back (see the top of this file).
func (d *delegMgr) recallAll(s *Service) {
	now := s.cfg.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resetLocked()
	for _, g := range s.fsm.delegs.all() {
		d.recallLocked(s, g.Client, g.dir, now)
	}
}

// reset ends a leadership: waiters wake (and find they no longer lead).
func (d *delegMgr) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resetLocked()
}

func (d *delegMgr) resetLocked() {
	for h := range d.notify {
		d.wakeLocked(h)
	}
	close(d.grantEnd)
	d.grantEnd = make(chan struct{})
	d.inflight = map[uint64]map[uint64]int{}
	d.grants = map[uint64]uint64{}
	d.recalled = map[uint64]map[uint64]time.Time{}
}

// recalledOf lists holder's recalled delegations still held.
func (d *delegMgr) recalledOf(s *Service, holder uint64) []uint64 {
	var out []uint64
	for dir := range d.recalled[holder] {
		if g, ok := s.fsm.delegs.holder(dir); ok && g.Client == holder {
			out = append(out, dir)
		} else {
			delete(d.recalled[holder], dir)
		}
	}
	slices.Sort(out)
	return out
}

// grantWaitMax bounds how long a grant waits for the operations admitted
// before it to end; then it answers EBUSY (the client asks again later).
const grantWaitMax = time.Second

// grant answers MDelegate: the delegation, if no other session holds one
// on the directory, has an operation on it under way, or is being granted
// it; with the directory's entries and the placement template.
func (d *delegMgr) grant(ctx context.Context, s *Service, r *rpc.DelegateReq) (rpc.Message, error) {
	client, dir := r.Hdr.ClientID, r.Dir
	if !s.sess.known(client) {
		return nil, rpc.Errorf(syscall.ESTALE, "unknown session %d: open a new one", client)
	}
	d.granting.Add(1)
	defer d.granting.Add(-1)
	for start := time.Now(); d.fast.Load() != 0; {
		if time.Since(start) > grantWaitMax {
			return nil, rpc.Errorf(syscall.EBUSY, "directory %d: operations under way did not end within %v", dir, grantWaitMax)
		}
		time.Sleep(50 * time.Microsecond)
	}
	d.mu.Lock()
	busy := ""
	if g, ok := d.grants[dir]; ok {
		busy = fmt.Sprintf("being delegated to session %d", g)
	}
	for c, n := range d.inflight[dir] {
		if c != client && n > 0 {
			busy = fmt.Sprintf("session %d has an operation on it under way", c)
		}
	}
	if _, ok := d.recalled[client][dir]; ok {
		busy = "its delegation to this session is recalled: return it first"
	}
	if busy != "" {
		d.mu.Unlock()
		return nil, rpc.Errorf(syscall.EBUSY, "directory %d: %s", dir, busy)
	}
	d.grants[dir] = client
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.grants, dir)
		close(d.grantEnd)
		d.grantEnd = make(chan struct{})
		d.mu.Unlock()
	}()
	res, err := s.propose(&command{Op: opDelegate, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: dir})
	if err != nil {
		return nil, err
	}
	if err := res.err(); err != nil {
		return nil, err
	}
	g, ok := s.fsm.delegs.holder(dir)
	if !ok || g.Client != client {
		return nil, rpc.Errorf(syscall.EBUSY, "directory %d: the delegation ended meanwhile", dir)
	}
	resp := &rpc.DelegateResp{Epoch: g.Epoch}
	if res.ans != nil {
		resp.Stamp = rpc.Stamp{Index: res.ans.rec.Index, Term: res.ans.rec.Term}
	}
	in, err := s.readInode(dir)
	if err != nil {
		return nil, err
	}
	resp.Dir = toAttr(dir, in)
	resp.StripeSize, resp.StripeCount = in.Layout.StripeSize, in.Layout.StripeCount
	if resp.Entries, err = s.listAll(dir); err != nil {
		return nil, err
	}
	tc := &command{Parent: dir}
	if err := s.place(ctx, tc); err == nil { // none: the client's creates place nothing, the service does
		resp.RRStart = tc.RRStart
		for _, c := range tc.Cands {
			resp.Cands = append(resp.Cands, rpc.PlacementCand{ID: c.ID, FreeBytes: c.FreeBytes})
		}
	}
	s.log.Info("directory delegated", "dir", dir, "client", client, "epoch", g.Epoch, "entries", len(resp.Entries))
	return resp, nil
}

// listAll lists every entry of dir (at most MaxDelegEntries).
func (s *Service) listAll(dir uint64) ([]rpc.DelegEntry, error) {
	p := schema.DentryPrefix(dir)
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "list directory %d: %v", dir, err)
	}
	defer it.Close()
	var out []rpc.DelegEntry
	for ok := it.First(); ok; ok = it.Next() {
		if len(out) >= rpc.MaxDelegEntries {
			return nil, rpc.Errorf(syscall.E2BIG, "directory %d has more than %d entries", dir, rpc.MaxDelegEntries)
		}
		de, err := schema.DecodeDentry(it.Value())
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "entry %x: %v", it.Key(), err)
		}
		out = append(out, rpc.DelegEntry{Name: string(schema.DentryName(it.Key())), Ino: de.Ino, Mode: de.Type})
	}
	if err := it.Error(); err != nil {
		return nil, rpc.Errorf(syscall.EIO, "list directory %d: %v", dir, err)
	}
	return out, nil
}

// waitRecall answers MWaitRecall: the caller's recalled delegations, at
// once if there are any, else at the next recall or after the wait asked
// for (at most rpc.MaxWaitRecallMs).
func (d *delegMgr) waitRecall(ctx context.Context, s *Service, r *rpc.WaitRecallReq) (rpc.Message, error) {
	if !s.sess.known(r.Client) {
		return nil, rpc.Errorf(syscall.ESTALE, "unknown session %d: open a new one", r.Client)
	}
	until := time.Now().Add(time.Duration(min(r.WaitMs, rpc.MaxWaitRecallMs)) * time.Millisecond)
	for {
		d.mu.Lock()
		dirs := d.recalledOf(s, r.Client)
		ch, ok := d.notify[r.Client]
		if !ok {
			ch = make(chan struct{})
			d.notify[r.Client] = ch
		}
		d.mu.Unlock()
		left := time.Until(until)
		if len(dirs) > 0 || left <= 0 {
			return &rpc.WaitRecallResp{Dirs: dirs}, nil
		}
		if !s.ready.Load() {
			return nil, s.notLeader()
		}
		t := time.NewTimer(min(left, 250*time.Millisecond)) // and look at leadership again
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return &rpc.WaitRecallResp{}, nil
		}
		t.Stop()
	}
}

// returnHandler answers MReturnDelegation.
func (d *delegMgr) returnHandler(s *Service, r *rpc.ReturnDelegationReq) (rpc.Message, error) {
	resp, err := s.mutate(&command{Op: opReturn, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Dir, Client: r.Hdr.ClientID, Epoch: r.Epoch})
	if err != nil {
		return nil, err
	}
	if g, ok := s.fsm.delegs.holder(r.Dir); !ok || g.Client != r.Hdr.ClientID {
		d.returned(r.Hdr.ClientID, r.Dir)
	}
	return resp, nil
}

// status lists the delegations for strata status.
func (d *delegMgr) status(s *Service) []rpc.DelegationInfo {
	all := s.fsm.delegs.all()
	if len(all) == 0 {
		return nil
	}
	out := make([]rpc.DelegationInfo, len(all))
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, g := range all {
		_, recalled := d.recalled[g.Client][g.dir]
		out[i] = rpc.DelegationInfo{Client: g.Client, Dir: g.dir, Epoch: g.Epoch,
			GrantedMs: g.Granted / int64(time.Millisecond), Recalled: recalled}
	}
	return out
}

// registerDelegation registers the inode-range and delegation methods.
func (s *Service) registerDelegation() {
	handle(s, rpc.MReserveInos, s.reserveInosHandler)
	handle(s, rpc.MCreateBatch, s.createBatchHandler)
	handle(s, rpc.MDelegate, func(ctx context.Context, r *rpc.DelegateReq) (rpc.Message, error) {
		return s.dg.grant(ctx, s, r)
	})
	handle(s, rpc.MReturnDelegation, func(_ context.Context, r *rpc.ReturnDelegationReq) (rpc.Message, error) {
		return s.dg.returnHandler(s, r)
	})
	handle(s, rpc.MWaitRecall, func(ctx context.Context, r *rpc.WaitRecallReq) (rpc.Message, error) {
		return s.dg.waitRecall(ctx, s, r)
	})
}
