package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

func TestENOSPCKeepsDataIntact(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs as a full target")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs (%v: %s)", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	e := newEnv(t, 1, func(c *Config) { c.Targets = []string{dir} })
	e.dirs = []string{dir}
	// No reserve check: the disk itself runs out, in the middle of
	// writes (the partial-write repair path).
	e.s.targets[0].noReserve.Store(true)

	const piece = 1 << 20
	var mu sync.Mutex
	written := map[uint64]int{} // ino -> bytes acknowledged
	var enospc atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ino := uint64(100 + w)
			for i := 0; ; i++ {
				// Unaligned offsets: edge blocks need read-modify-write.
				off := uint64(i*piece + 100)
				err := e.write(1, ino, off, pattern(w*1000+i, piece), false)
				if errors.Is(err, syscall.ENOSPC) {
					enospc.Store(err)
					return
				}
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				mu.Lock()
				written[ino] = i + 1
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	err, _ := enospc.Load().(error)
	if err == nil {
		t.Fatal("no ENOSPC on a 16 MiB target")
	}
	t.Logf("first ENOSPC seen: %v", err)
	if !strings.Contains(err.Error(), dir) {
		t.Fatalf("ENOSPC does not name the target: %v", err)
	}
	check := func() {
		for w := 0; w < 4; w++ {
			ino := uint64(100 + w)
			got, rerr := e.read(1, ino, 0, 32<<20)
			if rerr != nil {
				t.Fatalf("read back after ENOSPC: %v", rerr)
			}
			n := written[ino]
			want := 0 // a writer whose first write failed: the chunk stays empty
			if n > 0 {
				want = 100 + n*piece
			}
			if len(got) < want {
				t.Fatalf("ino %d: %d bytes, want at least %d", ino, len(got), want)
			}
			for i := 0; i < n; i++ {
				if !bytes.Equal(got[100+i*piece:100+(i+1)*piece], pattern(w*1000+i, piece)) {
					t.Fatalf("ino %d piece %d corrupted after ENOSPC", ino, i)
				}
			}
			// Nothing of a failed write survives past the old end of file.
			if len(got) != want {
				t.Fatalf("ino %d: %d bytes, want %d (failed write kept past old EOF)", ino, len(got), want)
			}
		}
	}
	check()
	// The reserve check answers too, with a clear message.
	e.stop()
	e.cfg.ReserveBytes = 15 << 20
	e.start()
	if err := e.write(1, 200, 0, []byte("x"), false); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "reserve") {
		t.Fatalf("write under the reserve: %v", err)
	}
	e.restart()
	check()
	// Freeing space makes writes work again.
	if err := e.call(rpc.SRemove, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 100}}); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.cfg.ReserveBytes = 0
	e.start()
	e.mustWrite(1, 300, 0, pattern(9, 4096), true)
}

func TestRestartKeepsIdentityAndData(t *testing.T) {
	e := newEnv(t, 2, nil)
	uuids := e.s.TargetUUIDs()
	if !slices.Equal(e.s.TargetIDs(), []uint32{1, 2}) {
		t.Fatalf("standalone ids %v", e.s.TargetIDs())
	}
	data := pattern(5, 3<<20+17)
	e.mustWrite(2, 42, 1234, data, false)
	e.restart()
	if got := e.s.TargetUUIDs(); !slices.Equal(got, uuids) || uuids[0] == uuids[1] {
		t.Fatalf("uuids %v after restart, were %v", got, uuids)
	}
	if got := e.mustRead(2, 42, 1234, uint32(len(data))); !bytes.Equal(got, data) {
		t.Fatal("data changed across restart")
	}
	// A second server on the same target is refused while the first runs.
	cfg := e.cfg
	cfg.Targets = e.dirs[:1]
	if _, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second server on a served target: %v", err)
	}
}

func TestValidate(t *testing.T) {
	d := t.TempDir()
	file := filepath.Join(d, "file")
	os.WriteFile(file, nil, 0o644)
	cfg := DefaultConfig()
	cfg.Targets = []string{d, d + "/", file, filepath.Join(d, "missing")}
	cfg.ListenAddr = "nonsense"
	cfg.MetaAddr = "host:0"
	err := cfg.Validate()
	if err == nil {
		t.Fatal("bad config validated")
	}
	for _, want := range []string{"given twice", "not a directory", "no such file", "listen address", "metadata service address"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q:\n%v", want, err)
		}
	}
	if err := (Config{ListenAddr: ":0"}).Validate(); err == nil || !strings.Contains(err.Error(), "no targets") {
		t.Fatalf("no targets: %v", err)
	}
	cfg = DefaultConfig()
	cfg.Targets = []string{d}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
}

