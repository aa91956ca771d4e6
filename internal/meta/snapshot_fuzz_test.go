package meta

import (
	"bytes"
	"testing"
)

// FuzzRestoreSnapshot feeds the snapshot stream decoder (Restore): a
// snapshot that does not decode is refused without a panic, whatever it
// holds.
func FuzzRestoreSnapshot(f *testing.F) {
	src := newTestFSM(f)
	applyAll(src, randomCommands(3, 40), 8, 1)
	snap, err := src.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		f.Fatal(err)
	}
	snap.Release()
	f.Add(sink.Bytes())
	f.Add(append(append([]byte(nil), snapMagic...), snapFormatV1, 0, 0))
	dst := newTestFSM(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = dst.Restore(nopCloser{bytes.NewReader(b)})
	})
}
