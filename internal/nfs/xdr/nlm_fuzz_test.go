package xdr

import (
	"bytes"
	"testing"
)

// nlmArgs are the NLM v4 and NSM v1 argument types the gateway decodes.
var nlmArgs = []func() XdrType{
	func() XdrType { return &Nlm4_testargs{} },
	func() XdrType { return &Nlm4_lockargs{} },
	func() XdrType { return &Nlm4_cancargs{} },
	func() XdrType { return &Nlm4_unlockargs{} },
	func() XdrType { return &Nlm4_shareargs{} },
	func() XdrType { return &Nlm4_notify{} },
	func() XdrType { return &Sm_name{} },
	func() XdrType { return &Mon{} },
	func() XdrType { return &Mon_id{} },
	func() XdrType { return &My_id{} },
	func() XdrType { return &Stat_chge{} },
}

// FuzzNLMArgs decodes any bytes as each NLM and NSM argument type: no
// panic, and what decodes encodes back to the bytes it was read from.
func FuzzNLMArgs(f *testing.F) {
	lock := Nlm4_lock{Caller_name: "client", Fh: []byte("handle"), Oh: []byte("12@client"), Svid: 12, L_offset: 1, L_len: 0}
	for _, v := range []XdrType{
		&Nlm4_lockargs{Cookie: []byte{1}, Block: true, Exclusive: true, Alock: lock, Reclaim: true, State: 3},
		&Nlm4_testargs{Cookie: []byte("c"), Alock: lock},
		&Nlm4_shareargs{Share: Nlm4_share{Caller_name: "c", Fh: []byte{1}, Mode: Fsm_DW, Access: Fsa_RW}},
		&Stat_chge{Mon_name: "client", State: 5},
		&Mon{Mon_id: Mon_id{Mon_name: "m", My_id: My_id{My_name: "localhost", My_prog: 100021}}},
	} {
		var b bytes.Buffer
		if err := Encode(&b, v); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes())
	}
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 7})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, mk := range nlmArgs {
			v := mk()
			rest, err := Decode(in, v)
			if err != nil {
				continue
			}
			var out bytes.Buffer
			if err := Encode(&out, v); err != nil {
				t.Fatalf("%s decoded but does not encode: %v", v.XdrTypeName(), err)
			}
			if used := in[:len(in)-len(rest)]; !bytes.Equal(out.Bytes(), used) {
				t.Fatalf("%s: decoded from %x, encodes to %x", v.XdrTypeName(), used, out.Bytes())
			}
		}
	})
}
