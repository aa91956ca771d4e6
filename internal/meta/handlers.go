package meta

import (
	"context"
	"errors"
	"github.com/stratafs/strata/internal/layout"
	"math"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// rawMsg is a response already encoded: the answer kept by a dedupe
// record of format version 1 (schema.AnswerWire).
type rawMsg []byte

func (m rawMsg) Encode(e *rpc.Enc) { e.B = append(e.B, m...) }
func (rawMsg) Decode(*rpc.Dec)     {}

var empty = &rpc.Empty{}

// handle registers fn behind the leadership check.
func handle[Req any, PReq interface {
	*Req
	rpc.Message
}](s *Service, m rpc.Method, fn func(context.Context, PReq) (rpc.Message, error)) {
	transport.Handle(s.srv, m, func(ctx context.Context, req PReq) (rpc.Message, error) {
		if !s.ready.Load() {
			return nil, s.notLeader()
		}
		// A deposed leader must not answer from its state (quorum.go).
		if err := s.node.VerifyRead(readVerifyTimeout); err != nil {
			return nil, s.notLeader()
		}
		// Another session's delegation on a directory the request works
		// on is recalled first (delegation.go).
		release, err := s.dg.gateReq(ctx, s, req)
		if err != nil {
			return nil, err
		}
		defer release()
		return fn(ctx, req)
	})
}

// place fills in the live targets a new regular file may be placed on and
// the round-robin start (ENOSPC when there are none).
func (s *Service) place(ctx context.Context, c *command) error {
	if mirrored, err := s.placeMirrored(ctx, c); mirrored || err != nil {
		return err
	}
	c.Cands = s.waitCandidates(ctx, func() []layout.Candidate { return s.live.candidates(s.cfg.Clock.Now()) })
	if len(c.Cands) == 0 {
		return rpc.Errorf(syscall.ENOSPC, "cannot place a new file: %s", s.live.noCandidates(s.cfg.Clock.Now()))
	}
	c.RRStart = s.rr.Add(1)
	return nil
}

// mutate proposes c and turns the answer into an rpc answer.
func (s *Service) mutate(c *command) (rpc.Message, error) {
	r, err := s.propose(c)
	if err != nil {
		return nil, err
	}
	if err := r.err(); err != nil {
		return nil, err
	}
	return r.reply(), nil
}

// reply is the wire answer of a successful result.
func (r *result) reply() rpc.Message {
	switch {
	case r.wire != nil:
		return rawMsg(r.wire)
	case r.ans == nil:
		return empty
	case r.ans.msg != nil:
		return r.ans.msg
	}
	a := &r.ans.rec
	st := rpc.Stamp{Index: a.Index, Term: a.Term}
	switch d := r.ans.dirs; {
	case d != nil && a.Kind == schema.AnswerStamp:
		return &rpc.DirChangeResp{Stamp: st, Dir: wireAttr(&d.dir), NewDir: wireAttr(&d.newDir),
			Entry: wireAttr(&d.entry), Other: wireAttr(&d.other)}
	case d != nil && a.Kind == schema.AnswerAttr:
		return &rpc.LinkResp{AttrResp: rpc.AttrResp{Attr: wireAttr(&a.Attr), Stamp: st}, Dir: wireAttr(&d.dir)}
	}
	switch a.Kind {
	case schema.AnswerStamp:
		return &st
	case schema.AnswerAttr:
		return &rpc.AttrResp{Attr: wireAttr(&a.Attr), Stamp: st}
	case schema.AnswerChange:
		return &rpc.ChangeResp{Attr: wireAttr(&a.Attr), Dir: wireAttr(&a.Dir), Index: a.Index, Term: a.Term}
	}
	return empty
}

// toAttr is an inode's attributes on the wire.
func toAttr(ino uint64, in *schema.Inode) rpc.Attr {
	a := recAttr(ino, in)
	return wireAttr(&a)
}

func wireAttr(a *schema.Attr) rpc.Attr {
	return rpc.Attr{Ino: a.Ino, Mode: a.Mode, Nlink: a.Nlink, Uid: a.Uid, Gid: a.Gid, Rdev: a.Rdev,
		Size: a.Size, Atime: a.Atime, Mtime: a.Mtime, Ctime: a.Ctime, Layout: a.Layout,
		Blocks: a.Blocks, BlocksKnown: a.BlocksKnown, Inline: a.Inline}
}

// allServersHeard reports whether every registered storage server is
// alive in this leader's view (has heartbeated since it took office).
func (s *Service) allServersHeard() bool {
	servers, _, err := s.registry()
	if err != nil {
		return true // no better answer by waiting
	}
	for _, sv := range servers {
		if !sv.Alive {
			return false
		}
	}
	return true
}

// now is the time the leader stamps on what it proposes (Config.Clock).
func (s *Service) now() int64 { return s.cfg.Clock.Now().UnixNano() }

// waitCandidates returns the placement candidates list gives (live
// targets, or groups, with free space). Liveness lives in the leader's
// memory, so a leader that has just started (a restart of the service)
// knows of no live target until the storage servers' next heartbeats;
// rather than fail creates with ENOSPC in that window, it waits for them
// (until every registered server has been heard from, when an empty list
// is the truth: full targets, or groups without a live primary)
// — at most ServerTimeout after taking office: the old leader counted a
// server alive that long after its last heartbeat, and under load a
// store's first heartbeat to a new leader (it finds the leader by trying
// the voters) came more than 5 s after a leader change, failing a create
// with ENOSPC in the soak.
func (s *Service) waitCandidates(ctx context.Context, list func() []layout.Candidate) []layout.Candidate {
	cands := list()
	if len(cands) > 0 {
		return cands
	}
	grace := s.cfg.ServerTimeout
	until := time.Unix(0, s.leaderSince.Load()).Add(grace)
	for len(cands) == 0 && s.cfg.Clock.Now().Before(until) && ctx.Err() == nil && !s.allServersHeard() {
		time.Sleep(50 * time.Millisecond)
		cands = list()
	}
	return cands
}

func (s *Service) register() {
	s.registerMembership()
	s.registerMirror()
	s.registerHALease()
	s.registerDelegation()
	// Reads of the leader's store, and the durability barrier (it waits
	// only as long as its caller's context lets it): in-process callers
	// (strata up) run them on their own goroutine.
	s.srv.Inline(rpc.MLookup, rpc.MGetAttr, rpc.MReadlink, rpc.MReadDir, rpc.MGetXattr,
		rpc.MListXattr, rpc.MStatFS, rpc.MListTargets, rpc.MSync, rpc.MInodesKnown)
	handle(s, rpc.MSessionOpen, func(_ context.Context, r *rpc.SessionOpenReq) (rpc.Message, error) {
		lease := uint32(min(s.cfg.SessionLease.Milliseconds(), math.MaxUint32))
		res, err := s.propose(&command{Op: opSessionOpen, Now: s.now(), Host: r.Host, MountPoint: r.MountPoint, Pid: r.Pid, LeaseMs: lease})
		if err != nil {
			return nil, err
		}
		if err := res.err(); err != nil {
			return nil, err
		}
		resp, ok := res.reply().(*rpc.SessionOpenResp)
		if !ok {
			return nil, rpc.Errorf(syscall.EIO, "session open answered %T", res.reply())
		}
		s.sess.add(resp.ClientID, s.cfg.Clock.Now())
		s.log.Info("session opened", "client", resp.ClientID, "host", r.Host, "mount", r.MountPoint, "pid", r.Pid)
		s.closeReplaced(resp.ClientID, r)
		return resp, nil
	})
	handle(s, rpc.MSessionHeartbeat, func(_ context.Context, r *rpc.SessionHeartbeatReq) (rpc.Message, error) {
		var builtAfter time.Time
		if r.ListedAfter > 0 {
			builtAfter = time.Unix(0, r.ListedAfter)
		}
		t := s.cfg.Clock.Now()
		if !s.sess.heartbeat(r.ClientID, r.OpenInodes, builtAfter, t, r.Gateway) {
			return nil, rpc.Errorf(syscall.ESTALE, "unknown session %d (expired or closed): open a new one", r.ClientID)
		}
		s.locks.reclaimed(r.ClientID, r.LockEpoch)
		return &rpc.SessionHeartbeatResp{LockEpoch: s.locks.epoch(), Now: t.UnixNano()}, nil
	})
	handle(s, rpc.MSessionClose, func(_ context.Context, r *rpc.SessionCloseReq) (rpc.Message, error) {
		if err := s.closeSession(r.ClientID); err != nil {
			return nil, err
		}
		s.log.Info("session closed", "client", r.ClientID)
		return empty, nil
	})
	handle(s, rpc.MLookup, s.lookup)
	handle(s, rpc.MGetAttr, func(ctx context.Context, r *rpc.GetAttrReq) (rpc.Message, error) {
		if r.Flags != 0 {
			return s.getAttrFlags(ctx, r)
		}
		a, err := s.getAttr(r.Ino)
		if err != nil {
			return nil, err
		}
		return &rpc.AttrResp{Attr: a}, nil
	})
	handle(s, rpc.MDirLayout, func(_ context.Context, r *rpc.GetAttrReq) (rpc.Message, error) {
		in, err := s.readInode(r.Ino)
		if err != nil {
			return nil, err
		}
		if in.Mode&modeType != modeDir {
			return nil, rpc.Errorf(syscall.ENOTDIR, "inode %d is not a directory: only directories have a default layout", r.Ino)
		}
		return &rpc.DirLayoutResp{StripeSize: in.Layout.StripeSize, StripeCount: in.Layout.StripeCount, Mirror: in.Mirror}, nil
	})
	handle(s, rpc.MSetAttr, func(_ context.Context, r *rpc.SetAttrReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opSetAttr, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Ino, Valid: r.Valid, Mode: r.Mode,
			Uid: r.Uid, Gid: r.Gid, Size: r.Size, Atime: r.Atime, Mtime: r.Mtime, Ctime: r.Ctime})
	})
	handle(s, rpc.MCreate, func(ctx context.Context, r *rpc.CreateReq) (rpc.Message, error) {
		c := &command{Op: opCreate, Now: s.now(), Hdr: hdrOf(r.Hdr), Parent: r.Parent, Name: r.Name, Mode: r.Mode,
			Uid: r.Uid, Gid: r.Gid, Rdev: r.Rdev, Symlink: r.SymlinkTarget}
		if r.Mode&modeType == modeReg || r.Mode&modeType == 0 {
			if err := s.place(ctx, c); err != nil {
				return nil, err
			}
		}
		resp, err := s.mutate(c)
		s.noteNoGroups(err)
		return resp, err
	})
	handle(s, rpc.MTmpfile, func(ctx context.Context, r *rpc.CreateReq) (rpc.Message, error) {
		if r.Name != "" {
			return nil, rpc.Errorf(syscall.EINVAL, "a file made with O_TMPFILE has no name (got %q)", r.Name)
		}
		c := &command{Op: opTmpfile, Now: s.now(), Hdr: hdrOf(r.Hdr), Parent: r.Parent, Mode: r.Mode, Uid: r.Uid, Gid: r.Gid}
		if err := s.place(ctx, c); err != nil {
			return nil, err
		}
		resp, err := s.mutate(c)
		s.noteNoGroups(err)
		return resp, err
	})
	// Unlink and rename do not wake the reaper: an orphan only becomes
	// reapable after every session's next open-file report, and the
	// reaper's ticker scans for those; a scan per unlink made remove-heavy
	// workloads quadratic in the number of waiting orphans.
	handle(s, rpc.MUnlink, func(_ context.Context, r *rpc.EntryReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opUnlink, Now: s.now(), Hdr: hdrOf(r.Hdr), Parent: r.Parent, Name: r.Name})
	})
	handle(s, rpc.MRmdir, func(_ context.Context, r *rpc.EntryReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opRmdir, Now: s.now(), Hdr: hdrOf(r.Hdr), Parent: r.Parent, Name: r.Name})
	})
	handle(s, rpc.MRename, func(_ context.Context, r *rpc.RenameReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opRename, Now: s.now(), Hdr: hdrOf(r.Hdr), Parent: r.OldParent, Name: r.OldName,
			NewParent: r.NewParent, NewName: r.NewName, Flags: r.Flags})
	})
	handle(s, rpc.MLink, func(_ context.Context, r *rpc.LinkReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opLink, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Ino, NewParent: r.NewParent, NewName: r.NewName})
	})
	handle(s, rpc.MReadlink, func(_ context.Context, r *rpc.GetAttrReq) (rpc.Message, error) {
		in, err := s.readInode(r.Ino)
		if err != nil {
			return nil, err
		}
		if in.Mode&modeType != modeLink {
			return nil, rpc.Errorf(syscall.EINVAL, "inode %d is not a symlink", r.Ino)
		}
		return &rpc.ReadlinkResp{Target: in.Symlink}, nil
	})
	handle(s, rpc.MReadDir, s.readDir)
	handle(s, rpc.MStatFS, func(_ context.Context, _ *rpc.Empty) (rpc.Message, error) {
		total, rawFree, free := s.live.capacityRaw()
		used := s.fsm.inodes.Load()
		const maxInodes = 1 << 40
		return &rpc.StatFSResp{TotalBytes: total, FreeBytes: rawFree, AvailBytes: free,
			Inodes: maxInodes, FreeInodes: maxInodes - min(used, maxInodes)}, nil
	})
	handle(s, rpc.MGetXattr, func(_ context.Context, r *rpc.XattrReq) (rpc.Message, error) {
		v, err := s.db.Get(schema.XattrKey(r.Ino, r.Name))
		if errors.Is(err, kv.ErrNotFound) {
			if _, err := s.readInode(r.Ino); err != nil {
				return nil, err
			}
			return nil, rpc.Errorf(syscall.ENODATA, "no xattr %q on inode %d", r.Name, r.Ino)
		}
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "read xattr %q of inode %d: %v", r.Name, r.Ino, err)
		}
		return &rpc.XattrResp{Value: v}, nil
	})
	handle(s, rpc.MSetXattr, func(_ context.Context, r *rpc.XattrReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opSetXattr, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Ino, Name: r.Name, Value: r.Value, Flags: r.Flags})
	})
	handle(s, rpc.MListXattr, s.listXattr)
	handle(s, rpc.MSetAtimes, func(_ context.Context, r *rpc.SetAtimesReq) (rpc.Message, error) {
		if len(r.Inos) > rpc.MaxSetAtimes || len(r.Atimes) != len(r.Inos) {
			return nil, rpc.Errorf(syscall.EINVAL, "%d access times for %d files (at most %d)", len(r.Atimes), len(r.Inos), rpc.MaxSetAtimes)
		}
		return s.mutate(&command{Op: opSetAtimes, Now: s.now(), Hdr: hdrOf(r.Hdr), Inos: r.Inos, Atimes: r.Atimes})
	})
	handle(s, rpc.MRemoveXattr, func(_ context.Context, r *rpc.XattrReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opRemoveXattr, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Ino, Name: r.Name})
	})
	handle(s, rpc.MSync, func(ctx context.Context, r *rpc.SyncReq) (rpc.Message, error) {
		if err := s.checkEntry(r.Index, r.Term); err != nil {
			return nil, err
		}
		if err := s.syncLogTo(ctx, r.Index); err != nil {
			return nil, err
		}
		// The term first: a durable index reported with the term it was
		// durable in (a client trusts it for changes of that term only).
		term := s.node.Term()
		return &rpc.SyncResp{Durable: s.node.DurableIndex(), Term: term}, nil
	})
	handle(s, rpc.MCommitSize, func(_ context.Context, r *rpc.CommitSizeReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opCommitSize, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Ino, Size: r.Size, Mtime: r.Mtime, ClearSuid: r.ClearSuid, Alloc: slotAllocsOf(r.Alloc), Deferred: r.Deferred})
	})
	handle(s, rpc.MGetLk, func(ctx context.Context, r *rpc.LockReq) (rpc.Message, error) {
		if !s.sess.known(r.ClientID) {
			return nil, rpc.Errorf(syscall.ESTALE, "unknown session %d: open a new one", r.ClientID)
		}
		return s.locks.get(ctx, r)
	})
	handle(s, rpc.MSetLk, func(ctx context.Context, r *rpc.LockReq) (rpc.Message, error) {
		if !s.sess.known(r.ClientID) {
			return nil, rpc.Errorf(syscall.ESTALE, "unknown session %d: open a new one", r.ClientID)
		}
		epoch, err := s.locks.set(ctx, r)
		if err != nil {
			return nil, err
		}
		return &rpc.LockGrant{Epoch: epoch}, nil
	})
	handle(s, rpc.MSetDirLayout, func(_ context.Context, r *rpc.SetDirLayoutReq) (rpc.Message, error) {
		return s.mutate(&command{Op: opSetDirLayout, Now: s.now(), Hdr: hdrOf(r.Hdr), Ino: r.Dir, Size: uint64(r.StripeSize), Flags: r.StripeCount, MirrorMode: r.Mirror})
	})
	handle(s, rpc.MRegisterServer, func(_ context.Context, r *rpc.RegisterServerReq) (rpc.Message, error) {
		if err := s.checkForeignTargets(r.Targets); err != nil {
			return nil, err
		}
		next := s.fsm.nextIno()
		res, err := s.propose(&command{Op: opRegister, Now: s.now(), Addr: r.Addr, Host: r.Host, Targets: targetRegsOf(r.Targets), Domain: r.Domain})
		if err != nil {
			return nil, err
		}
		if err := res.err(); err != nil {
			return nil, err
		}
		resp, ok := res.reply().(*rpc.RegisterServerResp)
		if !ok {
			return nil, rpc.Errorf(syscall.EIO, "register answered %T", res.reply())
		}
		for _, t := range r.Targets {
			s.warnIfBehind(t.InoCeiling, next, "target "+t.Path)
		}
		s.live.registered(resp.ServerID, r.Host, resp.TargetIDs, r.Targets, s.cfg.Clock.Now())
		s.log.Info("storage server registered", "server", resp.ServerID, "addr", r.Addr, "host", r.Host, "targets", resp.TargetIDs, "domain", r.Domain)
		return resp, nil
	})
	handle(s, rpc.MServerHeartbeat, func(_ context.Context, r *rpc.ServerHeartbeatReq) (rpc.Message, error) {
		v, err := s.db.Get(schema.ServerKey(r.ServerID))
		if errors.Is(err, kv.ErrNotFound) {
			return nil, rpc.Errorf(syscall.ESTALE, "unknown storage server %d: register again", r.ServerID)
		} else if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "read server %d: %v", r.ServerID, err)
		}
		srv, err := schema.DecodeServer(v)
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "server %d: %v", r.ServerID, err)
		}
		// A server's targets become placement candidates only once no
		// inode number below their chunks' can be handed out again.
		if next := s.fsm.nextIno(); r.InoCeiling > next {
			if err := s.raiseIno(r.InoCeiling); err != nil {
				return nil, err
			}
			s.warnIfBehind(r.InoCeiling, next, "storage server "+srv.Addr)
		}
		now := s.cfg.Clock.Now()
		s.live.heartbeat(r.ServerID, srv.Host, r.Targets, r.FSIDs, r.RawFree, now)
		s.live.reportUnsynced(r.Targets, r.Unsynced, now)
		return s.serverGroups(&srv, now)
	})
	handle(s, rpc.MClusterStatus, s.clusterStatus)
	handle(s, rpc.MInodesKnown, func(_ context.Context, r *rpc.InodesKnownReq) (rpc.Message, error) {
		if len(r.Inos) > rpc.MaxInodesKnown {
			return nil, rpc.Errorf(syscall.EINVAL, "%d inode numbers in one call; at most %d", len(r.Inos), rpc.MaxInodesKnown)
		}
		resp := &rpc.InodesKnownResp{NextIno: s.fsm.nextIno(), Known: make([]bool, len(r.Inos))}
		var reserved []inoRange
		loaded := false
		for i, ino := range r.Inos {
			_, err := s.db.Get(schema.InodeKey(ino))
			switch {
			case err == nil:
				resp.Known[i] = true
			case !errors.Is(err, kv.ErrNotFound):
				return nil, rpc.Errorf(syscall.EIO, "read inode %d: %v", ino, err)
			default:
				// A number a live session reserved may have chunks
				// before its create reaches the service (a create
				// answered by the client under a delegation): not an
				// orphan while the session lives.
				if !loaded {
					if reserved, err = reservedRanges(s.db); err != nil {
						return nil, err
					}
					loaded = true
				}
				resp.Known[i] = inRanges(reserved, ino)
			}
		}
		return resp, nil
	})
	handle(s, rpc.MListTargets, func(_ context.Context, _ *rpc.Empty) (rpc.Message, error) {
		_, targets, err := s.registry()
		if err != nil {
			return nil, err
		}
		return &rpc.ListTargetsResp{Targets: targets}, nil
	})
}

