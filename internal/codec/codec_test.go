package codec

import (
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
)

// TestPrimitivesFrozen pins the bytes of every primitive: every stored
// raft log and metadata store depends on them, so none may change.
func TestPrimitivesFrozen(t *testing.T) {
	var e Enc
	e.U8(7)
	e.U32(300)
	e.U64(1 << 40)
	e.I64(-3)
	e.Bool(true)
	e.Bool(false)
	e.Bytes([]byte{0xaa})
	e.String("hi")
	e.U64s([]uint64{1, 128})
	e.U32s([]uint32{2})
	e.Strings([]string{"a", ""})
	const want = "07ac02808080808020050100" + "01aa" + "026869" + "02018001" + "0102" + "02016100"
	if got := hex.EncodeToString(e.B); got != want {
		t.Fatalf("primitives encode to %s, want %s", got, want)
	}
	d := NewDec(e.B)
	got := []any{d.U8(), d.U32(), d.U64(), d.I64(), d.Bool(), d.Bool(), d.Bytes(), d.String(), d.U64s(), d.U32s(), d.Strings()}
	wantVals := []any{uint8(7), uint32(300), uint64(1 << 40), int64(-3), true, false, []byte{0xaa}, "hi", []uint64{1, 128}, []uint32{2}, []string{"a", ""}}
	if err := d.Finish(); err != nil || !reflect.DeepEqual(got, wantVals) {
		t.Fatalf("decoded %v, %v; want %v", got, err, wantVals)
	}
}

func TestMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"short u8":      {},
		"bad uvarint":   {0x80},
		"u32 overflow":  {0x80, 0x80, 0x80, 0x80, 0x10},
		"bad bool":      {2},
		"long bytes":    {5, 1},
		"huge count":    {0xff, 0x01},
		"trailing byte": {0, 0},
	} {
		d := NewDec(b)
		switch name {
		case "short u8":
			d.U8()
		case "bad uvarint":
			d.U64()
		case "u32 overflow":
			d.U32()
		case "bad bool":
			d.Bool()
		case "long bytes":
			d.Bytes()
		case "huge count":
			d.U64s()
		case "trailing byte":
			d.U8()
		}
		if err := d.Finish(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}