func TestFormatChecks(t *testing.T) {
	// A target of a future format version is refused with a clear error.
	future := t.TempDir()
	os.WriteFile(filepath.Join(future, identityName), []byte(`{"format": 9, "uuid": "x"}`), 0o644)
	cfg := DefaultConfig()
	cfg.Targets = []string{future}
	_, err := Open(cfg)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "format version 9") {
		t.Fatalf("future format: %v", err)
	}
	// A non-empty directory that is not a target is not formatted.
	busy := t.TempDir()
	os.WriteFile(filepath.Join(busy, "thesis.tex"), []byte("x"), 0o644)
	cfg.Targets = []string{busy}
	if _, err := Open(cfg); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("non-empty dir: %v", err)
	}
	// The same target under two names (a symlink) is refused.
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(real, link)
	cfg.Targets = []string{real, link}
	if _, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("same dir twice: %v", err)
	}
}

// fakeMeta stands in for the metadata service: it answers registrations
// with fixed ids and counts heartbeats; staleOnce makes the next heartbeat
// answer ESTALE.
type fakeMeta struct {
	srv         *transport.Server
	addr        string
	regs        atomic.Int32
	beats       atomic.Int32
	staleOnce   atomic.Bool
	mu          sync.Mutex
	lastReg     rpc.RegisterServerReq
	lastBeatIDs []uint32
	lastBeatIno uint64 // the last heartbeat's InoCeiling
}

func startFakeMeta(t *testing.T, addr string) *fakeMeta {
	t.Helper()
	f := &fakeMeta{srv: transport.NewServer(testKey)}
	transport.Handle(f.srv, rpc.MRegisterServer, func(ctx context.Context, r *rpc.RegisterServerReq) (*rpc.RegisterServerResp, error) {
		f.mu.Lock()
		f.lastReg = *r
		f.lastReg.Targets = slices.Clone(r.Targets)
		f.mu.Unlock()
		f.regs.Add(1)
		ids := make([]uint32, len(r.Targets))
		for i := range ids {
			ids[i] = uint32(10 + i)
		}
		return &rpc.RegisterServerResp{ServerID: 5, TargetIDs: ids}, nil
	})
	transport.Handle(f.srv, rpc.MServerHeartbeat, func(ctx context.Context, r *rpc.ServerHeartbeatReq) (*rpc.Empty, error) {
		if r.ServerID != 5 {
			return nil, rpc.Errorf(syscall.ESTALE, "unknown server %d", r.ServerID)
		}
		if f.staleOnce.CompareAndSwap(true, false) {
			return nil, rpc.Errorf(syscall.ESTALE, "server %d forgotten", r.ServerID)
		}
		f.mu.Lock()
		f.lastBeatIDs = nil
		f.lastBeatIno = r.InoCeiling
		for _, u := range r.Targets {
			f.lastBeatIDs = append(f.lastBeatIDs, u.ID)
		}
		f.mu.Unlock()
		f.beats.Add(1)
		return &rpc.Empty{}, nil
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	go f.srv.Serve(ln)
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRegistrationAndHeartbeats(t *testing.T) {
	meta := startFakeMeta(t, "127.0.0.1:0")
	e := newEnv(t, 2, func(c *Config) {
		c.MetaAddr = meta.addr
		c.HeartbeatInterval = 20 * time.Millisecond
	})
	if ids := e.s.TargetIDs(); !slices.Equal(ids, []uint32{10, 11}) {
		t.Fatalf("target ids %v, want [10 11]", ids)
	}
	meta.mu.Lock()
	reg := meta.lastReg
	meta.mu.Unlock()
	if reg.Addr != e.s.Addr() || len(reg.Targets) != 2 || reg.Targets[0].UUID != e.s.TargetUUIDs()[0] || reg.Targets[0].TotalBytes == 0 {
		t.Fatalf("registration %+v", reg)
	}
	waitFor(t, "heartbeats", func() bool { return meta.beats.Load() >= 3 })
	meta.mu.Lock()
	beatIDs := meta.lastBeatIDs
	meta.mu.Unlock()
	if !slices.Equal(beatIDs, []uint32{10, 11}) {
		t.Fatalf("heartbeat ids %v", beatIDs)
	}
	// Requests use the assigned ids; the standalone ids are unknown.
	e.mustWrite(11, 1, 0, []byte("hello"), true)
	if got := e.mustRead(11, 1, 0, 10); string(got) != "hello" {
		t.Fatalf("read %q", got)
	}
	if err := e.write(1, 1, 0, []byte("x"), false); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("unregistered id: %v", err)
	}
	// ESTALE makes the server register again.
	meta.staleOnce.Store(true)
	waitFor(t, "re-registration", func() bool { return meta.regs.Load() >= 2 })
	waitFor(t, "heartbeats after re-registration", func() bool { return meta.beats.Load() >= 6 })
	// The ids are remembered: after a restart with the service down, the
	// server still serves its targets.
	meta.srv.Close()
	e.restart()
	if ids := e.s.TargetIDs(); !slices.Equal(ids, []uint32{10, 11}) {
		t.Fatalf("remembered ids %v", ids)
	}
	if got := e.mustRead(11, 1, 0, 10); string(got) != "hello" {
		t.Fatalf("read %q", got)
	}
}

func TestRegistrationWhileMetaDown(t *testing.T) {
	// Reserve a port, then free it: nothing listens there at first.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	e := newEnv(t, 1, func(c *Config) {
		c.MetaAddr = addr
		c.HeartbeatInterval = 20 * time.Millisecond
	})
	if d := time.Since(start); d > registerWait+2*time.Second {
		t.Fatalf("Open blocked %v while the metadata service was down", d)
	}
	if ids := e.s.TargetIDs(); len(ids) != 0 {
		t.Fatalf("ids %v before registration", ids)
	}
	if err := e.write(10, 1, 0, []byte("x"), false); !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "not served") {
		t.Fatalf("before registration: %v", err)
	}
	meta := startFakeMeta(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := e.s.WaitRegistered(ctx); err != nil {
		t.Fatalf("no registration after the service came up: %v", err)
	}
	waitFor(t, "heartbeats", func() bool { return meta.beats.Load() >= 2 })
	e.mustWrite(10, 1, 0, []byte("x"), false)
}