// readInode reads ino's record (through the FSM's cache: the answer's
// slices must not be changed).
func (s *Service) readInode(ino uint64) (*schema.Inode, error) {
	return s.fsm.readInode(ino)
}

func (s *Service) getAttr(ino uint64) (rpc.Attr, error) {
	in, err := s.readInode(ino)
	if err != nil {
		return rpc.Attr{}, err
	}
	return toAttr(ino, in), nil
}

// errNoEntry answers a lookup of an absent name: the usual answer (every
// create starts with one), so it is not formatted per call; the caller
// knows the name.
var errNoEntry = &rpc.Error{Errno: syscall.ENOENT, Msg: "no such entry"}

func (s *Service) lookup(_ context.Context, r *rpc.LookupReq) (rpc.Message, error) {
	if r.Name == ".." {
		return s.lookupParent(r.Parent)
	}
	if err := checkName(r.Name); err != nil {
		return nil, err
	}
	de, err := s.fsm.readEntry(schema.DentryKey(r.Parent, r.Name))
	if errors.Is(err, kv.ErrNotFound) {
		// Absent from a directory, or the parent is no directory: tell
		// which. A parent once seen as a directory is one for good (inode
		// numbers are not reused), so it is read once, not per lookup of a
		// new name (each create starts with one).
		if !s.dirs.has(r.Parent) {
			in, err := s.readInode(r.Parent)
			if err != nil {
				return nil, err
			}
			if in.Mode&modeType != modeDir {
				return nil, rpc.Errorf(syscall.ENOTDIR, "inode %d is not a directory", r.Parent)
			}
			s.dirs.add(r.Parent)
		}
		return nil, errNoEntry
	}
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "lookup %d/%q: %v", r.Parent, r.Name, err)
	}
	a, err := s.getAttr(de.Ino)
	if err != nil {
		// The entry was removed between the two reads.
		return nil, rpc.Errorf(syscall.ENOENT, "no %q in directory %d", r.Name, r.Parent)
	}
	return &rpc.AttrResp{Attr: a}, nil
}

