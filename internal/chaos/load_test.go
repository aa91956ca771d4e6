package chaos

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLoadVerifyFindsLossDoublesAndCorruption runs the load on a local
// directory, then damages what it left in each way the check must catch.
func TestLoadVerifyFindsLossDoublesAndCorruption(t *testing.T) {
	dir := t.TempDir()
	l, err := StartLoad(LoadConfig{Dir: dir, Workers: 2, Keep: 5, RecordBytes: 64 << 10, MaxWriterBytes: 1 << 20,
		Writers: 2, Readers: 2, ReadFiles: 2, ReadFileBytes: 256 << 10})
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
		if creates > 20 && writes > 70*len(l.writers) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Stop()
	c, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if !c.OK() || c.Files == 0 || c.Records == 0 || c.Reads == 0 {
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
	w0 := l.writers[0]
	for n, recs := range w0.records {
		if recs > 0 {
			name = n
		}
	}
	if w0.checked == 0 {
		t.Fatalf("the writer verified and removed no file (records %v)", w0.records)
	}
	rec := filepath.Join(w0.dir, name)
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

// TestLoadReadersFindCorruptAndStaleReads: the readers' checks find a
// pre-written file whose bytes changed and an acknowledged record that
// reads otherwise, and Pause holds every operation until Resume.
func TestLoadReadersFindCorruptAndStaleReads(t *testing.T) {
	dir := t.TempDir()
	l, err := StartLoad(LoadConfig{Dir: dir, RecordBytes: 64 << 10, MaxWriterBytes: 64 << 20, Writers: 1,
		Readers: 2, ReadFiles: 1, ReadFileBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	waitOps := func(kind string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			c := 0
			for _, op := range l.Ops() {
				if op.Kind == kind && op.Err == nil {
					c++
				}
			}
			if c >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d %s operations within 10s, want %d", c, kind, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOps("read", 50)
	waitOps("write+fsync", 5)
	l.Pause()
	before := len(l.Ops())
	time.Sleep(200 * time.Millisecond)
	if after := len(l.Ops()); after != before {
		t.Fatalf("%d operations while paused", after-before)
	}
	// Damage the pre-written file and every acknowledged record.
	junk := make([]byte, 64<<10)
	for i := range junk {
		junk[i] = 0xa5
	}
	if err := os.WriteFile(l.readPath(0), junk, 0o644); err != nil {
		t.Fatal(err)
	}
	l.ackMu.Lock()
	acked := maps.Clone(l.acked)
	l.ackMu.Unlock()
	for name, a := range acked {
		f, err := os.OpenFile(filepath.Join(dir, "writer", name), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for r := range a.n {
			if _, err := f.WriteAt(junk, int64(r)*int64(len(junk))); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
	}
	l.Resume()
	waitOps("read", 200)
	l.Stop()
	c, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	var stale, corrupt bool
	for _, s := range c.Corrupt {
		stale = stale || strings.Contains(s, "stale")
		corrupt = corrupt || strings.Contains(s, "data-00")
	}
	if c.OK() || c.CorruptReads == 0 || !stale || !corrupt {
		t.Fatalf("damaged files: %d reads, %d corrupt: %v", c.Reads, c.CorruptReads, c.Corrupt)
	}
}
