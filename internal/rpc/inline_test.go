package rpc

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/stratafs/strata/internal/layout"
)

// Inline data on the wire (docs/design/0017): CreateBatchReq's Written
// byte 3 with the data, GetAttrReq's Flags, AttrResp's Data and Attr.Inline
// in the blocks tail.

func TestCreateBatchInlineRoundTrip(t *testing.T) {
	lay := layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{3}}
	m := &CreateBatchReq{Hdr: ReqHeader{ClientID: 7}, Creates: []BatchCreate{
		{Seq: 1, Parent: 2, Name: "inline", Ino: 9, Mode: 0o100644, Layout: lay, Written: true, Size: 5, Mtime: 4, Inline: []byte("hello")},
		{Seq: 2, Parent: 2, Name: "plain", Ino: 10, Mode: 0o100644, Layout: lay, Written: true, Size: 3901, Mtime: 5,
			Alloc: []SlotAlloc{{Slot: 0, Bytes: 4096}}},
		{Seq: 3, Parent: 2, Name: "empty", Ino: 11, Mode: 0o100644, Layout: lay, Written: true, Inline: []byte{}},
		{Seq: 4, Parent: 2, Name: "unwritten", Ino: 12, Mode: 0o100644, Layout: lay},
	}}
	b := Marshal(m)
	var got CreateBatchReq
	if err := Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, m) {
		t.Fatalf("round trip gives\n%+v\nwant\n%+v", got, *m)
	}
	if got.Creates[1].Inline != nil || got.Creates[3].Inline != nil {
		t.Fatal("a create without inline data decoded with some")
	}
	if got.Creates[2].Inline == nil {
		t.Fatal("an empty inline file decoded as not inline")
	}
	// Inline bytes on a create that is not Written are not sent.
	m.Creates[3].Inline = []byte("x")
	var again CreateBatchReq
	if err := Unmarshal(Marshal(m), &again); err != nil || again.Creates[3].Inline != nil || again.Creates[3].Written {
		t.Fatalf("unwritten create with inline bytes: %+v %v", again.Creates[3], err)
	}
}

// A Written byte other than 0, 1 and 3 is malformed (a newer form this
// build does not know), not read as a bool.
func TestCreateBatchWrittenByteRefused(t *testing.T) {
	m := &CreateBatchReq{Hdr: ReqHeader{ClientID: 7}, Creates: []BatchCreate{
		{Seq: 2, Parent: 2, Name: "plain", Ino: 10, Written: true, Size: 1, Mtime: 5}}}
	b := Marshal(m)
	// The record is Written (1 byte), Size, Mtime, an empty Alloc list:
	// find the Written byte as the last 1 before those.
	var tail Enc
	tail.U64(1)
	tail.I64(5)
	EncodeSlotAllocs(&tail, nil)
	at := len(b) - len(tail.B) - 1
	if b[at] != 1 {
		t.Fatalf("written byte at %d is %d, want 1 (%x)", at, b[at], b)
	}
	for _, w := range []byte{2, 4, 0xff} {
		bad := append([]byte{}, b...)
		bad[at] = w
		var got CreateBatchReq
		if err := Unmarshal(bad, &got); !errors.Is(err, ErrMalformed) {
			t.Errorf("written byte %d: %v, want malformed", w, err)
		}
	}
	bad := append([]byte{}, b...)
	bad[at] = 3 // inline, but no data follows
	var got CreateBatchReq
	if err := Unmarshal(bad, &got); err == nil {
		t.Error("written byte 3 without its data decoded")
	}
}

