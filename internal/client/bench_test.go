package client

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
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

// BenchmarkSmallRead measures what a small file's stat + open + read +
// close costs the library (no FUSE) in `strata up`'s shape — metadata
// service, stores and client in one process —, 4 goroutines over 4 × 2,000
// files of 3,901 bytes, more than the stores keep open: lookup, open (its
// read started beside the getattr, smallread.go), read, flush, release.
// cpu-ns/op is the process's CPU time per file.
//
//	go test -run XXX -bench SmallRead -benchtime 20000x -count 3 ./internal/client/
func BenchmarkSmallRead(b *testing.B) {
	tc := startCluster(b, clusterOpts{stores: 2, targets: 2})
	c := tc.client(nil)
	const jobs, files = 4, 2000
	dir, err := c.Mkdir(bg, RootIno, "d", 0o755, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 3901)
	for i := range data {
		data[i] = byte(i)
	}
	for i := range jobs * files {
		f, err := c.CreateOpen(bg, dir.Ino, fmt.Sprint(i), 0o644, 0, 0, syscall.O_WRONLY)
		if err == nil {
			_, err = f.WriteAt(bg, data, 0)
		}
		if err == nil {
			err = f.Release(bg)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	var start, end syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &start)
	b.ResetTimer()
	var wg sync.WaitGroup
	for j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 128<<10)
			for i := 0; i < b.N/jobs+1; i++ {
				name := fmt.Sprint(j*files + i%files)
				a, err := c.Lookup(bg, dir.Ino, name)
				if err != nil {
					b.Error(err)
					return
				}
				f, err := c.Open(bg, a.Ino, syscall.O_RDONLY)
				if err != nil {
					b.Error(err)
					return
				}
				d, err := f.ReadBuffers(bg, buf, 0)
				if err == nil && d.Len() != len(data) {
					err = fmt.Errorf("read %d bytes of %s, want %d", d.Len(), name, len(data))
				}
				d.Release()
				if err == nil {
					err = f.Flush(bg)
				}
				if rerr := f.Release(bg); err == nil {
					err = rerr
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &end)
	cpu := time.Duration(end.Utime.Nano() + end.Stime.Nano() - start.Utime.Nano() - start.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "files/s")
}