// lookupParent answers the directory containing directory dir (the
// root's is itself): an NFS client asks the gateway for "..", and a
// directory's inode keeps its parent. Older services answer EINVAL.
func (s *Service) lookupParent(dir uint64) (rpc.Message, error) {
	in, err := s.readInode(dir)
	if err != nil {
		return nil, err
	}
	if in.Mode&modeType != modeDir {
		return nil, rpc.Errorf(syscall.ENOTDIR, "inode %d is not a directory", dir)
	}
	a, err := s.getAttr(in.Parent)
	if err != nil {
		// The parent was removed meanwhile (dir with it, or moved).
		return nil, rpc.Errorf(syscall.ENOENT, "the parent %d of directory %d: %v", in.Parent, dir, err)
	}
	return &rpc.AttrResp{Attr: a}, nil
}

const (
	readDirDefault = 1024
	readDirMax     = 8192
)

// readDir lists a directory from the cursor name onwards. Entries come from
// one iterator (a consistent view), so a page never mixes states; across
// pages the name cursor guarantees that an entry present throughout is
// listed exactly once.
func (s *Service) readDir(_ context.Context, r *rpc.ReadDirReq) (rpc.Message, error) {
	dir, err := s.readInode(r.Dir)
	if err != nil {
		return nil, err
	}
	if dir.Mode&modeType != modeDir {
		return nil, rpc.Errorf(syscall.ENOTDIR, "inode %d is not a directory", r.Dir)
	}
	limit := int(r.Limit)
	if limit == 0 {
		limit = readDirDefault
	}
	limit = min(limit, readDirMax)
	prefix := schema.DentryPrefix(r.Dir)
	lower := prefix
	if r.After != "" {
		lower = append(schema.DentryKey(r.Dir, r.After), 0) // first name after the cursor
	}
	it, err := s.db.NewIter(lower, kv.PrefixEnd(prefix))
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "list directory %d: %v", r.Dir, err)
	}
	defer it.Close()
	resp := &rpc.ReadDirResp{Entries: make([]rpc.DirEntry, 0, min(limit, 256))}
	ok := it.First()
	for ; ok && len(resp.Entries) < limit; ok = it.Next() {
		de, err := schema.DecodeDentry(it.Value())
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "entry %x: %v", it.Key(), err)
		}
		e := rpc.DirEntry{Name: string(schema.DentryName(it.Key())), Ino: de.Ino, Mode: de.Type}
		if r.Plus {
			in, err := s.readInode(de.Ino)
			if err != nil {
				continue // removed since the iterator was opened
			}
			e.Attr = toAttr(de.Ino, in)
			e.Mode = in.Mode
		}
		resp.Entries = append(resp.Entries, e)
	}
	if err := it.Error(); err != nil {
		return nil, rpc.Errorf(syscall.EIO, "list directory %d: %v", r.Dir, err)
	}
	resp.EOF = !ok
	return resp, nil
}

