package meta

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// getattrFlags is GetAttr with rpc.GetAttrData / GetAttrWrite.
func (c *client) getattrFlags(ino uint64, flags uint32) (rpc.AttrResp, error) {
	var r rpc.AttrResp
	err := c.call(rpc.MGetAttr, &rpc.GetAttrReq{Ino: ino, Client: c.id, Flags: flags}, &r)
	return r, err
}

// inlineFile is a written create of name carrying data inline.
func inlineFile(parent, ino uint64, name string, target uint32, data []byte) rpc.BatchCreate {
	return rpc.BatchCreate{Parent: parent, Name: name, Ino: ino, Mode: 0o644, Uid: 1, Gid: 2,
		Layout:  layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{target}},
		Written: true, Size: uint64(len(data)), Mtime: 12345, Inline: data}
}

// checkInline reads ino with GetAttrData and checks it is inline with
// data and size, and st_blocks of its bytes rounded up to 512.
func checkInline(t *testing.T, c *client, ino uint64, data []byte, size uint64) {
	t.Helper()
	r, err := c.getattrFlags(ino, rpc.GetAttrData)
	if err != nil {
		t.Fatalf("getattr %d with data: %v", ino, err)
	}
	if !r.Attr.Inline || r.Data == nil || !bytes.Equal(r.Data, data) {
		t.Fatalf("inode %d: inline %v, data %d bytes (nil %v), want %d bytes", ino, r.Attr.Inline, len(r.Data), r.Data == nil, len(data))
	}
	if want := (uint64(len(data)) + 511) / 512; r.Attr.Size != size || !r.Attr.BlocksKnown || r.Attr.Blocks != want {
		t.Fatalf("inode %d: size %d blocks %d (known %v), want %d, %d", ino, r.Attr.Size, r.Attr.Blocks, r.Attr.BlocksKnown, size, want)
	}
	// Without the flag: the same attributes, no data.
	var plain rpc.AttrResp
	if err := c.call(rpc.MGetAttr, &rpc.GetAttrReq{Ino: ino}, &plain); err != nil || !plain.Attr.Inline || plain.Data != nil ||
		plain.Attr.Size != size {
		t.Fatalf("plain getattr of inode %d: %+v data %v, %v", ino, plain.Attr, plain.Data, err)
	}
}

// TestInlineCreateBatch: a batch create with inline data makes an inode
// that keeps the bytes (GetAttr with GetAttrData answers them, Inline,
// blocks of the bytes); data longer than the size, over MaxInlineBytes or
// with chunk space is refused; a truncate cuts the bytes and a later growth
// reads zeros past them; a size commit with chunk space is refused and
// changes nothing; a failed spill leaves the data inline; all of it
// survives a restart.
func TestInlineCreateBatch(t *testing.T) {
	dir := t.TempDir()
	s := openService(t, testConfig(t, dir))
	raw := newClient(t, s.Addr())
	// No storage server listens there: a spill cannot write.
	tid := raw.registerTargets("127.0.0.1:1", "u1").TargetIDs[0]
	a := libClient(t, s.Addr())
	d, err := a.Mkdir(t.Context(), rootIno, "d", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := reserve(t, a, 16)
	data := bytes.Repeat([]byte("inline data "), 100)[:1000]
	res, err := a.CreateBatch(t.Context(), []rpc.BatchCreate{
		inlineFile(d.Ino, r.start, "inl", tid, data),
		inlineFile(d.Ino, r.start+1, "empty", tid, []byte{}),
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range res {
		// (BatchResult carries no blocks tail: Inline is not answered.)
		if err := x.Err(); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	checkInline(t, raw, r.start, data, 1000)
	checkInline(t, raw, r.start+1, []byte{}, 0)
	if got, err := raw.lookup(d.Ino, "inl"); err != nil || !got.Inline || got.Blocks != 2 {
		t.Fatalf("lookup: %+v %v", got, err)
	}
	ents, err := raw.readdirAll(d.Ino, 10, true)
	if err != nil || len(ents) != 2 || !ents[0].Attr.Inline || !ents[1].Attr.Inline {
		t.Fatalf("readdirplus: %+v %v", ents, err)
	}

	// Refused: more bytes than the size, a size beyond the bound, chunk
	// space next to inline data. Each refusal makes nothing.
	long := inlineFile(d.Ino, r.start+2, "long", tid, []byte("0123456789"))
	long.Size = 5
	big := inlineFile(d.Ino, r.start+3, "big", tid, make([]byte, rpc.MaxInlineBytes+1))
	alloc := inlineFile(d.Ino, r.start+4, "alloc", tid, []byte("abc"))
	alloc.Alloc = []rpc.SlotAlloc{{Slot: 0, Bytes: 4096}}
	for _, bad := range []rpc.BatchCreate{long, big, alloc} {
		if _, err := a.CreateBatch(t.Context(), []rpc.BatchCreate{bad}); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("create %q: %v, want EINVAL", bad.Name, err)
		}
		if _, err := raw.lookup(d.Ino, bad.Name); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("refused create %q: lookup %v, want ENOENT", bad.Name, err)
		}
	}

	// Truncate to 300 bytes, then grow to 2000: the bytes past 300 are
	// gone (zeros), the data kept is the first 300.
	ino := r.start
	if _, err := setattr(raw, rpc.SetAttrReq{Ino: ino, Valid: rpc.SetSize, Size: 300}); err != nil {
		t.Fatal(err)
	}
	checkInline(t, raw, ino, data[:300], 300)
	if _, err := setattr(raw, rpc.SetAttrReq{Ino: ino, Valid: rpc.SetSize, Size: 2000}); err != nil {
		t.Fatal(err)
	}
	checkInline(t, raw, ino, data[:300], 2000)

	// A size commit with chunk space on an inline inode: EIO, nothing
	// changes (a commit without space is a size change as any).
	var cr rpc.AttrResp
	err = raw.call(rpc.MCommitSize, &rpc.CommitSizeReq{Hdr: raw.hdr(), Ino: ino, Size: 5000, Mtime: time.Now().UnixNano(),
		Alloc: []rpc.SlotAlloc{{Slot: 0, Bytes: 8192}}}, &cr)
	wantErrno(t, err, syscall.EIO, "size commit with space on an inline file")
	checkInline(t, raw, ino, data[:300], 2000)

	// The write open's spill cannot reach the target: the open fails,
	// and the data stays with the inode.
	if _, err := raw.getattrFlags(ino, rpc.GetAttrWrite|rpc.GetAttrData); err == nil {
		t.Fatal("a spill to a target nobody serves succeeded")
	}
	checkInline(t, raw, ino, data[:300], 2000)

	// A restart replays the log: the inline data is still there.
	s.Close()
	s2 := openService(t, testConfig(t, dir))
	raw2 := newClient(t, s2.Addr())
	checkInline(t, raw2, ino, data[:300], 2000)
	checkInline(t, raw2, r.start+1, []byte{}, 0)
	// And after a snapshot.
	if err := s2.node.Snapshot(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	s2.Close()
	s3 := openService(t, testConfig(t, dir))
	checkInline(t, newClient(t, s3.Addr()), ino, data[:300], 2000)
}
