package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// TestFailoverUnderLoadWithVoterList: a store and a mount given the three
// voters (--meta A,B,C) keep working through kill -9 of the leader, three
// times: the load (creates, stats and removes in four goroutines, 1 MiB
// records written and fsync'ed in a fifth) sees no error, the files that
// exist afterwards are exactly those created and not removed, and the
// longest pause of an operation is reported.
func TestFailoverUnderLoadWithVoterList(t *testing.T) {
	g, mnts := startListedCluster(t, 1)
	runLoad(t, mnts[0], func() {
		for trial := range 3 {
			time.Sleep(2 * time.Second)
			l := g.leader(-1)
			g.procs[l].Kill()
			t.Logf("trial %d: kill -9 of the leader %s", trial, g.peers[l])
			time.Sleep(3 * time.Second)
			g.start(l)
		}
	})
}

// TestHungLeaderUnderLoadWithVoterList: the same load through SIGSTOP of
// the leader (its sockets stay open): calls waiting on it go to another
// voter after the client's attempt timeout, and none fails.
func TestHungLeaderUnderLoadWithVoterList(t *testing.T) {
	g, mnts := startListedCluster(t, 1)
	runLoad(t, mnts[0], func() {
		time.Sleep(2 * time.Second)
		l := g.leader(-1)
		if err := syscall.Kill(g.procs[l].Pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Logf("SIGSTOP of the leader %s", g.peers[l])
		time.Sleep(8 * time.Second)
		syscall.Kill(g.procs[l].Pid(), syscall.SIGCONT)
	})
}

// runLoad runs the load on mnt while during runs, then checks it.
func runLoad(t *testing.T, mnt string, during func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	var maxPause time.Duration
	alive := map[string]bool{}
	timed := func(f func() error) error {
		start := time.Now()
		err := f()
		d := time.Since(start)
		mu.Lock()
		maxPause = max(maxPause, d)
		if err != nil {
			errs = append(errs, err)
		}
		mu.Unlock()
		return err
	}
	for w := range 4 {
		dir := filepath.Join(mnt, fmt.Sprintf("w%d", w))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := filepath.Join(dir, fmt.Sprint(i))
				if timed(func() error { return os.WriteFile(p, []byte(p), 0o644) }) != nil {
					return
				}
				mu.Lock()
				alive[p] = true
				mu.Unlock()
				if timed(func() error { _, err := os.Stat(p); return err }) != nil {
					return
				}
				if i%3 == 0 {
					if timed(func() error { return os.Remove(p) }) != nil {
						return
					}
					mu.Lock()
					delete(alive, p)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.Create(filepath.Join(mnt, "records"))
		if err != nil {
			timed(func() error { return err })
			return
		}
		defer f.Close()
		rec := bytes.Repeat([]byte("r"), 1<<20)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if timed(func() error {
				if _, err := f.Write(rec); err != nil {
					return err
				}
				return f.Sync()
			}) != nil {
				return
			}
		}
	}()
	during()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d operations failed, first: %v", len(errs), errs[0])
	}
	t.Logf("longest pause of an operation: %v", maxPause)
	for w := range 4 {
		dir := filepath.Join(mnt, fmt.Sprintf("w%d", w))
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if !alive[p] {
				t.Errorf("%s exists: removed, or never acknowledged", p)
			}
			delete(alive, p)
		}
	}
	if len(alive) > 0 {
		t.Errorf("%d files acknowledged and not removed are missing", len(alive))
	}
}

// startListedCluster starts a group of three voters, a store and n mounts
// given the voters as --meta A,B,C; it returns the group and the mount
// points.
func startListedCluster(t *testing.T, n int) (*metaGroup, []string) {
	testutil.RequireFUSE(t)
	g := startMetaGroup(t, 3)
	g.leader(-1)
	list := strings.Join(g.peers, ",")
	keyFile := filepath.Join(g.dir, "key")
	target := filepath.Join(g.dir, "target")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	st := testutil.StartProc(t, g.dir, "store", nil, g.bin, "store", "--meta", list, "--listen", "127.0.0.1:0", "--key-file", keyFile, "--target", target)
	t.Cleanup(func() { st.Stop(10 * time.Second) })
	if err := testutil.WaitFor(20*time.Second, func() error {
		out, code := run(t, g.bin, g.dir, "status", "--json", "--meta", list, "--key-file", keyFile)
		var s struct {
			Targets []struct{ Alive bool } `json:"targets"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &s) != nil || len(s.Targets) != 1 || !s.Targets[0].Alive {
			return fmt.Errorf("status: exit %d: %s", code, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var mnts []string
	for i := range n {
		mnt := filepath.Join(g.dir, fmt.Sprintf("mnt%d", i))
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		mp := testutil.StartProc(t, g.dir, fmt.Sprintf("mount%d", i), nil, g.bin, "mount", "--meta", list, "--key-file", keyFile, mnt)
		t.Cleanup(func() { mp.Stop(10 * time.Second); testutil.ForceUnmount(mnt) })
		if err := testutil.WaitFor(20*time.Second, func() error {
			if !testutil.IsMounted(mnt) {
				return fmt.Errorf("not mounted:\n%s", mp.Tail(10))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		mnts = append(mnts, mnt)
	}
	return g, mnts
}

// TestLockHeldAcrossFailoverWithVoterList: a lock a process holds through
// one mount (given the voters as --meta A,B,C) keeps excluding a process
// on another mount through kill -9 of the leader, also once the new
// leader's grace period is over (the holder's mount reclaimed it there).
func TestLockHeldAcrossFailoverWithVoterList(t *testing.T) {
	g, mnts := startListedCluster(t, 2)
	for _, kind := range []string{"fcntl", "flock"} {
		name := "locked-" + kind
		if err := os.WriteFile(filepath.Join(mnts[0], name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		holder := exec.Command(os.Args[0])
		holder.Env = append(os.Environ(), "STRATA_TEST_WORKER=lock", "LOCK_KIND="+kind, "LOCK_FILE="+filepath.Join(mnts[0], name), "LOCK_HOLD=1")
		out, err := holder.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
		buf := make([]byte, 6)
		if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "locked" {
			t.Fatalf("%s holder: %q %v", kind, buf, err)
		}
	}
	for trial := range 2 {
		l := g.leader(-1)
		g.procs[l].Kill()
		g.leader(l)
		for _, wait := range []time.Duration{0, 20 * time.Second} { // at once, and past a lease (15 s)
			time.Sleep(wait)
			for _, kind := range []string{"fcntl", "flock"} {
				if got := tryLock(filepath.Join(mnts[1], "locked-"+kind), kind); got != "busy" {
					t.Fatalf("trial %d, %v after the failover: %s lock from the other mount: %s, want busy", trial, wait, kind, got)
				}
			}
		}
		g.start(l)
	}
}