func (s *Service) listXattr(_ context.Context, r *rpc.GetAttrReq) (rpc.Message, error) {
	if _, err := s.readInode(r.Ino); err != nil {
		return nil, err
	}
	p := schema.XattrPrefix(r.Ino)
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "list xattrs of %d: %v", r.Ino, err)
	}
	defer it.Close()
	resp := &rpc.ListXattrResp{}
	for ok := it.First(); ok; ok = it.Next() {
		_, name, err := schema.DecodeXattrKey(it.Key())
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "%v", err)
		}
		resp.Names = append(resp.Names, name)
	}
	return resp, it.Error()
}

// registry lists the registered servers and targets with their health.
func (s *Service) registry() ([]rpc.ServerInfo, []rpc.TargetInfo, error) {
	now := s.cfg.Clock.Now()
	var servers []rpc.ServerInfo
	addrs := map[uint32]string{}
	p := schema.ServerPrefix()
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return nil, nil, err
	}
	for ok := it.First(); ok; ok = it.Next() {
		sv, err := schema.DecodeServer(it.Value())
		if err != nil {
			it.Close()
			return nil, nil, rpc.Errorf(syscall.EIO, "server record: %v", err)
		}
		alive, seen := s.live.alive(sv.ID, now)
		info := rpc.ServerInfo{ID: sv.ID, Addr: sv.Addr, Host: sv.Host, Alive: alive, LastSeenMs: -1}
		if !seen.IsZero() {
			info.LastSeenMs = now.Sub(seen).Milliseconds()
		}
		servers = append(servers, info)
		addrs[sv.ID] = sv.Addr
	}
	it.Close()
	var targets []rpc.TargetInfo
	p = schema.TargetPrefix()
	if it, err = s.db.NewIter(p, kv.PrefixEnd(p)); err != nil {
		return nil, nil, err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		t, err := schema.DecodeTarget(it.Value())
		if err != nil {
			return nil, nil, rpc.Errorf(syscall.EIO, "target record: %v", err)
		}
		alive, _ := s.live.alive(t.ServerID, now)
		u, _ := s.live.usage(t.ID)
		targets = append(targets, rpc.TargetInfo{ID: t.ID, ServerID: t.ServerID, Addr: addrs[t.ServerID], Path: t.Path,
			TotalBytes: u.total, FreeBytes: u.free, Alive: alive})
	}
	return servers, targets, it.Error()
}

