package test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/testutil"
)

// TestMetaAddressList: `--meta A,B` lists the metadata service's voters;
// store, mount and status work when the first address is dead (nobody
// listens there), the mount records the list (its source and its runtime
// record), so status run inside it without flags finds the service.
func TestMetaAddressList(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1, Mounts: 1})
	dead := testutil.FreePort(t)
	list := dead + "," + c.MetaAddr

	target := filepath.Join(c.Dir, "listed-store", "t0")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	st := testutil.StartProc(t, c.Dir, "listed-store", nil, c.Bin, "store", "--meta", list, "--listen", "127.0.0.1:0",
		"--key-file", c.KeyFile, "--target", target)
	t.Cleanup(func() { st.Stop(10 * time.Second) })
	c.WaitTargets(2, 20*time.Second)

	mnt := filepath.Join(c.Dir, "listed-mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	mp := testutil.StartProc(t, c.Dir, "listed-mount", nil, c.Bin, "mount", "--meta", list, "--key-file", c.KeyFile, mnt)
	t.Cleanup(func() {
		mp.Stop(10 * time.Second)
		testutil.ForceUnmount(mnt)
	})
	if err := testutil.WaitFor(20*time.Second, func() error {
		if mp.Exited() {
			t.Fatalf("mount --meta %s exited:\n%s", list, mp.Tail(20))
		}
		if !testutil.IsMounted(mnt) {
			return os.ErrNotExist
		}
		return nil
	}); err != nil {
		t.Fatalf("mount --meta %s: %v\n%s", list, err, mp.Tail(20))
	}
	data := bytes.Repeat([]byte("voters"), 50000)
	if err := os.WriteFile(filepath.Join(mnt, "f"), data, 0o644); err != nil {
		t.Fatalf("write through the mount with --meta %s: %v", list, err)
	}
	if got, err := os.ReadFile(filepath.Join(c.Mount(0), "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back through the other mount: %d bytes, %v", len(got), err)
	}

	out, code := run(t, c.Bin, t.TempDir(), "status", "--json", "--meta", list, "--key-file", c.KeyFile)
	var status struct {
		Servers []struct{ Alive bool } `json:"servers"`
	}
	if err := json.Unmarshal([]byte(out), &status); code != 0 || err != nil || len(status.Servers) != 2 {
		t.Fatalf("status --meta %s: exit %d, %v\n%s", list, code, err, out)
	}

	// The mount names the whole list; status inside it needs no flags.
	m, ok, err := mountinfo.OnStrata(mnt)
	if err != nil || !ok || m.Source != mountinfo.Source(list) {
		t.Fatalf("mount source %q (%v, %v), want %q", m.Source, ok, err, mountinfo.Source(list))
	}
	if r, ok := mountinfo.RecordFor(m.Point); !ok || r.Meta != list {
		t.Fatalf("runtime record of the mount: %+v (found %v), want meta %q", r, ok, list)
	}
	if out, code := run(t, c.Bin, mnt, "status"); code != 0 || !strings.Contains(out, "health ok") {
		t.Fatalf("status inside the mount with --meta %s: exit %d\n%s", list, code, out)
	}
}

// TestMetaAddressListRefused: a list with an empty element, an address
// given twice or a bad port is a usage error (exit 2) of every command
// that takes --meta, with a message naming the problem.
func TestMetaAddressListRefused(t *testing.T) {
	bin := testutil.Binary(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "k")
	if err := os.WriteFile(key, []byte("k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ list, says string }{
		{"127.0.0.1:7400,,127.0.0.1:7401", "element 2 of 3 is empty"},
		{"127.0.0.1:7400,", "element 2 of 2 is empty"},
		{"127.0.0.1:7400,127.0.0.1:7400", "127.0.0.1:7400 given twice"},
		{"127.0.0.1:7400,127.0.0.1:99999", `port "99999"`},
		{"127.0.0.1", "missing port"},
	} {
		for _, args := range [][]string{
			{"store", "--meta", bad.list, "--listen", "127.0.0.1:0", "--key-file", key, "--target", dir},
			{"mount", "--meta", bad.list, "--key-file", key, mnt},
			{"status", "--meta", bad.list, "--key-file", key},
			{"fsck", "--meta", bad.list, "--key-file", key},
		} {
			out, code := run(t, bin, dir, args...)
			if code != 2 || !strings.Contains(out, bad.says) || !strings.Contains(out, "--meta") {
				t.Errorf("strata %s --meta %q: exit %d, want 2 with %q:\n%s", args[0], bad.list, code, bad.says, out)
			}
		}
	}
	if testutil.IsMounted(mnt) {
		testutil.ForceUnmount(mnt)
		t.Fatal("a refused mount mounted")
	}
}
