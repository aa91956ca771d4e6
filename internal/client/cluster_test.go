package client

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/transport"
)

// testCluster runs a real metadata service and real storage servers in
// this process, on loopback ports, with data in a temp dir.
type testCluster struct {
	t        testing.TB
	dir      string
	key      []byte
	metaAddr string
	meta     *meta.Service
	stores   []*store.Server
	scfg     []store.Config
	// syncDelay is the metadata log's SyncDelay.
	syncDelay time.Duration
}

type clusterOpts struct {
	stores, targets int
	reserve         uint64 // store.Config.ReserveBytes
	metrics         bool   // stores serve /metrics (store.Server.MetricsAddr)
	// syncDelay is the metadata log's SyncDelay. 0: an hour, so that
	// namespace changes become durable only at barriers (what must be
	// durable has to ask for it).
	syncDelay time.Duration
}

func startCluster(t testing.TB, o clusterOpts) *testCluster {
	t.Helper()
	if o.stores == 0 {
		o.stores = 2
	}
	if o.targets == 0 {
		o.targets = 2
	}
	if o.syncDelay == 0 {
		o.syncDelay = time.Hour
	}
	tc := &testCluster{t: t, dir: t.TempDir(), key: []byte("test-cluster-key"), syncDelay: o.syncDelay}
	tc.startMeta("127.0.0.1:0")
	for i := 0; i < o.stores; i++ {
		var targets []string
		for j := 0; j < o.targets; j++ {
			d := filepath.Join(tc.dir, fmt.Sprintf("store%d", i), fmt.Sprintf("t%d", j))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			targets = append(targets, d)
		}
		cfg := store.DefaultConfig()
		cfg.MetaAddr = tc.metaAddr
		cfg.ListenAddr = "127.0.0.1:0"
		cfg.Targets = targets
		cfg.ClusterKey = tc.key
		cfg.ReserveBytes = o.reserve
		if o.metrics {
			cfg.MetricsAddr = "127.0.0.1:0"
		}
		tc.scfg = append(tc.scfg, cfg)
		s, err := store.Open(cfg)
		if err != nil {
			t.Fatalf("store.Open: %v", err)
		}
		tc.stores = append(tc.stores, s)
	}
	t.Cleanup(tc.close)
	tc.waitTargets(o.stores * o.targets)
	return tc
}

func (tc *testCluster) startMeta(addr string) {
	tc.t.Helper()
	var err error
	for i := 0; i < 50; i++ {
		tc.meta, err = meta.Open(meta.Config{DataDir: filepath.Join(tc.dir, "meta"), ListenAddr: addr, ClusterKey: tc.key,
			SessionLease: 6 * time.Second, OrphanGrace: time.Second,
			SyncDelay: tc.syncDelay})
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // port still held by the old instance
	}
	if err != nil {
		tc.t.Fatalf("meta.Open: %v", err)
	}
	tc.metaAddr = tc.meta.Addr()
}

func (tc *testCluster) restartMeta() {
	tc.meta.Close()
	tc.startMeta(tc.metaAddr)
}

func (tc *testCluster) stopStore(i int) {
	if tc.stores[i] != nil {
		tc.stores[i].Close()
		tc.stores[i] = nil
	}
}

func (tc *testCluster) close() {
	for i := range tc.stores {
		tc.stopStore(i)
	}
	if tc.meta != nil {
		tc.meta.Close()
	}
}

func (tc *testCluster) waitTargets(n int) {
	tc.t.Helper()
	cl := transport.NewClient(tc.metaAddr, transport.ClientConfig{Key: tc.key})
	defer cl.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var resp rpc.ListTargetsResp
		err := cl.Call(context.Background(), rpc.MListTargets, &rpc.Empty{}, &resp)
		alive := 0
		for _, t := range resp.Targets {
			if t.Alive {
				alive++
			}
		}
		if err == nil && alive >= n {
			return
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("only %d of %d targets registered: %v", alive, n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (tc *testCluster) config() Config {
	cfg := DefaultConfig()
	cfg.MetaAddr = tc.metaAddr
	cfg.ClusterKey = tc.key
	cfg.IOTimeout = 10 * time.Second
	return cfg
}

func (tc *testCluster) client(mod func(*Config)) *Client {
	tc.t.Helper()
	cfg := tc.config()
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(context.Background(), cfg)
	if err != nil {
		tc.t.Fatalf("client.New: %v", err)
	}
	tc.t.Cleanup(func() { c.Close() })
	return c
}

// chunkStat asks the store owning target for the chunk of ino.
func chunkStat(t testing.TB, c *Client, target uint32, ino uint64) rpc.ChunkStatResp {
	t.Helper()
	var resp rpc.ChunkStatResp
	req := &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: target, Ino: ino}}
	err := c.storeCall(context.Background(), "stat", &req.Chunk, rpc.SChunkStat, req, &resp)
	if err != nil {
		t.Fatalf("chunk stat target %d ino %d: %v", target, ino, err)
	}
	return resp
}
