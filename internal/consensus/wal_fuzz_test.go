package consensus

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// FuzzWALSegment feeds the segment reader (openSegment, the decoder behind
// recovery) a valid segment header followed by records whose checksums
// are right (so that the fuzzer reaches the record decoder and the index
// checks, past the CRC) and then arbitrary bytes. Nothing may panic; a
// segment that opens accounts for its records inside the file.
func FuzzWALSegment(f *testing.F) {
	var entries []byte
	for _, l := range walEntries(1, 3) {
		entries = encodeRecord(entries, l)
	}
	f.Add(entries, []byte{}, true)
	f.Add(entries, []byte{1, 0, 0, 0, 0xff}, false)
	f.Add(encodeRecord(nil, &raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("x")}), make([]byte, 16), true)
	dir := f.TempDir()
	w := &wal{dir: dir, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f.Fuzz(func(t *testing.T, records, raw []byte, last bool) {
		// records is reframed: each chunk of up to 200 bytes becomes one
		// payload with a correct length and CRC.
		var seg bytes.Buffer
		var hdr [walHeaderBytes]byte
		copy(hdr[:], walMagic)
		hdr[8] = walVersion
		binary.LittleEndian.PutUint64(hdr[16:], 1)
		seg.Write(hdr[:])
		for len(records) > 0 {
			n := min(len(records), 200)
			var head [walRecordHead]byte
			binary.LittleEndian.PutUint32(head[:4], uint32(n))
			binary.LittleEndian.PutUint32(head[4:], crc32.Checksum(records[:n], castagnoli))
			seg.Write(head[:])
			seg.Write(records[:n])
			records = records[n:]
		}
		seg.Write(raw)
		if err := os.WriteFile(filepath.Join(dir, segName(1)), seg.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := w.openSegment(1, 0, last)
		if err != nil {
			return
		}
		defer s.f.Close()
		if s.end > s.size {
			t.Fatalf("segment ends at %d past its size %d", s.end, s.size)
		}
		for i, off := range s.offs {
			if off < walHeaderBytes || off >= s.end {
				t.Fatalf("record %d at %d outside [%d, %d)", i, off, walHeaderBytes, s.end)
			}
		}
	})
}

// FuzzDecodeRecord: a record payload that decodes re-encodes to one that
// decodes to the same entry.
func FuzzDecodeRecord(f *testing.F) {
	for _, l := range walEntries(1, 3) {
		f.Add(encodeRecord(nil, l)[walRecordHead:])
	}
	f.Add(encodeRecord(nil, &raft.Log{Index: 9, Term: 2, Type: raft.LogConfiguration, AppendedAt: time.Unix(5, 6),
		Data: []byte("d"), Extensions: []byte("e")})[walRecordHead:])
	f.Fuzz(func(t *testing.T, payload []byte) {
		var l raft.Log
		idx, err := decodeRecord(payload, &l)
		if err != nil {
			return
		}
		var again raft.Log
		idx2, err := decodeRecord(encodeRecord(nil, &l)[walRecordHead:], &again)
		if err != nil || idx2 != idx || again.Term != l.Term || again.Type != l.Type || !again.AppendedAt.Equal(l.AppendedAt) ||
			!bytes.Equal(again.Data, l.Data) || !bytes.Equal(again.Extensions, l.Extensions) {
			t.Fatalf("%+v re-decodes to %+v, %v", l, again, err)
		}
	})
}
