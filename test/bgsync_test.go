package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/testutil"
)

// TestAsyncDataDurableWithinSyncInterval: files written and closed under
// --sync-policy async show in `strata status --json` as unsynced on their
// targets until the storage servers' background round (--sync-interval)
// has synced them; then every figure is zero, and a stop syncs what a
// later write left in one line per storage server.
func TestAsyncDataDurableWithinSyncInterval(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	// Inline data off: the files' bytes are to be on the targets (a small
	// file keeps them with its inode otherwise, docs/design/0017).
	p := startUp(t, bin, dir, data, mnt, "--sync-policy", "async", "--sync-interval", "8s", "--inline-bytes", "0")
	t.Cleanup(func() { p.Kill(); testutil.ForceUnmount(mnt) })
	const n = 40
	content := bytes.Repeat([]byte("s"), 3901)
	write := func(prefix string) {
		for i := 0; i < n; i++ {
			if err := os.WriteFile(filepath.Join(mnt, fmt.Sprintf("%s%d", prefix, i)), content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	unsynced := func() (chunks, bytes uint64) {
		out, code := run(t, bin, mnt, "status", "--json")
		var st struct {
			Targets []struct {
				Chunks *uint64  `json:"unsynced_chunks"`
				Bytes  *uint64  `json:"unsynced_bytes"`
				Oldest *float64 `json:"oldest_unsynced_seconds"`
			} `json:"targets"`
		}
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || len(st.Targets) == 0 {
			t.Fatalf("strata status --json: exit %d, %v\n%s", code, err, out)
		}
		for _, tg := range st.Targets {
			if tg.Chunks == nil || tg.Bytes == nil || tg.Oldest == nil {
				t.Fatalf("a target without the unsynced figures:\n%s", out)
			}
			chunks += *tg.Chunks
			bytes += *tg.Bytes
		}
		return chunks, bytes
	}
	write("a")
	// The first round comes 8 s after the start; a heartbeat (every
	// second) shows the files before it.
	var c0, b0 uint64
	if err := testutil.WaitFor(8*time.Second, func() error {
		if c0, b0 = unsynced(); c0 < n || b0 < n*3901 {
			return fmt.Errorf("%d chunks, %d bytes unsynced", c0, b0)
		}
		return nil
	}); err != nil {
		t.Fatalf("before the background round, want at least %d chunks of %d bytes: %v", n, len(content), err)
	}
	if err := testutil.WaitFor(20*time.Second, func() error {
		if c, b := unsynced(); c != 0 || b != 0 {
			return fmt.Errorf("%d chunks, %d bytes unsynced", c, b)
		}
		return nil
	}); err != nil {
		t.Fatalf("after the background round: %v\n%s", err, p.Tail(20))
	}
	t.Logf("unsynced right after the writes: %d chunks, %d bytes; then none", c0, b0)
	// Every chunk's sums on disk say clean: the sidecar's header, or the
	// inline sums of a small chunk (store/inlinesums.go).
	checked := 0
	err := filepath.WalkDir(data, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, ".data") {
			v := make([]byte, 64)
			n, err := unix.Getxattr(path, "user.strata.sums", v)
			if errors.Is(err, unix.ENODATA) {
				return nil // a sidecar's chunk
			}
			if err != nil {
				return err
			}
			checked++
			if n < 8 || v[1]&1 != 0 { // flags at offset 1, bit 0 dirty
				return errors.New(path + "'s inline sums are dirty (or short)")
			}
			return nil
		}
		if !strings.HasSuffix(path, ".sum") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		if len(b) < 64 || b[10]&1 != 0 { // flags at offset 10, bit 0 dirty (store/format.go)
			return errors.New(path + " is dirty (or has no header)")
		}
		return nil
	})
	if err == nil && checked < n {
		err = fmt.Errorf("found the sums of %d chunks, want at least %d", checked, n)
	}
	if err != nil {
		t.Fatal(err)
	}
	write("b")
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Tail(30))
	}
	log, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	if k := strings.Count(string(log), "storage server closed: synced the chunks written since their last sync"); k != 2 {
		t.Errorf("%d closing lines of storage servers, want 2 (one each):\n%s", k, p.Tail(30))
	}
}
