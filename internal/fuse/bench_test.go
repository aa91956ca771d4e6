package fuse

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Benchmarks run each workload on a Strata mount and on a local directory
// in the same run, so the numbers can be put side by side:
//
//	go test -run XXX -bench . -benchtime 1x ./internal/fuse/
//
// They report MiB/s, IOPS or ops/s as custom metrics; they assert nothing.

var benchCluster struct {
	once  sync.Once
	mount string
	local string
}

func benchDirs(b *testing.B) map[string]string {
	requireFUSE(b)
	benchCluster.once.Do(func() {
		tc := startClusterNoCleanup(b)
		benchCluster.mount = tc
		benchCluster.local, _ = os.MkdirTemp("", "strata-bench-local")
	})
	if benchCluster.mount == "" {
		b.Skip("no mount")
	}
	return map[string]string{"strata": benchCluster.mount, "local": benchCluster.local}
}

const benchJobs = 4

func forEachFS(b *testing.B, fn func(b *testing.B, dir string)) {
	dirs := benchDirs(b)
	for _, name := range []string{"strata", "local"} {
		b.Run(name, func(b *testing.B) {
			d, err := os.MkdirTemp(dirs[name], "b")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(d)
			fn(b, d)
		})
	}
}

func dropCaches() {
	unix.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

const seqFileBytes = 256 << 20

func seqWrite(b *testing.B, dir string) {
	buf := pattern(5, 1<<20)
	var wg sync.WaitGroup
	for j := 0; j < benchJobs; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("seq%d", j)))
			if err != nil {
				b.Error(err)
				return
			}
			for off := 0; off < seqFileBytes; off += len(buf) {
				if _, err := f.Write(buf); err != nil {
					b.Error(err)
					return
				}
			}
			if err := f.Sync(); err != nil {
				b.Error(err)
			}
			f.Close()
		}()
	}
	wg.Wait()
}

func BenchmarkSeqWrite1M(b *testing.B) {
	forEachFS(b, func(b *testing.B, dir string) {
		b.SetBytes(benchJobs * seqFileBytes)
		for i := 0; i < b.N; i++ {
			seqWrite(b, dir)
		}
	})
}

func BenchmarkSeqRead1M(b *testing.B) {
	forEachFS(b, func(b *testing.B, dir string) {
		seqWrite(b, dir)
		b.SetBytes(benchJobs * seqFileBytes)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dropCaches()
			b.StartTimer()
			var wg sync.WaitGroup
			for j := 0; j < benchJobs; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f, err := os.Open(filepath.Join(dir, fmt.Sprintf("seq%d", j)))
					if err != nil {
						b.Error(err)
						return
					}
					defer f.Close()
					buf := make([]byte, 1<<20)
					total := 0
					for {
						n, err := f.Read(buf)
						total += n
						if err != nil || n == 0 {
							break
						}
					}
					if total != seqFileBytes {
						b.Errorf("read %d bytes", total)
					}
				}()
			}
			wg.Wait()
		}
	})
}

const randFileBytes = 64 << 20

func randIO(b *testing.B, write bool) {
	forEachFS(b, func(b *testing.B, dir string) {
		fds := make([]int, benchJobs)
		for j := range fds {
			p := filepath.Join(dir, fmt.Sprintf("rand%d", j))
			f, _ := os.Create(p)
			f.Write(pattern(1, randFileBytes))
			f.Close()
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_DIRECT, 0)
			if err != nil {
				b.Fatal(err)
			}
			fds[j] = fd
			defer unix.Close(fd)
		}
		var ops atomic.Int64
		b.ResetTimer()
		var wg sync.WaitGroup
		per := b.N/benchJobs + 1
		for j := 0; j < benchJobs; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := alignedBuf(b, 4096)
				rng := rand.New(rand.NewSource(int64(j)))
				for i := 0; i < per; i++ {
					off := int64(rng.Intn(randFileBytes/4096)) * 4096
					var err error
					if write {
						_, err = unix.Pwrite(fds[j], buf, off)
					} else {
						_, err = unix.Pread(fds[j], buf, off)
					}
					if err != nil {
						b.Error(err)
						return
					}
					ops.Add(1)
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(ops.Load())/b.Elapsed().Seconds(), "IOPS")
	})
}

func BenchmarkRandWrite4KDirect(b *testing.B) { randIO(b, true) }
func BenchmarkRandRead4KDirect(b *testing.B)  { randIO(b, false) }

// BenchmarkMeta: 4 goroutines, each in its own directory, create then stat
// then unlink b.N empty files.
func BenchmarkMeta(b *testing.B) {
	for _, phase := range []string{"create", "stat", "unlink"} {
		b.Run(phase, func(b *testing.B) {
			forEachFS(b, func(b *testing.B, dir string) {
				n := b.N/benchJobs + 1
				for j := 0; j < benchJobs; j++ {
					os.Mkdir(filepath.Join(dir, fmt.Sprint(j)), 0o755)
				}
				run := func(op func(p string) error) {
					var wg sync.WaitGroup
					for j := 0; j < benchJobs; j++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := 0; i < n; i++ {
								if err := op(filepath.Join(dir, fmt.Sprint(j), fmt.Sprintf("f%07d", i))); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
				}
				create := func(p string) error {
					fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY, 0o644)
					if err == nil {
						unix.Close(fd)
					}
					return err
				}
				stat := func(p string) error { var st unix.Stat_t; return unix.Stat(p, &st) }
				unlink := func(p string) error { return unix.Unlink(p) }
				switch phase {
				case "create":
					b.ResetTimer()
					run(create)
				case "stat":
					run(create)
					b.ResetTimer()
					run(stat)
				case "unlink":
					run(create)
					b.ResetTimer()
					run(unlink)
				}
				b.ReportMetric(float64(n*benchJobs)/b.Elapsed().Seconds(), "ops/s")
			})
		})
	}
}
