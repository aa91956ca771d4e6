package meta

import (
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// commandSamples has a command of every op with every operand the op
// keeps set, and the bytes the version 1 encoder of the code base before
// commands got their own types (commit 98f997f) wrote for it: the golden
// form of what existing raft logs hold. The encoder must keep writing
// them, and the decoder keep reading them, for as long as version 1 is
// current.
func commandSamples() []struct {
	c      command
	golden string
} {
	h := reqHeader{ClientID: 7, Seq: 300}
	now := int64(1_764_000_000_123_456_789)
	return []struct {
		c      command
		golden string
	}{
		{command{Op: opInit, Now: now, Ino: 1}, "0101aab4aef2eda9fefa30000001"},
		{command{Op: opCreate, Now: now, Hdr: h, Parent: 1, Name: "file", Mode: 0o100644, Uid: 1000, Gid: 100,
			Cands: []layout.Candidate{{ID: 1, FreeBytes: 1 << 40}, {ID: 3, FreeBytes: 5}}, RRStart: 42},
			"0102aab4aef2eda9fefa3007ac02010466696c65a48302e807640000020180808080802003052a"},
		{command{Op: opCreate, Now: now, Hdr: h, Parent: 9, Name: "ln", Mode: 0o120777, Uid: 1, Gid: 2, Rdev: 0x103, Symlink: "../target"},
			"0102aab4aef2eda9fefa3007ac0209026c6effc30201028302092e2e2f7461726765740000"},
		{command{Op: opSetAttr, Now: now, Hdr: h, Ino: 12, Valid: rpc.SetMode | rpc.SetSize | rpc.SetMtime, Mode: 0o640, Uid: 3, Gid: 4,
			Size: 1 << 33, Atime: -5, Mtime: now, Ctime: now + 1},
			"0103aab4aef2eda9fefa3007ac020c29a0030304808080802009aab4aef2eda9fefa30acb4aef2eda9fefa30"},
		{command{Op: opUnlink, Now: now, Hdr: h, Parent: 1, Name: "gone"}, "0104aab4aef2eda9fefa3007ac020104676f6e65"},
		{command{Op: opRmdir, Now: now, Hdr: h, Parent: 2, Name: "dir"}, "0105aab4aef2eda9fefa3007ac020203646972"},
		{command{Op: opRename, Now: now, Hdr: h, Parent: 1, Name: "a", NewParent: 2, NewName: "b", Flags: 1},
			"0106aab4aef2eda9fefa3007ac0201016102016201"},
		{command{Op: opLink, Now: now, Hdr: h, Ino: 12, NewParent: 3, NewName: "hard"}, "0107aab4aef2eda9fefa3007ac020c030468617264"},
		{command{Op: opSetXattr, Now: now, Hdr: h, Ino: 12, Name: "user.k", Value: []byte("v\x00alue"), Flags: 2},
			"0108aab4aef2eda9fefa3007ac020c06757365722e6b067600616c756502"},
		{command{Op: opRemoveXattr, Now: now, Hdr: h, Ino: 12, Name: "user.k", Value: []byte{}}, "0109aab4aef2eda9fefa3007ac020c06757365722e6b0000"},
		{command{Op: opCommitSize, Now: now, Hdr: h, Ino: 12, Size: 4096, Mtime: now, ClearSuid: true,
			Alloc: []slotAlloc{{Slot: 0, Bytes: 4096}, {Slot: 3, Bytes: 0}}},
			"010aaab4aef2eda9fefa3007ac020c8020aab4aef2eda9fefa3001020080200300"},
		{command{Op: opSetDirLayout, Now: now, Hdr: h, Ino: 2, Size: 1 << 20, Flags: 4}, "010baab4aef2eda9fefa3007ac020280804004"},
		{command{Op: opSessionOpen, Now: now, Host: "node1", MountPoint: "/mnt/strata", Pid: 4242, LeaseMs: 30000},
			"010caab4aef2eda9fefa300000056e6f6465310b2f6d6e742f7374726174619221b0ea01"},
		{command{Op: opSessionClose, Now: now, Ino: 7}, "010daab4aef2eda9fefa30000007"},
		{command{Op: opRegister, Now: now, Addr: "127.0.0.1:7001", Host: "node1",
			Targets: []targetReg{{UUID: "u-1", Path: "/t/1", InoCeiling: 1 << 16}, {UUID: "u-2", Path: "/t/2"}}},
			"010eaab4aef2eda9fefa3000000e3132372e302e302e313a37303031056e6f6465310203752d31042f742f3103752d32042f742f3280800400"},
		{command{Op: opReap, Now: now, Ino: 99}, "010faab4aef2eda9fefa30000063"},
		{command{Op: opReapMany, Now: now, Inos: []uint64{5, 6, 1 << 40}}, "0110aab4aef2eda9fefa300000030506808080808020"},
		{command{Op: opRaiseIno, Now: now, Ino: 1 << 32}, "0111aab4aef2eda9fefa3000008080808010"},
		{command{Op: opTmpfile, Now: now, Hdr: h, Parent: 2, Mode: 0o100600, Uid: 5, Gid: 6,
			Cands: []layout.Candidate{{ID: 2, FreeBytes: 77}}, RRStart: 1},
			"0112aab4aef2eda9fefa3007ac0202008083020506000001024d01"},
		{command{Op: opSetAtimes, Now: now, Hdr: h, Inos: []uint64{5, 1 << 40}, Atimes: []int64{now, -1}},
			"0113aab4aef2eda9fefa3007ac020205aab4aef2eda9fefa3080808080802001"},
		// Appended within version 1 for mirror groups (issue 21): these
		// bytes are this code's, the golden form from now on.
		{command{Op: opSetDirLayout, Now: now, Hdr: h, Ino: 2, Size: 1 << 20, Flags: 4, MirrorMode: rpc.DirMirrorOn}, "010baab4aef2eda9fefa3007ac02028080400401"},
		{command{Op: opRegister, Now: now, Addr: "a:1", Host: "n", Targets: []targetReg{{UUID: "u", Path: "/t"}}, Domain: "rack1"},
			"010eaab4aef2eda9fefa30000003613a31016e010175022f7400057261636b31"},
		{command{Op: opMirrorCreate, Now: now, Flags: mirrorAuto | mirrorByDomain, Pairs: []uint32{1, 4}}, "0114aab4aef2eda9fefa30000003020104"},
		{command{Op: opMirrorFailOver, Now: now, Group: 3, Epoch: 9, Flags: mirrorAutomatic}, "0115aab4aef2eda9fefa300000030901"},
		{command{Op: opMirrorReport, Now: now, Group: 3, Epoch: 9, Target: 4, Flags: uint32(rpc.MirrorResyncProgress), Done: 1 << 30, Total: 1 << 33}, "0116aab4aef2eda9fefa3000000309040280808080048080808020"},
		{command{Op: opMirrorReplace, Now: now, Group: 3, Target: 7}, "0117aab4aef2eda9fefa3000000307"},
		{command{Op: opMirrorResync, Now: now, Group: 3, Epoch: 10}, "0118aab4aef2eda9fefa300000030a"},
		// Appended within version 1 for the NFS gateway's HA pair (issue 22).
		{command{Op: opHALease, Now: now, Name: "nfs-ha", Host: "gw-a/01", LeaseMs: 4000, Flags: haLeaseFlagRelease}, "0119aab4aef2eda9fefa300000066e66732d68610767772d612f3031a01f01"},
		// Appended within version 1 for create delegations (docs/design/0016).
		{command{Op: opReserveInos, Now: now, Hdr: h, Size: 4096}, "011aaab4aef2eda9fefa3007ac028020"},
		{command{Op: opCreateBatch, Now: now, Hdr: reqHeader{ClientID: 7}, Cands: []layout.Candidate{{ID: 1, FreeBytes: 9}}, RRStart: 5,
			Batch: []batchCreate{{Seq: 301, Parent: 2, Ino: 1 << 20, Name: "f0", Mode: 0o644, Uid: 1, Gid: 2, Time: now},
				{Seq: 302, Parent: 2, Ino: 1<<20 + 1, Name: "f1", Mode: 0o600, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{3}}}}},
			"011baab4aef2eda9fefa3007000101090502ad0202026630808040a4030102aab4aef2eda9fefa30000000ae02020266318180408003000000808040010103"},
		// Then opCreateBatch's appended records of written files.
		{command{Op: opCreateBatch, Now: now, Hdr: reqHeader{ClientID: 7}, Batch: []batchCreate{
			{Seq: 303, Parent: 2, Ino: 1<<20 + 2, Name: "f2", Mode: 0o644, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{3}},
				Written: true, Size: 3901, Mtime: now, Alloc: []slotAlloc{{Slot: 0, Bytes: 4096}}}}}, "011baab4aef2eda9fefa300700000001af0202026632828040a40300000080804001010301bd1eaab4aef2eda9fefa3001008020"},
		{command{Op: opDelegate, Now: now, Hdr: h, Ino: 2}, "011caab4aef2eda9fefa3007ac0202"},
		{command{Op: opReturn, Now: now, Hdr: h, Ino: 2, Client: 7, Epoch: 99}, "011daab4aef2eda9fefa3007ac02020763"},
		// Inline data (docs/design/0017): opCreateBatch's Written byte 3
		// with the file's bytes after its Alloc list (an empty file's: an
		// empty, non-nil slice), next to a plain written create; opUninline.
		{command{Op: opCreateBatch, Now: now, Hdr: reqHeader{ClientID: 7}, Batch: inlineBatchSample(now)},
			"011baab4aef2eda9fefa300700000003b002020169838040a403000000808040010103b102020165848040a403000000808040010103b202020170858040a4030000008080400101030305aab4aef2eda9fefa30000568656c6c6f0300aab4aef2eda9fefa30000001bd1eaab4aef2eda9fefa3001008020"},
		{command{Op: opUninline, Now: now, Ino: 1<<20 + 3, Ctime: now - 5, Size: 3901, Alloc: []slotAlloc{{Slot: 0, Bytes: 4096}}},
			"011eaab4aef2eda9fefa300000838040a0b4aef2eda9fefa30bd1e01008020"},
	}
}

