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

// Encode writes what goxdr's own encoder (XdrOut) writes, for messages
// with every kind of field: numbers, enums, unions, optional data, fixed
// and variable opaques, strings and their padding; and refuses an opaque
// over its bound.
func TestEncodeMatchesXdrOut(t *testing.T) {
	var getattr GETATTR3res
	getattr.Status = NFS3_OK
	a := &getattr.Resok().Obj_attributes
	a.Type, a.Mode, a.Nlink, a.Uid, a.Size, a.Fileid = NF3REG, 0o4755, 2, 1000, 1<<40+3, 77
	a.Rdev, a.Mtime = Specdata3{Specdata1: 8, Specdata2: 1}, Nfstime3{Seconds: 5, Nseconds: 6}
	var remove REMOVE3res
	remove.Status = NFS3ERR_ACCES
	wcc := &remove.Resfail().Dir_wcc
	wcc.After.Attributes_follow = true
	wcc.After.Attributes().Fileid = 9
	var entries READDIRPLUS3res
	entries.Status = NFS3_OK
	list := entries.Resok()
	list.Cookieverf = Cookieverf3{1, 2, 3, 4, 5, 6, 7, 8}
	list.Reply.Entries = &Entryplus3{Fileid: 3, Name: "abcde", Cookie: 9, Nextentry: &Entryplus3{Fileid: 4, Name: "xy"}}
	list.Reply.Entries.Name_handle.Handle_follows = true
	list.Reply.Entries.Name_handle.Handle().Data = []byte{1, 2, 3}
	write := WRITE3args{File: Nfs_fh3{Data: []byte("handle!")}, Offset: 1 << 33, Count: 3, Stable: DATA_SYNC, Data: []byte("abc")}
	for _, v := range []XdrType{&getattr, &remove, &entries, &write} {
		var got, want bytes.Buffer
		if err := Encode(&got, v); err != nil {
			t.Fatalf("%s: %v", v.XdrTypeName(), err)
		}
		v.XdrMarshal(&XdrOut{Out: &want}, "")
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("%s: Encode wrote\n%x\nXdrOut\n%x", v.XdrTypeName(), got.Bytes(), want.Bytes())
		}
	}
	var b bytes.Buffer
	bad := Nfs_fh3{Data: make([]byte, NFS3_FHSIZE+1)}
	if err := Encode(&b, &bad); err == nil {
		t.Fatal("a handle over NFS3_FHSIZE encoded")
	}
}

// A READ answer sent as its encoding without the data, then the data and
// EndData's padding, is the answer's encoding, for every length modulo 4.
func TestReadSplitData(t *testing.T) {
	for n := 1; n <= 8; n++ {
		var r READ3res
		r.Status = NFS3_OK
		ok := r.Resok()
		ok.Count, ok.Eof, ok.Data = uint32(n), true, bytes.Repeat([]byte{0xab}, n)
		ok.File_attributes.Attributes_follow = true
		ok.File_attributes.Attributes().Size = 99
		var whole bytes.Buffer
		if err := Encode(&whole, &r); err != nil {
			t.Fatal(err)
		}
		data := r.SplitData()
		if len(data) != n || r.Resok().Data != nil {
			t.Fatalf("SplitData took %d bytes, left %d", len(data), len(r.Resok().Data))
		}
		var split bytes.Buffer
		if err := Encode(&split, &r); err != nil {
			t.Fatal(err)
		}
		pad := EndData(split.Bytes(), data)
		got := append(append(split.Bytes(), data...), pad...)
		if !bytes.Equal(got, whole.Bytes()) {
			t.Fatalf("%d bytes: split\n%x\nwhole\n%x", n, got, whole.Bytes())
		}
	}
	var fail READ3res
	fail.Status = NFS3ERR_IO
	if fail.SplitData() != nil {
		t.Fatal("a failed READ has data")
	}
}