func (s *Service) clusterStatus(_ context.Context, _ *rpc.Empty) (rpc.Message, error) {
	st := s.node.Stats()
	leader, _ := s.node.Leader()
	servers, targets, err := s.registry()
	if err != nil {
		return nil, err
	}
	total, free := s.live.capacity()
	ls := s.locks.status(rpc.MaxStatusLocks)
	clients, gateways, err := s.clientInfo(ls.byClient)
	if err != nil {
		return nil, err
	}
	pendingFiles, pendingBytes, err := s.freePending()
	if err != nil {
		return nil, err
	}
	groups, _, err := s.listGroups()
	if err != nil {
		return nil, err
	}
	return &rpc.ClusterStatusResp{
		MetaAddr: s.Addr(), RaftState: st.State, Leader: leader, Term: st.Term,
		CommitIndex: st.CommitIndex, AppliedIndex: s.fsm.AppliedIndex(), DurableIndex: st.DurableIndex,
		Inodes: s.fsm.inodes.Load(), Sessions: uint32(s.sess.count()),
		Servers: servers, Targets: targets, TotalBytes: total, FreeBytes: free,
		Clients: clients, Locks: ls.locks, LocksTotal: uint32(min(ls.total, math.MaxUint32)),
		LockGrace: ls.grace, LockGracePending: uint32(ls.pending),
		Problems:         s.problems(),
		FreePendingFiles: pendingFiles, FreePendingBytes: pendingBytes, Unsynced: s.unsyncedOf(targets),
		Groups: groups, Gateways: gateways, Delegations: s.dg.status(s),
	}, nil
}

