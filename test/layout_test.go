package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// chunkPaths finds the chunk data files of inode ino under the data
// directory, as paths relative to their target's chunks/ directory.
func chunkPaths(t *testing.T, data string, ino uint64) []string {
	t.Helper()
	name := fmt.Sprintf("%016x.data", ino)
	var out []string
	err := filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == name {
			out = append(out, filepath.Join(filepath.Base(filepath.Dir(filepath.Dir(p))), filepath.Base(filepath.Dir(p)), d.Name()))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", data, err)
	}
	return out
}

func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestUpServesFormat1Targets: targets formatted by a build before chunk
// layout 2 (format 1 identity files) are upgraded to format 3 with their old
// layout by `strata up`: chunks land at chunks/<ino&0xff>/<(ino>>8)&0xff>/, a removed
// file's chunk is freed there, `strata fsck` finds an orphan chunk there and
// removes it, and the files read back after a restart; a fresh data
// directory gets layout 2 (chunks/<(ino>>16)&0xff>/<(ino>>8)&0xff>/).
func TestUpServesFormat1Targets(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	var idents []string
	for s := 0; s < 2; s++ {
		for tg := 0; tg < 2; tg++ {
			td := filepath.Join(data, fmt.Sprintf("store%d", s), fmt.Sprintf("target%d", tg))
			if err := os.MkdirAll(td, 0o755); err != nil {
				t.Fatal(err)
			}
			id := filepath.Join(td, "strata-target")
			content := fmt.Sprintf(`{"format": 1, "uuid": "0b7f5e2c-1d3a-4c1e-9a2b-00000000000%d", "created": "2026-06-01T00:00:00Z"}`, 2*s+tg)
			if err := os.WriteFile(id, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			idents = append(idents, id)
		}
	}
	// Inline data off: each file is to have a chunk (a small file keeps
	// its bytes with its inode otherwise, docs/design/0017).
	p := startUp(t, bin, dir, data, mnt, "--inline-bytes", "0")
	t.Cleanup(func() { p.Kill(); testutil.ForceUnmount(mnt) })
	content := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("small %d ", i)), 400) }
	const files = 20
	for i := 0; i < files; i++ {
		if err := os.WriteFile(filepath.Join(mnt, fmt.Sprintf("s%d", i)), content(i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	oldPath := func(ino uint64) string {
		return fmt.Sprintf("%02x/%02x/%016x.data", ino&0xff, ino>>8&0xff, ino)
	}
	for i := 0; i < files; i++ {
		ino := inoOf(t, filepath.Join(mnt, fmt.Sprintf("s%d", i)))
		if got := chunkPaths(t, data, ino); len(got) != 1 || got[0] != oldPath(ino) {
			t.Fatalf("s%d (inode %x) has chunk files %q, want [%s] (format 1 layout)", i, ino, got, oldPath(ino))
		}
	}

	// Remove s0: its chunk is freed in the background, from its old path.
	victim := filepath.Join(mnt, "s0")
	ino := inoOf(t, victim)
	var saved [][2]string // the chunk's files and their contents
	err := filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), fmt.Sprintf("%016x.", ino)) {
			b, rerr := os.ReadFile(p)
			saved = append(saved, [2]string{p, string(b)})
			return rerr
		}
		return err
	})
	// The upgraded target (format 4) keeps a new small chunk's sums in an
	// extended attribute of its data file: one file, no sidecar.
	if err != nil || len(saved) != 1 || !strings.HasSuffix(saved[0][0], ".data") {
		t.Fatalf("the chunk files of s0: %v (%d found, want its .data alone)", err, len(saved))
	}
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	if err := testutil.WaitFor(60*time.Second, func() error {
		if got := chunkPaths(t, data, ino); len(got) > 0 {
			return fmt.Errorf("the removed file's chunk is still at %q", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Put it back: an orphan chunk (an inode the namespace no longer knows).
	for _, f := range saved {
		if err := os.WriteFile(f[0], []byte(f[1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fsck := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"fsck", "--data", data}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("strata fsck %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := fsck(); !strings.Contains(out, "1 orphan chunks found; run again") {
		t.Fatalf("fsck with the chunk of the removed file put back:\n%s", out)
	}
	if out := fsck("--remove-orphans"); !strings.Contains(out, "1 orphan chunks found, 1 removed") {
		t.Fatalf("fsck --remove-orphans:\n%s", out)
	}
	for _, f := range saved {
		if _, err := os.Stat(f[0]); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("fsck --remove-orphans left %s: %v", f[0], err)
		}
	}
	if out := fsck(); !strings.Contains(out, "no orphan chunks") {
		t.Fatalf("fsck after the removal:\n%s", out)
	}

	if err := p.Stop(60 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, p.Tail(20))
	}
	p = startUp(t, bin, dir, data, mnt, "--inline-bytes", "0")
	for i := 1; i < files; i++ {
		if b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("s%d", i))); err != nil || !bytes.Equal(b, content(i)) {
			t.Fatalf("s%d after a restart: %v (%d bytes, want %d)", i, err, len(b), len(content(i)))
		}
	}
	for _, id := range idents {
		var v struct {
			Format      int
			ChunkLayout int `json:"chunk_layout"`
		}
		b, err := os.ReadFile(id)
		if err == nil {
			err = json.Unmarshal(b, &v)
		}
		if err != nil || v.Format != 4 || v.ChunkLayout != 1 {
			t.Fatalf("%s after serving: format %d, chunk layout %d, %v", id, v.Format, v.ChunkLayout, err)
		}
	}

	// A fresh data directory: layout 2.
	if err := p.Stop(60 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, p.Tail(20))
	}
	data2 := filepath.Join(dir, "data2")
	p = startUp(t, bin, dir, data2, mnt, "--inline-bytes", "0")
	f := filepath.Join(mnt, "new")
	if err := os.WriteFile(f, content(0), 0o644); err != nil {
		t.Fatal(err)
	}
	ino = inoOf(t, f)
	want := fmt.Sprintf("%02x/%02x/%016x.data", ino>>16&0xff, ino>>8&0xff, ino)
	if got := chunkPaths(t, data2, ino); len(got) != 1 || got[0] != want {
		t.Fatalf("a new target holds inode %x's chunk at %q, want [%s]", ino, got, want)
	}
}
