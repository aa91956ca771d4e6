package test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/testutil"
)

// TestKill9Durability: everything fsync'ed, or closed under the default sync
// policy (empty files too), survives kill -9 of every daemon at once.
func TestKill9Durability(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2})
	mnt := c.Mount(0)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	want := map[string][32]byte{}
	sizes := map[string]int{}
	if err := os.MkdirAll(filepath.Join(mnt, "d1", "d2"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Closed files (sync policy: close is durable).
	for i := 0; i < 20; i++ {
		name := filepath.Join("d1", fmt.Sprintf("closed-%d", i))
		data := make([]byte, rng.Intn(3<<20)+1)
		rng.Read(data)
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		want[name], sizes[name] = sha256.Sum256(data), len(data)
	}
	// A file kept open, fsync'ed at a checkpoint, then written more (not synced).
	f, err := os.OpenFile(filepath.Join(mnt, "d1", "d2", "ckpt"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ckpt := make([]byte, 5<<20+123)
	rng.Read(ckpt)
	if _, err := f.Write(ckpt); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte{0xAB}, 1<<20)); err != nil { // unsynced tail
		t.Fatal(err)
	}
	// A file written through O_TMPFILE, named with linkat, then closed.
	tmp, err := os.OpenFile(filepath.Join(mnt, "d1"), unix.O_TMPFILE|os.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	tdata := make([]byte, 2<<20+7)
	rng.Read(tdata)
	if _, err := tmp.Write(tdata); err != nil {
		t.Fatal(err)
	}
	if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", tmp.Fd()), unix.AT_FDCWD, filepath.Join(mnt, "d1", "from-tmpfile"), unix.AT_SYMLINK_FOLLOW); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	want["d1/from-tmpfile"], sizes["d1/from-tmpfile"] = sha256.Sum256(tdata), len(tdata)
	// Renames and unlinks that returned are committed metadata.
	if err := os.Rename(filepath.Join(mnt, "d1", "closed-0"), filepath.Join(mnt, "d1", "d2", "moved")); err != nil {
		t.Fatal(err)
	}
	want["d1/d2/moved"], sizes["d1/d2/moved"] = want["d1/closed-0"], sizes["d1/closed-0"]
	delete(want, "d1/closed-0")
	if err := os.Remove(filepath.Join(mnt, "d1", "closed-1")); err != nil {
		t.Fatal(err)
	}
	delete(want, "d1/closed-1")

	// Empty files closed just before the kill: the close of a file that
	// wrote nothing does not wait for the metadata log's sync, but each
	// create was in the log (the page cache, which kill -9 keeps) before
	// it was answered.
	for i := 0; i < 10; i++ {
		name := filepath.Join("d1", "d2", fmt.Sprintf("empty-%d", i))
		if err := os.WriteFile(filepath.Join(mnt, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		want[name], sizes[name] = sha256.Sum256(nil), 0
	}

	c.KillAll() // kill -9 of every daemon; f's mount is gone with it
	f.Close()

	c.StartMeta()
	for i := range c.Stores {
		c.StartStore(i)
	}
	c.WaitTargets(4, 30*time.Second)
	c.StartMount(0)

	for name, sum := range want {
		data, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(data) != sizes[name] || sha256.Sum256(data) != sum {
			t.Errorf("%s: %d bytes, content differs (want %d bytes)", name, len(data), sizes[name])
		}
	}
	for _, gone := range []string{"d1/closed-0", "d1/closed-1"} {
		if _, err := os.Stat(filepath.Join(mnt, gone)); !os.IsNotExist(err) {
			t.Errorf("%s: exists after rename/unlink before the crash (%v)", gone, err)
		}
	}
	got, err := os.ReadFile(filepath.Join(mnt, "d1", "d2", "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < len(ckpt) || !bytes.Equal(got[:len(ckpt)], ckpt) {
		t.Fatalf("fsync'ed prefix of ckpt lost: have %d bytes, want at least %d matching", len(got), len(ckpt))
	}
}
