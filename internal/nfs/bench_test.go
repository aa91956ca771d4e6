package nfs_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// BenchmarkWrite1MiB and BenchmarkRead1MiB move 1 MiB per NFS call through
// a gateway on a cluster in this process (UNSTABLE writes, one COMMIT at
// the end; reads of what was written).
func BenchmarkWrite1MiB(b *testing.B) { benchIO(b, false) }
func BenchmarkRead1MiB(b *testing.B)  { benchIO(b, true) }

func benchIO(b *testing.B, read bool) {
	cl := startCluster(b)
	g := cl.startGateway("/=rw,no_root_squash,clients=127.0.0.1")
	f := fs{b, g.dial(b, "", 0, 0)}
	root := mount(b, f.c, "/")
	st, file := f.create(root, "bench", xdr.GUARDED, 0o644, 0)
	if st != xdr.NFS3_OK {
		b.Fatal(st)
	}
	data := randomBytes(b, 1<<20)
	const span = 256 // MiB written before the reads wrap around
	if read {
		for i := 0; i < span; i++ {
			if st, _ := f.write(file, uint64(i)<<20, data, xdr.UNSTABLE); st != xdr.NFS3_OK {
				b.Fatal(st)
			}
		}
		f.commit(file)
	}
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := uint64(i%span) << 20
		if read {
			if st, p, _ := f.read(file, off, 1<<20); st != xdr.NFS3_OK || len(p) != 1<<20 {
				b.Fatalf("read: %v %d", st, len(p))
			}
		} else if st, _ := f.write(file, off, data, xdr.UNSTABLE); st != xdr.NFS3_OK {
			b.Fatal(st)
		}
	}
	if !read {
		if st, _ := f.commit(file); st != xdr.NFS3_OK {
			b.Fatal(st)
		}
	}
}

// The bench's NFS row (internal/bench/peers, nfsdrive.go) in this process,
// for profiles: 4 streams, each its own connection and file or directory,
// one call at a time each. Reported per NFS call: the client library's
// metadata and store calls.
const benchStreams = 4

func BenchmarkStreamsGetattr(b *testing.B) { benchStreams4(b, "getattr") }
func BenchmarkStreamsRemove(b *testing.B)  { benchStreams4(b, "remove") }

// BenchmarkStreamsRemoveAsync is REMOVE on an async export: without the
// wait for the metadata log's sync.
func BenchmarkStreamsRemoveAsync(b *testing.B) { benchStreams4(b, "remove-async") }
func BenchmarkStreamsRandRead(b *testing.B)    { benchStreams4(b, "randread") }
func BenchmarkStreamsRandWrite(b *testing.B)   { benchStreams4(b, "randwrite") }

func benchStreams4(b *testing.B, op string) {
	cl := startCluster(b)
	cl.cfg.ReadAheadBytes = 0 // as strata nfs and strata up --nfs
	cl.c = cl.newClient()
	export := "/=rw,sync,no_root_squash,clients=127.0.0.1"
	if op == "remove-async" {
		op, export = "remove", "/=rw,async,no_root_squash,clients=127.0.0.1"
	}
	g := cl.startGateway(export)
	root := mount(b, g.dial(b, "", 0, 0), "/")
	const fileBytes = 16 << 20
	type stream struct {
		c         *nfstest.Client
		dir, file []byte
		names     []string
		rng       *rand.Rand
		block     []byte
	}
	ss := make([]*stream, benchStreams)
	per := (b.N + benchStreams - 1) / benchStreams
	for i := range ss {
		s := &stream{c: g.dial(b, "", 0, 0), rng: rand.New(rand.NewPCG(uint64(i), 7)), block: make([]byte, 4096)}
		var err error
		if s.dir, err = s.c.Mkdir(root, fmt.Sprintf("s%d", i), 0o755); err != nil {
			b.Fatal(err)
		}
		if s.file, err = s.c.Create(s.dir, "data", 0o644); err != nil {
			b.Fatal(err)
		}
		if op == "randread" || op == "randwrite" {
			blk := make([]byte, 1<<20)
			for off := 0; off < fileBytes; off += len(blk) {
				if _, err := s.c.Write(s.file, uint64(off), blk, xdr.UNSTABLE); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.c.Commit(s.file); err != nil {
				b.Fatal(err)
			}
		}
		if op == "remove" {
			for k := 0; k < per; k++ {
				s.names = append(s.names, fmt.Sprintf("f%d", k))
				if _, err := s.c.Create(s.dir, s.names[k], 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
		ss[i] = s
	}
	counted := []struct {
		svc string
		m   rpc.Method
	}{{"meta", rpc.MGetAttr}, {"meta", rpc.MLookup}, {"meta", rpc.MUnlink}, {"meta", rpc.MSync}, {"meta", rpc.MCommitSize},
		{"store", rpc.SRead}, {"store", rpc.SWrite}}
	before := make([]uint64, len(counted))
	for i, k := range counted {
		before[i] = cl.c.Calls(k.svc, k.m)
	}
	cpu0 := cpuTime(b)
	stopProfile := profileTimed(b)
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make([]error, len(ss))
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < per && errs[i] == nil; k++ {
				off := uint64(s.rng.Int64N(fileBytes/4096)) * 4096
				switch op {
				case "getattr":
					_, errs[i] = s.c.Getattr(s.file)
				case "remove":
					errs[i] = s.c.Remove(s.dir, s.names[k])
				case "randread":
					_, errs[i] = s.c.Read(s.file, off, 4096)
				case "randwrite":
					_, errs[i] = s.c.Write(s.file, off, s.block, xdr.UNSTABLE)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	stopProfile()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	n := float64(per * benchStreams)
	// CPU time of the process (gateway, cluster and test clients) per
	// call: on a shared machine a steadier figure than the wall time.
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/n, "cpu-us/op")
	for i, k := range counted {
		if d := cl.c.Calls(k.svc, k.m) - before[i]; d > 0 {
			b.ReportMetric(float64(d)/n, fmt.Sprintf("%s-%d/op", k.svc, k.m))
		}
	}
}

// profileTimed writes a CPU profile of the timed part alone to the file
// $STRATA_BENCH_CPUPROFILE names, if set (go test's -cpuprofile also
// covers the setup: a cluster, and for REMOVE the files it removes).
func profileTimed(b *testing.B) (stop func()) {
	path := os.Getenv("STRATA_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
