package layout

import (
	"errors"
	"testing"
)

func TestLocateAndSplit(t *testing.T) {
	l := Layout{StripeSize: 1 << 20, StripeCount: 3, Targets: []uint32{7, 8, 9}}
	const M = 1 << 20
	cases := []struct {
		off      int64
		slot     int
		chunkOff int64
	}{
		{0, 0, 0}, {M - 1, 0, M - 1}, {M, 1, 0}, {2 * M, 2, 0}, {3 * M, 0, M}, {4*M + 5, 1, M + 5},
	}
	for _, c := range cases {
		s, co := l.Locate(c.off)
		if s != c.slot || co != c.chunkOff {
			t.Errorf("Locate(%d) = (%d,%d), want (%d,%d)", c.off, s, co, c.slot, c.chunkOff)
		}
	}
	ext := l.Split(M-10, 2*M+20)
	want := []Extent{{0, M - 10, M - 10, 10}, {1, M, 0, M}, {2, 2 * M, 0, M}, {0, 3 * M, M, 10}}
	if len(ext) != len(want) {
		t.Fatalf("Split: got %v want %v", ext, want)
	}
	for i := range want {
		if ext[i] != want[i] {
			t.Errorf("extent %d: got %+v want %+v", i, ext[i], want[i])
		}
	}
	if got := l.Split(5, 0); got != nil {
		t.Errorf("empty split: %v", got)
	}
}

func TestChunkSizeMatchesSplit(t *testing.T) {
	for _, count := range []uint32{1, 2, 3, 4, 8} {
		l := Layout{StripeSize: 64 << 10, StripeCount: count, Targets: make([]uint32, count)}
		for _, size := range []int64{0, 1, 64<<10 - 1, 64 << 10, 64<<10 + 1, 5*64<<10 + 77, 17 * 64 << 10} {
			want := make([]int64, count)
			for _, e := range l.Split(0, size) {
				if end := e.ChunkOff + e.Len; end > want[e.Slot] {
					want[e.Slot] = end
				}
			}
			for slot := 0; slot < int(count); slot++ {
				if got := l.ChunkSize(size, slot); got != want[slot] {
					t.Errorf("count %d size %d slot %d: ChunkSize %d want %d", count, size, slot, got, want[slot])
				}
			}
		}
	}
}

// ChunkFrom and FileOff agree with Locate byte by byte: ChunkFrom(off,
// slot) is the chunk offset of the first file byte at or after off that
// lies on slot, and FileOff inverts Locate.
func TestChunkFromAndFileOff(t *testing.T) {
	for _, count := range []uint32{1, 2, 3, 4} {
		const unit = 16
		l := Layout{StripeSize: unit, StripeCount: count, Targets: make([]uint32, count)}
		end := int64(unit * count * 4)
		for off := int64(0); off < end; off++ {
			for slot := 0; slot < int(count); slot++ {
				x := off
				for {
					if sl, _ := l.Locate(x); sl == slot {
						break
					}
					x++
				}
				_, want := l.Locate(x)
				if got := l.ChunkFrom(off, slot); got != want {
					t.Fatalf("count %d: ChunkFrom(%d, slot %d) = %d, want %d (file offset %d)", count, off, slot, got, want, x)
				}
			}
			slot, co := l.Locate(off)
			if got := l.FileOff(slot, co); got != off {
				t.Fatalf("count %d: FileOff(Locate(%d)) = %d", count, off, got)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	good := Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 2}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good layout: %v", err)
	}
	bad := []Layout{
		{StripeSize: 1000, StripeCount: 2, Targets: []uint32{1, 2}},
		{StripeSize: 1 << 20, StripeCount: 0},
		{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1}},
		{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 1}},
	}
	for _, l := range bad {
		if err := l.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", l, err)
		}
	}
}

func TestChoose(t *testing.T) {
	cands := []Candidate{{4, 100}, {1, 100}, {3, 100}, {2, 100}}
	got, err := Choose(cands, 2, 0)
	if err != nil || len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("Choose start 0: %v %v", got, err)
	}
	got, _ = Choose(cands, 2, 3)
	if got[0] != 4 || got[1] != 1 {
		t.Fatalf("Choose start 3: %v", got)
	}
	// A nearly full target is skipped while enough roomy ones remain.
	cands[1].FreeBytes = 1
	for start := uint64(0); start < 8; start++ {
		got, _ = Choose(cands, 3, start)
		for _, id := range got {
			if id == 1 {
				t.Fatalf("start %d chose the full target: %v", start, got)
			}
		}
	}
	// But it is used when the file needs every target.
	got, _ = Choose(cands, 4, 0)
	if len(got) != 4 {
		t.Fatalf("need all: %v", got)
	}
	if _, err := Choose(cands, 5, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("too many: %v", err)
	}
}

func TestDefaultCount(t *testing.T) {
	if DefaultCount(4) != 4 || DefaultCount(20) != 8 {
		t.Fatal("DefaultCount")
	}
}

// MaxFileSize is the largest size whose chunks all fit MaxChunkBytes: one
// byte more puts slot 0's chunk past it.
func TestMaxFileSize(t *testing.T) {
	for _, size := range []uint32{MinStripeSize, 1 << 20, 3 * MinStripeSize, 5 << 20, MaxStripeSize} {
		for _, count := range []uint32{1, 2, 3, 8, MaxStripeCount} {
			l := Layout{StripeSize: size, StripeCount: count}
			m := l.MaxFileSize()
			for slot := 0; slot < int(count); slot++ {
				if cs := l.ChunkSize(m, slot); cs > MaxChunkBytes {
					t.Fatalf("size %d count %d: a file of %d bytes has a chunk of %d at slot %d, over %d",
						size, count, m, cs, slot, int64(MaxChunkBytes))
				}
			}
			if cs := l.ChunkSize(m+1, 0); cs <= MaxChunkBytes {
				t.Fatalf("size %d count %d: a file of %d+1 bytes still fits (slot 0 holds %d)", size, count, m, cs)
			}
			if lo := int64(count) * (MaxChunkBytes - int64(size)); m < lo || m > int64(count)*MaxChunkBytes {
				t.Fatalf("size %d count %d: %d is not about count × the chunk limit", size, count, m)
			}
		}
	}
	if m := (Layout{StripeSize: 1 << 20, StripeCount: 1}).MaxFileSize(); m != MaxChunkBytes {
		t.Fatalf("one target: %d, want the chunk limit %d", m, int64(MaxChunkBytes))
	}
}
