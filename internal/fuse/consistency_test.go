package fuse

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/failpoint"
)

// clientOps is the client's count of operations of kind (its
// strata_client_ops_total).
func clientOps(t *testing.T, c *client.Client, kind string) float64 {
	t.Helper()
	mfs, err := c.Registry().Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "strata_client_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waitOps waits (bounded) until c counted more than n operations of kind.
func waitOps(t *testing.T, c *client.Client, kind string, n float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); clientOps(t, c, kind) <= n; {
		if time.Now().After(deadline) {
			t.Fatalf("no %s operation after 10 s", kind)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A read during an open with O_TRUNC, on the same mount, sees the file
// either as it was or empty: never at its old size with its data gone. A
// failpoint holds the truncate after the chunks were cut and before the
// new size is in metadata, and a reader that opened the file reads it
// then; before the fix it read 16 zeros (the client's size still 16, the
// chunks already empty; and the kernel, asked with a separate SETATTR,
// kept its size of 16 over the zeroed page of a short read).
func TestTruncateAtomicToReaders(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	a, ca := tc.mount(nil)
	b, _ := tc.mount(nil)
	old := []byte("0123456789abcdef")
	// Written through the other mount: a's page cache holds nothing of
	// it, so its reads reach the client.
	must(t, os.WriteFile(filepath.Join(b, "f"), old, 0o644))
	p := filepath.Join(a, "f")
	if st, err := os.Stat(p); err != nil || st.Size() != int64(len(old)) {
		t.Fatalf("stat before: %v %v", st, err)
	}
	t.Cleanup(failpoint.DisarmAll)
	must(t, failpoint.Arm("client/after-truncate-chunks", "1*sleep(400ms)"))
	before := clientOps(t, ca, "truncate")
	done := make(chan error, 1)
	go func() {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Close(fd)
		}
		done <- err
	}()
	waitOps(t, ca, "truncate", before) // the chunks are cut; the size is not set yet
	got, err := os.ReadFile(p)
	must(t, err)
	if !bytes.Equal(got, old) && len(got) != 0 {
		t.Errorf("read during the truncate: %q, want %q or nothing", got, old)
	}
	must(t, <-done)
	got, err = os.ReadFile(p)
	must(t, err)
	if len(got) != 0 {
		t.Errorf("read after the truncate: %q, want nothing", got)
	}
}

// A fresh open reads what a write closed before it began, also when the
// write, of a value of the same length, was closed during an earlier
// open of the same mount that read the file early (the client starts
// reading a small file a lookup described at open, in parallel with the
// open's attributes: smallread.go). A failpoint holds the earlier open's
// attribute read until a write through another mount has closed. Before
// the fix that open adopted its early read, as the size had not changed,
// and gave the kernel the old bytes under the new mtime, so the next
// open kept them (FOPEN_KEEP_CACHE) and read the value before the write.
func TestOpenReadOlderThanOpenAttrs(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	a, _ := tc.mount(nil)
	b, _ := tc.mount(nil)
	old, next := []byte("old-value-000001"), []byte("new-value-000002")
	must(t, os.WriteFile(filepath.Join(b, "f"), old, 0o644))
	p := filepath.Join(a, "f")
	if _, err := os.Stat(p); err != nil { // a lookup on a: its open may read early
		t.Fatal(err)
	}
	t.Cleanup(failpoint.DisarmAll)
	must(t, failpoint.Arm("client/open-before-getattr", "1*sleep(500ms)"))
	type result struct {
		data []byte
		err  error
	}
	first := make(chan result, 1)
	go func() {
		data, err := os.ReadFile(p)
		first <- result{data, err}
	}()
	// The write on b closes while a's open waits for its attributes.
	for deadline := time.Now().Add(10 * time.Second); failpoint.Armed()["client/open-before-getattr"] == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the open on a did not reach the failpoint")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the early read is done (a loopback store read)
	fd, err := unix.Open(filepath.Join(b, "f"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	must(t, err)
	if _, err := unix.Pwrite(fd, next, 0); err != nil {
		t.Fatal(err)
	}
	must(t, unix.Close(fd))
	r := <-first
	must(t, r.err)
	if !bytes.Equal(r.data, old) && !bytes.Equal(r.data, next) {
		t.Fatalf("read during the write: %q", r.data)
	}
	got, err := os.ReadFile(p)
	must(t, err)
	if !bytes.Equal(got, next) {
		t.Fatalf("read after the write closed: %q, want %q", got, next)
	}
}

// An open of a name whose unlink is in flight on another thread (the
// service removed the file, the kernel still holds the name) fails with
// ENOENT, and a stat right after agrees. A failpoint holds the unlink's
// answer after the service applied it. Before the fix the open answered
// ENOENT from the client's open of the removed inode while the kernel kept
// the name and its attributes, so the stat after it still found the file.
func TestOpenDuringUnlinkAgreesWithStat(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	a, _ := tc.mount(nil)
	_, cb := tc.mount(nil)
	p := filepath.Join(a, "f")
	must(t, os.WriteFile(p, []byte("data"), 0o644))
	if _, err := os.Stat(p); err != nil { // the kernel holds the name and its attributes
		t.Fatal(err)
	}
	t.Cleanup(failpoint.DisarmAll)
	must(t, failpoint.Arm("meta/before-reply/unlink", "1*sleep(500ms)"))
	unlinked := make(chan error, 1)
	go func() { unlinked <- os.Remove(p) }()
	for deadline := time.Now().Add(10 * time.Second); ; { // applied by the service, not yet answered
		if _, err := cb.Lookup(context.Background(), client.RootIno, "f"); errors.Is(err, syscall.ENOENT) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unlink was not applied")
		}
		time.Sleep(time.Millisecond)
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd) // opened before the unlink: allowed
	} else if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open during the unlink: %v, want success or ENOENT", err)
	} else if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("open during the unlink answered ENOENT, then stat: %v, want ENOENT", err)
	}
	must(t, <-unlinked)
}

