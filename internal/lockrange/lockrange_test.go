package lockrange

import (
	"reflect"
	"testing"
)

func TestReplace(t *testing.T) {
	a := func(start, end uint64, typ uint32) Lock {
		return Lock{Client: 1, Owner: 1, Start: start, End: end, Type: typ}
	}
	b := func(start, end uint64, typ uint32) Lock {
		return Lock{Client: 2, Owner: 1, Start: start, End: end, Type: typ}
	}
	via := func(l Lock, handle uint64) Lock { l.Handle = handle; return l }
	for _, tc := range []struct {
		name     string
		list     []Lock
		want     Lock
		out      []Lock
		released bool
	}{
		{"first lock", nil, a(0, 9, Write), []Lock{a(0, 9, Write)}, false},
		{"unlock the middle splits", []Lock{a(0, 9, Write)}, a(3, 5, Unlock), []Lock{a(0, 2, Write), a(6, 9, Write)}, true},
		{"read inside write splits in three", []Lock{a(0, 9, Write)}, a(3, 5, Read), []Lock{a(0, 2, Write), a(6, 9, Write), a(3, 5, Read)}, true},
		{"adjacent same type merges", []Lock{a(0, 4, Read)}, a(5, 9, Read), []Lock{a(0, 9, Read)}, false},
		{"overlap same type merges", []Lock{a(0, 6, Read), a(8, 20, Read)}, a(5, 9, Read), []Lock{a(0, 20, Read)}, false},
		{"to EOF", []Lock{a(10, EOF, Write)}, a(0, 9, Write), []Lock{a(0, EOF, Write)}, false},
		{"upgrade read to write is no release", []Lock{a(0, 9, Read)}, a(0, 9, Write), []Lock{a(0, 9, Write)}, false},
		{"other owners untouched", []Lock{b(0, 9, Read)}, a(0, 9, Unlock), []Lock{b(0, 9, Read)}, false},
		{"unlock all", []Lock{a(0, 2, Write), a(5, 7, Read), b(0, 9, Read)}, a(0, EOF, Unlock), []Lock{b(0, 9, Read)}, true},
		{"through another open: cut, not merged", []Lock{via(a(0, 9, Write), 1)}, via(a(5, 20, Write), 2),
			[]Lock{via(a(0, 4, Write), 1), via(a(5, 20, Write), 2)}, false},
		{"through the same open: merged", []Lock{via(a(0, 9, Write), 1)}, via(a(5, 20, Write), 1), []Lock{via(a(0, 20, Write), 1)}, false},
		{"unlock through any open", []Lock{via(a(0, 9, Write), 1), via(a(10, 20, Read), 2)}, via(a(0, EOF, Unlock), 3), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]Lock(nil), tc.list...)
			out, released := Replace(tc.list, tc.want)
			if !reflect.DeepEqual(out, tc.out) && !(len(out) == 0 && len(tc.out) == 0) {
				t.Fatalf("Replace(%v, %v) = %v, want %v", tc.list, tc.want, out, tc.out)
			}
			if released != tc.released {
				t.Fatalf("released = %v, want %v", released, tc.released)
			}
			if !reflect.DeepEqual(in, tc.list) {
				t.Fatalf("input modified: %v, was %v", tc.list, in)
			}
		})
	}
}

func TestConflicts(t *testing.T) {
	r1 := Lock{Client: 1, Owner: 1, Start: 0, End: 9, Type: Read}
	r2 := Lock{Client: 2, Owner: 1, Start: 5, End: 15, Type: Read}
	w2 := r2
	w2.Type = Write
	w1b := Lock{Client: 1, Owner: 2, Start: 9, End: 9, Type: Write} // same client, other owner
	far := Lock{Client: 2, Owner: 1, Start: 10, End: EOF, Type: Write}
	for _, tc := range []struct {
		a, b Lock
		want bool
	}{
		{r1, r2, false}, {r1, w2, true}, {r1, w1b, true}, {r1, far, false}, {w2, w2, false},
	} {
		if got := Conflicts(&tc.a, &tc.b); got != tc.want {
			t.Errorf("Conflicts(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestDropHandle(t *testing.T) {
	l := func(client, owner, handle, start uint64) Lock {
		return Lock{Client: client, Owner: owner, Handle: handle, Start: start, End: start + 9, Type: Write}
	}
	list := []Lock{l(1, 1, 1, 0), l(1, 1, 2, 10), l(1, 2, 1, 20), l(2, 1, 1, 30), l(1, 3, 3, 40)}
	in := append([]Lock(nil), list...)
	out, released := DropHandle(list, 1, 1)
	if want := []Lock{l(1, 1, 2, 10), l(2, 1, 1, 30), l(1, 3, 3, 40)}; !reflect.DeepEqual(out, want) || !released {
		t.Fatalf("DropHandle(client 1, handle 1) = %v, %v; want %v, true", out, released, want)
	}
	if !reflect.DeepEqual(in, list) {
		t.Fatalf("input modified: %v, was %v", list, in)
	}
	if out, released := DropHandle(list, 1, 9); !reflect.DeepEqual(out, list) || released {
		t.Fatalf("DropHandle of an open without locks = %v, %v; want the list unchanged, false", out, released)
	}
}
