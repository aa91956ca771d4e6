package fuse

import (
	"bufio"
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rpcCounts reads the metadata service's requests by method and the
// storage servers' by method from their /metrics, summed.
func (tc *testCluster) rpcCounts() map[string]float64 {
	tc.t.Helper()
	out := map[string]float64{}
	scrape := func(addr, metric, prefix string) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			tc.t.Fatalf("metrics: %v", err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, metric+"{") {
				continue
			}
			i := strings.Index(line, `method="`)
			j := strings.LastIndexByte(line, ' ')
			if i < 0 || j < 0 {
				continue
			}
			name := line[i+len(`method="`):]
			name = name[:strings.IndexByte(name, '"')]
			v, err := strconv.ParseFloat(line[j+1:], 64)
			if err != nil {
				tc.t.Fatalf("metrics line %q: %v", line, err)
			}
			out[prefix+name] += v
		}
	}
	scrape(tc.meta.MetricsAddr(), "strata_meta_ops_total", "meta.")
	for _, s := range tc.stores {
		scrape(s.MetricsAddr(), "strata_store_request_seconds_count", "store.")
	}
	return out
}

// rpcsOf counts the requests fn makes, by "meta.METHOD" and
// "store.METHOD" (heartbeats left out).
func (tc *testCluster) rpcsOf(fn func()) map[string]int {
	tc.t.Helper()
	before := tc.rpcCounts()
	fn()
	after := tc.rpcCounts()
	d := map[string]int{}
	for k, v := range after {
		if n := int(v - before[k]); n > 0 && !strings.HasSuffix(k, "_heartbeat") {
			d[k] = n
		}
	}
	return d
}

// TestSmallFileReadRPCs: stat, open, read and close of a file smaller
// than a stripe, from a mount that has not seen it, is one lookup, one
// open (a getattr) and one read of one storage server, which the open
// starts in parallel with its getattr (client/smallread.go): the
// attributes come from the lookup, and read-ahead asks for no more than
// the file holds (it used to fetch the file's bytes a second time).
func TestSmallFileReadRPCs(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 2, 2)
	a, _ := tc.mount(nil)
	b, _ := tc.mount(nil)
	data := pattern(7, 3901)
	must(t, os.MkdirAll(filepath.Join(a, "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(a, "d", "f"), data, 0o644))
	if _, err := os.Stat(filepath.Join(b, "d")); err != nil { // the directory's lookup is not counted
		t.Fatal(err)
	}
	name := filepath.Join(b, "d", "f")
	var got []byte
	calls := tc.rpcsOf(func() {
		st, err := os.Stat(name)
		if err != nil || st.Size() != int64(len(data)) {
			t.Fatalf("stat: %v %v", st, err)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		n, err := f.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = buf[:n]
		must(t, f.Close())
	})
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the file's %d", len(got), len(data))
	}
	t.Logf("requests: %v", calls)
	if calls["store.read"] != 1 {
		t.Errorf("%d storage reads, want 1: %v", calls["store.read"], calls)
	}
	for k, n := range calls {
		if strings.HasPrefix(k, "store.") && k != "store.read" {
			t.Errorf("%d %s requests, want none: %v", n, k, calls)
		}
	}
	// The first read after a write moves atime (relatime): noted for the
	// client's next batch (a second away), not a setattr of its own.
	for k, n := range calls {
		if k == "meta.lookup" && n != 1 || k == "meta.getattr" && n > 1 ||
			strings.HasPrefix(k, "meta.") && k != "meta.lookup" && k != "meta.getattr" && k != "meta.set_atimes" {
			t.Errorf("want one lookup and at most one getattr (open's): %v", calls)
			break
		}
	}
}
