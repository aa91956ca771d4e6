package rpc

import (
	"bytes"
	"fmt"
	"runtime"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/layout"
	"google.golang.org/protobuf/encoding/protowire"
)

// Per-call CPU of the message codecs (docs/design/0009-formats.md): one
// encode into a reused buffer and one decode into a fresh message, for
// the hand-written codec ("strata") and for the protobuf wire format of
// equivalent messages written the way vtprotobuf generates code (sizes
// computed first, straight-line field code, bytes aliased on decode:
// "protowire"). Run with:
//
//	go test -run '^$' -bench Codec -benchmem ./internal/rpc/

func benchAttr(ino uint64) Attr {
	return Attr{Ino: ino, Mode: 0o100644, Nlink: 1, Uid: 1000, Gid: 1000, Size: 1 << 20,
		Atime: 1763885000123456789, Mtime: 1763885000123456789, Ctime: 1763885000123456789,
		Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 2}}, Blocks: 2048, BlocksKnown: true}
}

func benchMessages() []struct {
	name string
	m    Message
	pb   pbMessage
} {
	create := &CreateReq{Hdr: ReqHeader{ClientID: 3, Seq: 123456}, Parent: 1 << 20, Name: "file-000123.dat", Mode: 0o100644, Uid: 1000, Gid: 1000}
	change := &ChangeResp{Attr: benchAttr(1<<20 + 5), Dir: benchAttr(1 << 20), Index: 123456, Term: 3}
	write := &WriteReq{Chunk: ChunkID{Target: 2, Ino: 1<<20 + 5}, Off: 3 << 20, Data: make([]byte, 1<<20)}
	rd := &ReadDirResp{EOF: true}
	for i := range 32 {
		rd.Entries = append(rd.Entries, DirEntry{Name: fmt.Sprintf("file-%06d.dat", i), Ino: uint64(1<<20 + i), Mode: 0o100644, Attr: benchAttr(uint64(1<<20 + i))})
	}
	return []struct {
		name string
		m    Message
		pb   pbMessage
	}{
		{"MCreateReq", create, (*pbCreate)(create)},
		{"MCreateResp", change, (*pbChange)(change)},
		{"SWriteHeader", write, (*pbWrite)(write)},
		{"MReadDirResp32", rd, (*pbReadDir)(rd)},
	}
}