// unsyncedOf lists the targets' unsynced figures in their order.
func (s *Service) unsyncedOf(targets []rpc.TargetInfo) []rpc.TargetUnsynced {
	now := s.cfg.Clock.Now()
	out := make([]rpc.TargetUnsynced, len(targets))
	for i, t := range targets {
		out[i] = s.live.unsynced(t.ID, now)
	}
	return out
}

// raiseIno makes the state machine skip every inode number below ceiling.
func (s *Service) raiseIno(ceiling uint64) error {
	res, err := s.propose(&command{Op: opRaiseIno, Now: s.now(), Ino: ceiling})
	if err != nil {
		return err
	}
	return res.err()
}

// warnIfBehind logs when a target's chunks prove the namespace older than
// the data: some chunk file has an inode number at or above the one the
// service would have handed out next (ceilings are rounded up to
// rpc.InoCeilingStep, so only a ceiling a whole step above next proves it).
func (s *Service) warnIfBehind(ceiling, next uint64, who string) {
	if ceiling >= rpc.InoCeilingStep && ceiling-rpc.InoCeilingStep >= next {
		s.log.Warn("the metadata is older than the storage targets' chunks (restored from an older copy?): "+
			"inode numbers below the targets' ceiling are no longer handed out; the chunks of files the metadata does not know stay behind as orphans (strata fsck lists them, --remove-orphans deletes them)",
			"from", who, "next_inode_was", next, "ceiling", ceiling)
	}
}

