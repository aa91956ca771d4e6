package nfs_test

import (
	"testing"

	"github.com/stratafs/strata/internal/nfs/xdr"
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
