package chaos

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLoadVerifyFindsLossDoublesAndCorruption runs the load on a local
// directory, then damages what it left in each way the check must catch.
func TestLoadVerifyFindsLossDoublesAndCorruption(t *testing.T) {
	dir := t.TempDir()
	l, err := StartLoad(LoadConfig{Dir: dir, Workers: 2, Keep: 5, RecordBytes: 64 << 10, MaxWriterBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var creates, writes int
		for _, op := range l.Ops() {
			switch op.Kind {
			case "create":
				creates++
			case "write+fsync":
				writes++
			}
		}
		if creates > 20 && writes > 70 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Stop()
	c, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if !c.OK() || c.Files == 0 || c.Records == 0 {
		t.Fatalf("undamaged load: %+v", c)
	}
	w := l.workers[0]
	lost := filepath.Join(w.dir, w.live[0])
	if err := os.Remove(lost); err != nil {
		t.Fatal(err)
	}
	extra := filepath.Join(w.dir, "f9999999")
	if err := os.WriteFile(extra, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var name string
	for n, recs := range l.writer.records {
		if recs > 0 {
			name = n
		}
	}
	if l.writer.checked == 0 {
		t.Fatalf("the writer verified and removed no file (records %v)", l.writer.records)
	}
	rec := filepath.Join(l.writer.dir, name)
	f, err := os.OpenFile(rec, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c, err = l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if c.OK() || len(c.Lost) != 1 || c.Lost[0] != lost || len(c.Extra) != 1 || c.Extra[0] != extra || len(c.Bad) != 1 {
		t.Fatalf("damaged load: lost %v extra %v bad %v", c.Lost, c.Extra, c.Bad)
	}
}
