package meta

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// sessions is the leader's view of client sessions: lease renewal times and
// the inodes each client reports open. The set of sessions mirrors the
// replicated session records (loaded when leadership starts, changed with
// each SessionOpen/Close); times and open inodes live only in memory.
type sessions struct {
	mu struct {
		sync.Mutex
		m map[uint64]*sessionState
		// floor is when this leader loaded the sessions: an echoed time
		// from before it came from another leader's clock and is not
		// trusted.
		floor time.Time
	}
}

type sessionState struct {
	lastSeen time.Time
	open     []uint64 // as last reported
	// builtAfter: the open set was made after this time of ours (zero:
	// no set known yet). A heartbeat's receipt says nothing of when its
	// client listed its open files — one listed before an open and
	// received after another client's unlink would let the reaper delete
	// a file still open — so the client echoes the time of the previous
	// answer it got, which it listed after.
	builtAfter time.Time
	// created is when this leader opened the session (zero for sessions
	// loaded at leadership start): the first heartbeat, which has no
	// answer to echo, was listed after it.
	created time.Time
	// gateway is an NFS gateway's last report (nil: not a gateway, or
	// none since this leader took over).
	gateway *rpc.GatewayReport
}

func newSessions() *sessions {
	s := &sessions{}
	s.mu.m = map[uint64]*sessionState{}
	return s
}

// load replaces the table with the replicated sessions, all freshly renewed:
// a new leader gives every client a full lease to find it.
func (s *sessions) load(db kv.Reader, now time.Time) error {
	p := schema.SessionPrefix()
	it, err := db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return err
	}
	defer it.Close()
	m := map[uint64]*sessionState{}
	for ok := it.First(); ok; ok = it.Next() {
		id, err := schema.DecodeSessionKey(it.Key())
		if err != nil {
			return err
		}
		m[id] = &sessionState{lastSeen: now}
	}
	if err := it.Error(); err != nil {
		return err
	}
	s.mu.Lock()
	s.mu.m = m
	s.mu.floor = now
	s.mu.Unlock()
	return nil
}

// add records a session opened now. Its open files are unknown until its
// first heartbeat (a client whose session expired opens a new one with
// files open), which it lists after our answer.
func (s *sessions) add(id uint64, now time.Time) {
	s.mu.Lock()
	s.mu.m[id] = &sessionState{lastSeen: now, created: now}
	s.mu.Unlock()
}

func (s *sessions) remove(id uint64) {
	s.mu.Lock()
	delete(s.mu.m, id)
	s.mu.Unlock()
}

func (s *sessions) known(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.mu.m[id]
	return ok
}

// ids lists the sessions.
func (s *sessions) ids() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.mu.m))
}

func (s *sessions) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.m)
}

// heartbeat renews a lease and records the open set, listed by the client
// after builtAfter (zero: unknown, e.g. the first heartbeat to this
// leader); false if the session is unknown. A set older than the one
// recorded (heartbeats overtaking each other) is ignored. gw is the
// session's NFS gateway report (nil: none).
func (s *sessions) heartbeat(id uint64, open []uint64, builtAfter, now time.Time, gw *rpc.GatewayReport) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.mu.m[id]
	if !ok {
		return false
	}
	st.lastSeen = now
	st.gateway = gw
	switch {
	case builtAfter.IsZero():
		// No answer to echo yet: a client's first list, made after our
		// answer to its opening. (An echo older than that — a client
		// that reopened its session with opens under way — stays as it
		// is: it is all the client vouches for.)
		builtAfter = st.created
	case builtAfter.Before(s.mu.floor):
		builtAfter = time.Time{} // another leader's clock: age unknown
	}
	if builtAfter.Before(st.builtAfter) { // (a zero time is before any other)
		return true // not known to be newer than the list we have
	}
	st.builtAfter = builtAfter
	st.open = append(st.open[:0], open...)
	return true
}

// sessionSnap is one session's liveness as `strata status` shows it.
type sessionSnap struct {
	lastSeen time.Time
	open     int
	gateway  *rpc.GatewayReport
}

