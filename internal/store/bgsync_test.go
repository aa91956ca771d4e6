package store

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

func isDirty(t *testing.T, dir string, ino uint64) bool {
	t.Helper()
	return chunkFlags(t, dir, ino)&flagDirty != 0
}

// Chunks written and never synced by anyone — open ones and ones evicted
// from the open-chunk cache — become clean within the background interval
// with no SSync, and the target's unsynced figures and gauges go from
// what was written to zero.
func TestBackgroundRoundCleansDirtyChunks(t *testing.T) {
	e := newEnv(t, 1, func(c *Config) {
		c.SyncInterval = 200 * time.Millisecond
		c.MaxOpenChunks = 4
		c.MetricsAddr = "127.0.0.1:0"
	})
	const n = 10
	for ino := uint64(1); ino <= n; ino++ {
		e.mustWrite(1, ino, 0, pattern(int(ino), 3901), false)
	}
	tg := e.s.targets[0]
	if f := tg.unsyncedFigures(time.Now()); f.Chunks > n || f.Bytes > n*3901 {
		t.Fatalf("figures after %d writes: %+v", n, f)
	}
	waitFor(t, "the background round to clean every chunk", func() bool {
		for ino := uint64(1); ino <= n; ino++ {
			if isDirty(t, e.dirs[0], ino) {
				return false
			}
		}
		return true
	})
	if f := tg.unsyncedFigures(time.Now()); f != (rpc.TargetUnsynced{}) {
		t.Fatalf("figures after the round: %+v, want zero", f)
	}
	if len(tg.oursList()) != 0 {
		t.Fatalf("evicted chunks still recorded dirty: %v", tg.oursList())
	}
	body := scrapeMetrics(t, e.s.MetricsAddr())
	for _, want := range []string{
		`strata_store_request_seconds_count{method="sync"} 0`, // no SSync: the round did it
		`strata_store_request_seconds_count{method="sync_stat"} 0`,
		`strata_store_unsynced_chunks{target="` + e.dirs[0] + `"} 0`,
		`strata_store_unsynced_bytes{target="` + e.dirs[0] + `"} 0`,
		`strata_store_oldest_unsynced_seconds{target="` + e.dirs[0] + `"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

func scrapeMetrics(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", addr))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The gauges show what is written and not synced.
func TestUnsyncedGauges(t *testing.T) {
	e := newEnv(t, 1, func(c *Config) { c.MetricsAddr = "127.0.0.1:0" })
	e.mustWrite(1, 1, 0, pattern(1, 3901), false)
	e.mustWrite(1, 2, 0, pattern(2, 100), false)
	e.mustWrite(1, 2, 100, pattern(3, 100), false)
	body := scrapeMetrics(t, e.s.MetricsAddr())
	for _, want := range []string{
		`strata_store_unsynced_chunks{target="` + e.dirs[0] + `"} 2`,
		`strata_store_unsynced_bytes{target="` + e.dirs[0] + `"} 4101`,
		`strata_store_oldest_unsynced_seconds{target="` + e.dirs[0] + `"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// A chunk rewritten while its round syncs stays dirty (and counted), and
// the next round cleans it; the write is not held up by the round.
func TestRoundLeavesChunkRewrittenDuringItDirty(t *testing.T) {
	if !syncfsReportsErrors {
		t.Skip("syncfs reports no errors on this kernel: no rounds")
	}
	old := groupSyncDirtyBound.Swap(1 << 62) // the machine's dirty memory is not this test's
	t.Cleanup(func() { groupSyncDirtyBound.Store(old) })
	e := newEnv(t, 1, nil)
	e.mustWrite(1, 7, 0, pattern(7, 3901), false)
	var hooked atomic.Int32
	rewrote := make(chan error, 1)
	hook := func() {
		if hooked.Add(1) != 1 {
			return
		}
		done := make(chan error, 1)
		go func() { done <- e.write(1, 7, 3901, pattern(8, 1000), false) }()
		select {
		case err := <-done:
			rewrote <- err
		case <-time.After(10 * time.Second):
			rewrote <- fmt.Errorf("a write waited 10 s for the background round")
		}
	}
	testHookSyncfs.Store(&hook)
	t.Cleanup(func() { testHookSyncfs.Store(nil) })
	tg := e.s.targets[0]
	if n, more, err := e.s.syncRound(tg); err != nil || more {
		t.Fatalf("round: %d synced, more %v, %v", n, more, err)
	}
	select { // the hook runs inside a syncfs round; a round without one never feeds rewrote
	case err := <-rewrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the round never reached its syncfs (hook not called)")
	}
	if !isDirty(t, e.dirs[0], 7) {
		t.Fatal("a chunk written during its round was marked clean")
	}
	if f := tg.unsyncedFigures(time.Now()); f.Chunks != 1 || f.Bytes != 3901+1000 {
		t.Fatalf("figures after the round: %+v, want 1 chunk of 4901 bytes", f)
	}
	if _, _, err := e.s.syncRound(tg); err != nil {
		t.Fatal(err)
	}
	if isDirty(t, e.dirs[0], 7) {
		t.Fatal("the next round left the chunk dirty")
	}
	if f := tg.unsyncedFigures(time.Now()); f != (rpc.TargetUnsynced{}) {
		t.Fatalf("figures after the second round: %+v", f)
	}
	if got := e.mustRead(1, 7, 0, 8192); string(got) != string(append(pattern(7, 3901), pattern(8, 1000)...)) {
		t.Fatal("chunk content wrong after the rounds")
	}
}

// A round takes the oldest chunks first and at most its bound; the rest
// waits for the next round.
func TestRoundIsBounded(t *testing.T) {
	e := newEnv(t, 1, nil)
	for ino := uint64(1); ino <= 5; ino++ {
		e.mustWrite(1, ino, 0, pattern(int(ino), 4096), false)
		time.Sleep(2 * time.Millisecond) // distinct dirty times
	}
	tg := e.s.targets[0]
	inos, more := tg.unsyncedBatch(3, 1<<30)
	if !more || fmt.Sprint(inos) != "[1 2 3]" {
		t.Fatalf("batch of 3: %v, more %v", inos, more)
	}
	inos, more = tg.unsyncedBatch(10, 2*4096)
	if !more || fmt.Sprint(inos) != "[1 2]" {
		t.Fatalf("batch of 8 KiB: %v, more %v", inos, more)
	}
	inos, more = tg.unsyncedBatch(10, 1)
	if !more || fmt.Sprint(inos) != "[1]" {
		t.Fatalf("batch of 1 byte: %v, more %v (the first chunk goes whatever its size)", inos, more)
	}
	inos, more = tg.unsyncedBatch(10, 1<<30)
	if more || len(inos) != 5 {
		t.Fatalf("batch of all: %v, more %v", inos, more)
	}
}

// A clean stop syncs the chunks still dirty (open and evicted) and says so
// in one line.
func TestCloseSyncsDirtyChunksWithOneLine(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, 1, func(c *Config) {
		c.MaxOpenChunks = 2
		c.SyncInterval = time.Hour // running, but no round before the stop
	})
	for ino := uint64(1); ino <= 6; ino++ {
		e.mustWrite(1, ino, 0, pattern(int(ino), 1000), false)
	}
	e.stop()
	for ino := uint64(1); ino <= 6; ino++ {
		if isDirty(t, e.dirs[0], ino) {
			t.Fatalf("chunk %d still dirty after a clean stop", ino)
		}
	}
	var closing []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "storage server closed") {
			closing = append(closing, l)
		}
	}
	if len(closing) != 1 || !strings.Contains(closing[0], "chunks=6") || !strings.Contains(closing[0], "bytes=6000") {
		t.Fatalf("closing lines %q, want one saying chunks=6 bytes=6000", closing)
	}
	if n := strings.Count(logs.String(), "level=WARN") + strings.Count(logs.String(), "level=ERROR"); n != 0 {
		t.Fatalf("%d warnings or errors at a clean stop:\n%s", n, logs.String())
	}
}