// TestCommandGoldenV1 decodes the version 1 bytes of today's logs into the
// same commands, and encodes the commands into the same bytes.
func TestCommandGoldenV1(t *testing.T) {
	for _, s := range commandSamples() {
		b, err := hex.DecodeString(s.golden)
		if err != nil {
			t.Fatal(err)
		}

		var got command
		if err := decodeCommand(b, &got); err != nil {
			t.Fatalf("op %d: decode golden: %v", s.c.Op, err)
		}
		if !reflect.DeepEqual(got, s.c) {
			t.Errorf("op %d: golden decodes to\n%+v\nwant\n%+v", s.c.Op, got, s.c)
		}
		if enc := hex.EncodeToString(s.c.encode(nil)); enc != s.golden {
			t.Errorf("op %d: encodes to %s, want the version 1 bytes %s", s.c.Op, enc, s.golden)
		}
	}
}

// TestCommandRoundTripEveryOp makes the samples exhaustive by
// construction: every op number the decoder accepts needs a sample, so a
// new op without one fails here.
func TestCommandRoundTripEveryOp(t *testing.T) {
	have := map[op]bool{}
	for _, s := range commandSamples() {
		have[s.c.Op] = true
		var got command
		if err := decodeCommand(s.c.encode(nil), &got); err != nil || !reflect.DeepEqual(got, s.c) {
			t.Errorf("op %d: round trip gave %+v, %v", s.c.Op, got, err)
		}
	}
	for o := 1; o < 256; o++ {
		var c command
		err := decodeCommand((&command{Op: op(o)}).encode(nil), &c)
		if err == nil && !have[op(o)] {
			t.Errorf("op %d decodes but has no sample in commandSamples", o)
		}
		if err != nil && have[op(o)] {
			t.Errorf("op %d has a sample but does not decode: %v", o, err)
		}
	}
}

