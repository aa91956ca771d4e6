package schema

import (
	"bytes"
	"encoding/hex"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/layout"
)

// valueCodec is one stored value type's encoder and decoder, with samples:
// the round-trip test and the fuzz target iterate them all.
type valueCodec struct {
	samples []any
	encode  func(v any) []byte
	decode  func(b []byte) (any, error)
}

var sampleLayout = layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 3}}

// valueCodecs has an entry for every Decode* function of values.go
// (TestValueCodecsExhaustive), keyed by the type's name.
var valueCodecs = map[string]valueCodec{
	"Inode": {
		samples: []any{
			Inode{Mode: 0o100644, Nlink: 1, Uid: 1, Gid: 2, Size: 1 << 40, Atime: -1, Mtime: 2, Ctime: 3, Layout: sampleLayout},
			Inode{Mode: 0o40755, Nlink: 2, Parent: 1, Entries: 3, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 1}},
			Inode{Mode: 0o120777, Nlink: 1, Symlink: "../x"},
			Inode{Mode: 0o100600, Layout: sampleLayout, Alloc: []uint64{4096, 0}},
			Inode{Mode: 0o100600, Layout: sampleLayout, Alloc: []uint64{}},
			Inode{Mode: 0o40755, Nlink: 2, Parent: 1, Layout: layout.Layout{StripeSize: 1 << 20}, Mirror: true},
			Inode{Mode: 0o100600, Layout: sampleLayout, Alloc: []uint64{1}, Mirror: true},
			Inode{Mode: 0o100644, Nlink: 1, Size: 5, Layout: sampleLayout, Inline: []byte("hello")},
			Inode{Mode: 0o100644, Nlink: 1, Layout: sampleLayout, Inline: []byte{}},
			Inode{Mode: 0o100644, Nlink: 1, Size: 3, Layout: sampleLayout, Alloc: []uint64{0, 0}, Mirror: true, Inline: []byte{0, 1, 2}},
		},
		encode: func(v any) []byte { in := v.(Inode); return AppendInode(nil, &in) },
		decode: func(b []byte) (any, error) { var in Inode; err := DecodeInode(b, &in); return in, err },
	},
	"Dentry": {
		samples: []any{Dentry{Ino: 99, Type: 0o40000}},
		encode:  func(v any) []byte { return AppendDentry(nil, v.(Dentry)) },
		decode:  func(b []byte) (any, error) { return DecodeDentry(b) },
	},
	"Counters": {
		samples: []any{Counters{NextIno: 1, NextClient: 2, NextServer: 3, NextTarget: 4, Inodes: 5, AppliedIndex: 6, AppliedTerm: 7}},
		encode:  func(v any) []byte { c := v.(Counters); return AppendCounters(nil, &c) },
		decode:  func(b []byte) (any, error) { return DecodeCounters(b) },
	},
	"Orphan": {
		samples: []any{Orphan{Since: 42}, Orphan{Since: -3, Tmpfile: true}},
		encode:  func(v any) []byte { return AppendOrphan(nil, v.(Orphan)) },
		decode:  func(b []byte) (any, error) { return DecodeOrphan(b) },
	},
	"Session": {
		samples: []any{Session{Host: "h", MountPoint: "/m", Pid: 9, Opened: 11}},
		encode:  func(v any) []byte { s := v.(Session); return AppendSession(nil, &s) },
		decode:  func(b []byte) (any, error) { return DecodeSession(b) },
	},
	"Result": {
		samples: []any{
			Result{Errno: 17, Msg: "file exists"},
			Result{},
			Result{Answer: Answer{Kind: AnswerStamp, Index: 9, Term: 2}},
			Result{Answer: Answer{Kind: AnswerAttr, Index: 9, Term: 2, Attr: Attr{Ino: 5, Mode: 0o100644, Nlink: 1, Size: 7,
				Atime: 1, Mtime: -2, Ctime: 3, Layout: sampleLayout, Blocks: 8, BlocksKnown: true}}},
			Result{Answer: Answer{Kind: AnswerChange, Index: 1 << 40, Term: 1, Attr: Attr{Ino: 5, Mode: 0o100644, Rdev: 0x103, Layout: sampleLayout},
				Dir: Attr{Ino: 1, Mode: 0o40755, Nlink: 3, Uid: 4, Gid: 5, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 2}}}},
			Result{Answer: Answer{Kind: AnswerWire}, Wire: []byte{1, 2}},
			Result{Answer: Answer{Kind: AnswerRange, Index: 9, Term: 2, Start: 1 << 20, Count: 4096}},
			Result{Answer: Answer{Kind: AnswerAttr, Index: 9, Term: 2, Attr: Attr{Ino: 6, Mode: 0o100644, Nlink: 1, Size: 5,
				Layout: sampleLayout, Blocks: 1, BlocksKnown: true, Inline: true}}},
			Result{Answer: Answer{Kind: AnswerChange, Index: 9, Term: 2, Attr: Attr{Ino: 6, Mode: 0o100644, Nlink: 1, Inline: true},
				Dir: Attr{Ino: 1, Mode: 0o40755, Nlink: 2}}},
		},
		encode: func(v any) []byte { r := v.(Result); return AppendResult(nil, &r) },
		decode: func(b []byte) (any, error) { return DecodeResult(b) },
	},
	"Server": {
		samples: []any{Server{ID: 1, Addr: "a:1", Host: "h", Targets: []uint32{1, 2}},
			Server{ID: 2, Addr: "b:1", Host: "h2", Targets: []uint32{3}, Domain: "rack2"}},
		encode: func(v any) []byte { s := v.(Server); return AppendServer(nil, &s) },
		decode: func(b []byte) (any, error) { return DecodeServer(b) },
	},
	"Target": {
		samples: []any{Target{ID: 1, ServerID: 2, UUID: "u", Path: "/p"}},
		encode:  func(v any) []byte { t := v.(Target); return AppendTarget(nil, &t) },
		decode:  func(b []byte) (any, error) { return DecodeTarget(b) },
	},
	"Group": {
		samples: []any{Group{ID: 1, Epoch: 7, Primary: 3, Secondary: 5, State: GroupDegraded, Since: 99,
			ResyncDone: 1, ResyncTotal: 2, CopyBad: 3}, Group{ID: 2},
			Group{ID: 3, Epoch: 2, Primary: 5, Secondary: 3, State: GroupResyncing, FullResync: true}},
		encode: func(v any) []byte { g := v.(Group); return AppendGroup(nil, &g) },
		decode: func(b []byte) (any, error) { return DecodeGroup(b) },
	},
	"HALease": {
		samples: []any{HALease{Holder: "gw-a/1f2e", Expiry: 1 << 60, Epoch: 3}, HALease{}},
		encode:  func(v any) []byte { l := v.(HALease); return AppendHALease(nil, &l) },
		decode:  func(b []byte) (any, error) { return DecodeHALease(b) },
	},
	"SessionRange": {
		samples: []any{SessionRange{End: 1 << 40}, SessionRange{}},
		encode:  func(v any) []byte { return AppendSessionRange(nil, v.(SessionRange)) },
		decode:  func(b []byte) (any, error) { return DecodeSessionRange(b) },
	},
	"Delegation": {
		samples: []any{Delegation{Client: 3, Epoch: 1 << 33, Granted: -5}, Delegation{}},
		encode:  func(v any) []byte { return AppendDelegation(nil, v.(Delegation)) },
		decode:  func(b []byte) (any, error) { return DecodeDelegation(b) },
	},
	"TargetRef": {
		samples: []any{TargetRef{ID: 8}},
		encode:  func(v any) []byte { return AppendTargetRef(nil, v.(TargetRef)) },
		decode:  func(b []byte) (any, error) { return DecodeTargetRef(b) },
	},
}