func TestMetricsEndpoint(t *testing.T) {
	e := newEnv(t, 1, func(c *Config) { c.MetricsAddr = "127.0.0.1:0" })
	e.mustWrite(1, 1, 0, pattern(1, 8192), false)
	e.mustRead(1, 1, 0, 8192)
	e.stop()
	flipBit(t, dataPath(e.dirs[0], 1), 5)
	e.start()
	if _, err := e.read(1, 1, 0, 100); !errors.Is(err, syscall.EIO) {
		t.Fatalf("want EIO, got %v", err)
	}
	e.mustWrite(1, 1, 4096, pattern(2, 4096), false)
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", e.s.MetricsAddr()))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`strata_store_write_bytes_total{target="` + e.dirs[0] + `"} 4096`,
		`strata_store_checksum_errors_total{target="` + e.dirs[0] + `"} 1`,
		`strata_store_request_seconds_count{method="read"} 1`,
		`strata_store_request_errors_total{errno="input/output error",method="read"} 1`,
		`strata_store_free_bytes{target=`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
}

func TestIdentityFile(t *testing.T) {
	e := newEnv(t, 1, nil)
	b, err := os.ReadFile(filepath.Join(e.dirs[0], identityName))
	if err != nil {
		t.Fatal(err)
	}
	var id identity
	if err := json.Unmarshal(b, &id); err != nil || id.Format != targetFormat || len(id.UUID) != 36 || id.Created.IsZero() {
		t.Fatalf("identity %s: %v", b, err)
	}
}