// snapshot copies every session's liveness.
func (s *sessions) snapshot() map[uint64]sessionSnap {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint64]sessionSnap, len(s.mu.m))
	for id, st := range s.mu.m {
		out[id] = sessionSnap{lastSeen: st.lastSeen, open: len(st.open), gateway: st.gateway}
	}
	return out
}

// oldestReport is the time of the least recent open-file report among the
// live sessions (zero when there are none).
func (s *sessions) oldestReport() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest time.Time
	for _, st := range s.mu.m {
		at := st.builtAfter
		if at.IsZero() {
			at = time.Unix(0, 1) // nothing listed yet: older than any orphan
		}
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	return oldest
}

// expired lists sessions whose lease ran out.
func (s *sessions) expired(now time.Time, lease time.Duration) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint64
	for id, st := range s.mu.m {
		if now.Sub(st.lastSeen) > lease {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// openSet is every inode some live session reports open.
func (s *sessions) openSet() map[uint64]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[uint64]struct{}{}
	for _, st := range s.mu.m {
		for _, ino := range st.open {
			out[ino] = struct{}{}
		}
	}
	return out
}

// liveness tracks storage servers' heartbeats and their targets' capacity
// (leader memory; not replicated — a new leader learns it from the next
// heartbeats).
type liveness struct {
	timeout time.Duration
	mu      struct {
		sync.Mutex
		servers map[uint32]time.Time // last heartbeat or registration
		targets map[uint32]targetUsage
		cands   []layout.Candidate // cached candidates for new files
		candsAt time.Time
	}
}

type targetUsage struct {
	server      uint32
	total, free uint64
	rawFree     uint64 // free including root-reserved blocks (0 if unknown)
	fs          fsKey  // the file system the target lives on; zero if unknown
	// unsynced is the target's data written and not yet durable as its
	// server last reported it (unsyncedAt), for strata status.
	unsynced   rpc.TargetUnsynced
	unsyncedAt time.Time
}

// fsKey names a file system: its host and statfs f_fsid.
type fsKey struct {
	host string
	id   uint64
}

// candidateTTL bounds how stale the cached placement candidates may be.
const candidateTTL = 200 * time.Millisecond

func newLiveness(timeout time.Duration) *liveness {
	l := &liveness{timeout: timeout}
	l.mu.servers = map[uint32]time.Time{}
	l.mu.targets = map[uint32]targetUsage{}
	return l
}

func (l *liveness) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.servers = map[uint32]time.Time{}
	l.mu.targets = map[uint32]targetUsage{}
	l.mu.cands, l.mu.candsAt = nil, time.Time{}
}

func (l *liveness) aliveLocked(server uint32, now time.Time) bool {
	t, ok := l.mu.servers[server]
	return ok && now.Sub(t) < l.timeout
}

func (l *liveness) alive(server uint32, now time.Time) (bool, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.aliveLocked(server, now), l.mu.servers[server]
}

func (l *liveness) usage(target uint32) (targetUsage, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u, ok := l.mu.targets[target]
	return u, ok
}

// registered records a registration by a server on host as a heartbeat.
func (l *liveness) registered(server uint32, host string, ids []uint32, regs []rpc.TargetReg, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.servers[server] = now
	for i, id := range ids {
		r := &regs[i]
		l.mu.targets[id] = newTargetUsage(server, host, r.TotalBytes, r.FreeBytes, r.RawFree, r.FSID)
	}
	l.mu.candsAt = time.Time{}
}

// newTargetUsage is a target's capacity as its server on host reported it;
// rawFree and fsid are 0 when unknown.
func newTargetUsage(server uint32, host string, total, free, rawFree, fsid uint64) targetUsage {
	tu := targetUsage{server: server, total: total, free: free, rawFree: rawFree}
	if fsid != 0 {
		tu.fs = fsKey{host, fsid}
	}
	return tu
}

