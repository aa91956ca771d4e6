package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// A close under `sync` (and an fsync) whose file's bytes are all still
// buffered sends them as a synced write (WriteReq.Sync) and makes no
// SSyncStat: the store syncs the chunk after the write and answers its
// space, which the size commit reports without an SChunkStat. The chunks
// are durable (no unsynced chunk on any target) and the size is
// committed. A slot with a write in flight at the close is synced by
// SSyncStat as before.
func TestSyncCloseSyncsThroughTheWrite(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 1, metrics: true})
	c := tc.client(nil) // the default policy: sync
	ctx := context.Background()
	calls := func() (w, s, st uint64) {
		return c.Calls("store", rpc.SWrite), c.Calls("store", rpc.SSyncStat) + c.Calls("store", rpc.SSync), c.Calls("store", rpc.SChunkStat)
	}
	check := func(what string, f *File, size, space uint64, wantWrites uint64, w0, s0, st0 uint64) {
		t.Helper()
		w, s, st := calls()
		if w-w0 != wantWrites || s != s0 || st != st0 {
			t.Fatalf("%s: %d writes, %d chunk syncs, %d chunk stats; want %d, 0, 0", what, w-w0, s-s0, st-st0, wantWrites)
		}
		if n := storeGaugeSum(t, tc, "strata_store_unsynced_chunks"); n != 0 {
			t.Fatalf("%s: %v chunks unsynced on the targets after it returned", what, n)
		}
		a, err := c.GetAttr(ctx, f.Ino())
		if err != nil {
			t.Fatal(err)
		}
		if a.Size != size || !a.BlocksKnown || a.Blocks*512 < space {
			t.Fatalf("%s: size %d, st_blocks %d (known %v); want size %d and at least %d bytes of space", what, a.Size, a.Blocks, a.BlocksKnown, size, space)
		}
	}

	// A small file: one write, one slot.
	f, err := c.CreateOpen(ctx, 1, "small", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("s"), 3901)
	if _, err := f.WriteAt(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	w0, s0, st0 := calls()
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	check("close of a 3,901-byte file", f, 3901, 3901, 1, w0, s0, st0)

	// fsync after more writes over both slots (1 MiB stripes, two
	// targets): two synced writes.
	if _, err := f.WriteAt(ctx, data, 3901); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, data, 1<<20); err != nil {
		t.Fatal(err)
	}
	w0, s0, st0 = calls()
	if err := f.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	check("fsync after writes to both slots", f, 1<<20+3901, 3*3901, 2, w0, s0, st0)
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// What was written reads back through a new handle of another client.
	r, err := tc.client(nil).Open(ctx, f.Ino(), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release(ctx)
	got := make([]byte, len(data))
	if _, err := r.ReadAt(ctx, got, 1<<20); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back at 1 MiB: %v, equal %v", err, bytes.Equal(got, data))
	}

	// A slot written and already sent (its write no longer buffered):
	// the close syncs it with SSyncStat.
	g, err := c.CreateOpen(ctx, 1, "sent", 0o644, 0, 0, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release(ctx)
	if _, err := g.WriteAt(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.in.drain(ctx); err != nil {
		t.Fatal(err)
	}
	_, s0, _ = calls()
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, s, _ := calls(); s-s0 != 1 {
		t.Fatalf("close of a file whose write was sent before: %d chunk syncs, want 1", s-s0)
	}
}

// storeGaugeSum adds up a gauge of every store's /metrics over its labels.
func storeGaugeSum(t *testing.T, tc *testCluster, name string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{[^}]*\} (\S+)$`)
	sum := 0.0
	for _, body := range storesMetrics(t, tc) {
		for _, m := range re.FindAllSubmatch(body, -1) {
			v, err := strconv.ParseFloat(string(m[1]), 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sum += v
		}
	}
	return sum
}

// storesMetrics reads every store's /metrics page.
func storesMetrics(t *testing.T, tc *testCluster) [][]byte {
	t.Helper()
	var out [][]byte
	for _, s := range tc.stores {
		resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, body)
	}
	return out
}