// TestValueCodecsExhaustive finds every value decoder in values.go: each
// needs an entry in valueCodecs, so a new value type cannot go untested.
func TestValueCodecsExhaustive(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "values.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Decode") {
			found = append(found, strings.TrimPrefix(fn.Name.Name, "Decode"))
		}
	}
	sort.Strings(found)
	for _, name := range found {
		if _, ok := valueCodecs[name]; !ok {
			t.Errorf("values.go decodes %s but valueCodecs has no samples for it", name)
		}
	}
	if len(found) != len(valueCodecs) {
		t.Errorf("values.go has %d decoders %v, valueCodecs %d entries", len(found), found, len(valueCodecs))
	}
}

func TestValueRoundTripEveryType(t *testing.T) {
	for name, vc := range valueCodecs {
		if len(vc.samples) == 0 {
			t.Errorf("%s: no samples", name)
		}
		for _, v := range vc.samples {
			got, err := vc.decode(vc.encode(v))
			if err != nil || !reflect.DeepEqual(got, v) {
				t.Errorf("%s: %+v round-trips to %+v, %v", name, v, got, err)
			}
		}
	}
}

// TestResultGoldenV1 reads dedupe records as the code before the table got
// its own encoding wrote them (the wire answer's bytes: a ChangeResp, an
// AttrResp, a Stamp, a failure, an empty answer), and keeps them as they
// are when written back.
func TestResultGoldenV1(t *testing.T) {
	for _, tc := range []struct {
		golden string
		errno  uint32
		msg    string
		wire   string
	}{
		{"010000590ca4830201e807640000aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa308080400202010301ed83010300000002aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa3080804002004d030001", 0, "", "0ca4830201e807640000aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa308080400202010301ed83010300000002aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa3080804002004d030001"},
		{"010000300ca4830201e807640000aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa30808040020201034e030001", 0, "", "0ca4830201e807640000aab4aef2eda9fefa30aab4aef2eda9fefa30aab4aef2eda9fefa30808040020201034e030001"},
		{"010000024f04", 0, "", "4f04"},
		{"01110b66696c652065786973747300", 17, "file exists", ""},
		{"01000000", 0, "", ""},
	} {
		b, _ := hex.DecodeString(tc.golden)
		r, err := DecodeResult(b)
		if err != nil || r.Errno != tc.errno || r.Msg != tc.msg || r.Answer.Kind != AnswerWire || hex.EncodeToString(r.Wire) != tc.wire {
			t.Errorf("%s: decodes to %+v, %v", tc.golden, r, err)
		}
		if again := hex.EncodeToString(AppendResult(nil, &r)); again != tc.golden {
			t.Errorf("%s: written back as %s", tc.golden, again)
		}
	}
	if _, err := DecodeResult([]byte{resultFormatV2 + 1, 0, 0, 0}); !errors.Is(err, ErrNewer) {
		t.Errorf("newer result: %v, want ErrNewer", err)
	}
	if _, err := DecodeResult([]byte{resultFormatV2, 0, 0, uint8(AnswerWire)}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("version 2 result of kind AnswerWire: %v, want ErrCorrupt", err)
	}
}

