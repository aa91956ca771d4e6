package test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
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

	mnt := startListedMount(t, c, list)
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

// startListedMount mounts the cluster with --meta list and returns the
// mount point.
func startListedMount(t *testing.T, c *testutil.ProcCluster, list string) string {
	t.Helper()
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
	return mnt
}

// TestListedMountRidesOutAMetaKill: a mount given --meta DEAD,LIVE keeps
// creating, writing and removing files while the metadata service is
// killed (kill -9) and restarted: no operation fails, and the files that
// exist afterwards are exactly those created and not removed (a create or
// unlink repeated after the kill is answered from the duplicate-request
// table, not applied twice).
func TestListedMountRidesOutAMetaKill(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1, Mounts: 1})
	mnt := startListedMount(t, c, testutil.FreePort(t)+","+c.MetaAddr)
	dir := filepath.Join(mnt, "load")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	created := 0
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			p := filepath.Join(dir, "f"+strconv.Itoa(i))
			if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
				done <- err
				return
			}
			if i%2 == 1 {
				if err := os.Remove(p); err != nil {
					done <- err
					return
				}
			}
			created = i + 1
		}
	}()
	time.Sleep(time.Second)
	c.Meta.Kill()
	time.Sleep(500 * time.Millisecond)
	c.StartMeta()
	time.Sleep(time.Second)
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("operation failed across the metadata service's kill and restart: %v", err)
	}
	t.Logf("%d files created (every other one removed) across the kill", created)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for i := 0; i < created; i += 2 {
		want["f"+strconv.Itoa(i)] = true
	}
	for _, e := range ents {
		if !want[e.Name()] {
			t.Errorf("%s exists: it was removed, or never created", e.Name())
		}
		delete(want, e.Name())
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err != nil || string(b) != filepath.Join(dir, e.Name()) {
			t.Errorf("%s holds %q, %v", e.Name(), b, err)
		}
	}
	if len(want) > 0 {
		t.Errorf("created and not removed, but missing: %v", want)
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
