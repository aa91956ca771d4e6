package schema

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/stratafs/strata/internal/layout"
)

func TestKeyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		parent uint64
		name   string
	}{{1, "a"}, {0xdeadbeef, "name with spaces"}, {^uint64(0), string(make([]byte, 255))}} {
		p, n, err := DecodeDentryKey(DentryKey(tc.parent, tc.name))
		if err != nil || p != tc.parent || n != tc.name {
			t.Errorf("dentry %v: got %d %q %v", tc, p, n, err)
		}
		if !bytes.HasPrefix(DentryKey(tc.parent, tc.name), DentryPrefix(tc.parent)) {
			t.Errorf("dentry key not under its prefix")
		}
	}
	if ino, name, err := DecodeXattrKey(XattrKey(7, "user.x")); err != nil || ino != 7 || name != "user.x" {
		t.Errorf("xattr key: %d %q %v", ino, name, err)
	}
	if c, s, err := DecodeDedupeKey(DedupeKey(3, 9)); err != nil || c != 3 || s != 9 {
		t.Errorf("dedupe key: %d %d %v", c, s, err)
	}
	for _, k := range [][]byte{InodeKey(5), OrphanKey(5), SessionKey(5)} {
		var v uint64
		var err error
		switch k[0] {
		case 'i':
			v, err = DecodeInodeKey(k)
		case 'o':
			v, err = DecodeOrphanKey(k)
		case 's':
			v, err = DecodeSessionKey(k)
		}
		if err != nil || v != 5 {
			t.Errorf("key %x: %d %v", k, v, err)
		}
	}
	if id, err := DecodeGroupKey(GroupKey(9)); err != nil || id != 9 {
		t.Errorf("group key: %d %v", id, err)
	}
	for _, k := range [][]byte{ServerKey(4), TargetKey(4)} {
		if id, err := DecodeRegistryID(k); err != nil || id != 4 {
			t.Errorf("registry key %x: %d %v", k, id, err)
		}
	}
}

func TestKeyOrder(t *testing.T) {
	// Numeric order of inode numbers is byte order; names sort within a parent;
	// xattrs sort inside the inode's range and before the next inode.
	ordered := [][]byte{
		DentryKey(1, "a"), DentryKey(1, "b"), DentryKey(2, "a"),
		InodeKey(255), XattrKey(255, "z"), InodeKey(256),
	}
	for i := 1; i < len(ordered); i++ {
		if bytes.Compare(ordered[i-1], ordered[i]) >= 0 {
			t.Errorf("key %x not before %x", ordered[i-1], ordered[i])
		}
	}
	s, e := InodeRange(255)
	x := XattrKey(255, "\xff\xff")
	if bytes.Compare(s, x) > 0 || bytes.Compare(x, e) >= 0 {
		t.Errorf("xattr key outside inode range")
	}
	if bytes.Compare(InodeKey(256), e) < 0 {
		t.Errorf("next inode inside range")
	}
}

func TestBadKeys(t *testing.T) {
	for _, k := range [][]byte{nil, {'d'}, {'x', 1, 2}, InodeKey(1)[:5]} {
		if _, _, err := DecodeDentryKey(k); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeDentryKey(%x) = %v", k, err)
		}
		if _, err := DecodeInodeKey(k); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeInodeKey(%x) = %v", k, err)
		}
	}
}

