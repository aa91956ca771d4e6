package xdr

import (
	"bytes"
	"testing"
)

// The codec's cost per message: a GETATTR answer (the most frequent
// small reply) encoded, a REMOVE's arguments decoded.
func BenchmarkEncodeGetattrRes(b *testing.B) {
	var r GETATTR3res
	r.Status = NFS3_OK
	a := &r.Resok().Obj_attributes
	a.Type, a.Mode, a.Nlink, a.Size, a.Fileid = NF3REG, 0o644, 1, 4096, 77
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := Encode(&buf, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRemoveArgs(b *testing.B) {
	var buf bytes.Buffer
	in := REMOVE3args{Object: Diropargs3{Dir: Nfs_fh3{Data: make([]byte, 28)}, Name: "f123"}}
	if err := Encode(&buf, &in); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var out REMOVE3args
		if _, err := Decode(buf.Bytes(), &out); err != nil {
			b.Fatal(err)
		}
	}
}