func BenchmarkCodec(b *testing.B) {
	for _, bm := range benchMessages() {
		b.Run(bm.name+"/strata", func(b *testing.B) {
			var e Enc
			b.ReportAllocs()
			defer threadCPU(b)()
			for range b.N {
				e.B = e.B[:0]
				if t, ok := bm.m.(Tailer); ok {
					// SWrite sends the data from the caller's memory
					// (writev): only the head is encoded.
					_ = t.EncodeHead(&e)
					e.B = append(e.B, bm.m.(*WriteReq).Data[:0]...)
				} else {
					bm.m.Encode(&e)
				}
				fresh := newLike(bm.m)
				if w, ok := bm.m.(*WriteReq); ok {
					// The server decodes the head and takes the data from
					// the frame buffer that follows it.
					d := NewDec(e.B)
					d.tail = w.Data
					fresh.Decode(d)
				} else if err := Unmarshal(e.B, fresh); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bm.name+"/protowire", func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			defer threadCPU(b)()
			for range b.N {
				buf = bm.pb.marshal(buf[:0])
				if err := bm.pb.fresh().unmarshal(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// threadCPU reports the CPU time the benchmark's thread spent per op
// (cpu-ns/op): on a shared machine the wall time per op also counts the
// time spent waiting for a core. Call the result when the loop ends.
func threadCPU(b *testing.B) func() {
	runtime.LockOSThread()
	var start syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &start); err != nil {
		b.Fatal(err)
	}
	return func() {
		var end syscall.Rusage
		if err := syscall.Getrusage(rusageThread, &end); err != nil {
			b.Fatal(err)
		}
		runtime.UnlockOSThread()
		ns := func(r *syscall.Rusage) int64 { return r.Utime.Nano() + r.Stime.Nano() }
		b.ReportMetric(float64(ns(&end)-ns(&start))/float64(b.N), "cpu-ns/op")
	}
}

// rusageThread is RUSAGE_THREAD (Linux): the calling thread's usage.
const rusageThread = 1

// TestProtowireEquivalent checks that the protobuf-format versions carry
// the same content (so the benchmark compares like with like).
func TestProtowireEquivalent(t *testing.T) {
	for _, bm := range benchMessages() {
		fresh := bm.pb.fresh()
		if err := fresh.unmarshal(bm.pb.marshal(nil)); err != nil {
			t.Fatalf("%s: %v", bm.name, err)
		}
		if !bytes.Equal(Marshal(fresh.(interface{ msg() Message }).msg()), Marshal(bm.m)) {
			t.Fatalf("%s: protobuf round trip lost content", bm.name)
		}
	}
}

// pbMessage is a message in protobuf wire format, coded by hand as
// vtprotobuf's generated MarshalVT/UnmarshalVT do.
type pbMessage interface {
	marshal(b []byte) []byte
	unmarshal(b []byte) error
	fresh() pbMessage
}

type (
	pbCreate  CreateReq
	pbChange  ChangeResp
	pbWrite   WriteReq
	pbReadDir ReadDirResp
)

func (m *pbCreate) msg() Message  { return (*CreateReq)(m) }
func (m *pbChange) msg() Message  { return (*ChangeResp)(m) }
func (m *pbWrite) msg() Message   { return (*WriteReq)(m) }
func (m *pbReadDir) msg() Message { return (*ReadDirResp)(m) }

func (*pbCreate) fresh() pbMessage  { return &pbCreate{} }
func (*pbChange) fresh() pbMessage  { return &pbChange{} }
func (*pbWrite) fresh() pbMessage   { return &pbWrite{} }
func (*pbReadDir) fresh() pbMessage { return &pbReadDir{} }

func pbVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func pbVarintSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func pbBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func pbString(b []byte, num protowire.Number, v string) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
}

func pbBytesSize(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func pbBool(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

// pbFields walks b's fields: varints to onVarint, length-delimited ones
// (aliasing b) to onBytes.
func pbFields(b []byte, onVarint func(protowire.Number, uint64), onBytes func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			onVarint(num, v)
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if onBytes == nil {
				continue
			}
			if err := onBytes(num, v); err != nil {
				return err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

func zigzag(v int64) uint64 { return protowire.EncodeZigZag(v) }

func (m *pbCreate) hdrSize() int {
	return pbVarintSize(1, m.Hdr.ClientID) + pbVarintSize(2, m.Hdr.Seq)
}

func (m *pbCreate) marshal(b []byte) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(m.hdrSize()))
	b = pbVarint(b, 1, m.Hdr.ClientID)
	b = pbVarint(b, 2, m.Hdr.Seq)
	b = pbVarint(b, 2, m.Parent)
	b = pbString(b, 3, m.Name)
	b = pbVarint(b, 4, uint64(m.Mode))
	b = pbVarint(b, 5, uint64(m.Uid))
	b = pbVarint(b, 6, uint64(m.Gid))
	b = pbVarint(b, 7, uint64(m.Rdev))
	return pbString(b, 8, m.SymlinkTarget)
}

func (m *pbCreate) unmarshal(b []byte) error {
	return pbFields(b, func(num protowire.Number, v uint64) {
		switch num {
		case 2:
			m.Parent = v
		case 4:
			m.Mode = uint32(v)
		case 5:
			m.Uid = uint32(v)
		case 6:
			m.Gid = uint32(v)
		case 7:
			m.Rdev = uint32(v)
		}
	}, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			return pbFields(v, func(num protowire.Number, v uint64) {
				switch num {
				case 1:
					m.Hdr.ClientID = v
				case 2:
					m.Hdr.Seq = v
				}
			}, nil)
		case 3:
			m.Name = string(v)
		case 8:
			m.SymlinkTarget = string(v)
		}
		return nil
	})
}

// Attr: 1 ino, 2 mode, 3 nlink, 4 uid, 5 gid, 6 rdev, 7 size, 8-10 times
// (sint64), 11 layout {1 stripe size, 2 count, 3 packed targets},
// 12 blocks, 13 blocks known.
func pbLayoutSize(l *layout.Layout) (int, int) {
	packed := 0
	for _, t := range l.Targets {
		packed += protowire.SizeVarint(uint64(t))
	}
	return pbVarintSize(1, uint64(l.StripeSize)) + pbVarintSize(2, uint64(l.StripeCount)) + pbBytesSize(3, packed), packed
}

func pbAttrSize(a *Attr) int {
	ls, _ := pbLayoutSize(&a.Layout)
	return pbVarintSize(1, a.Ino) + pbVarintSize(2, uint64(a.Mode)) + pbVarintSize(3, uint64(a.Nlink)) +
		pbVarintSize(4, uint64(a.Uid)) + pbVarintSize(5, uint64(a.Gid)) + pbVarintSize(6, uint64(a.Rdev)) +
		pbVarintSize(7, a.Size) + pbVarintSize(8, zigzag(a.Atime)) + pbVarintSize(9, zigzag(a.Mtime)) +
		pbVarintSize(10, zigzag(a.Ctime)) + pbBytesSize(11, ls) + pbVarintSize(12, a.Blocks) + pbVarintSize(13, pbBool(a.BlocksKnown))
}

func pbAttr(b []byte, num protowire.Number, a *Attr) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(pbAttrSize(a)))
	b = pbVarint(b, 1, a.Ino)
	b = pbVarint(b, 2, uint64(a.Mode))
	b = pbVarint(b, 3, uint64(a.Nlink))
	b = pbVarint(b, 4, uint64(a.Uid))
	b = pbVarint(b, 5, uint64(a.Gid))
	b = pbVarint(b, 6, uint64(a.Rdev))
	b = pbVarint(b, 7, a.Size)
	b = pbVarint(b, 8, zigzag(a.Atime))
	b = pbVarint(b, 9, zigzag(a.Mtime))
	b = pbVarint(b, 10, zigzag(a.Ctime))
	ls, packed := pbLayoutSize(&a.Layout)
	if ls > 0 {
		b = protowire.AppendTag(b, 11, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(ls))
		b = pbVarint(b, 1, uint64(a.Layout.StripeSize))
		b = pbVarint(b, 2, uint64(a.Layout.StripeCount))
		if packed > 0 {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(packed))
			for _, t := range a.Layout.Targets {
				b = protowire.AppendVarint(b, uint64(t))
			}
		}
	}
	b = pbVarint(b, 12, a.Blocks)
	return pbVarint(b, 13, pbBool(a.BlocksKnown))
}

func pbUnmarshalAttr(b []byte, a *Attr) error {
	return pbFields(b, func(num protowire.Number, v uint64) {
		switch num {
		case 1:
			a.Ino = v
		case 2:
			a.Mode = uint32(v)
		case 3:
			a.Nlink = uint32(v)
		case 4:
			a.Uid = uint32(v)
		case 5:
			a.Gid = uint32(v)
		case 6:
			a.Rdev = uint32(v)
		case 7:
			a.Size = v
		case 8:
			a.Atime = protowire.DecodeZigZag(v)
		case 9:
			a.Mtime = protowire.DecodeZigZag(v)
		case 10:
			a.Ctime = protowire.DecodeZigZag(v)
		case 12:
			a.Blocks = v
		case 13:
			a.BlocksKnown = v != 0
		}
	}, func(num protowire.Number, v []byte) error {
		if num != 11 {
			return nil
		}
		l := &a.Layout
		return pbFields(v, func(num protowire.Number, v uint64) {
			switch num {
			case 1:
				l.StripeSize = uint32(v)
			case 2:
				l.StripeCount = uint32(v)
			}
		}, func(num protowire.Number, v []byte) error {
			if num != 3 {
				return nil
			}
			n := 0
			for _, c := range v {
				if c < 0x80 {
					n++
				}
			}
			l.Targets = make([]uint32, 0, n)
			for len(v) > 0 {
				t, k := protowire.ConsumeVarint(v)
				if k < 0 {
					return protowire.ParseError(k)
				}
				l.Targets = append(l.Targets, uint32(t))
				v = v[k:]
			}
			return nil
		})
	})
}

func (m *pbChange) marshal(b []byte) []byte {
	b = pbAttr(b, 1, &m.Attr)
	b = pbAttr(b, 2, &m.Dir)
	b = pbVarint(b, 3, m.Index)
	return pbVarint(b, 4, m.Term)
}

func (m *pbChange) unmarshal(b []byte) error {
	return pbFields(b, func(num protowire.Number, v uint64) {
		switch num {
		case 3:
			m.Index = v
		case 4:
			m.Term = v
		}
	}, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			return pbUnmarshalAttr(v, &m.Attr)
		case 2:
			return pbUnmarshalAttr(v, &m.Dir)
		}
		return nil
	})
}

