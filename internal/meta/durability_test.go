package meta

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const childEnv = "STRATA_META_TEST_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		runChild(dir)
		return
	}
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}

// runChild serves a metadata service until killed (crash test).
func runChild(dir string) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	s, err := Open(Config{DataDir: dir, ListenAddr: "127.0.0.1:0", ClusterKey: testKey})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("ADDR", s.Addr())
	select {}
}

func TestRestartKeepsNamespace(t *testing.T) {
	dir := t.TempDir()
	s := openService(t, testConfig(t, dir))
	c := newClient(t, s.Addr())
	c.registerTargets("127.0.0.1:1", "u1")
	d := c.mustCreate(1, "d", dirMode)
	f := c.mustCreate(d.Ino, "f", fileMode)
	root := c.mustGetattr(1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // idempotent
		t.Fatal(err)
	}

	s2 := openService(t, testConfig(t, dir))
	c2 := newClient(t, s2.Addr())
	if got := c2.mustGetattr(1); !reflect.DeepEqual(got, root) {
		t.Fatalf("root changed across restart: %+v vs %+v", got, root)
	}
	got, err := c2.lookup(d.Ino, "f")
	if err != nil || got.Ino != f.Ino || got.Layout.Targets[0] != f.Layout.Targets[0] {
		t.Fatalf("lookup after restart = %+v %v", got, err)
	}
	// inode numbers are never reused
	if g := c2.mustCreate(1, "g", dirMode); g.Ino <= f.Ino {
		t.Fatalf("new inode %d not above %d", g.Ino, f.Ino)
	}
}

func TestFormatVersionRefused(t *testing.T) {
	dir := t.TempDir()
	s := openService(t, testConfig(t, dir))
	s.Close()
	p := filepath.Join(dir, stateFileName)
	b, _ := os.ReadFile(p)
	os.WriteFile(p, []byte(strings.Replace(string(b), `"format_version": 1`, `"format_version": 99`, 1)), 0o600)
	_, err := Open(testConfig(t, dir))
	if err == nil || !strings.Contains(err.Error(), "format version 99") {
		t.Fatalf("Open of a version-99 dir: %v", err)
	}
	os.WriteFile(p, b, 0o600)
	cfg := testConfig(t, dir)
	cfg.NodeID = "someone-else"
	if _, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "belongs to node") {
		t.Fatalf("Open with another node id: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{ListenAddr: "nope", RaftAddr: "x:99999", SessionLease: time.Millisecond, ServerTimeout: -1}.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"data dir", "listen address", "raft address", "session lease", "server timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	c := Config{DataDir: "d", ListenAddr: "10.0.0.5:7700"}.withDefaults()
	if c.RaftAddr != "10.0.0.5:7701" || c.SessionLease != 15*time.Second || c.ServerTimeout != 10*time.Second {
		t.Fatalf("defaults = %+v", c)
	}
	if c := (Config{ListenAddr: "127.0.0.1:7700"}).withDefaults(); c.RaftAddr != "127.0.0.1:0" {
		t.Fatalf("loopback raft default = %q", c.RaftAddr)
	}
}

// TestCrashKeepsAcknowledgedCreates runs the service in a child process,
// kills it with SIGKILL in the middle of a create storm, and checks that
// every create it acknowledged is there after a restart.
func TestCrashKeepsAcknowledgedCreates(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ADDR ") {
		t.Fatalf("child said %q, %v", line, err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))

	c := newClient(t, addr)
	c.registerTargets("127.0.0.1:1", "u1", "u2")
	var mu sync.Mutex
	acked := map[string]uint64{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("w%d-%d", w, i)
				a, err := c.create(1, name, fileMode)
				if err != nil {
					return // the kill
				}
				mu.Lock()
				acked[name] = a.Ino
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(700 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	close(stop)
	wg.Wait()
	c.c.Close()
	if len(acked) < 100 {
		t.Fatalf("only %d creates before the kill", len(acked))
	}

	s := openService(t, testConfig(t, dir))
	c2 := newClient(t, s.Addr())
	for name, ino := range acked {
		a, err := c2.lookup(1, name)
		if err != nil || a.Ino != ino {
			t.Fatalf("acknowledged create %q (inode %d) after kill -9: %+v %v", name, ino, a, err)
		}
	}
	ents, err := c2.readdirAll(1, 0, false)
	if err != nil || len(ents) < len(acked) {
		t.Fatalf("readdir after crash: %d entries, %v", len(ents), err)
	}
	if root := c2.mustGetattr(1); root.Nlink != 2 {
		t.Fatalf("root nlink %d", root.Nlink)
	}
	t.Logf("%d acknowledged creates survived kill -9 (%d entries present)", len(acked), len(ents))
}
