package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/testutil"
)

// TestKillDelegationHolder: a mount answering creates itself under a
// directory's create delegation (docs/design/0016) is killed with -9
// while files it answered are still on their way. Another mount's
// listing of the directory waits for the holder's session to go (at most
// about a lease), then shows every file made before the holder's last
// fsync of the directory with its data, any later one either absent or whole, and no
// name twice.
func TestKillDelegationHolder(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, Mounts: 2,
		MountArgs: []string{"--create-delegation", "--sync-policy", "async"},
		MetaArgs:  []string{"--session-lease", "3s", "--orphan-grace", "2s"}})
	a, b := c.Mount(0), c.Mount(1)
	d := filepath.Join(a, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	content := func(name string) []byte { return bytes.Repeat([]byte(name+";"), 300) }
	write := func(prefix string, n int) {
		for i := 0; i < n; i++ {
			name := fmt.Sprint(prefix, i)
			if err := os.WriteFile(filepath.Join(d, name), content(name), 0o644); err != nil {
				t.Fatalf("write %s: %v", name, err)
			}
		}
	}
	write("f", 20)
	if err := testutil.WaitFor(15*time.Second, func() error {
		out, err := runBounded(10*time.Second, c.Bin, "status", "--meta", c.MetaAddr, "--key-file", c.KeyFile)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "create delegations: directory") {
			return fmt.Errorf("no delegation held yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	write("g", 100) // answered by mount A itself
	fsyncDir(t, d)
	write("h", 100) // some still queued at the kill
	killed := time.Now()
	c.Mounts[0].Kill()
	testutil.ForceUnmount(a)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ls", "-1", filepath.Join(b, "d")).CombinedOutput()
	if err != nil {
		t.Fatalf("listing from B after the holder's kill: %v: %s", err, out)
	}
	t.Logf("B's listing answered %v after the kill", time.Since(killed).Round(time.Millisecond))
	seen := map[string]bool{}
	late := 0
	for _, name := range strings.Fields(string(out)) {
		if seen[name] {
			t.Fatalf("%s listed twice", name)
		}
		seen[name] = true
		got, err := os.ReadFile(filepath.Join(b, "d", name))
		if err != nil {
			t.Fatalf("read %s from B: %v", name, err)
		}
		if !bytes.Equal(got, content(name)) {
			t.Fatalf("%s from B: %d bytes, want %d", name, len(got), len(content(name)))
		}
		if strings.HasPrefix(name, "h") {
			late++
		}
	}
	for _, p := range []string{"f", "g"} {
		for i := 0; i < map[string]int{"f": 20, "g": 100}[p]; i++ {
			if name := fmt.Sprint(p, i); !seen[name] {
				t.Fatalf("%s, made before the holder's fsync of the directory, is missing after its kill", name)
			}
		}
	}
	t.Logf("%d of 100 files closed after the directory's last fsync survived the kill", late)
	// B goes on in the directory.
	if err := os.WriteFile(filepath.Join(b, "d", "fromB"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fsyncDir fsyncs directory path: on a Strata mount a barrier of every
// metadata change of the mount (its queued creates included).
func fsyncDir(t *testing.T, path string) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		t.Fatalf("fsync of directory %s: %v", path, err)
	}
}
