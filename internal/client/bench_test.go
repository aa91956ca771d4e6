package client

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
)

// BenchmarkCreate measures the library's create+open+release of empty
// files with 4 goroutines (no FUSE): the metadata service's rate as this
// client sees it.
func BenchmarkCreate(b *testing.B) {
	tc := startCluster(b, clusterOpts{stores: 2, targets: 2})
	c := tc.client(nil)
	const jobs = 4
	var dirs [jobs]uint64
	for j := range dirs {
		a, err := c.Mkdir(bg, RootIno, fmt.Sprint(j), 0o755, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		dirs[j] = a.Ino
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for j := 0; j < jobs; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < b.N/jobs+1; i++ {
				f, err := c.CreateOpen(bg, dirs[j], fmt.Sprintf("f%d", i), 0o644, 0, 0, syscall.O_WRONLY)
				if err != nil {
					b.Error(err)
					return
				}
				f.Release(bg)
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
}

// BenchmarkGetAttr measures stat-like calls with 4 goroutines.
func BenchmarkGetAttr(b *testing.B) {
	tc := startCluster(b, clusterOpts{stores: 1, targets: 1})
	c := tc.client(nil)
	b.ResetTimer()
	var wg sync.WaitGroup
	for j := 0; j < 4; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < b.N/4+1; i++ {
				if _, err := c.GetAttr(bg, RootIno); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
