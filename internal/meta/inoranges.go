package meta

import (
	"context"
	"errors"
	"syscall"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// Inode ranges and batched creates (docs/design/0016, slice 1).
//
// A session reserves inode numbers (opReserveInos): NextIno moves past
// them and the range is recorded under the session ('n' client 'r'
// start), so it survives leader changes and snapshots, and goes with the
// session (sessionClose drops everything under 'n' client). A create of a
// batch (opCreateBatch) names a number of its session's ranges; the number
// leaves the range as the create applies, so no number is used twice —
// not by two creates of the session, and never by anybody else, since
// NextIno is past it.

// reserveInos applies opReserveInos: c.Size numbers for session
// c.Hdr.ClientID.
func (x *opCtx) reserveInos(c *command) (*answer, error) {
	client := c.Hdr.ClientID
	if err := x.session(client); err != nil {
		return nil, err
	}
	if c.Size == 0 || c.Size > rpc.MaxReserveInos {
		return nil, rpc.Errorf(syscall.EINVAL, "cannot reserve %d inode numbers: 1 to %d at a time", c.Size, rpc.MaxReserveInos)
	}
	n, err := x.countRanges(client)
	if err != nil {
		return nil, err
	}
	if n >= rpc.MaxSessionRanges {
		return nil, rpc.Errorf(syscall.EAGAIN, "session %d holds %d inode ranges already (at most %d): use them first", client, n, rpc.MaxSessionRanges)
	}
	ctr := &x.f.ctr
	start := ctr.NextIno
	ctr.NextIno += c.Size
	if err := x.b.Set(schema.SessionRangeKey(client, start), schema.AppendSessionRange(nil, schema.SessionRange{End: start + c.Size})); err != nil {
		return nil, err
	}
	return &answer{rec: schema.Answer{Kind: schema.AnswerRange, Index: x.index, Term: x.term, Start: start, Count: c.Size}}, nil
}

// session checks that client is an open session (ESTALE otherwise).
func (x *opCtx) session(client uint64) error {
	if _, ok := x.f.sess[client]; !ok || client == 0 {
		return rpc.Errorf(syscall.ESTALE, "unknown session %d: open a new one", client)
	}
	return nil
}

// countRanges counts the ranges session client holds.
func (x *opCtx) countRanges(client uint64) (int, error) {
	p := schema.SessionRangePrefix(client)
	it, err := x.b.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n, it.Error()
}

// rangeOf finds the range of session client that holds ino: its start and
// end (EINVAL when none does).
func (x *opCtx) rangeOf(client, ino uint64) (start, end uint64, err error) {
	p := schema.SessionRangePrefix(client)
	it, err := x.b.NewIter(p, schema.SessionRangeKey(client, ino+1))
	if err != nil {
		return 0, 0, err
	}
	defer it.Close()
	if it.Last() {
		_, start, err := schema.DecodeSessionRangeKey(it.Key())
		if err != nil {
			return 0, 0, rpc.Errorf(syscall.EIO, "%v", err)
		}
		r, err := schema.DecodeSessionRange(it.Value())
		if err != nil {
			return 0, 0, rpc.Errorf(syscall.EIO, "inode range %d of session %d: %v", start, client, err)
		}
		if ino >= start && ino < r.End {
			return start, r.End, nil
		}
	}
	if err := it.Error(); err != nil {
		return 0, 0, err
	}
	return 0, 0, rpc.Errorf(syscall.EINVAL, "inode number %d is not in a range reserved for session %d (used already, never reserved, or the session ended): reserve numbers with MReserveInos", ino, client)
}

// useIno takes ino out of the range [start, end) of session client.
func (x *opCtx) useIno(client, start, end, ino uint64) error {
	if err := x.b.Delete(schema.SessionRangeKey(client, start)); err != nil {
		return err
	}
	if start < ino {
		if err := x.b.Set(schema.SessionRangeKey(client, start), schema.AppendSessionRange(nil, schema.SessionRange{End: ino})); err != nil {
			return err
		}
	}
	if ino+1 < end {
		if err := x.b.Set(schema.SessionRangeKey(client, ino+1), schema.AppendSessionRange(nil, schema.SessionRange{End: end})); err != nil {
			return err
		}
	}
	return nil
}

// createBatch applies opCreateBatch: each create in order, each
// deduplicated by its own (client, seq) — a batch sent again after a
// leader change answers the creates it made from the dedupe table — and
// each with its own result, so that one failure leaves the others.
func (x *opCtx) createBatch(c *command) (*answer, error) {
	f := x.f
	client := c.Hdr.ClientID
	if err := x.session(client); err != nil {
		return nil, err
	}
	resp := &rpc.CreateBatchResp{Results: make([]rpc.BatchResult, len(c.Batch)), Stamp: rpc.Stamp{Index: x.index, Term: x.term}}
	for i := range c.Batch {
		h := reqHeader{ClientID: client, Seq: c.Batch[i].Seq}
		res, record := f.deduped(x.b, h)
		if res == nil {
			x.reset(f, x.b, x.now)
			res = x.resultOf(x.createNumbered(c, i))
			if record {
				f.recordResult(x.b, opCreate, h, res)
			}
		}
		resp.Results[i] = batchResult(res)
	}
	x.reset(f, x.b, x.now)
	return &answer{msg: resp}, nil
}

// batchResult is one create's answer on the wire.
func batchResult(res *result) rpc.BatchResult {
	switch {
	case res.errno != 0:
		return rpc.BatchResult{Errno: uint32(res.errno), Msg: res.msg}
	case res.ans == nil || res.ans.rec.Kind != schema.AnswerChange:
		return rpc.BatchResult{Errno: uint32(syscall.EIO), Msg: "the create's recorded answer is not a create's (seq used twice?)"}
	}
	a := &res.ans.rec
	return rpc.BatchResult{Attr: wireAttr(&a.Attr), Dir: wireAttr(&a.Dir), Stamp: rpc.Stamp{Index: a.Index, Term: a.Term}}
}

// createNumbered makes create i of a batch: an empty regular file with the
// number the client chose from its ranges. Everything is checked before
// anything is written.
func (x *opCtx) createNumbered(c *command, i int) (*answer, error) {
	bc := &c.Batch[i]
	if t := bc.Mode & modeType; t != 0 && t != modeReg {
		return nil, rpc.Errorf(syscall.EINVAL, "a batch makes regular files, not type %o", t)
	}
	parent, err := x.newEntryDir(bc.Parent, bc.Name)
	if err != nil {
		return nil, err
	}
	start, end, err := x.rangeOf(c.Hdr.ClientID, bc.Ino)
	if err != nil {
		return nil, err
	}
	if _, err := x.b.Get(schema.InodeKey(bc.Ino)); err == nil {
		return nil, rpc.Errorf(syscall.EINVAL, "inode number %d is in use", bc.Ino)
	} else if !errors.Is(err, kv.ErrNotFound) {
		return nil, err
	}
	var l layout.Layout
	if len(bc.Layout.Targets) == 0 {
		if l, err = placeFile(bc.Parent, parent, c.Cands, c.RRStart+uint64(i)); err != nil {
			return nil, err
		}
	} else {
		if err := x.checkLayout(bc.Parent, parent, bc.Layout); err != nil {
			return nil, err
		}
		l = bc.Layout
	}
	t := bc.Time
	if t == 0 {
		t = x.now
	}
	in := schema.Inode{Mode: modeReg | bc.Mode&modePerm, Nlink: 1, Uid: bc.Uid, Gid: bc.Gid, Atime: t, Mtime: t, Ctime: t,
		Layout: l, Alloc: make([]uint64, len(l.Targets))}
	if parent.Mode&modeSetgid != 0 {
		in.Gid = parent.Gid
	}
	if bc.Written { // what the close's size commit would have set
		if limit := l.MaxFileSize(); bc.Size > uint64(limit) {
			return nil, rpc.Errorf(syscall.EFBIG, "a written file of %d bytes: its layout holds %d", bc.Size, limit)
		}
		in.Size = bc.Size
		if bc.Mtime != 0 {
			in.Mtime, in.Ctime = bc.Mtime, bc.Mtime
		}
		for _, a := range bc.Alloc {
			if int(a.Slot) < len(in.Alloc) {
				in.Alloc[a.Slot] = a.Bytes
			}
		}
		if bc.Inline != nil {
			if uint64(len(bc.Inline)) != bc.Size || len(bc.Inline) > rpc.MaxInlineBytes || len(bc.Alloc) > 0 {
				return nil, rpc.Errorf(syscall.EINVAL, "a create's inline data of %d bytes for a file of %d (at most %d, no chunks)",
					len(bc.Inline), bc.Size, rpc.MaxInlineBytes)
			}
			in.Inline = bc.Inline
			in.Alloc = nil
		}
	}
	if err := x.useIno(c.Hdr.ClientID, start, end, bc.Ino); err != nil {
		return nil, err
	}
	x.f.ctr.Inodes++
	x.put(bc.Ino, in)
	parent.Entries++
	x.touchDir(bc.Parent, parent)
	if err := x.setDentry(bc.Parent, bc.Name, schema.Dentry{Ino: bc.Ino, Type: modeReg}); err != nil {
		return nil, err
	}
	return x.changeBody(bc.Ino, &in, bc.Parent, parent)
}

// checkLayout checks a layout a client chose for a new file in directory
// dirIno: a valid file layout over registered targets — or, under a
// directory marked mirrored, over existing mirror groups.
func (x *opCtx) checkLayout(dirIno uint64, dir *schema.Inode, l layout.Layout) error {
	if err := l.Validate(); err != nil {
		return rpc.Errorf(syscall.EINVAL, "layout of a new file: %v", err)
	}
	for _, id := range l.Targets {
		switch {
		case dir.Mirror != layout.IsGroup(id):
			return rpc.Errorf(syscall.EINVAL, "layout of a new file in directory %d names %d: the directory's files go on %s", dirIno, id,
				map[bool]string{true: "mirror groups", false: "single targets"}[dir.Mirror])
		case dir.Mirror:
			if _, err := x.group(id &^ layout.GroupBit); err != nil {
				return rpc.Errorf(syscall.EINVAL, "layout of a new file: %v", err)
			}
		default:
			if _, err := x.b.Get(schema.TargetKey(id)); errors.Is(err, kv.ErrNotFound) {
				return rpc.Errorf(syscall.EINVAL, "layout of a new file: no target %d is registered", id)
			} else if err != nil {
				return err
			}
		}
	}
	return nil
}

// reserveInosHandler answers MReserveInos once the reservation is durable:
// a client writes chunks under the numbers before its creates reach the
// service, so a reservation a crash lost could hand them out again.
func (s *Service) reserveInosHandler(_ context.Context, r *rpc.ReserveInosReq) (rpc.Message, error) {
	res, err := s.propose(&command{Op: opReserveInos, Now: s.now(), Hdr: hdrOf(r.Hdr), Size: uint64(r.Count)})
	if err != nil {
		return nil, err
	}
	if err := res.err(); err != nil {
		return nil, err
	}
	if res.ans == nil || res.ans.rec.Kind != schema.AnswerRange {
		return nil, rpc.Errorf(syscall.EIO, "inode reservation answered no range (seq used twice?)")
	}
	a := &res.ans.rec
	return &rpc.ReserveInosResp{Start: a.Start, Count: a.Count, Stamp: rpc.Stamp{Index: a.Index, Term: a.Term}}, nil
}

// createBatchHandler answers MCreateBatch. A batch's creates are in one
// directory (a client queues creates per directory): the leader places the
// files without a client layout over one candidate list, from a
// round-robin start one step further per create, as as many MCreates
// would; the batch waits for the recall of another session's delegation
// on the directory as MCreate does.
func (s *Service) createBatchHandler(ctx context.Context, r *rpc.CreateBatchReq) (rpc.Message, error) {
	if len(r.Creates) == 0 || len(r.Creates) > rpc.MaxCreateBatch {
		return nil, rpc.Errorf(syscall.EINVAL, "a batch of %d creates: 1 to %d", len(r.Creates), rpc.MaxCreateBatch)
	}
	dir := r.Creates[0].Parent
	c := &command{Op: opCreateBatch, Now: s.now(), Hdr: reqHeader{ClientID: r.Hdr.ClientID}, Parent: dir,
		Batch: make([]batchCreate, len(r.Creates)), Durable: r.Durable}
	place := false
	for i, x := range r.Creates {
		if x.Parent != dir {
			return nil, rpc.Errorf(syscall.EINVAL, "a batch's creates are in one directory: %d and %d", dir, x.Parent)
		}
		c.Batch[i] = batchCreate{Seq: x.Seq, Parent: x.Parent, Ino: x.Ino, Name: x.Name, Mode: x.Mode, Uid: x.Uid, Gid: x.Gid,
			Time: x.Time, Layout: x.Layout, Written: x.Written, Size: x.Size, Mtime: x.Mtime, Alloc: slotAllocsOf(x.Alloc)}
		if x.Written && x.Inline != nil {
			if len(x.Inline) > rpc.MaxInlineBytes || uint64(len(x.Inline)) != x.Size || len(x.Alloc) > 0 {
				return nil, rpc.Errorf(syscall.EINVAL, "create %q: inline data of %d bytes for a file of %d (this service keeps at most %d, no chunks)",
					x.Name, len(x.Inline), x.Size, rpc.MaxInlineBytes)
			}
			c.Batch[i].Inline = x.Inline
		}
		if x.Written && len(x.Layout.Targets) == 0 {
			return nil, rpc.Errorf(syscall.EINVAL, "create %q: a written file names its layout", x.Name)
		}
		place = place || len(x.Layout.Targets) == 0
	}
	release, err := s.dg.gate(ctx, s, r.Hdr.ClientID, dir)
	if err != nil {
		return nil, err
	}
	defer release()
	if place {
		if err := s.place(ctx, c); err != nil {
			return nil, err
		}
		n := uint64(len(r.Creates))
		c.RRStart = s.rr.Add(n) - n + 1
	}
	resp, err := s.mutate(c)
	s.noteNoGroups(err)
	return resp, err
}

// inoRange is [start, end) of inode numbers.
type inoRange struct{ start, end uint64 }

// reservedRanges lists the inode ranges every live session holds
// (opReserveInos), for the orphan checks (MInodesKnown): a chunk of a
// reserved number belongs to a create its client has answered and not
// yet sent.
func reservedRanges(r kv.Reader) ([]inoRange, error) {
	clients, err := readRecordKeys(r, schema.SessionPrefix(), schema.DecodeSessionKey, "session")
	if err != nil {
		return nil, err
	}
	var out []inoRange
	for _, client := range clients {
		rs, err := scanPrefix(r, schema.SessionRangePrefix(client), func(k, v []byte) (inoRange, error) {
			_, start, err := schema.DecodeSessionRangeKey(k)
			if err != nil {
				return inoRange{}, err
			}
			rg, err := schema.DecodeSessionRange(v)
			return inoRange{start, rg.End}, err
		}, "inode range")
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

func inRanges(rs []inoRange, ino uint64) bool {
	for _, r := range rs {
		if ino >= r.start && ino < r.end {
			return true
		}
	}
	return false
}