// TestCommandNewerVersion: an entry of a format version this build does
// not know is refused as newer, and the state machine stops on it rather
// than skip it.
func TestCommandNewerVersion(t *testing.T) {
	b := (&command{Op: opReap, Ino: 5}).encode(nil)
	b[0] = commandFormatV1 + 1
	var c command
	err := decodeCommand(b, &c)
	if !errors.Is(err, errNewerCommand) || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("decode of version %d: %v, want errNewerCommand", b[0], err)
	}
	b[0] = 0
	if err := decodeCommand(b, &c); err == nil || errors.Is(err, errNewerCommand) {
		t.Fatalf("decode of version 0: %v, want a corrupt-entry error", err)
	}
	f := newTestFSM(t)
	b[0] = commandFormatV1 + 1
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "newer") {
			t.Fatalf("apply of a newer entry: recovered %v, want a panic naming it", r)
		}
	}()
	f.applyLocal([][]byte{b})
}

// TestCommandFlagValues pins the wire constants whose values commands
// keep (Valid, Flags): renumbering one on the wire would change what
// existing log entries mean.
func TestCommandFlagValues(t *testing.T) {
	got := []uint32{rpc.SetMode, rpc.SetUid, rpc.SetGid, rpc.SetSize, rpc.SetAtime, rpc.SetMtime, rpc.SetAtimeNow,
		rpc.SetMtimeNow, rpc.SetCtime, rpc.RenameNoReplace, rpc.RenameExchange, rpc.XattrCreate, rpc.XattrReplace}
	want := []uint32{1, 2, 4, 8, 16, 32, 64, 128, 256, 1, 2, 1, 2}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("flag values %v, want %v (they are part of the raft command format)", got, want)
	}
	// opMirrorReport keeps the wire's event numbers, opSetDirLayout its
	// mirror mark changes.
	got8 := []uint8{rpc.MirrorSecondaryLost, rpc.MirrorResyncProgress, rpc.MirrorResyncDone, rpc.DirMirrorKeep, rpc.DirMirrorOn, rpc.DirMirrorOff}
	if want8 := []uint8{1, 2, 3, 0, 1, 2}; !reflect.DeepEqual(got8, want8) {
		t.Fatalf("mirror values %v, want %v (they are part of the raft command format)", got8, want8)
	}
}