// heartbeat records a server's heartbeat from host; fsids, when the
// server sent them, name each target's file system.
func (l *liveness) heartbeat(server uint32, host string, usage []rpc.TargetUsage, fsids, rawFree []uint64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.aliveLocked(server, now) {
		l.mu.candsAt = time.Time{}
	}
	l.mu.servers[server] = now
	for i, u := range usage {
		old, ok := l.mu.targets[u.ID]
		if !ok || (old.free == 0) != (u.FreeBytes == 0) {
			l.mu.candsAt = time.Time{}
		}
		var raw, fsid uint64
		if i < len(rawFree) {
			raw = rawFree[i]
		}
		if i < len(fsids) {
			fsid = fsids[i]
		}
		l.mu.targets[u.ID] = newTargetUsage(server, host, u.TotalBytes, u.FreeBytes, raw, fsid)
	}
}

// reportUnsynced records the unsynced figures a heartbeat carried (one
// per target of usage; an older server sends none).
func (l *liveness) reportUnsynced(usage []rpc.TargetUsage, unsynced []rpc.TargetUnsynced, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, u := range usage {
		tu, ok := l.mu.targets[u.ID]
		if !ok || i >= len(unsynced) {
			continue
		}
		tu.unsynced, tu.unsyncedAt = unsynced[i], now
		l.mu.targets[u.ID] = tu
	}
}

// unsynced is a target's last reported unsynced figures with the oldest
// chunk's age carried forward to now.
func (l *liveness) unsynced(target uint32, now time.Time) rpc.TargetUnsynced {
	l.mu.Lock()
	defer l.mu.Unlock()
	tu := l.mu.targets[target]
	f := tu.unsynced
	if f.Chunks > 0 && !tu.unsyncedAt.IsZero() {
		f.OldestMs += max(now.Sub(tu.unsyncedAt).Milliseconds(), 0)
	}
	return f
}

