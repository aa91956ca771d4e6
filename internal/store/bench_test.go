package store

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Benchmarks go through a real transport.Client and Server over loopback into the
// page cache of the temp directory's file system. Each parallel worker has
// its own chunk (as the stripes of an N-to-N workload would).
//
//	go test -run XXX -bench . -benchtime 2s ./internal/store/

const benchSpan = 64 << 20 // bytes per chunk the workers cycle over

func benchEnv(b *testing.B) *env { return benchEnvIn(b, b.TempDir()) }

// benchEnvIn is benchEnv on target directory dir.
func benchEnvIn(b *testing.B, dir string) *env {
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(discard{}, nil)))
	b.Cleanup(func() { slog.SetDefault(old) })
	e := &env{}
	e.cfg = DefaultConfig()
	e.cfg.Targets = []string{dir}
	e.cfg.ClusterKey = testKey
	s, err := Open(e.cfg)
	if err != nil {
		b.Fatal(err)
	}
	e.s = s
	e.cl = transport.NewClient(s.Addr(), transport.ClientConfig{Key: testKey, Conns: 4})
	b.Cleanup(func() { e.cl.Close(); s.Close() })
	return e
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

var benchIno atomic.Uint64

func benchIO(b *testing.B, size int, random, write bool) {
	e := benchEnv(b)
	ctx := context.Background()
	// Prefill for reads.
	nworkers := 4 * 2 // RunParallel uses GOMAXPROCS × parallelism goroutines
	b.SetParallelism(4)
	inos := make(chan uint64, 64)
	for i := 0; i < 64; i++ {
		ino := benchIno.Add(1)
		inos <- ino
		if !write && i < nworkers*2 {
			buf := make([]byte, 1<<20)
			for off := 0; off < benchSpan; off += len(buf) {
				if err := e.cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Off: uint64(off), Data: buf}, &rpc.Empty{}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ino := <-inos
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = byte(i)
		}
		rng := rand.New(rand.NewPCG(ino, 1))
		off := 0
		var resp rpc.ReadResp
		for pb.Next() {
			if random {
				off = rng.IntN(benchSpan/size) * size
			} else {
				off = (off + size) % benchSpan
			}
			var err error
			if write {
				err = e.cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Off: uint64(off), Data: buf}, &rpc.Empty{})
			} else {
				err = e.cl.Call(ctx, rpc.SRead, &rpc.ReadReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Off: uint64(off), Len: uint32(size)}, &resp)
				if err == nil && len(resp.Data) != size {
					b.Errorf("short read %d", len(resp.Data))
				}
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkSeqWrite1M(b *testing.B)  { benchIO(b, 1<<20, false, true) }
func BenchmarkSeqRead1M(b *testing.B)   { benchIO(b, 1<<20, false, false) }
func BenchmarkRandWrite4K(b *testing.B) { benchIO(b, 4<<10, true, true) }
func BenchmarkRandRead4K(b *testing.B)  { benchIO(b, 4<<10, true, false) }

// BenchmarkChunkWrite4K and BenchmarkChunkRead4K measure the store's own
// cost per 4 KiB request, without rpc: what the data path adds to pwrite
// and pread.
func BenchmarkChunkWrite4K(b *testing.B) { benchChunk(b, true) }
func BenchmarkChunkRead4K(b *testing.B)  { benchChunk(b, false) }

func benchChunk(b *testing.B, write bool) {
	e := benchEnv(b)
	t := e.s.targets[0]
	c, err := e.s.cache.get(t, 1, true)
	if err != nil {
		b.Fatal(err)
	}
	defer e.s.cache.release(c)
	buf := make([]byte, 4096)
	const span = 16 << 20
	for off := 0; off < span; off += 1 << 20 {
		if err := c.write(context.Background(), e.s, int64(off), make([]byte, 1<<20)); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := int64(rng.IntN(span/4096) * 4096)
		if write {
			err = c.write(context.Background(), e.s, off, buf)
		} else {
			var r *readResp
			r, err = c.read(e.s, off, 4096, nil)
			r.Release()
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSmallChunkCreate creates chunks of 3,901 bytes (no sync) for
// consecutive inode numbers from four goroutines on a fresh target of each
// chunk layout and chunk sums form: layout 1 makes one or two fan-out
// directories per chunk, layout 2 one per 256; sums 1 a sidecar per chunk,
// sums 2 none (the sums in the data file's attribute). cpu-ns/op is the
// whole process's CPU time (user and system: the mkdirs are the kernel's)
// per chunk, which the load of a shared machine inflates less than the
// wall time.
//
//	go test -run XXX -bench SmallChunkCreate -benchtime 5000x -count 3 ./internal/store/
func BenchmarkSmallChunkCreate(b *testing.B) {
	for _, c := range []struct {
		lay  chunkLayout
		sums int
	}{{layoutLowBytes, sumsSidecar}, {layoutRuns, sumsSidecar}, {layoutRuns, sumsInline}} {
		b.Run(fmt.Sprintf("layout=%d/sums=%d", c.lay, c.sums), func(b *testing.B) {
			dir := b.TempDir()
			id := identity{Format: targetFormat, UUID: newUUID(), Created: time.Now().UTC(), ChunkLayout: int(c.lay), ChunkSums: c.sums}
			if err := writeIdentity(dir, id); err != nil {
				b.Fatal(err)
			}
			e := benchEnvIn(b, dir)
			ctx := context.Background()
			data := pattern(1, 3901)
			var next atomic.Uint64
			next.Store(1 << 20)
			b.SetParallelism(2)
			var start, end syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &start)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ino := next.Add(1)
					if err := e.cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: 1, Ino: ino}, Data: data}, &rpc.Empty{}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			syscall.Getrusage(syscall.RUSAGE_SELF, &end)
			cpu := time.Duration(end.Utime.Nano() + end.Stime.Nano() - start.Utime.Nano() - start.Stime.Nano())
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
