package store

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
	"github.com/stratafs/strata/internal/transport"
)

var testKey = []byte("test-cluster-key")

// env is a standalone server on temp targets plus a client.
type env struct {
	t    *testing.T
	cfg  Config
	s    *Server
	cl   *transport.Client
	dirs []string
}

func newEnv(t *testing.T, ntargets int, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t}
	for i := 0; i < ntargets; i++ {
		e.dirs = append(e.dirs, t.TempDir())
	}
	e.cfg = DefaultConfig()
	e.cfg.Targets = e.dirs
	e.cfg.ClusterKey = testKey
	// No background rounds unless a test asks for them: they would clean
	// the dirty chunks other tests look at (bgsync_test.go).
	e.cfg.SyncInterval = 0
	if mod != nil {
		mod(&e.cfg)
	}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *env) start() {
	e.t.Helper()
	s, err := Open(e.cfg)
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	e.s = s
	e.cl = transport.NewClient(s.Addr(), transport.ClientConfig{Key: testKey})
}

func (e *env) stop() {
	if e.s == nil {
		return
	}
	e.cl.Close()
	if err := e.s.Close(); err != nil {
		e.t.Errorf("Close: %v", err)
	}
	e.s = nil
}

// crash stops the server without syncing anything or clearing dirty
// flags, as a kill -9 would leave the sidecars (the page cache survives,
// which is the worst case for the checksum logic: data may be anywhere).
func (e *env) crash() {
	e.cl.Close()
	e.s.closeOnce.Do(func() { e.s.closeErr = e.s.close(false) })
	e.s = nil
}

func (e *env) restart() {
	e.stop()
	e.start()
}

func (e *env) write(tgt uint32, ino, off uint64, data []byte, sync bool) error {
	return e.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}, Off: off, Sync: sync, Data: data}, &rpc.Empty{})
}

func (e *env) mustWrite(tgt uint32, ino, off uint64, data []byte, sync bool) {
	e.t.Helper()
	if err := e.write(tgt, ino, off, data, sync); err != nil {
		e.t.Fatalf("write target %d ino %x off %d len %d: %v", tgt, ino, off, len(data), err)
	}
}

func (e *env) read(tgt uint32, ino, off uint64, n uint32) ([]byte, error) {
	var resp rpc.ReadResp
	err := e.cl.Call(context.Background(), rpc.SRead, &rpc.ReadReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}, Off: off, Len: n}, &resp)
	return resp.Data, err
}

func (e *env) mustRead(tgt uint32, ino, off uint64, n uint32) []byte {
	e.t.Helper()
	b, err := e.read(tgt, ino, off, n)
	if err != nil {
		e.t.Fatalf("read target %d ino %x off %d len %d: %v", tgt, ino, off, n, err)
	}
	return b
}

func (e *env) call(m rpc.Method, req rpc.Message) error {
	return e.cl.Call(context.Background(), m, req, &rpc.Empty{})
}

func (e *env) stat(tgt uint32, ino uint64) rpc.ChunkStatResp {
	e.t.Helper()
	var r rpc.ChunkStatResp
	if err := e.cl.Call(context.Background(), rpc.SChunkStat, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}}, &r); err != nil {
		e.t.Fatalf("chunk stat: %v", err)
	}
	return r
}

// dataPath is the chunk's data file in target directory dir.
func dataPath(dir string, ino uint64) string {
	d, base := layoutTarget(dir).chunkPath(ino)
	return filepath.Join(d, base+".data")
}

func sumPath(dir string, ino uint64) string {
	d, base := layoutTarget(dir).chunkPath(ino)
	return filepath.Join(d, base+".sum")
}

// layoutTarget is enough of a target for chunkPath: formatted target
// directory dir with the chunk layout its identity file names.
func layoutTarget(dir string) *target {
	b, err := os.ReadFile(filepath.Join(dir, identityName))
	if err != nil {
		panic(err) // a test's mistake: dir is no target
	}
	var id identity
	if err := json.Unmarshal(b, &id); err != nil {
		panic(err)
	}
	l, err := layoutOf(id)
	if err != nil {
		panic(fmt.Sprintf("target %s: %v", dir, err))
	}
	return &target{path: dir, layout: l}
}

// captureLogs routes the default slog logger to a buffer (and stderr) for
// the test; servers opened afterwards log there.
func captureLogs(t *testing.T) *testutil.SyncBuffer {
	lc := &testutil.SyncBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(multiWriter{lc, os.Stderr}, &slog.HandlerOptions{Level: slog.LevelInfo})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return lc
}

type multiWriter []interface{ Write([]byte) (int, error) }

func (m multiWriter) Write(p []byte) (int, error) {
	for _, w := range m {
		w.Write(p)
	}
	return len(p), nil
}

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed*2654435761 + 1)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}