// WriteReq: 1 chunk {1 target, 2 ino}, 2 off, 3 sync, 4 data. Protobuf
// has no out-of-line field, so the data is part of the marshalled message
// (a copy); decoding aliases it, as vtprotobuf's UnmarshalVTUnsafe does.
func (m *pbWrite) marshal(b []byte) []byte {
	cs := pbVarintSize(1, uint64(m.Chunk.Target)) + pbVarintSize(2, m.Chunk.Ino)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(cs))
	b = pbVarint(b, 1, uint64(m.Chunk.Target))
	b = pbVarint(b, 2, m.Chunk.Ino)
	b = pbVarint(b, 2, m.Off)
	b = pbVarint(b, 3, pbBool(m.Sync))
	return pbBytes(b, 4, m.Data)
}

func (m *pbWrite) unmarshal(b []byte) error {
	return pbFields(b, func(num protowire.Number, v uint64) {
		switch num {
		case 2:
			m.Off = v
		case 3:
			m.Sync = v != 0
		}
	}, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			return pbFields(v, func(num protowire.Number, v uint64) {
				switch num {
				case 1:
					m.Chunk.Target = uint32(v)
				case 2:
					m.Chunk.Ino = v
				}
			}, nil)
		case 4:
			m.Data = v
		}
		return nil
	})
}

