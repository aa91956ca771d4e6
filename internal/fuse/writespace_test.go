package fuse

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// chunkSpace is the space the chunks of ino take on their targets, as
// their storage servers stat them (SChunkStat, asked here directly).
func (tc *testCluster) chunkSpace(c *client.Client, ino uint64) uint64 {
	tc.t.Helper()
	ctx := context.Background()
	a, err := c.GetAttr(ctx, ino)
	if err != nil {
		tc.t.Fatal(err)
	}
	mc := transport.NewClient(tc.meta.Addr(), transport.ClientConfig{Key: tc.key})
	defer mc.Close()
	var targets rpc.ListTargetsResp
	if err := mc.Call(ctx, rpc.MListTargets, &rpc.Empty{}, &targets); err != nil {
		tc.t.Fatal(err)
	}
	addr := map[uint32]string{}
	for _, ti := range targets.Targets {
		addr[ti.ID] = ti.Addr
	}
	var sum uint64
	for _, tgt := range a.Layout.Targets {
		sc := transport.NewClient(addr[tgt], transport.ClientConfig{Key: tc.key})
		var r rpc.ChunkStatResp
		err := sc.Call(ctx, rpc.SChunkStat, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}}, &r)
		sc.Close()
		if err != nil {
			tc.t.Fatal(err)
		}
		sum += r.Alloc
	}
	return sum
}

// TestBlocksFromWriteAnswers: files written and closed on one mount, under
// the async and the sync policy, show on a second mount st_blocks equal to
// the space their chunks take: small files, whose closes asked no storage
// server for that space (it came with the writes' answers), a file over
// two chunks, one with a hole punched and one truncated. Each file is
// stat'ed once on the second mount (its kernel caches attributes).
func TestBlocksFromWriteAnswers(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	b, cb := tc.mount(nil)
	small := bytes.Repeat([]byte("s"), 3901)
	for _, policy := range []string{client.SyncPolicyAsync, client.SyncPolicySync} {
		a, ca := tc.mount(func(cfg *client.Config) { cfg.SyncPolicy = policy })
		stats := ca.Calls("store", rpc.SChunkStat)
		var names []string
		for i := range 10 {
			name := fmt.Sprintf("%s-small%d", policy, i)
			must(t, os.WriteFile(filepath.Join(a, name), small, 0o644))
			names = append(names, name)
		}
		if n := ca.Calls("store", rpc.SChunkStat) - stats; n != 0 {
			t.Fatalf("%s: 10 small files written and closed made %d SChunkStat calls, want none", policy, n)
		}
		// Large files may be asked: writes of one chunk in flight together
		// answer no usable space (inode.allocAns).
		big := bytes.Repeat([]byte{1}, 5<<20+100)
		for _, name := range []string{"big", "punched", "truncated"} {
			must(t, os.WriteFile(filepath.Join(a, policy+"-"+name), big, 0o644))
			names = append(names, policy+"-"+name)
		}
		f, err := os.OpenFile(filepath.Join(a, policy+"-punched"), os.O_RDWR, 0)
		must(t, err)
		must(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 64<<10, 3<<20))
		_, err = f.WriteAt(small, 1<<20+5000)
		must(t, err)
		must(t, f.Close())
		must(t, os.Truncate(filepath.Join(a, policy+"-truncated"), 30000))
		for _, name := range names {
			var st syscall.Stat_t
			must(t, syscall.Stat(filepath.Join(b, name), &st))
			if want := tc.chunkSpace(cb, st.Ino); uint64(st.Blocks)*512 != want {
				t.Errorf("%s: st_blocks on the second mount says %d bytes, the chunks take %d", name, st.Blocks*512, want)
			}
		}
	}
}