// checkForeignTargets refuses targets that were registered before (their
// identity file records an id) but are unknown here: they hold another
// file system's chunks — or those of a metadata store that was lost or
// restored from an older copy — and a new file given one of those inode
// numbers would read the old bytes where it has holes.
func (s *Service) checkForeignTargets(ts []rpc.TargetReg) error {
	for _, t := range ts {
		if t.PrevID == 0 {
			continue
		}
		_, err := s.db.Get(schema.TargetUUIDKey(t.UUID))
		if err == nil {
			continue
		}
		if !errors.Is(err, kv.ErrNotFound) {
			return rpc.Errorf(syscall.EIO, "read target %s: %v", t.UUID, err)
		}
		return rpc.Errorf(syscall.EXDEV, "target %s (uuid %s) was target %d of another Strata file system, or of a metadata store that no longer knows it: "+
			"its chunks belong there, and new files here would read them; give the storage server an empty directory, or move the old contents away", t.Path, t.UUID, t.PrevID)
	}
	return nil
}

// problems lists what keeps this service's stores from working.
func (s *Service) problems() []string {
	var out []string
	for _, err := range s.node.Health() {
		out = append(out, err.Error())
	}
	if err := s.db.Health(); err != nil {
		out = append(out, "metadata store: "+err.Error())
	}
	if why := s.disk.low(time.Now()); why != "" {
		out = append(out, why+": creates, links, renames and xattrs fail with ENOSPC")
	}
	return out
}

