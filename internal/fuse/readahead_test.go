package fuse

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/client"
)

// readOps is the client's count of READ requests served.
func readOps(t *testing.T, c *client.Client) float64 {
	t.Helper()
	return clientOps(t, c, "read")
}

// TestKernelReadAhead: the mount raises the kernel's read-ahead window, so
// a sequential reader's pages arrive in 1 MiB READs instead of the
// kernel's default 128 KiB ones; with a negative option the kernel's
// window stays.
func TestKernelReadAhead(t *testing.T) {
	requireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("skipping: setting a mount's read-ahead needs root")
	}
	tc := startCluster(t, 1, 2)
	const size = 32 << 20
	data := pattern(7, size)
	for _, tt := range []struct {
		name   string
		opts   Options
		wantKB string
		maxOps float64 // READ requests for the file, at most
		minOps float64
	}{
		{"default", Options{}, "1024", size / (1 << 20) * 2, 1},
		{"kept", Options{KernelReadAhead: -1}, "128", size / (128 << 10) * 2, size/(1<<20)*2 + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			writer, _ := tc.mount(nil)
			reader, rc := tc.mountWith(nil, tt.opts)
			p, err := bdiPath(reader)
			must(t, err)
			kb, err := os.ReadFile(p)
			must(t, err)
			if got := strings.TrimSpace(string(kb)); got != tt.wantKB {
				t.Fatalf("read_ahead_kb of the mount = %s, want %s", got, tt.wantKB)
			}
			// Written through another mount, so the reader's page cache
			// holds none of it and every page comes through READ.
			must(t, os.WriteFile(filepath.Join(writer, "f"), data, 0o644))
			before := readOps(t, rc)
			got, err := os.ReadFile(filepath.Join(reader, "f"))
			must(t, err)
			if !bytes.Equal(got, data) {
				t.Fatal("read back differs")
			}
			ops := readOps(t, rc) - before
			t.Logf("%d MiB read in %.0f READ requests", size>>20, ops)
			if ops > tt.maxOps || ops < tt.minOps {
				t.Fatalf("%.0f READ requests for %d MiB, want %.0f..%.0f", ops, size>>20, tt.minOps, tt.maxOps)
			}
		})
	}
}
