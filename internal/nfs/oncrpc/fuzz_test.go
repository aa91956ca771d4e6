package oncrpc

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// argTypes are the argument types the gateway decodes from callers.
var argTypes = []func() xdr.XdrType{
	func() xdr.XdrType { return &xdr.GETATTR3args{} },
	func() xdr.XdrType { return &xdr.SETATTR3args{} },
	func() xdr.XdrType { return &xdr.LOOKUP3args{} },
	func() xdr.XdrType { return &xdr.ACCESS3args{} },
	func() xdr.XdrType { return &xdr.READLINK3args{} },
	func() xdr.XdrType { return &xdr.READ3args{} },
	func() xdr.XdrType { return &xdr.WRITE3args{} },
	func() xdr.XdrType { return &xdr.CREATE3args{} },
	func() xdr.XdrType { return &xdr.MKDIR3args{} },
	func() xdr.XdrType { return &xdr.SYMLINK3args{} },
	func() xdr.XdrType { return &xdr.MKNOD3args{} },
	func() xdr.XdrType { return &xdr.REMOVE3args{} },
	func() xdr.XdrType { return &xdr.RMDIR3args{} },
	func() xdr.XdrType { return &xdr.RENAME3args{} },
	func() xdr.XdrType { return &xdr.LINK3args{} },
	func() xdr.XdrType { return &xdr.READDIR3args{} },
	func() xdr.XdrType { return &xdr.READDIRPLUS3args{} },
	func() xdr.XdrType { return &xdr.FSSTAT3args{} },
	func() xdr.XdrType { return &xdr.FSINFO3args{} },
	func() xdr.XdrType { return &xdr.PATHCONF3args{} },
	func() xdr.XdrType { return &xdr.COMMIT3args{} },
	func() xdr.XdrType { var p xdr.Dirpath; return xdr.XDR_Dirpath(&p) },
	func() xdr.XdrType { return &xdr.Authsys_parms{} },
	func() xdr.XdrType { return &xdr.Nlm4_testargs{} },
	func() xdr.XdrType { return &xdr.Nlm4_lockargs{} },
	func() xdr.XdrType { return &xdr.Nlm4_cancargs{} },
	func() xdr.XdrType { return &xdr.Nlm4_unlockargs{} },
	func() xdr.XdrType { return &xdr.Nlm4_shareargs{} },
	func() xdr.XdrType { return &xdr.Nlm4_notify{} },
	func() xdr.XdrType { return &xdr.Sm_name{} },
	func() xdr.XdrType { return &xdr.Mon{} },
	func() xdr.XdrType { return &xdr.Mon_id{} },
	func() xdr.XdrType { return &xdr.My_id{} },
	func() xdr.XdrType { return &xdr.Stat_chge{} },
}

// FuzzCall feeds a stream to the record reader, the call header decoder,
// the credential parser and every argument decoder: none may panic, and a
// record is never larger than the limit.
func FuzzCall(f *testing.F) {
	var call bytes.Buffer
	call.Write([]byte{0, 0, 0, 0})
	var m xdr.Rpc_msg
	m.Xid = 7
	m.Body.Mtype = xdr.CALL
	cb := m.Body.Cbody()
	cb.Rpcvers, cb.Prog, cb.Vers, cb.Proc = 2, 100003, 3, 1
	var cred bytes.Buffer
	xdr.Encode(&cred, &xdr.Authsys_parms{Machinename: "m", Uid: 1, Gid: 2, Gids: []uint32{3}})
	cb.Cred = xdr.Opaque_auth{Flavor: uint32(xdr.AUTH_SYS), Body: cred.Bytes()}
	xdr.Encode(&call, &m)
	xdr.Encode(&call, &xdr.WRITE3args{File: xdr.Nfs_fh3{Data: []byte("handle")}, Count: 3, Data: []byte("abc")})
	b := call.Bytes()
	FinishRecord(b)
	f.Add(b)
	f.Add([]byte{0x80, 0, 0, 4, 0, 0, 0, 1})
	f.Add(binary.BigEndian.AppendUint32(nil, 1<<31|1<<30))
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for i := 0; i < 4; i++ {
			rec, err := ReadRecord(r, nil, limit)
			if err != nil {
				return
			}
			if len(rec) > limit {
				t.Fatalf("record of %d bytes beyond the limit", len(rec))
			}
			h, args, err := decodeCall(rec)
			if err != nil {
				continue
			}
			parseCred(&h.msg.Body.Cbody().Cred)
			for _, mk := range argTypes {
				xdr.Decode(args, mk())
			}
		}
	})
}

func TestReadRecordFragments(t *testing.T) {
	var in []byte
	in = binary.BigEndian.AppendUint32(in, 3)
	in = append(in, 'a', 'b', 'c')
	in = binary.BigEndian.AppendUint32(in, 1<<31|2)
	in = append(in, 'd', 'e')
	in = binary.BigEndian.AppendUint32(in, 1<<31|1)
	in = append(in, 'f')
	r := bytes.NewReader(in)
	rec, err := ReadRecord(r, nil, 5)
	if err != nil || string(rec) != "abcde" {
		t.Fatalf("first record %q %v", rec, err)
	}
	rec, err = ReadRecord(r, rec, 5)
	if err != nil || string(rec) != "f" {
		t.Fatalf("second record %q %v", rec, err)
	}
	if _, err := ReadRecord(bytes.NewReader(in), nil, 4); err == nil {
		t.Fatal("a 5-byte record under a limit of 4 was read")
	}
}
