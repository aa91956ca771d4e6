package nfs_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/nfs"
	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/transport"
)

// cluster is a real metadata service and one storage server with two
// targets, in this process on loopback, and a client library on them.
type cluster struct {
	t        testing.TB
	key      []byte
	metaAddr string
	meta     *meta.Service
	c        *client.Client
	cfg      client.Config
	// gatewayCfg, when set, changes the gateways' configuration.
	gatewayCfg func(*nfs.Config)
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	return startClusterWith(t, nil)
}

// startClusterWith is startCluster with the metadata service's
// configuration changed by mod.
func startClusterWith(t testing.TB, mod func(*meta.Config)) *cluster {
	t.Helper()
	dir := t.TempDir()
	key := []byte("nfs-test-cluster-key")
	mcfg := meta.Config{DataDir: filepath.Join(dir, "meta"), ListenAddr: "127.0.0.1:0", ClusterKey: key,
		SessionLease: 6 * time.Second, OrphanGrace: time.Second, SyncDelay: 5 * time.Millisecond}
	if mod != nil {
		mod(&mcfg)
	}
	m, err := meta.Open(mcfg)
	if err != nil {
		t.Fatalf("meta.Open: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	scfg := store.DefaultConfig()
	scfg.MetaAddr, scfg.ListenAddr, scfg.ClusterKey = m.Addr(), "127.0.0.1:0", key
	for i := range 2 {
		d := filepath.Join(dir, "t"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		scfg.Targets = append(scfg.Targets, d)
	}
	s, err := store.Open(scfg)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	waitTargets(t, m.Addr(), key, len(scfg.Targets))
	cl := &cluster{t: t, key: key, metaAddr: m.Addr(), meta: m}
	cl.cfg = client.DefaultConfig()
	cl.cfg.MetaAddr, cl.cfg.ClusterKey, cl.cfg.IOTimeout = m.Addr(), key, 10*time.Second
	cl.c = cl.newClient()
	return cl
}

func waitTargets(t testing.TB, addr string, key []byte, n int) {
	t.Helper()
	tc := transport.NewClient(addr, transport.ClientConfig{Key: key})
	defer tc.Close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		var resp rpc.ListTargetsResp
		err := tc.Call(context.Background(), rpc.MListTargets, &rpc.Empty{}, &resp)
		alive := 0
		for _, tg := range resp.Targets {
			if tg.Alive {
				alive++
			}
		}
		if err == nil && alive >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d targets registered: %v", alive, n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newClient is another client library session on the cluster (another
// machine's view).
func (cl *cluster) newClient() *client.Client {
	c, err := client.New(context.Background(), cl.cfg)
	if err != nil {
		cl.t.Fatalf("client.New: %v", err)
	}
	cl.t.Cleanup(func() { c.Close() })
	return c
}

// gateway is an NFS gateway on a loopback port.
type gateway struct {
	s    *nfs.Server
	addr string
	done chan error
}

// startGateway serves exports (--export values) through cl's client,
// with no NLM grace period.
func (cl *cluster) startGateway(exports ...string) *gateway {
	cl.t.Helper()
	return cl.startGatewayWith(nil, exports...)
}

// startGatewayWith is startGateway with the configuration changed by mod.
func (cl *cluster) startGatewayWith(mod func(*nfs.Config), exports ...string) *gateway {
	cl.t.Helper()
	cfg := nfs.DefaultConfig()
	cfg.ClusterKey = cl.key
	cfg.NLMGrace = 0
	if cl.gatewayCfg != nil {
		cl.gatewayCfg(&cfg)
	}
	for _, x := range exports {
		e, err := nfs.ParseExport(x)
		if err != nil {
			cl.t.Fatal(err)
		}
		cfg.Exports = append(cfg.Exports, e)
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := nfs.New(cl.c, cfg)
	if err != nil {
		cl.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cl.t.Fatal(err)
	}
	g := &gateway{s: s, addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { g.done <- s.Serve(ln) }()
	cl.t.Cleanup(g.stop)
	return g
}

func (g *gateway) stop() {
	if g.s == nil {
		return
	}
	g.s.Close()
	<-g.done
	g.s = nil
}

// dial connects a test client as uid/gid, from local ("" for any).
func (g *gateway) dial(t testing.TB, local string, uid, gid uint32) *nfstest.Client {
	t.Helper()
	c, err := nfstest.Dial(g.addr, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.As(uid, gid)
	return c
}
