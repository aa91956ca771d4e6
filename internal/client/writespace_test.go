package client

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// realSpace is the space the chunks of ino take on their targets now, as
// the storage servers stat it, asked by c (not the client under test, so
// that its call counts stay its own).
func realSpace(t *testing.T, c *Client, ino uint64) uint64 {
	t.Helper()
	a, err := c.GetAttr(context.Background(), ino)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, tgt := range a.Layout.Targets {
		var r rpc.ChunkStatResp
		req := &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: tgt, Ino: ino}}
		if err := c.storeCall(context.Background(), "stat", &req.Chunk, rpc.SChunkStat, req, &r); err != nil {
			t.Fatal(err)
		}
		sum += r.Alloc
	}
	return sum
}

// checkBlocks: st_blocks of ino, as another client sees it, is the space
// its chunks take.
func checkBlocks(t *testing.T, other *Client, ino uint64, what string) {
	t.Helper()
	a, err := other.GetAttr(context.Background(), ino)
	if err != nil {
		t.Fatal(err)
	}
	if want := realSpace(t, other, ino); !a.BlocksKnown || a.Blocks*512 != want {
		t.Fatalf("%s: st_blocks says %d bytes (known %v), the chunks take %d", what, a.Blocks*512, a.BlocksKnown, want)
	}
}

// A write's answer carries the chunk's space, and a close's size commit
// reports it without asking (no SChunkStat), under async (which used to ask
// once per written chunk) and sync (whose SSyncStat answers it too).
// st_blocks, seen from another client, stays the chunks' real space: after
// small files, a file over two chunks, a hole punch, a truncate, writes in
// flight together to one chunk, and against older servers (write answers
// without the space), which are asked as before.
func TestCloseTakesSpaceFromWrites(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2})
	ctx := context.Background()
	other := tc.client(nil)
	data := bytes.Repeat([]byte("s"), 3901)
	for _, policy := range []string{SyncPolicyAsync, SyncPolicySync} {
		for _, older := range []bool{false, true} {
			c := tc.client(func(cfg *Config) { cfg.SyncPolicy = policy })
			c.noWriteSpace.Store(older)
			name := fmt.Sprintf("%s-%v", policy, older)
			stats := c.Calls("store", rpc.SChunkStat)
			const files = 20
			inos := make([]uint64, files)
			for i := range files {
				inos[i] = writeWhole(t, c, fmt.Sprintf("%s-%d", name, i), data)
			}
			stats = c.Calls("store", rpc.SChunkStat) - stats
			switch {
			case !older && stats != 0:
				t.Fatalf("%s: %d creates+writes+closes made %d SChunkStat calls, want none", name, files, stats)
			case older && policy == SyncPolicyAsync && stats != files:
				t.Fatalf("%s: against older servers %d closes made %d SChunkStat calls, want one each", name, files, stats)
			}
			for i, ino := range inos {
				checkBlocks(t, other, ino, fmt.Sprintf("%s file %d", name, i))
			}

			// Two chunks, 5 MiB: several writes of one chunk in flight
			// together, whose answers may miss each other's space.
			ino := writeWhole(t, c, name+"-big", bytes.Repeat([]byte{1}, 5<<20+100))
			checkBlocks(t, other, ino, name+" 5 MiB file")
			// Each step opens the file, does its part and closes it.
			step := func(what string, do func(f *File) error) {
				t.Helper()
				f, err := c.Open(ctx, ino, syscall.O_RDWR)
				if err != nil {
					t.Fatal(err)
				}
				if err := do(f); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if err := f.Release(ctx); err != nil {
					t.Fatal(err)
				}
				checkBlocks(t, other, ino, name+" after "+what)
			}
			write := func(f *File, off int64) error { _, err := f.WriteAt(ctx, data, off); return err }
			step("a punch", func(f *File) error { return f.Punch(ctx, 64<<10, 3<<20) })
			step("a write and a punch", func(f *File) error {
				if err := write(f, 1<<20+5000); err != nil {
					return err
				}
				return f.Punch(ctx, 4<<20, 8192)
			})
			// Written, truncated while open (checked before the close),
			// written again.
			step("a write, a truncate and a write", func(f *File) error {
				if err := write(f, 20000); err != nil {
					return err
				}
				if _, err := c.SetAttr(ctx, ino, rpc.SetAttrReq{Valid: rpc.SetSize, Size: 30000}); err != nil {
					return err
				}
				checkBlocks(t, other, ino, name+" after a truncate")
				return write(f, 40000)
			})
		}
	}
}
