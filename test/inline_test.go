package test

import (
	"bytes"
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

// withChunks counts the n files of writeSmallFiles in dir that have a
// chunk file under the strata up data directory data.
func withChunks(t *testing.T, data, dir string, n int) int {
	t.Helper()
	k := 0
	for i := 0; i < n; i++ {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, fmt.Sprint("f", i)), &st); err != nil {
			t.Fatal(err)
		}
		if chunkFiles(t, data, st.Ino) > 0 {
			k++
		}
	}
	return k
}

// inlineContent is file i's content: 3,901 bytes naming it.
func inlineContent(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("inline file %04d;", i)), 3901/17+1)[:3901]
}

// writeSmallFiles writes n files of inlineContent in dir.
func writeSmallFiles(t *testing.T, dir string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), inlineContent(i), 0o644); err != nil {
			t.Fatalf("write f%d: %v", i, err)
		}
	}
}

// checkSmallFiles reads back the n files of writeSmallFiles byte-exact.
func checkSmallFiles(t *testing.T, dir string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		got, err := os.ReadFile(filepath.Join(dir, fmt.Sprint("f", i)))
		if err != nil {
			t.Fatalf("read f%d: %v", i, err)
		}
		if !bytes.Equal(got, inlineContent(i)) {
			t.Fatalf("f%d: %d bytes, not its content (%d bytes)", i, len(got), len(inlineContent(i)))
		}
	}
}

// TestInlineSurvivesKill: under --sync-policy sync, 200 files of 3,901
// bytes made in one directory (under its create delegation: their data
// kept with their inodes, no chunk file) are all there with their content
// after the strata up whose closes returned is killed with -9 and
// started again on the same data directory.
func TestInlineSurvivesKill(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	p := startUp(t, bin, dir, data, mnt, "--sync-policy", "sync")
	t.Cleanup(func() { p.Kill(); testutil.ForceUnmount(mnt) })
	d := filepath.Join(mnt, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 200
	writeSmallFiles(t, d, n)
	made := withChunks(t, data, d, n)
	t.Logf("%d of %d files have a chunk file", made, n)
	if made > n/2 {
		t.Errorf("%d of %d files of 3,901 bytes have a chunk file: their data is not inline", made, n)
	}
	p.Kill()
	if err := testutil.WaitFor(5*time.Second, func() error {
		if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
			return fmt.Errorf("after kill -9 the mount point answers %v, want ENOTCONN", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	p = testutil.StartProc(t, dir, "up-again", nil, bin, "up", "--data", data, "--mount", mnt, "--sync-policy", "sync")
	if err := testutil.WaitFor(30*time.Second, func() error {
		if p.Exited() {
			return errors.New("strata up exited:\n" + p.Tail(30))
		}
		if _, err := os.Stat(filepath.Join(d, "f0")); err != nil {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	checkSmallFiles(t, d, n)
	if ents, err := os.ReadDir(d); err != nil || len(ents) != n {
		t.Fatalf("%d names after the restart (%v), want %d", len(ents), err, n)
	}
}

// TestInlineBytesFlag: --inline-bytes beyond 64 KiB is a usage error
// (exit 2, naming the flag) before anything starts; --inline-bytes 0
// keeps no data inline (every file has its chunk) and the content is
// right.
func TestInlineBytesFlag(t *testing.T) {
	bin := testutil.Binary(t)
	bad := t.TempDir()
	out, err := runBounded(20*time.Second, bin, "up", "--data", filepath.Join(bad, "data"), "--mount", filepath.Join(bad, "mnt"),
		"--inline-bytes", "70000")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "--inline-bytes") {
		t.Fatalf("strata up --inline-bytes 70000: %v, want exit 2 naming the flag\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(bad, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused strata up made its data directory: %v", err)
	}

	testutil.RequireFUSE(t)
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	p := startUp(t, bin, dir, data, mnt, "--inline-bytes", "0")
	t.Cleanup(func() { p.Kill(); testutil.ForceUnmount(mnt) })
	d := filepath.Join(mnt, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 60
	writeSmallFiles(t, d, n)
	if made := withChunks(t, data, d, n); made != n {
		t.Errorf("%d of %d files have a chunk file under --inline-bytes 0, want all", made, n)
	}
	checkSmallFiles(t, d, n)
}