func TestGetAttrFlags(t *testing.T) {
	for _, m := range []*GetAttrReq{{Ino: 5, Flags: GetAttrData}, {Ino: 5, Client: 9, Flags: GetAttrWrite | GetAttrData}} {
		var got GetAttrReq
		if err := Unmarshal(Marshal(m), &got); err != nil || got != *m {
			t.Errorf("%+v round-trips to %+v, %v", *m, got, err)
		}
	}
	// Without Flags the request is the bytes it was before them: Ino, and
	// Client only when set.
	var e Enc
	e.U64(5)
	if b := Marshal(&GetAttrReq{Ino: 5}); !bytes.Equal(b, e.B) {
		t.Errorf("GetAttrReq{Ino} = %x, want %x", b, e.B)
	}
	e.U64(9)
	if b := Marshal(&GetAttrReq{Ino: 5, Client: 9}); !bytes.Equal(b, e.B) {
		t.Errorf("GetAttrReq{Ino, Client} = %x, want %x", b, e.B)
	}
	// With Flags, Client is sent even when 0.
	e = Enc{}
	e.U64(5)
	e.U64(0)
	e.U32(GetAttrData)
	if b := Marshal(&GetAttrReq{Ino: 5, Flags: GetAttrData}); !bytes.Equal(b, e.B) {
		t.Errorf("GetAttrReq{Ino, Flags} = %x, want %x", b, e.B)
	}
}

func TestAttrRespData(t *testing.T) {
	a := Attr{Ino: 5, Mode: 0o100644, Size: 5, Blocks: 1, BlocksKnown: true, Inline: true}
	for _, data := range [][]byte{[]byte("hello"), {}, nil} {
		m := &AttrResp{Attr: a, Stamp: Stamp{Index: 3, Term: 1}, Data: data}
		var got AttrResp
		if err := Unmarshal(Marshal(m), &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(&got, m) {
			t.Errorf("data %q (nil %v): round trip gives %+v (data nil %v)", data, data == nil, got, got.Data == nil)
		}
	}
	// Without Data, the answer is the bytes it was before inline data.
	plain := &AttrResp{Attr: Attr{Ino: 5, Size: 7, Blocks: 1, BlocksKnown: true}, Stamp: Stamp{Index: 3, Term: 1}}
	var e Enc
	plain.Attr.Encode(&e)
	plain.Stamp.Encode(&e)
	e.U64(1)
	e.Bool(true)
	if b := Marshal(plain); !bytes.Equal(b, e.B) {
		t.Errorf("AttrResp without Data = %x, want %x", b, e.B)
	}
}

// Attr.Inline is carried in the blocks tail of every answer that has one,
// and an unknown bit there is malformed.
func TestAttrInlineInAnswers(t *testing.T) {
	a := Attr{Ino: 5, Mode: 0o100644, Nlink: 1, Size: 100, Blocks: 1, BlocksKnown: true, Inline: true}
	noBlocks := Attr{Ino: 6, Mode: 0o100644, Nlink: 1, Size: 0, Inline: true}
	for _, m := range []Message{
		&AttrResp{Attr: a, Stamp: Stamp{Index: 3, Term: 1}},
		&AttrResp{Attr: noBlocks},
		&ChangeResp{Attr: a, Dir: Attr{Ino: 1, Mode: 0o40755}, Index: 4, Term: 1},
		&ReadDirResp{Entries: []DirEntry{{Name: "a", Ino: 5, Mode: 0o100644, Attr: a}, {Name: "b", Ino: 7, Mode: 0o100644, Attr: Attr{Ino: 7}},
			{Name: "c", Ino: 6, Mode: 0o100644, Attr: noBlocks}}, EOF: true},
		&LinkResp{AttrResp: AttrResp{Attr: a, Stamp: Stamp{Index: 9, Term: 2}}, Dir: Attr{Ino: 1, Mode: 0o40755}},
	} {
		fresh := newLike(m)
		if err := Unmarshal(Marshal(m), fresh); err != nil {
			t.Errorf("%T: %v", m, err)
			continue
		}
		if !reflect.DeepEqual(fresh, m) {
			t.Errorf("%T: round trip gives\n%+v\nwant\n%+v", m, fresh, m)
		}
	}
	// The flag byte is the answer's last: bit 2 is no flag of this build.
	b := Marshal(&ChangeResp{Attr: a})
	if b[len(b)-1] != 3 {
		t.Fatalf("blocks flags byte %d, want 3 (known, inline)", b[len(b)-1])
	}
	b[len(b)-1] = 4 | 1
	var got ChangeResp
	if err := Unmarshal(b, &got); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown blocks flag: %v, want malformed", err)
	}
}
