package meta

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

func quietLogs(b *testing.B) {
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.Cleanup(func() { slog.SetDefault(old) })
}

// BenchmarkCreateParallel measures creates from 8 concurrent rpc callers,
// each with its own session and directory (the mdtest shape): group commit
// is what makes this fast.
func BenchmarkCreateParallel(b *testing.B) {
	quietLogs(b)
	s := openService(b, testConfig(b, ""))
	setup := newClient(b, s.Addr())
	setup.registerTargets("127.0.0.1:1", "u1", "u2", "u3", "u4")
	const callers = 8
	clients := make([]*client, callers)
	dirs := make([]uint64, callers)
	for i := range clients {
		clients[i] = newClient(b, s.Addr())
		dirs[i] = clients[i].mustCreate(1, fmt.Sprintf("d%d", i), 0o040755).Ino
	}
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := clients[i]
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				if _, err := c.create(dirs[i], fmt.Sprintf("f%d", n), 0o100644); err != nil {
					b.Error(err)
					return
				}
			}
		}(i)
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
}

// BenchmarkLookup measures lookups from 8 concurrent callers.
func BenchmarkLookup(b *testing.B) {
	quietLogs(b)
	s := openService(b, testConfig(b, ""))
	c := newClient(b, s.Addr())
	c.registerTargets("127.0.0.1:1", "u1")
	for i := 0; i < 100; i++ {
		c.mustCreate(1, fmt.Sprintf("f%d", i), 0o100644)
	}
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				var r rpc.AttrResp
				if err := c.call(rpc.MLookup, &rpc.LookupReq{Parent: 1, Name: fmt.Sprintf("f%d", n%100)}, &r); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
}

// BenchmarkCreate64 compares 64 creates in one directory made as one
// MCreateBatch (numbers from a reserved range, one reservation per 64
// batches, counted) with the same 64 as MCreate calls one after another,
// from one session over loopback: what a delegation holder's flush saves
// the service.
func BenchmarkCreate64(b *testing.B) {
	quietLogs(b)
	for _, mode := range []string{"single", "batch"} {
		b.Run(mode, func(b *testing.B) {
			s := openService(b, testConfig(b, ""))
			c := newClient(b, s.Addr())
			c.registerTargets("127.0.0.1:1", "u1", "u2")
			dir := c.mustCreate(1, "d", 0o040755).Ino
			var next, end uint64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if mode == "single" {
					for k := range 64 {
						if _, err := c.create(dir, fmt.Sprintf("f%d-%d", i, k), 0o100644); err != nil {
							b.Fatal(err)
						}
					}
					continue
				}
				if end-next < 64 {
					var rr rpc.ReserveInosResp
					if err := c.call(rpc.MReserveInos, &rpc.ReserveInosReq{Hdr: c.hdr(), Count: 4096}, &rr); err != nil {
						b.Fatal(err)
					}
					next, end = rr.Start, rr.Start+rr.Count
				}
				req := &rpc.CreateBatchReq{Hdr: rpc.ReqHeader{ClientID: c.id}, Creates: make([]rpc.BatchCreate, 64)}
				for k := range req.Creates {
					req.Creates[k] = rpc.BatchCreate{Seq: c.seq.Add(1), Parent: dir, Name: fmt.Sprintf("f%d-%d", i, k), Ino: next, Mode: 0o644}
					next++
				}
				var resp rpc.CreateBatchResp
				if err := c.call(rpc.MCreateBatch, req, &resp); err != nil {
					b.Fatal(err)
				}
				if e := resp.Results[63].Err(); e != nil {
					b.Fatal(e)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "creates/s")
		})
	}
}

// BenchmarkCreateClose is a FUSE mount's creates closed one by one under
// the sync policy: 4 callers, each its own session and directory, each
// create followed by the close's barrier (MSync for the create's entry).
// The leader's early write-out of the log (consensus wal.go, "hot")
// serves this shape.
func BenchmarkCreateClose(b *testing.B) { benchChanges(b, "create", true) }

// BenchmarkUnlink and BenchmarkUnlinkSync remove files (4 callers), the
// second with a barrier after each (an NFS REMOVE on a sync export).
func BenchmarkUnlink(b *testing.B)     { benchChanges(b, "unlink", false) }
func BenchmarkUnlinkSync(b *testing.B) { benchChanges(b, "unlink", true) }

func benchChanges(b *testing.B, op string, barrier bool) {
	quietLogs(b)
	s := openService(b, testConfig(b, ""))
	setup := newClient(b, s.Addr())
	setup.registerTargets("127.0.0.1:1", "u1", "u2")
	const callers = 4
	per := (b.N + callers - 1) / callers
	clients := make([]*client, callers)
	dirs := make([]uint64, callers)
	for i := range clients {
		clients[i] = newClient(b, s.Addr())
		dirs[i] = clients[i].mustCreate(1, fmt.Sprintf("d%d", i), 0o040755).Ino
		for k := 0; op == "unlink" && k < per; k++ {
			clients[i].mustCreate(dirs[i], fmt.Sprintf("f%d", k), 0o100644)
		}
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < per; k++ {
				var r rpc.ChangeResp
				m := rpc.MCreate
				var req rpc.Message = &rpc.CreateReq{Hdr: c.hdr(), Parent: dirs[i], Name: fmt.Sprintf("f%d", k), Mode: 0o100644}
				if op == "unlink" {
					m, req = rpc.MUnlink, &rpc.EntryReq{Hdr: c.hdr(), Parent: dirs[i], Name: fmt.Sprintf("f%d", k)}
				}
				if err := c.call(m, req, &r); err != nil {
					b.Error(err)
					return
				}
				if barrier {
					if err := c.call(rpc.MSync, &rpc.SyncReq{Index: r.Index, Term: r.Term}, &rpc.SyncResp{}); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(per*callers)/b.Elapsed().Seconds(), op+"s/s")
}