// candidates lists live targets with free space, by id. The slice is
// shared: callers must not modify it.
func (l *liveness) candidates(now time.Time) []layout.Candidate {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mu.candsAt.IsZero() && now.Sub(l.mu.candsAt) < candidateTTL {
		return l.mu.cands
	}
	out := make([]layout.Candidate, 0, len(l.mu.targets))
	for id, u := range l.mu.targets {
		if u.free > 0 && l.aliveLocked(u.server, now) {
			out = append(out, layout.Candidate{ID: id, FreeBytes: u.free})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	l.mu.cands, l.mu.candsAt = out, now
	return out
}

// noCandidates says why candidates is empty, for the ENOSPC of a create:
// no targets known, none on a live server, or every live one full.
func (l *liveness) noCandidates(now time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	live := 0
	for _, u := range l.mu.targets {
		if l.aliveLocked(u.server, now) {
			live++
		}
	}
	switch {
	case len(l.mu.targets) == 0:
		return "no storage target is registered: start a storage server (strata store)"
	case live == 0:
		return fmt.Sprintf("none of the %d storage targets is on a live storage server (no heartbeat within %v): see strata status", len(l.mu.targets), l.timeout)
	default:
		return fmt.Sprintf("all %d live storage targets are full (no space above their reserve): free space on them or add targets", live)
	}
}

// capacity sums the last reported capacity of every known target,
// counting targets that share a file system (several targets, or several
// servers, of one host on one disk — strata up's default) once: df on the
// mount then shows the disks, not a multiple of them.
func (l *liveness) capacity() (total, free uint64) {
	total, _, free = l.capacityRaw()
	return total, free
}

// capacityRaw is capacity with the free space including blocks reserved
// for root (statfs f_bfree, what df's Used is computed from) besides the
// usable free space (f_bavail).
func (l *liveness) capacityRaw() (total, rawFree, free uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := make(map[fsKey]bool, len(l.mu.targets))
	for _, u := range l.mu.targets {
		if u.fs.id != 0 {
			if seen[u.fs] {
				continue
			}
			seen[u.fs] = true
		}
		total += u.total
		free += u.free
		rawFree += max(u.rawFree, u.free)
	}
	return total, rawFree, free
}

// leaderLoop runs while this node leads: it expires sessions and, once
// mirror groups exist, makes the automatic switch of a silent primary.
// It owns nothing but its timers; state changes go through raft. The
// orphan reaper runs on a goroutine of its own (reapLoop): it calls the
// storage servers, and a hung one (SIGSTOP, a lost link) held a pass for
// up to its call timeout — the mirror switch, run on the same loop, came
// 15–30 s late instead of after the failover timeout.
func (s *Service) leaderLoop(ctx context.Context) {
	var reaper sync.WaitGroup
	reaper.Add(1)
	go func() {
		defer reaper.Done()
		s.reapLoop(ctx)
	}()
	defer reaper.Wait()
	sessTick := clampDur(s.cfg.SessionLease/4, 25*time.Millisecond, time.Second)
	st := s.cfg.Clock.NewTicker(sessTick)
	defer st.Stop()
	// The mirror groups' automatic switch (mirrorsvc.go): checked ten
	// times per failover timeout, so a switch comes at most a tenth late.
	// Its ticker exists once there are groups (made at a session tick
	// after the first): a cluster without mirrors has no such timer.
	var ft clock.Ticker
	var ftC <-chan time.Time
	startFailover := func() {
		if ft == nil && s.fsm.groups.Load() > 0 {
			ft = s.cfg.Clock.NewTicker(clampDur(s.cfg.FailoverTimeout/10, 10*time.Millisecond, 250*time.Millisecond))
			ftC = ft.C()
		}
	}
	startFailover()
	defer func() {
		if ft != nil {
			ft.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-st.C():
			s.expireSessions()
			startFailover()
		case <-ftC:
			s.checkMirrors()
		}
	}
}

// reapLoop runs the orphan reaper while this node leads (leaderLoop).
func (s *Service) reapLoop(ctx context.Context) {
	reapTick := clampDur(s.cfg.OrphanGrace/4, 50*time.Millisecond, time.Second)
	rt := s.cfg.Clock.NewTicker(reapTick)
	defer rt.Stop()
	start := s.cfg.Clock.Now()
	pace := reapPacer{last: start, at: start, requests: s.requests.Load()}
	for {
		select {
		case <-ctx.Done():
			s.logFreePending()
			return
		case now := <-rt.C():
			if pace.due(now, s.requests.Load(), s.cfg.ReapDeferMax, s.lowOnSpace()) {
				s.reapOrphans(ctx)
			}
		}
	}
}

// logFreePending says in one line, as this node stops leading (or
// stops), how many removed files still wait for their chunks to be freed:
// the next leader frees them, and their number is all an operator needs,
// not a line per file or per failed attempt.
func (s *Service) logFreePending() {
	files, bytes, err := s.freePending()
	if err != nil || files == 0 {
		return
	}
	s.log.Info("removed files wait for their chunks to be freed; the next leader frees them in the background",
		"files", files, "bytes", bytes)
}

// reapBusyRate is the request rate above which the reaper yields to
// clients (ReapDeferMax). Deleting a removed file's chunks costs the
// service and the storage servers about as much as the removal itself;
// during a burst of creates and removals (a job's cleanup, mdtest) it
// took a tenth of the metadata rate. Deferred, it runs in the pauses.
const reapBusyRate = 500

// reapPacer decides when the reaper runs: at every tick while clients are
// quiet, and while they are busy only once maxDefer has passed since the
// last pass (or at once when space runs low).
type reapPacer struct {
	last     time.Time // last pass
	at       time.Time // last tick
	requests uint64    // request count at the last tick
}

func (p *reapPacer) due(now time.Time, requests uint64, maxDefer time.Duration, lowSpace bool) bool {
	elapsed := now.Sub(p.at)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(requests-p.requests) / elapsed.Seconds()
	}
	p.at, p.requests = now, requests
	if maxDefer > 0 && !lowSpace && rate > reapBusyRate && now.Sub(p.last) < maxDefer {
		return false
	}
	p.last = now
	return true
}

// lowOnSpace reports whether less than a tenth of the registered capacity
// is free: then freeing space beats client latency.
func (s *Service) lowOnSpace() bool {
	total, free := s.live.capacity()
	return total > 0 && free < total/10
}

func clampDur(d, lo, hi time.Duration) time.Duration {
	return max(lo, min(d, hi))
}

func (s *Service) expireSessions() {
	for _, id := range s.sess.expired(s.cfg.Clock.Now(), s.cfg.SessionLease) {
		if err := s.closeSession(id); err != nil {
			s.log.Warn("expire session", "client", id, "err", err)
			return
		}
		s.log.Info("session expired", "client", id, "lease", s.cfg.SessionLease)
	}
}

// closeSession removes a session through raft, then frees its locks.
func (s *Service) closeSession(id uint64) error {
	r, err := s.propose(&command{Op: opSessionClose, Now: s.now(), Ino: id})
	if err != nil {
		return err
	}
	if err := r.err(); err != nil {
		return err
	}
	s.sess.remove(id)
	s.dg.forget(id)
	if n := s.locks.releaseClient(id); n > 0 {
		s.log.Info("released locks of closed session", "client", id, "locks", n)
	}
	return nil
}

// closeReplaced closes the sessions that session id, just opened by r,
// replaces: a FUSE mount restarted at the same mount point of the same
// host by another process. The process that held the older session is
// gone (a live mount would hold the point), so its locks and create
// delegations go now rather than after its lease — the restarted mount's
// own creates in a directory the dead one held would wait that long.
// NFS gateways (mount point nfs://…) and sessions of the same process
// (several clients of one process, tests) are left alone.
func (s *Service) closeReplaced(id uint64, r *rpc.SessionOpenReq) {
	if r.Host == "" || !strings.HasPrefix(r.MountPoint, "/") {
		return
	}
	p := schema.SessionPrefix()
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return
	}
	var old []uint64
	for ok := it.First(); ok; ok = it.Next() {
		sid, err := schema.DecodeSessionKey(it.Key())
		if err != nil || sid == id {
			continue
		}
		rec, err := schema.DecodeSession(it.Value())
		if err == nil && rec.Host == r.Host && rec.MountPoint == r.MountPoint && rec.Pid != r.Pid {
			old = append(old, sid)
		}
	}
	it.Close()
	for _, sid := range old {
		if err := s.closeSession(sid); err != nil {
			s.log.Warn("closing the session of a mount restarted at the same point", "client", sid, "err", err)
			continue
		}
		s.log.Info("session closed: its mount point was mounted again by another process", "client", sid, "host", r.Host,
			"mount", r.MountPoint, "new_client", id)
	}
}

