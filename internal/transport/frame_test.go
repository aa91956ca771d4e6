package transport

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// frameSamples are messages of each shape the frame code treats apart:
// plain ones, lists, and the two whose data is sent from the caller's
// memory (rpc.Tailer).
func frameSamples() []rpc.Message {
	return []rpc.Message{
		&rpc.CreateReq{Hdr: rpc.ReqHeader{ClientID: 1, Seq: 2}, Parent: 1, Name: "a", Mode: 0o100644},
		&rpc.AttrResp{Attr: rpc.Attr{Ino: 5, Size: 7, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{3}}}},
		&rpc.ReadDirResp{Entries: []rpc.DirEntry{{Name: "a", Ino: 2, Mode: 0o40755}}, EOF: true},
		&rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: 2}, Off: 3, Data: []byte("hi")},
		&rpc.ReadResp{Data: []byte("read")},
		&rpc.Empty{},
	}
}

// FuzzReadFrame feeds the frame reader (transport.go) and then a
// response's errno and text, and decoders of each shape with the body, as
// the client and server do: nothing may panic. (rpc's FuzzDecode feeds
// every message decoder.)
func FuzzReadFrame(f *testing.F) {
	samples := frameSamples()
	for _, m := range samples {
		head, tail := encodeFrame(kindRequest, rpc.MCreate, 7, 0, "", m)
		f.Add(append(head, tail...))
		head, tail = encodeFrame(kindResponse, 0, 7, 0, "", m)
		f.Add(append(head, tail...))
	}
	head, _ := encodeFrame(kindResponse, 0, 9, 2, "no such file", nil)
	f.Add(head)
	f.Fuzz(func(t *testing.T, b []byte) {
		rd := &frameReader{r: bufio.NewReader(bytes.NewReader(b))} // no conn: no deadlines are set
		fr, n, err := rd.header(0)
		if err != nil || rd.body(fr, n) != nil {
			return
		}
		defer putBuf(fr.buf)
		body := fr.body
		if fr.kind == kindResponse {
			d := rpc.NewDec(body)
			_ = d.U64()
			_ = d.String()
			if d.Err() != nil {
				return
			}
			body = d.B
		}
		for _, m := range frameSamples() {
			_ = rpc.Unmarshal(body, m)
		}
	})
}
