package store

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// TestMirrorMeasureWrite measures (no assertion) the cost of mirroring at
// the storage servers: 4 writers of 1 MiB SWrites, each to a chunk of its
// own, to one store (unmirrored) and through a group's primary (both
// copies on this machine's disk), over loopback TCP and in-process, two
// rounds each. Run with
//
//	STRATA_MIRROR_MEASURE=1 go test ./internal/store -run TestMirrorMeasureWrite -v
func TestMirrorMeasureWrite(t *testing.T) {
	if os.Getenv("STRATA_MIRROR_MEASURE") == "" {
		t.Skip("a measurement: set STRATA_MIRROR_MEASURE=1")
	}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(discard{}, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	const writers, perWriter = 4, 256 // 1 GiB in all
	data := pattern(1, 1<<20)
	run := func(name string, p *mirrorPair, id func(w int) rpc.ChunkID) {
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perWriter; i++ {
					err := p.a.cl.Call(context.Background(), rpc.SWrite, &rpc.WriteReq{Chunk: id(w), Off: uint64(i) << 20, Data: data}, &rpc.WriteResp{})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		took := time.Since(start)
		t.Logf("%s: %d MiB in %v: %.0f MiB/s", name, writers*perWriter, took.Round(time.Millisecond), float64(writers*perWriter)/took.Seconds())
	}
	for _, network := range []bool{true, false} {
		how := "in-process"
		if network {
			how = "tcp"
		}
		p := newMirrorPairNet(t, nil, network)
		for round := 0; round < 2; round++ {
			base := uint64(round) << 8
			run(how+", unmirrored (one store)", p, func(w int) rpc.ChunkID { return rpc.ChunkID{Target: p.ta, Ino: 0x1000 + base + uint64(w)} })
			ep := p.epoch()
			run(how+", mirrored (primary + secondary)", p, func(w int) rpc.ChunkID { return gid(0x2000+base+uint64(w), ep) })
		}
	}
}