// --sync-interval 0: no background rounds; dirty chunks stay dirty until
// a sync or the stop (a server with rounds, alongside, cleans its own).
func TestSyncIntervalZeroDisablesRounds(t *testing.T) {
	off := newEnv(t, 1, nil) // SyncInterval 0
	on := newEnv(t, 1, func(c *Config) { c.SyncInterval = 20 * time.Millisecond })
	off.mustWrite(1, 1, 0, pattern(1, 3901), false)
	on.mustWrite(1, 1, 0, pattern(1, 3901), false)
	waitFor(t, "the server with rounds to clean its chunk", func() bool { return !isDirty(t, on.dirs[0], 1) })
	time.Sleep(200 * time.Millisecond) // ten intervals of the other
	if !isDirty(t, off.dirs[0], 1) {
		t.Fatal("a chunk became clean with the background sync disabled")
	}
	if f := off.s.targets[0].unsyncedFigures(time.Now()); f.Chunks != 1 || f.Bytes != 3901 {
		t.Fatalf("figures: %+v", f)
	}
	if DefaultConfig().SyncInterval != DefaultSyncInterval {
		t.Fatalf("default sync interval %v", DefaultConfig().SyncInterval)
	}
	bad := DefaultConfig()
	bad.Targets = []string{t.TempDir()}
	bad.SyncInterval = -time.Second
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "sync interval") {
		t.Fatalf("negative sync interval: %v", err)
	}
}