// reapBatch bounds the orphans handled per round of a pass; a pass goes
// on with further rounds while they come back full, for at most
// reapPassTime, so a burst of removals is reaped at the rate it arrives.
const (
	reapBatch    = 4096
	reapPassTime = 500 * time.Millisecond
	// reapCallChunks bounds the chunks of one SRemoveMany call.
	reapCallChunks = 256
)

// reapOrphans deletes the chunks of unlinked files that no session holds
// open and then the orphan records. A store that cannot be reached leaves
// its orphans for a later pass.
func (s *Service) reapOrphans(ctx context.Context) {
	if s.cfg.Clock.Now().Sub(time.Unix(0, s.leaderSince.Load())) < s.cfg.OrphanGrace {
		return
	}
	start := time.Now()
	for ctx.Err() == nil && time.Since(start) < reapPassTime {
		if n := s.reapRound(ctx); n < reapBatch {
			return
		}
	}
}

// reapRound reaps up to reapBatch orphans and reports how many it found
// ready, or 0 when some could not be reaped (the pass ends there: the
// next tick retries, rather than the same failure again at once).
func (s *Service) reapRound(ctx context.Context) int {
	// An orphan may be reaped once every session has reported its open
	// files since the orphan appeared, and none reported it: a client that
	// opened the file just before another client unlinked it has not
	// necessarily said so yet.
	open := s.sess.openSet()
	reportedSince := s.sess.oldestReport()
	p := schema.OrphanPrefix()
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		s.log.Warn("scan orphans", "err", err)
		return 0
	}
	var inos []uint64
	for ok := it.First(); ok && len(inos) < reapBatch; ok = it.Next() {
		ino, err := schema.DecodeOrphanKey(it.Key())
		if err != nil {
			s.log.Error("bad orphan record", "key", it.Key(), "err", err)
			continue
		}
		o, err := schema.DecodeOrphan(it.Value())
		if err != nil {
			s.log.Error("bad orphan record", "ino", ino, "err", err)
			continue
		}
		if !reportedSince.IsZero() && o.Since >= reportedSince.UnixNano() {
			continue // some session has not reported since the unlink
		}
		if _, isOpen := open[ino]; !isOpen {
			inos = append(inos, ino)
		}
	}
	it.Close()
	if len(inos) == 0 {
		return 0
	}
	// The unlinks must not be lost once the data is gone.
	if err := s.syncLog(); err != nil {
		s.log.Warn("reap orphans: metadata log not durable", "err", err)
		return 0
	}
	reaped := s.removeChunks(ctx, inos)
	found := len(inos)
	if len(reaped) < found {
		found = 0
	}
	// Drop every orphan whose data is gone in one Raft command per
	// reapCommand inodes: one log append per round, not one per file.
	for len(reaped) > 0 {
		n := min(len(reaped), reapCommand)
		r, err := s.propose(&command{Op: opReapMany, Now: s.now(), Inos: reaped[:n]})
		if err == nil {
			err = r.err()
		}
		if err != nil {
			s.log.Warn("reap orphans", "count", n, "err", err)
			return 0
		}
		s.m.reaped.Add(float64(n))
		reaped = reaped[n:]
	}
	return found
}

