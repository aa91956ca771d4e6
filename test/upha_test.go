package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// haGroup is one entry of `strata status --json`'s "mirror_groups".
type haGroup struct {
	ID              uint32 `json:"id"`
	PrimaryServer   string `json:"primary_server"`
	SecondaryServer string `json:"secondary_server"`
	State           string `json:"state"`
	Epoch           uint64 `json:"epoch"`
}

// haUp is a `strata up --ha` run.
type haUp struct {
	bin, dir, data, mnt string
	meta, keyFile       string
}

// startUpHA starts `strata up --ha` with extra flags and waits until every
// mirror group is in sync.
func startUpHA(t *testing.T, extra ...string) *haUp {
	testutil.RequireFUSE(t)
	u := &haUp{bin: testutil.Binary(t), dir: t.TempDir()}
	u.data, u.mnt = filepath.Join(u.dir, "data"), filepath.Join(u.dir, "mnt")
	p := startUp(t, u.bin, u.dir, u.data, u.mnt, append([]string{"--ha"}, extra...)...)
	t.Cleanup(func() {
		if err := p.Stop(60 * time.Second); err != nil {
			t.Errorf("strata up --ha did not stop cleanly: %v\n%s", err, p.Tail(30))
		}
		testutil.ForceUnmount(u.mnt)
	})
	var l struct{ Voters []string }
	b, err := os.ReadFile(filepath.Join(u.data, "ha.json"))
	if err != nil || json.Unmarshal(b, &l) != nil {
		t.Fatalf("ha.json: %v %s", err, b)
	}
	u.meta, u.keyFile = strings.Join(l.Voters, ","), filepath.Join(u.data, "cluster.key")
	gs := u.waitGroups(t, 4, "in_sync", 60*time.Second)
	t.Logf("mirror groups: %+v", gs)
	return u
}

// groups returns the mirror groups as strata status --json shows them.
func (u *haUp) groups(t *testing.T) ([]haGroup, error) {
	out, code := run(t, u.bin, u.dir, "status", "--json", "--meta", u.meta, "--key-file", u.keyFile)
	var s struct {
		MirrorGroups []haGroup `json:"mirror_groups"`
	}
	if code != 0 {
		return nil, fmt.Errorf("status: exit %d: %s", code, out)
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return nil, fmt.Errorf("status: %v: %s", err, out)
	}
	return s.MirrorGroups, nil
}

// waitGroups waits until there are n groups, all in state.
func (u *haUp) waitGroups(t *testing.T, n int, state string, d time.Duration) []haGroup {
	t.Helper()
	var gs []haGroup
	if err := testutil.WaitFor(d, func() error {
		var err error
		if gs, err = u.groups(t); err != nil {
			return err
		}
		if len(gs) != n {
			return fmt.Errorf("%d mirror groups, want %d: %+v", len(gs), n, gs)
		}
		for _, g := range gs {
			if g.State != state {
				return fmt.Errorf("group %d is %s, want %s: %+v", g.ID, g.State, state, gs)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return gs
}

// storePid finds the pid of the `strata store --listen addr` child.
func storePid(t *testing.T, addr string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+2 < len(args); i++ {
			if args[i] == "store" && args[i+1] == "--listen" && args[i+2] == addr {
				return pid
			}
		}
	}
	t.Fatalf("no strata store --listen %s running", addr)
	return 0
}

// TestUpHAKillPrimary is the user story: `strata up --ha`, files
// written, then kill -9 of a primary's storage server while a load of
// creates, stats, removes and fsync'ed 1 MiB records runs: no operation
// fails, every file reads back, the group switches to its secondary (new
// epoch), and once up restarts the dead server the group is in sync
// again.
func TestUpHAKillPrimary(t *testing.T) {
	u := startUpHA(t, "--ha-restart-delay", "4s")
	before, err := u.groups(t)
	if err != nil {
		t.Fatal(err)
	}
	// Files written before the fault, read back after it.
	want := map[string][]byte{}
	for i := range 20 {
		p := filepath.Join(u.mnt, fmt.Sprintf("pre%d", i))
		b := bytes.Repeat([]byte{byte(i + 1)}, 300<<10+i)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		want[p] = b
	}
	// up --ha marked the root mirrored: the files are on groups.
	out, code := run(t, u.bin, u.dir, "stripe", "get", "--json", filepath.Join(u.mnt, "pre0"))
	var l struct{ Targets []uint32 }
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Targets) == 0 {
		t.Fatalf("stripe get: exit %d: %s", code, out)
	}
	for _, id := range l.Targets {
		if id < 1<<31 {
			t.Fatalf("pre0 is not mirrored: layout targets %v", l.Targets)
		}
	}
	victim := before[0]
	runLoad(t, u.mnt, func() {
		time.Sleep(2 * time.Second)
		pid := storePid(t, victim.PrimaryServer)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		t.Logf("kill -9 of %s (pid %d), primary of group %d", victim.PrimaryServer, pid, victim.ID)
		time.Sleep(6 * time.Second)
	})
	for p, b := range want {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s after the switch: %v", p, err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("%s: %d bytes differ after the switch", p, len(b))
		}
	}
	after := u.waitGroups(t, len(before), "in_sync", 90*time.Second)
	for _, g := range after {
		if g.ID != victim.ID {
			continue
		}
		if g.Epoch <= victim.Epoch {
			t.Errorf("group %d: epoch %d after the switch, was %d", g.ID, g.Epoch, victim.Epoch)
		}
		if g.PrimaryServer == victim.PrimaryServer {
			t.Errorf("group %d: primary still %s after its kill -9", g.ID, g.PrimaryServer)
		}
	}
}