// The unsynced figures travel with the heartbeats to a real metadata
// service, whose cluster status shows them per target, moving from what
// was written to zero after a background round.
func TestUnsyncedFiguresReachClusterStatus(t *testing.T) {
	dir := t.TempDir()
	m, err := meta.Open(meta.Config{DataDir: filepath.Join(dir, "meta"), ListenAddr: "127.0.0.1:0", ClusterKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e := newEnv(t, 2, func(c *Config) {
		c.MetaAddr = m.Addr()
		c.HeartbeatInterval = 20 * time.Millisecond
	})
	cl := transport.NewClient(m.Addr(), transport.ClientConfig{Key: testKey})
	defer cl.Close()
	status := func() map[uint32]rpc.TargetUnsynced {
		var st rpc.ClusterStatusResp
		if err := cl.Call(context.Background(), rpc.MClusterStatus, &rpc.Empty{}, &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Unsynced) != len(st.Targets) {
			t.Fatalf("%d unsynced figures for %d targets", len(st.Unsynced), len(st.Targets))
		}
		out := map[uint32]rpc.TargetUnsynced{}
		for i, tg := range st.Targets {
			out[tg.ID] = st.Unsynced[i]
		}
		return out
	}
	ids := e.s.TargetIDs()
	if len(ids) != 2 {
		t.Fatalf("target ids %v", ids)
	}
	for ino := uint64(1); ino <= 3; ino++ {
		e.mustWrite(ids[0], ino, 0, pattern(int(ino), 3901), false)
	}
	var got rpc.TargetUnsynced
	waitFor(t, "the status to show 3 unsynced chunks", func() bool {
		got = status()[ids[0]]
		return got.Chunks == 3
	})
	if got.Bytes != 3*3901 || got.OldestMs < 0 {
		t.Fatalf("status figures %+v, want 3 chunks of 3901 bytes", got)
	}
	if other := status()[ids[1]]; other != (rpc.TargetUnsynced{}) {
		t.Fatalf("the untouched target shows %+v", other)
	}
	if _, _, err := e.s.syncRound(e.s.targets[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the status to show nothing unsynced", func() bool { return status()[ids[0]] == (rpc.TargetUnsynced{}) })
}
