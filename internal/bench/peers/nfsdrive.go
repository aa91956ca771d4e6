package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/bench"
	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// The NFS row: a system served over NFSv3 (strata-nfs, ganesha) is driven
// by one user-space client for both, nfstest's, over TCP on loopback
// (the kernel's NFS client is not available here), with nfsStreams
// concurrent streams, each its own connection, as libnfs's nfs-cp would
// be run four times.

// nfsTarget is where a system serves NFS: MOUNT and NFS addresses (the
// same for Strata, one port) and the exported path to mount.
type nfsTarget struct {
	mountAddr, nfsAddr, export string
}

// nfsSizes sizes the NFS row.
type nfsSizes struct {
	streams   int
	seqBytes  int64 // per stream, in 1 MiB writes
	randOps   int   // 4 KiB reads, then writes, per stream
	metaFiles int   // per stream
}

func defaultNFSSizes() nfsSizes {
	return nfsSizes{streams: 4, seqBytes: 128 << 20, randOps: 2000, metaFiles: 500}
}

// NFSWorkloads are the NFS row's workloads and their phases.
var NFSWorkloads = []string{"nfs-seq", "nfs-random", "nfs-meta"}

const (
	seqRecord  = 1 << 20
	randRecord = 4 << 10
)

// nfsStream is one stream's connection and directory.
type nfsStream struct {
	c    *nfstest.Client
	dir  []byte // the stream's own directory
	file []byte // its seq file (reused by the random phases)
}

// dialNFS mounts t.export and opens the streams, each with a directory of
// its own named after the run.
func dialNFS(t nfsTarget, n int, run string) ([]*nfsStream, error) {
	mc, err := nfstest.Dial(t.mountAddr, "")
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", t.mountAddr, err)
	}
	root, err := mc.MountRoot(t.export)
	mc.Close()
	if err != nil {
		return nil, err
	}
	var ss []*nfsStream
	for i := 0; i < n; i++ {
		c, err := nfstest.Dial(t.nfsAddr, "")
		if err != nil {
			closeStreams(ss)
			return nil, fmt.Errorf("nfs %s: %w", t.nfsAddr, err)
		}
		c.As(0, 0)
		s := &nfsStream{c: c}
		ss = append(ss, s)
		if s.dir, err = c.Mkdir(root, fmt.Sprintf("%s-%d", run, i), 0o755); err != nil {
			closeStreams(ss)
			return nil, err
		}
	}
	return ss, nil
}

func closeStreams(ss []*nfsStream) {
	for _, s := range ss {
		s.c.Close()
	}
}

// parallel runs fn on every stream at once and returns the wall time.
func parallel(ss []*nfsStream, fn func(i int, s *nfsStream) error) (time.Duration, error) {
	var wg sync.WaitGroup
	errs := make([]error, len(ss))
	t0 := time.Now()
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i, s)
		}()
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// fillBlock fills b with the content of block blk of stream i.
func fillBlock(b []byte, i int, blk int64) {
	for j := range b {
		b[j] = byte(j) ^ byte(blk*131) ^ byte(i*37+1)
	}
}