// clientInfo lists the replicated sessions with this leader's view of their
// liveness, open files and locks (locks: held per client), and the NFS
// gateways' last reports among them.
func (s *Service) clientInfo(locks map[uint64]int) ([]rpc.ClientInfo, []rpc.GatewayStatus, error) {
	live := s.sess.snapshot()
	p := schema.SessionPrefix()
	it, err := s.db.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return nil, nil, rpc.Errorf(syscall.EIO, "list sessions: %v", err)
	}
	defer it.Close()
	now := s.cfg.Clock.Now()
	var out []rpc.ClientInfo
	var gws []rpc.GatewayStatus
	for ok := it.First(); ok; ok = it.Next() {
		id, err := schema.DecodeSessionKey(it.Key())
		if err != nil {
			return nil, nil, rpc.Errorf(syscall.EIO, "session key: %v", err)
		}
		rec, err := schema.DecodeSession(it.Value())
		if err != nil {
			return nil, nil, rpc.Errorf(syscall.EIO, "session %d: %v", id, err)
		}
		c := rpc.ClientInfo{ID: id, Host: rec.Host, MountPoint: rec.MountPoint, Pid: rec.Pid,
			OpenedMs: rec.Opened / int64(time.Millisecond), LastSeenMs: -1, Locks: uint32(locks[id])}
		if l, ok := live[id]; ok {
			c.LastSeenMs = now.Sub(l.lastSeen).Milliseconds()
			c.OpenFiles = uint32(l.open)
			if l.gateway != nil {
				gws = append(gws, rpc.GatewayStatus{Client: id, Report: *l.gateway})
			}
		}
		out = append(out, c)
	}
	if err := it.Error(); err != nil {
		return nil, nil, rpc.Errorf(syscall.EIO, "list sessions: %v", err)
	}
	return out, gws, nil
}
