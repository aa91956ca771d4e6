package xdr

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestDecodeRoundTrip(t *testing.T) {
	in := WRITE3args{File: Nfs_fh3{Data: []byte("handle")}, Offset: 1 << 40, Count: 5, Stable: FILE_SYNC, Data: []byte("hello")}
	var b bytes.Buffer
	if err := Encode(&b, &in); err != nil {
		t.Fatal(err)
	}
	b.WriteString("tail")
	var out WRITE3args
	rest, err := Decode(b.Bytes(), &out)
	if err != nil || string(rest) != "tail" {
		t.Fatalf("decode: %v, rest %q", err, rest)
	}
	if string(out.File.Data) != "handle" || out.Offset != 1<<40 || out.Stable != FILE_SYNC || string(out.Data) != "hello" {
		t.Fatalf("decoded %+v", out)
	}
	var attrs Sattr3
	attrs.Mtime.Set_it = SET_TO_CLIENT_TIME
	*attrs.Mtime.Mtime() = Nfstime3{Seconds: 7}
	b.Reset()
	if err := Encode(&b, &attrs); err != nil {
		t.Fatal(err)
	}
	var back Sattr3
	if _, err := Decode(b.Bytes(), &back); err != nil || back.Mtime.Set_it != SET_TO_CLIENT_TIME || back.Mtime.Mtime().Seconds != 7 {
		t.Fatalf("sattr3: %v %+v", err, back)
	}
}

func TestDecodeRefuses(t *testing.T) {
	huge := binary.BigEndian.AppendUint32(nil, 1<<31) // an opaque of 2 GiB, in 4 bytes
	var fh Nfs_fh3
	if _, err := Decode(huge, &fh); err == nil {
		t.Fatal("a 2 GiB handle in 4 bytes decoded")
	}
	long := binary.BigEndian.AppendUint32(nil, 65) // longer than NFS3_FHSIZE
	long = append(long, make([]byte, 68)...)
	if _, err := Decode(long, &fh); err == nil {
		t.Fatal("a 65-byte handle decoded")
	}
	badTag := binary.BigEndian.AppendUint32(nil, 9) // no such stable_how
	var st Stable_how
	if _, err := Decode(badTag, XDR_Stable_how(&st)); err == nil {
		t.Fatal("stable_how 9 decoded")
	}
	pad := binary.BigEndian.AppendUint32(nil, 1)
	pad = append(pad, 'x', 1, 0, 0)
	if _, err := Decode(pad, &fh); err == nil {
		t.Fatal("non-zero padding decoded")
	}
}