// TestInoCeiling: the identity file records a bound on the target's chunk
// inode numbers before a chunk above it exists, the bound survives a
// restart (and is found by a scan on a target that never recorded one),
// and the metadata service hears it — exactly (one past the highest inode)
// for the chunks made since the start, so that in normal operation it
// never exceeds the service's next inode number.
func TestInoCeiling(t *testing.T) {
	meta := startFakeMeta(t, "127.0.0.1:0")
	e := newEnv(t, 1, func(c *Config) {
		c.MetaAddr = meta.addr
		c.HeartbeatInterval = 20 * time.Millisecond
	})
	idPath := filepath.Join(e.dirs[0], identityName)
	readID := func() identity {
		t.Helper()
		b, err := os.ReadFile(idPath)
		if err != nil {
			t.Fatal(err)
		}
		var id identity
		if err := json.Unmarshal(b, &id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	recorded := func() uint64 { return readID().InoCeiling }
	registered := func() uint64 {
		meta.mu.Lock()
		defer meta.mu.Unlock()
		return meta.lastReg.Targets[0].InoCeiling
	}
	beat := func(want uint64) {
		t.Helper()
		waitFor(t, fmt.Sprintf("a heartbeat with inode ceiling %d", want), func() bool {
			meta.mu.Lock()
			defer meta.mu.Unlock()
			return meta.lastBeatIno == want
		})
	}
	if got := recorded(); got != 1 {
		t.Fatalf("fresh target records ceiling %d, want 1", got)
	}
	if got := registered(); got != 1 {
		t.Fatalf("fresh target registered with ceiling %d, want 1", got)
	}
	e.mustWrite(10, 5, 0, []byte("a"), false)
	if got := recorded(); got != rpc.InoCeilingStep {
		t.Fatalf("after chunk 5 the identity records %d, want %d", got, rpc.InoCeilingStep)
	}
	beat(6) // exact: one past the chunk, not the recorded (rounded) ceiling
	const high = 2*rpc.InoCeilingStep + 7
	e.mustWrite(10, high, 0, []byte("b"), false)
	if got := recorded(); got != 3*rpc.InoCeilingStep {
		t.Fatalf("after chunk %d the identity records %d, want %d", high, got, 3*rpc.InoCeilingStep)
	}
	beat(high + 1)
	e.mustWrite(10, 9, 0, []byte("c"), false) // below: nothing changes
	if got := recorded(); got != 3*rpc.InoCeilingStep {
		t.Fatalf("a lower chunk moved the ceiling to %d", got)
	}

	e.restart()
	if got := registered(); got != 3*rpc.InoCeilingStep {
		t.Fatalf("after a restart the registration says %d, want the recorded %d", got, 3*rpc.InoCeilingStep)
	}
	// A target formatted before ceilings were recorded: found by a scan.
	e.stop()
	id := readID()
	id.InoCeiling = 0
	if err := writeIdentity(e.dirs[0], id); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(readFileString(t, idPath), "ino_ceiling") {
		t.Fatal("the identity file still names a ceiling")
	}
	e.start()
	if got := recorded(); got != 3*rpc.InoCeilingStep {
		t.Fatalf("the scan recorded %d, want %d", got, 3*rpc.InoCeilingStep)
	}
	if got := registered(); got != 3*rpc.InoCeilingStep {
		t.Fatalf("after the scan the registration says %d", got)
	}
	if got := e.mustRead(10, high, 0, 1); string(got) != "b" {
		t.Fatalf("chunk %d reads %q after the scan", high, got)
	}
}

func readFileString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestListChunks: SListChunks lists every chunk of a target once, with its
// data file's size, page by page across fan-out directories; a sidecar
// left alone by a cut removal counts as a chunk; an unknown target is
// ENOENT.
func TestListChunks(t *testing.T) {
	e := newEnv(t, 1, nil)
	want := map[uint64]uint64{1: 10, 2: 20, 0x100: 30, 0x10000: 40, 0xabcd: 50, 0x1234567: 60}
	for ino, n := range want {
		e.mustWrite(1, ino, 0, bytes.Repeat([]byte{'x'}, int(n)), false)
	}
	// A remove cut short: only the sidecar is left.
	dir, base := e.s.targets[0].chunkPath(0x7777)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, base+".sum"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	want[0x7777] = 0
	got, pages := listAll(t, e, 1, 2)
	if !maps.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if pages < 4 {
		t.Fatalf("%d pages of at most 2 chunks for %d chunks", pages, len(want))
	}
	err := e.cl.Call(context.Background(), rpc.SListChunks, &rpc.ListChunksReq{Target: 9}, &rpc.ListChunksResp{})
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("unknown target: %v", err)
	}
}