// TestDedupeRecordV1 answers a retried request from a dedupe record of
// format version 1 (the encoded wire answer, as the code before the
// dedupe table got its own encoding wrote it) with those bytes, and from
// a current record with an equal answer.
func TestDedupeRecordV1(t *testing.T) {
	f := newTestFSM(t)
	for _, r := range f.applyLocal([][]byte{
		(&command{Op: opInit, Now: 1}).encode(nil),
		(&command{Op: opSessionOpen, Now: 1, Host: "h", LeaseMs: 1000}).encode(nil),
	}) {
		if r.errno != 0 {
			t.Fatal(r.msg)
		}
	}
	create := (&command{Op: opCreate, Now: 2, Hdr: reqHeader{ClientID: 1, Seq: 1}, Parent: 1, Name: "d", Mode: dirMode}).encode(nil)
	first := f.applyLocal([][]byte{create})[0]
	again := f.applyLocal([][]byte{create})[0]
	if first.errno != 0 || !reflect.DeepEqual(first.reply(), again.reply()) {
		t.Fatalf("retry answered %+v, first %+v", again.reply(), first.reply())
	}
	if _, ok := first.reply().(*rpc.ChangeResp); !ok {
		t.Fatalf("create answered %T, want *rpc.ChangeResp", first.reply())
	}
	// A version 1 record of a ChangeResp (golden bytes of the old encoder).
	v1, _ := hex.DecodeString("010000590ca4830201e807640000aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa308080400202010301ed83010300000002aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa3080804002004d030001")
	b := f.db.NewBatch()
	if err := b.Set(schema.DedupeKey(1, 1), v1); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(false); err != nil {
		t.Fatal(err)
	}
	b.Close()
	old := f.applyLocal([][]byte{create})[0]
	raw, ok := old.reply().(rawMsg)
	if !ok || !reflect.DeepEqual([]byte(raw), v1[4:]) {
		t.Fatalf("answer from a version 1 record: %T %x, want its wire bytes %x", old.reply(), old.reply(), v1[4:])
	}
	var ch rpc.ChangeResp
	if err := rpc.Unmarshal(raw, &ch); err != nil || ch.Attr.Ino != 12 || ch.Index != 77 || !ch.Attr.BlocksKnown {
		t.Fatalf("version 1 answer decodes to %+v, %v", ch, err)
	}
}

// TestCommandHoldsNoWireTypes: a command's fields are meta's own types (or
// plain values), never rpc messages, so that a wire change cannot change
// the log format.
func TestCommandHoldsNoWireTypes(t *testing.T) {
	wire := reflect.TypeOf(rpc.ReqHeader{}).PkgPath()
	seen := map[reflect.Type]bool{}
	var check func(path string, typ reflect.Type)
	check = func(path string, typ reflect.Type) {
		if seen[typ] {
			return
		}
		seen[typ] = true
		if typ.PkgPath() == wire {
			t.Errorf("command field %s has the wire type %v", path, typ)
		}
		switch typ.Kind() {
		case reflect.Slice, reflect.Array, reflect.Pointer:
			check(path+"[]", typ.Elem())
		case reflect.Struct:
			for i := 0; i < typ.NumField(); i++ {
				check(path+"."+typ.Field(i).Name, typ.Field(i).Type)
			}
		}
	}
	check("command", reflect.TypeOf(command{}))
}