// driveNFS runs the NFS row once on t and returns its results labelled
// sys: seq write (UNSTABLE 1 MiB writes, then COMMIT, as a kernel
// client's close), seq read (verified), random 4 KiB reads and writes
// (UNSTABLE, one COMMIT at the end, in the time) over the seq files, and
// create, getattr, remove of small-file entries.
func driveNFS(ctx context.Context, sys string, t nfsTarget, sz nfsSizes, run string) ([]bench.Result, error) {
	ss, err := dialNFS(t, sz.streams, run)
	if err != nil {
		return nil, err
	}
	defer closeStreams(ss)
	var out []bench.Result
	add := func(w, phase, unit string, ops, byts int64, d time.Duration, rec int64, verified bool) {
		r := bench.Result{System: sys, Path: "nfs://" + t.nfsAddr + t.export, FSType: "nfs3 (user-space client)", Workload: w, Phase: phase,
			Threads: sz.streams, Clients: 1, Unit: unit, Ops: ops, Bytes: byts, Seconds: d.Seconds(), RecordBytes: rec, Verified: verified}
		switch unit {
		case bench.UnitMiBps:
			r.Value = bench.MiBps(byts, d.Seconds())
		default:
			r.Value = bench.OpsPerSecond(ops, d.Seconds())
		}
		r.Samples = []float64{r.Value}
		out = append(out, r)
	}
	blocks := sz.seqBytes / seqRecord
	d, err := parallel(ss, func(i int, s *nfsStream) error {
		var err error
		if s.file, err = s.c.Create(s.dir, "seq", 0o644); err != nil {
			return err
		}
		b := make([]byte, seqRecord)
		var verf xdr.Writeverf3
		for blk := int64(0); blk < blocks; blk++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fillBlock(b, i, blk)
			if verf, err = s.c.Write(s.file, uint64(blk*seqRecord), b, xdr.UNSTABLE); err != nil {
				return err
			}
		}
		cv, err := s.c.Commit(s.file)
		if err == nil && cv != verf {
			err = errors.New("nfs COMMIT: the write verifier changed (server restarted?)")
		}
		return err
	})
	if err != nil {
		return out, fmt.Errorf("nfs-seq write: %w", err)
	}
	add("nfs-seq", "write", bench.UnitMiBps, blocks*int64(sz.streams), blocks*seqRecord*int64(sz.streams), d, seqRecord, true)
	d, err = parallel(ss, func(i int, s *nfsStream) error {
		want := make([]byte, seqRecord)
		for blk := int64(0); blk < blocks; blk++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			got, err := s.c.Read(s.file, uint64(blk*seqRecord), seqRecord)
			if err != nil {
				return err
			}
			fillBlock(want, i, blk)
			if !bytes.Equal(got, want) {
				return fmt.Errorf("%w: stream %d block %d read back differs", bench.ErrCorrupt, i, blk)
			}
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("nfs-seq read: %w", err)
	}
	add("nfs-seq", "read", bench.UnitMiBps, blocks*int64(sz.streams), blocks*seqRecord*int64(sz.streams), d, seqRecord, true)

	slots := sz.seqBytes / randRecord
	randPhase := func(write bool) (time.Duration, error) {
		return parallel(ss, func(i int, s *nfsStream) error {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			b := make([]byte, randRecord)
			for k := 0; k < sz.randOps; k++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				off := uint64(rng.Int64N(slots)) * randRecord
				var err error
				if write {
					_, err = s.c.Write(s.file, off, b, xdr.UNSTABLE)
				} else {
					var got []byte
					if got, err = s.c.Read(s.file, off, randRecord); err == nil && len(got) != randRecord {
						err = fmt.Errorf("nfs READ: %d of %d bytes", len(got), randRecord)
					}
				}
				if err != nil {
					return err
				}
			}
			if write {
				_, err := s.c.Commit(s.file)
				return err
			}
			return nil
		})
	}
	ops := int64(sz.randOps * sz.streams)
	if d, err = randPhase(false); err != nil {
		return out, fmt.Errorf("nfs-random read: %w", err)
	}
	add("nfs-random", "read", bench.UnitIOPS, ops, ops*randRecord, d, randRecord, false)
	if d, err = randPhase(true); err != nil {
		return out, fmt.Errorf("nfs-random write: %w", err)
	}
	add("nfs-random", "write", bench.UnitIOPS, ops, ops*randRecord, d, randRecord, false)

	handles := make([][][]byte, len(ss))
	metaOps := int64(sz.metaFiles * sz.streams)
	phases := []struct {
		name string
		fn   func(i int, s *nfsStream, k int) error
	}{
		{"create", func(i int, s *nfsStream, k int) error {
			h, err := s.c.Create(s.dir, fmt.Sprintf("f%d", k), 0o644)
			handles[i] = append(handles[i], h)
			return err
		}},
		{"stat", func(i int, s *nfsStream, k int) error { _, err := s.c.Getattr(handles[i][k]); return err }},
		{"remove", func(i int, s *nfsStream, k int) error { return s.c.Remove(s.dir, fmt.Sprintf("f%d", k)) }},
	}
	for _, p := range phases {
		d, err := parallel(ss, func(i int, s *nfsStream) error {
			for k := 0; k < sz.metaFiles; k++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err := p.fn(i, s, k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("nfs-meta %s: %w", p.name, err)
		}
		add("nfs-meta", p.name, bench.UnitOpsps, metaOps, 0, d, 0, false)
	}
	// The seq files go: the next turn writes its own.
	for _, s := range ss {
		if err := s.c.Remove(s.dir, "seq"); err != nil {
			return out, err
		}
	}
	return out, nil
}

// runNFSRow drives the NFS systems, one turn of each at a time in the
// peers' interleaved order, and merges their turns into rep (median of
// the repeats). A system whose turn fails is dropped with a note; a
// corrupt read back fails the run.
func runNFSRow(ctx context.Context, sys []nfsSystem, repeat int, logf func(string, ...any), rep *bench.Report, results *[]bench.Result) error {
	failed := map[string]bool{}
	for turn := 1; turn <= repeat; turn++ {
		for _, i := range turnOrder(len(sys), turn) {
			s := sys[i]
			if failed[s.name()] {
				continue
			}
			logf("%s: NFS row, turn %d of %d", s.name(), turn, repeat)
			res, err := driveNFS(ctx, s.name(), s.target(), defaultNFSSizes(), fmt.Sprintf("bench-%d", turn))
			*results = append(*results, res...)
			rep.Results = bench.MergeRepeats(*results)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, bench.ErrCorrupt) {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s: VERIFICATION FAILED: %v", s.name(), err))
				return err
			}
			if err != nil {
				failed[s.name()] = true
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s: NFS row failed: %v", s.name(), err))
				logf("%s dropped from the run: %v", s.name(), err)
			}
		}
	}
	return nil
}