// freePending counts the orphans (removed files whose chunks the reaper
// has not freed yet, open ones included) and the space they hold: the
// space their size commits reported, else (none reported) their size. It reads every
// orphan record, as cluster status asks for it, not on any file's path.
func (s *Service) freePending() (files, bytes uint64, err error) {
	p := schema.OrphanPrefix()
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return 0, 0, fmt.Errorf("scan orphans: %w", err)
	}
	defer it.Close()
	var in schema.Inode
	for ok := it.First(); ok; ok = it.Next() {
		ino, err := schema.DecodeOrphanKey(it.Key())
		if err != nil {
			continue // reapRound logs bad records
		}
		files++
		v, err := s.db.Get(schema.InodeKey(ino))
		if err != nil || schema.DecodeInode(v, &in) != nil {
			continue
		}
		// A small file's size commit often reports no space yet (the
		// store's file system had not allocated it): count its size then.
		if blocks, _ := in.AllocBlocks(); blocks > 0 {
			bytes += blocks * 512
		} else {
			bytes += in.Size
		}
	}
	return files, bytes, it.Error()
}

// reapCommand bounds the inodes of one opReapMany command.
const reapCommand = 1024

// removeChunks removes the chunks of the given inodes with one
// SRemoveMany call per storage server (servers in parallel) and returns
// the inodes whose chunks are all gone.
func (s *Service) removeChunks(ctx context.Context, inos []uint64) []uint64 {
	type job struct {
		chunks []rpc.ChunkID
	}
	jobs := map[string]*job{}
	failed := map[uint64]bool{}
	// A round reaps up to reapBatch orphans striped over the same few
	// targets: resolve each target's server once, not once per chunk (two
	// store reads each — they were most of the leader's CPU while a round
	// of 20,000 removed files was reaped).
	type resolved struct {
		addr  string
		epoch uint64 // a group's (ChunkID.Epoch)
		err   error
	}
	addrs := map[uint32]resolved{}
	unreadable := 0 // logged once per round
	for _, ino := range inos {
		v, err := s.db.Get(schema.InodeKey(ino))
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		var in schema.Inode
		if err == nil {
			err = schema.DecodeInode(v, &in)
		}
		if err != nil {
			if unreadable == 0 {
				s.log.Warn("orphan inode unreadable; will retry", "ino", ino, "err", err)
			}
			unreadable++
			failed[ino] = true
			continue
		}
		for _, tid := range in.Layout.Targets {
			r, ok := addrs[tid]
			if !ok {
				if layout.IsGroup(tid) {
					r.addr, r.epoch, r.err = s.groupPrimaryAddr(tid &^ layout.GroupBit)
				} else {
					r.addr, r.err = s.targetAddr(tid)
				}
				addrs[tid] = r
			}
			addr, err := r.addr, r.err
			if err != nil {
				failed[ino] = true
				continue
			}
			if addr == "" {
				continue // target unknown to the registry: nothing to contact
			}
			j := jobs[addr]
			if j == nil {
				j = &job{}
				jobs[addr] = j
			}
			j.chunks = append(j.chunks, rpc.ChunkID{Target: tid, Ino: ino, Epoch: r.epoch})
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var down []string // servers that failed, for one warning
	var firstErr error
	for addr, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// In calls of at most reapCallChunks chunks, each bounded: a
			// store removes a call's chunks one after the other (a mirrored
			// one forwarding each removal), and one call of a whole round's
			// 4,096 took longer than its timeout on a loaded server, failed
			// whole, and was sent again next round — the orphans, and the
			// space they hold, piled up. After a failed call the rest of
			// the server's chunks wait for the next round.
			for start := 0; start < len(j.chunks); start += reapCallChunks {
				part := j.chunks[start:min(start+reapCallChunks, len(j.chunks))]
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := s.peer(addr).Call(cctx, rpc.SRemoveMany, &rpc.ChunksReq{Chunks: part}, nil)
				cancel()
				if err == nil {
					continue
				}
				mu.Lock()
				down = append(down, addr)
				if firstErr == nil {
					firstErr = err
				}
				for _, ch := range j.chunks[start:] {
					failed[ch.Ino] = true
				}
				mu.Unlock()
				return
			}
		}()
	}
	wg.Wait()
	// One line per round, none while the service stops (its storage
	// servers may be gone already; logFreePending sums up what is left).
	if len(down) > 0 && ctx.Err() == nil {
		s.log.Warn("orphan data not removed yet; will retry", "servers", down, "files", len(failed), "err", firstErr)
	}
	var done []uint64
	for _, ino := range inos {
		if !failed[ino] {
			done = append(done, ino)
		}
	}
	return done
}