func TestValueRoundTrip(t *testing.T) {
	in := Inode{Mode: 0100644, Nlink: 2, Uid: 1000, Gid: 100, Rdev: 3, Size: 1 << 40,
		Atime: -5, Mtime: 1e18, Ctime: 7,
		Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{4, 9}},
		Parent: 0, Entries: 0, Symlink: "x/y"}
	var got Inode
	if err := DecodeInode(AppendInode(nil, &in), &got); err != nil || !reflect.DeepEqual(in, got) {
		t.Errorf("inode: %+v %v", got, err)
	}
	if b, ok := got.AllocBlocks(); ok || b != 0 || got.Alloc != nil {
		t.Errorf("inode without Alloc: blocks %d known %v (%v), want unknown", b, ok, got.Alloc)
	}
	// The space per chunk is an optional tail: an inode with it decodes
	// with it; one without (every record written before it) without.
	withAlloc := in
	withAlloc.Alloc = []uint64{8192, 1000}
	got = Inode{Alloc: []uint64{7}}
	if err := DecodeInode(AppendInode(nil, &withAlloc), &got); err != nil || !reflect.DeepEqual(withAlloc, got) {
		t.Errorf("inode with Alloc: %+v %v", got, err)
	}
	if b, ok := got.AllocBlocks(); !ok || b != 18 {
		t.Errorf("blocks of 9,192 bytes = %d (known %v), want 18", b, ok)
	}
	if old := AppendInode(nil, &in); !bytes.HasPrefix(AppendInode(nil, &withAlloc), old) {
		t.Errorf("the Alloc tail is not appended after the older fields")
	}
	de := Dentry{Ino: 99, Type: 0040000}
	if g, err := DecodeDentry(AppendDentry(nil, de)); err != nil || g != de {
		t.Errorf("dentry: %+v %v", g, err)
	}
	c := Counters{NextIno: 1, NextClient: 2, NextServer: 3, NextTarget: 4, Inodes: 5, AppliedIndex: 6, AppliedTerm: 7}
	if g, err := DecodeCounters(AppendCounters(nil, &c)); err != nil || g != c {
		t.Errorf("counters: %+v %v", g, err)
	}
	if g, err := DecodeOrphan(AppendOrphan(nil, Orphan{Since: 42})); err != nil || g != (Orphan{Since: 42}) {
		t.Errorf("orphan: %+v %v", g, err)
	}
	if g, err := DecodeOrphan(AppendOrphan(nil, Orphan{Since: 42, Tmpfile: true})); err != nil || g != (Orphan{Since: 42, Tmpfile: true}) {
		t.Errorf("tmpfile orphan: %+v %v", g, err)
	}
	// An orphan of an unlinked file keeps the layout of records written
	// before the Tmpfile flag (format byte, Since) in both directions.
	if b := AppendOrphan(nil, Orphan{Since: 42}); !bytes.Equal(b, []byte{formatV1, 84}) {
		t.Errorf("orphan encoding %x, want %x", b, []byte{formatV1, 84})
	}
	if _, err := DecodeOrphan([]byte{formatV1, 84, 1, 0}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("orphan with trailing bytes after the flag: %v, want ErrCorrupt", err)
	}
	s := Session{Host: "h", MountPoint: "/m", Pid: 9, Opened: 11}
	if g, err := DecodeSession(AppendSession(nil, &s)); err != nil || g != s {
		t.Errorf("session: %+v %v", g, err)
	}
	sv := Server{ID: 1, Addr: "a:1", Host: "h", Targets: []uint32{1, 2}}
	if g, err := DecodeServer(AppendServer(nil, &sv)); err != nil || !reflect.DeepEqual(g, sv) {
		t.Errorf("server: %+v %v", g, err)
	}
	tg := Target{ID: 1, ServerID: 2, UUID: "u", Path: "/p"}
	if g, err := DecodeTarget(AppendTarget(nil, &tg)); err != nil || g != tg {
		t.Errorf("target: %+v %v", g, err)
	}
	if g, err := DecodeTargetRef(AppendTargetRef(nil, TargetRef{ID: 8})); err != nil || g.ID != 8 {
		t.Errorf("target ref: %+v %v", g, err)
	}
}

func TestBadValues(t *testing.T) {
	good := AppendDentry(nil, Dentry{Ino: 1, Type: 2})
	for name, b := range map[string][]byte{
		"empty":    nil,
		"version":  append([]byte{0}, good[1:]...),
		"trailing": append(append([]byte(nil), good...), 0),
		"short":    good[:1],
	} {
		if _, err := DecodeDentry(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	newer := append([]byte{formatV1 + 1}, good[1:]...)
	if _, err := DecodeDentry(newer); !errors.Is(err, ErrNewer) {
		t.Errorf("newer version: err = %v, want ErrNewer", err)
	}
}

// Fuzz targets: every decoder must reject garbage without panicking, and
// whatever decodes must re-encode to the same bytes.

func FuzzDecodeInode(f *testing.F) {
	f.Add(AppendInode(nil, &Inode{Mode: 0100644, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{1}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var in Inode
		if DecodeInode(b, &in) == nil {
			var again Inode
			if err := DecodeInode(AppendInode(nil, &in), &again); err != nil || !reflect.DeepEqual(in, again) {
				t.Fatalf("re-decode: %v", err)
			}
		}
	})
}

func FuzzDecodeDentry(f *testing.F) {
	f.Add(AppendDentry(nil, Dentry{Ino: 5, Type: 0100000}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if de, err := DecodeDentry(b); err == nil {
			if g, err := DecodeDentry(AppendDentry(nil, de)); err != nil || g != de {
				t.Fatalf("re-decode: %v", err)
			}
		}
	})
}

func FuzzDecodeKeys(f *testing.F) {
	f.Add(DentryKey(1, "x"))
	f.Add(XattrKey(1, "user.a"))
	f.Add(DedupeKey(1, 2))
	f.Add(ServerKey(1))
	f.Fuzz(func(t *testing.T, k []byte) {
		if p, n, err := DecodeDentryKey(k); err == nil && !bytes.Equal(DentryKey(p, n), k) {
			t.Fatalf("dentry key does not round-trip")
		}
		if i, n, err := DecodeXattrKey(k); err == nil && !bytes.Equal(XattrKey(i, n), k) {
			t.Fatalf("xattr key does not round-trip")
		}
		if c, s, err := DecodeDedupeKey(k); err == nil && !bytes.Equal(DedupeKey(c, s), k) {
			t.Fatalf("dedupe key does not round-trip")
		}
		_, _ = DecodeInodeKey(k)
		_, _ = DecodeOrphanKey(k)
		_, _ = DecodeSessionKey(k)
		_, _ = DecodeRegistryID(k)
	})
}
