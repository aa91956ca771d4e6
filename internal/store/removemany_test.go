package store

import (
	"context"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

func TestRemoveMany(t *testing.T) {
	e := newEnv(t, 2, nil)
	for ino := uint64(1); ino <= 5; ino++ {
		for tgt := uint32(1); tgt <= 2; tgt++ {
			if err := e.write(tgt, ino, 0, []byte("data"), false); err != nil {
				t.Fatal(err)
			}
		}
	}
	var chunks []rpc.ChunkID
	for ino := uint64(1); ino <= 4; ino++ {
		chunks = append(chunks, rpc.ChunkID{Target: 1, Ino: ino}, rpc.ChunkID{Target: 2, Ino: ino})
	}
	chunks = append(chunks, rpc.ChunkID{Target: 1, Ino: 99}) // absent is fine
	if err := e.cl.Call(context.Background(), rpc.SRemoveMany, &rpc.ChunksReq{Chunks: chunks}, nil); err != nil {
		t.Fatal(err)
	}
	for ino := uint64(1); ino <= 5; ino++ {
		var st rpc.ChunkStatResp
		if err := e.cl.Call(context.Background(), rpc.SChunkStat, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 2, Ino: ino}}, &st); err != nil {
			t.Fatal(err)
		}
		if st.Exists != (ino == 5) {
			t.Errorf("inode %d: exists=%v after RemoveMany", ino, st.Exists)
		}
	}
	// An unknown target is reported, after the others were tried.
	err := e.cl.Call(context.Background(), rpc.SRemoveMany, &rpc.ChunksReq{Chunks: []rpc.ChunkID{{Target: 77, Ino: 5}, {Target: 1, Ino: 5}}}, nil)
	if err == nil {
		t.Fatal("unknown target accepted")
	}
	var st rpc.ChunkStatResp
	e.cl.Call(context.Background(), rpc.SChunkStat, &rpc.ChunkReq{Chunk: rpc.ChunkID{Target: 1, Ino: 5}}, &st)
	if st.Exists {
		t.Error("chunk after the failing one was not removed")
	}
}