// targetAddr is the data address of the server owning target tid ("" when
// the target is not registered).
func (s *Service) targetAddr(tid uint32) (string, error) {
	v, err := s.db.Get(schema.TargetKey(tid))
	if errors.Is(err, kv.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	t, err := schema.DecodeTarget(v)
	if err != nil {
		return "", err
	}
	sv, err := s.db.Get(schema.ServerKey(t.ServerID))
	if err != nil {
		return "", err
	}
	srv, err := schema.DecodeServer(sv)
	if err != nil {
		return "", err
	}
	return srv.Addr, nil
}

// errPrimaryDown keeps an orphan whose mirrored chunks' group has no live
// primary: its chunks are removed through the primary (which removes the
// secondary's copy too), at a later pass.
var errPrimaryDown = errors.New("the mirror group's primary is down")

// groupPrimaryAddr is the data address of the server of group id's
// primary and the group's epoch: a group's chunks are removed through its
// primary, which forwards the removal to the secondary. ("" when the
// group does not exist; errPrimaryDown while its primary's server is
// silent.)
func (s *Service) groupPrimaryAddr(id uint32) (string, uint64, error) {
	v, err := s.db.Get(schema.GroupKey(id))
	if errors.Is(err, kv.ErrNotFound) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	g, err := schema.DecodeGroup(v)
	if err != nil {
		return "", 0, err
	}
	tv, err := s.db.Get(schema.TargetKey(g.Primary))
	if err != nil {
		return "", 0, err
	}
	t, err := schema.DecodeTarget(tv)
	if err != nil {
		return "", 0, err
	}
	if !s.heardWithin(t.ServerID, s.cfg.Clock.Now()) {
		return "", 0, fmt.Errorf("group %d: %w", id, errPrimaryDown)
	}
	addr, err := s.targetAddr(g.Primary)
	return addr, g.Epoch, err
}

// peer returns a cached rpc client for a storage server.
func (s *Service) peer(addr string) *transport.Client {
	s.peers.Lock()
	defer s.peers.Unlock()
	c := s.peers.m[addr]
	if c == nil {
		c = transport.NewClient(addr, transport.ClientConfig{Key: s.cfg.ClusterKey, TLS: s.cfg.TLS, Conns: 1, DialTimeout: 2 * time.Second})
		s.peers.m[addr] = c
	}
	return c
}