// TestDedupeRecordIsTheStoresOwn: the dedupe table records a change's
// answer in schema's terms (Result version 2), not as the wire message.
func TestDedupeRecordIsTheStoresOwn(t *testing.T) {
	f := newTestFSM(t)
	f.applyLocal([][]byte{
		(&command{Op: opInit, Now: 1}).encode(nil),
		(&command{Op: opSessionOpen, Now: 1, Host: "h", LeaseMs: 1000}).encode(nil),
	})
	res := f.applyLocal([][]byte{(&command{Op: opCreate, Now: 2, Hdr: reqHeader{ClientID: 1, Seq: 1}, Parent: 1, Name: "d", Mode: dirMode}).encode(nil)})[0]
	v, err := f.db.Get(schema.DedupeKey(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != 2 {
		t.Fatalf("dedupe record of format version %d, want 2", v[0])
	}
	r, err := schema.DecodeResult(v)
	if err != nil || r.Answer.Kind != schema.AnswerChange || r.Wire != nil {
		t.Fatalf("dedupe record %+v, %v: want the store's own answer", r, err)
	}
	ch := res.reply().(*rpc.ChangeResp)
	if r.Answer.Attr.Ino != ch.Attr.Ino || r.Answer.Dir.Ino != 1 || r.Answer.Attr.Mode != ch.Attr.Mode {
		t.Fatalf("record %+v does not match the answer %+v", r.Answer, ch)
	}
}

// inlineBatchSample is a batch of an inline create, an empty inline
// create and a plain written one.
func inlineBatchSample(now int64) []batchCreate {
	l := layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{3}}
	return []batchCreate{
		{Seq: 304, Parent: 2, Ino: 1<<20 + 3, Name: "i", Mode: 0o644, Layout: l, Written: true, Size: 5, Mtime: now, Inline: []byte("hello")},
		{Seq: 305, Parent: 2, Ino: 1<<20 + 4, Name: "e", Mode: 0o644, Layout: l, Written: true, Mtime: now, Inline: []byte{}},
		{Seq: 306, Parent: 2, Ino: 1<<20 + 5, Name: "p", Mode: 0o644, Layout: l, Written: true, Size: 3901, Mtime: now,
			Alloc: []slotAlloc{{Slot: 0, Bytes: 4096}}},
	}
}

// TestCommandInlineWrittenByte: a create's Written byte is 0, 1 or 3
// (inline); any other value is an error, not read as written, and an
// inline record cut before its data does not decode.
func TestCommandInlineWrittenByte(t *testing.T) {
	now := int64(1_764_000_000_123_456_789)
	c := command{Op: opCreateBatch, Now: now, Hdr: reqHeader{ClientID: 7}, Batch: inlineBatchSample(now)}
	b := c.encode(nil)
	var got command
	if err := decodeCommand(b, &got); err != nil {
		t.Fatal(err)
	}
	if !got.Batch[0].Written || string(got.Batch[0].Inline) != "hello" || got.Batch[1].Inline == nil || len(got.Batch[1].Inline) != 0 ||
		got.Batch[2].Inline != nil || len(got.Batch[2].Alloc) != 1 {
		t.Fatalf("decoded batch %+v", got.Batch)
	}
	// The first record's Written byte is followed by Size 5 and Mtime.
	at := strings.Index(hex.EncodeToString(b), "0305aab4aef2eda9fefa30")
	if at < 0 || at%2 != 0 {
		t.Fatalf("no inline record in %x", b)
	}
	at /= 2
	for _, w := range []byte{2, 4, 0x80} {
		bad := append([]byte{}, b...)
		bad[at] = w
		if err := decodeCommand(bad, &got); err == nil {
			t.Errorf("written byte %d decoded: %+v", w, got.Batch[0])
		}
	}
	if err := decodeCommand(b[:len(b)-1], &got); err == nil {
		t.Error("a batch cut short decoded")
	}
}