// FuzzDecodeValues feeds every value decoder: none may panic, and what
// decodes must re-encode to a value that decodes the same.
func FuzzDecodeValues(f *testing.F) {
	names := make([]string, 0, len(valueCodecs))
	for name := range valueCodecs {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		for _, v := range valueCodecs[name].samples {
			f.Add(uint8(i), valueCodecs[name].encode(v))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		vc := valueCodecs[names[int(which)%len(names)]]
		v, err := vc.decode(b)
		if err != nil {
			return
		}
		again, err := vc.decode(vc.encode(v))
		if err != nil || !reflect.DeepEqual(again, v) {
			t.Fatalf("%s: %+v re-decodes to %+v, %v", names[int(which)%len(names)], v, again, err)
		}
	})
}

// TestSchemaDoesNotDependOnTheWire: no stored value may change with a wire
// message, so schema depends on rpc neither directly nor through another
// package.
func TestSchemaDoesNotDependOnTheWire(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasSuffix(dep, "/internal/rpc") {
			t.Fatalf("meta/schema depends on %s", dep)
		}
	}
}

// TestMirrorFieldsKeepVersion1: a directory without the mirror mark and
// a server without a domain are written exactly as before they existed
// (older builds keep reading them); a marked directory is version 2,
// which an older build refuses by name (ErrNewer), not as corrupt.
func TestMirrorFieldsKeepVersion1(t *testing.T) {
	dir := Inode{Mode: 0o40755, Nlink: 2, Parent: 1}
	if b := AppendInode(nil, &dir); b[0] != 1 {
		t.Fatalf("unmarked directory written in version %d", b[0])
	}
	dir.Mirror = true
	if b := AppendInode(nil, &dir); b[0] != 2 {
		t.Fatalf("mirrored directory written in version %d, want 2", b[0])
	}
	// A version 1 server record (no domain) is the old bytes.
	s := Server{ID: 1, Addr: "a", Host: "h", Targets: []uint32{1}}
	old := AppendServer(nil, &s)
	s.Domain = "r1"
	if b := AppendServer(nil, &s); len(b) <= len(old) || string(b[:len(old)]) != string(old) {
		t.Fatalf("a domain is not a tail of the old record: %x vs %x", b, old)
	}
	// A version 3 inode is a newer Strata's.
	b := AppendInode(nil, &dir)
	b[0] = 3
	var in Inode
	if err := DecodeInode(b, &in); !errors.Is(err, ErrNewer) {
		t.Fatalf("inode version 3: %v, want ErrNewer", err)
	}
}