// The kernel retries a stale open once: the same caller's second stale
// open within staleRetry (same inode) or staleRetryOther (another)
// answers ENOENT instead (not ESTALE to the application); a third is
// stale again, and so is one of another inode long after.
func TestStaleAgain(t *testing.T) {
	fs := newFileSystem(nil, Options{})
	if fs.staleAgain(7, 100) {
		t.Fatal("a first stale open counted as a retry")
	}
	if fs.staleAgain(8, 100) {
		t.Fatal("another caller's stale open counted as a retry")
	}
	if !fs.staleAgain(7, 100) {
		t.Fatal("the retry did not count as one")
	}
	if fs.staleAgain(7, 100) {
		t.Fatal("a stale open after the retry counted as a retry")
	}
	if !fs.staleAgain(7, 102) {
		t.Fatal("a retry that found the name behind another removed inode did not count as one")
	}
	fs.staleAgain(7, 103)
	time.Sleep(staleRetryOther)
	if fs.staleAgain(7, 104) {
		t.Fatal("a stale open of another inode well after the last counted as a retry")
	}
}

// An open with O_TRUNC (now asked with the OPEN) marks the file modified
// also when it is empty, as the SETATTR the kernel sent before did.
func TestTruncOpenOfEmptyFileSetsMtime(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 1)
	a, _ := tc.mount(nil)
	p := filepath.Join(a, "empty")
	must(t, os.WriteFile(p, nil, 0o644))
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	must(t, os.Chtimes(p, old, old))
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	must(t, err)
	must(t, unix.Close(fd))
	st, err := os.Stat(p)
	must(t, err)
	if !st.ModTime().After(old.Add(30 * time.Minute)) {
		t.Fatalf("mtime after an O_TRUNC open of an empty file: %v, was %v", st.ModTime(), old)
	}
}
