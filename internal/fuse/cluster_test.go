package fuse

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/transport"
)

// testCluster: a real metadata service, real storage servers, and FUSE
// mounts of it, all in this process.
type testCluster struct {
	t      testing.TB
	dir    string
	key    []byte
	meta   *meta.Service
	stores []*store.Server
	mounts []*Mounted // in mount order
}

func requireFUSE(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("skipping: /dev/fuse is not usable: %v", err)
	}
	f.Close()
	if os.Geteuid() != 0 {
		if _, err := os.Stat("/usr/bin/fusermount3"); err != nil {
			t.Skip("skipping: not root and no fusermount3")
		}
	}
}

func startCluster(t testing.TB, stores, targets int) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, dir: t.TempDir(), key: []byte("fuse-test-key")}
	var err error
	tc.meta, err = meta.Open(meta.Config{DataDir: filepath.Join(tc.dir, "meta"), ListenAddr: "127.0.0.1:0", ClusterKey: tc.key,
		MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("meta.Open: %v", err)
	}
	t.Cleanup(func() { tc.meta.Close() })
	for i := 0; i < stores; i++ {
		var dirs []string
		for j := 0; j < targets; j++ {
			d := filepath.Join(tc.dir, fmt.Sprintf("store%d/t%d", i, j))
			os.MkdirAll(d, 0o755)
			dirs = append(dirs, d)
		}
		cfg := store.DefaultConfig()
		cfg.MetaAddr, cfg.Targets, cfg.ClusterKey = tc.meta.Addr(), dirs, tc.key
		cfg.MetricsAddr = "127.0.0.1:0"
		s, err := store.Open(cfg)
		if err != nil {
			t.Fatalf("store.Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		tc.stores = append(tc.stores, s)
	}
	cl := transport.NewClient(tc.meta.Addr(), transport.ClientConfig{Key: tc.key})
	defer cl.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var resp rpc.ListTargetsResp
		err := cl.Call(context.Background(), rpc.MListTargets, &rpc.Empty{}, &resp)
		if err == nil && len(resp.Targets) >= stores*targets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("targets did not register: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return tc
}

// mount starts a client and mounts it in a new temp dir.
func (tc *testCluster) mount(mod func(*client.Config)) (string, *client.Client) {
	tc.t.Helper()
	return tc.mountWith(mod, Options{})
}

// mountWith is mount with mount options.
func (tc *testCluster) mountWith(mod func(*client.Config), opts Options) (string, *client.Client) {
	tc.t.Helper()
	cfg := client.DefaultConfig()
	cfg.MetaAddr, cfg.ClusterKey = tc.meta.Addr(), tc.key
	cfg.IOTimeout = 10 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	c, err := client.New(context.Background(), cfg)
	if err != nil {
		tc.t.Fatalf("client.New: %v", err)
	}
	dir := tc.t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755) // other users must reach the mount
	m, err := Mount(c, dir, opts)
	if err != nil {
		c.Close()
		tc.t.Skipf("skipping: cannot mount FUSE: %v", err)
	}
	tc.mounts = append(tc.mounts, m)
	tc.t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			tc.t.Errorf("unmount: %v", err)
		}
		c.Close()
	})
	return dir, c
}

// startClusterNoCleanup starts a cluster and a mount that live until the
// test binary exits (shared by all benchmarks); it returns the mount dir.
func startClusterNoCleanup(b *testing.B) string {
	tb := &keepAlive{TB: b}
	tc := startCluster(tb, 2, 2)
	dir, _ := tc.mount(nil)
	return dir
}

// keepAlive defers cleanups to the end of the test binary (TestMain) so
// that resources outlive one benchmark.
type keepAlive struct{ testing.TB }

var atExit []func()

func (k *keepAlive) Cleanup(f func()) { atExit = append(atExit, f) }

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(atExit) - 1; i >= 0; i-- {
		atExit[i]()
	}
	os.Exit(code)
}
func (k *keepAlive) TempDir() string {
	d, err := os.MkdirTemp("", "strata-bench")
	if err != nil {
		k.TB.Fatal(err)
	}
	return d
}