// TestInodeInline: inline data (docs/design/0017) is written in format
// version 2 and read back as it was, an empty inline file stays inline (a
// non-nil empty slice), and a flag this build does not know is a newer
// Strata's (ErrNewer), not read as if absent.
func TestInodeInline(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Inode
	}{
		{"data", Inode{Mode: 0o100644, Nlink: 1, Size: 5, Layout: sampleLayout, Inline: []byte("hello")}},
		{"empty", Inode{Mode: 0o100644, Nlink: 1, Layout: sampleLayout, Inline: []byte{}}},
		{"mirror+alloc+inline", Inode{Mode: 0o100644, Nlink: 1, Size: 4, Layout: sampleLayout, Alloc: []uint64{512, 0}, Mirror: true,
			Inline: []byte{0, 0xff, 0, 7}}},
	} {
		b := AppendInode(nil, &tc.in)
		if b[0] != inodeFormatV2 {
			t.Errorf("%s: written in version %d, want %d", tc.name, b[0], inodeFormatV2)
		}
		got := Inode{Inline: []byte("stale"), Alloc: []uint64{9}}
		if err := DecodeInode(b, &got); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !got.IsInline() || !bytes.Equal(got.Inline, tc.in.Inline) {
			t.Errorf("%s: inline %q (inline %v), want %q", tc.name, got.Inline, got.IsInline(), tc.in.Inline)
		}
		if got.Mirror != tc.in.Mirror || len(got.Alloc) != len(tc.in.Alloc) || (tc.in.Alloc == nil) != (got.Alloc == nil) {
			t.Errorf("%s: mirror %v alloc %v, want %v %v", tc.name, got.Mirror, got.Alloc, tc.in.Mirror, tc.in.Alloc)
		}
	}

	// A plain file is still version 1, and decoding it into an inode that
	// held inline data leaves none.
	plain := Inode{Mode: 0o100644, Nlink: 1, Size: 5, Layout: sampleLayout, Alloc: []uint64{4096, 0}}
	b := AppendInode(nil, &plain)
	if b[0] != formatV1 {
		t.Fatalf("plain file written in version %d", b[0])
	}
	got := Inode{Inline: []byte("x")}
	if err := DecodeInode(b, &got); err != nil || got.IsInline() {
		t.Fatalf("plain file decodes inline %q, %v", got.Inline, err)
	}

	// Flag 8 is not this build's: the record is a newer Strata's.
	dir := Inode{Mode: 0o40755, Nlink: 2, Parent: 1, Mirror: true}
	b = AppendInode(nil, &dir)
	if b[len(b)-1] != inodeMirror {
		t.Fatalf("flags byte %#x is not the record's last, want %#x", b[len(b)-1], inodeMirror)
	}
	b[len(b)-1] |= 8
	if err := DecodeInode(b, &got); !errors.Is(err, ErrNewer) {
		t.Fatalf("inode with flag 8: %v, want ErrNewer", err)
	}
	// The inline flag without its data is corrupt, not empty.
	b[len(b)-1] = inodeMirror | inodeInline
	if err := DecodeInode(b, &got); err == nil || errors.Is(err, ErrNewer) {
		t.Fatalf("inline flag without data: %v, want a decode error", err)
	}
}

// TestAttrInline: Attr.Inline is bit 1 of the BlocksKnown byte of a Result
// record; a bit beyond those two is corrupt.
func TestAttrInline(t *testing.T) {
	for _, a := range []Attr{
		{Ino: 6, Mode: 0o100644, Nlink: 1, Size: 5, Blocks: 1, BlocksKnown: true, Inline: true},
		{Ino: 6, Mode: 0o100644, Nlink: 1, Inline: true},
		{Ino: 6, Mode: 0o100644, Nlink: 1, Blocks: 3, BlocksKnown: true},
	} {
		r := Result{Answer: Answer{Kind: AnswerAttr, Index: 3, Term: 1, Attr: a}}
		b := AppendResult(nil, &r)
		got, err := DecodeResult(b)
		if err != nil || !reflect.DeepEqual(got.Answer.Attr, a) {
			t.Errorf("%+v round-trips to %+v, %v", a, got.Answer.Attr, err)
		}
		if !a.Inline {
			continue
		}
		// The Attr is the record's tail: its last byte is the flags.
		if want := byte(2); b[len(b)-1]&2 != want {
			t.Fatalf("flags byte %#x lacks the inline bit", b[len(b)-1])
		}
		b[len(b)-1] |= 4
		if _, err := DecodeResult(b); err == nil {
			t.Errorf("attribute flags %#x decoded", b[len(b)-1])
		}
	}
}