// ReadDirResp: 1 repeated entry {1 name, 2 ino, 3 mode, 4 attr}, 2 eof.
func (m *pbReadDir) marshal(b []byte) []byte {
	for i := range m.Entries {
		x := &m.Entries[i]
		as := pbAttrSize(&x.Attr)
		es := pbBytesSize(1, len(x.Name)) + pbVarintSize(2, x.Ino) + pbVarintSize(3, uint64(x.Mode)) + pbBytesSize(4, as)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(es))
		b = pbString(b, 1, x.Name)
		b = pbVarint(b, 2, x.Ino)
		b = pbVarint(b, 3, uint64(x.Mode))
		b = pbAttr(b, 4, &x.Attr)
	}
	return pbVarint(b, 2, pbBool(m.EOF))
}

func (m *pbReadDir) unmarshal(b []byte) error {
	return pbFields(b, func(num protowire.Number, v uint64) {
		if num == 2 {
			m.EOF = v != 0
		}
	}, func(num protowire.Number, v []byte) error {
		if num != 1 {
			return nil
		}
		m.Entries = append(m.Entries, DirEntry{})
		x := &m.Entries[len(m.Entries)-1]
		return pbFields(v, func(num protowire.Number, v uint64) {
			switch num {
			case 2:
				x.Ino = v
			case 3:
				x.Mode = uint32(v)
			}
		}, func(num protowire.Number, v []byte) error {
			switch num {
			case 1:
				x.Name = string(v)
			case 4:
				return pbUnmarshalAttr(v, &x.Attr)
			}
			return nil
		})
	})
}
