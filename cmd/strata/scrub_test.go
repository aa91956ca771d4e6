package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/transport"
)

// TestScrubUnmirroredTarget: against a real metadata service and storage
// server, strata scrub verifies every chunk of a target in no group: a
// clean target passes; a flipped byte is one bad block that cannot be
// repaired (no second copy), named in the report, and fails the command.
func TestScrubUnmirroredTarget(t *testing.T) {
	metaAddr, keyFile := startMeta(t)
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.DefaultConfig()
	cfg.MetaAddr = metaAddr
	cfg.ClusterKey = key
	cfg.SyncInterval = 0
	tdir := t.TempDir()
	cfg.Targets = []string{tdir}
	s, err := store.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	id := s.TargetIDs()[0]
	cl := transport.NewClient(s.Addr(), transport.ClientConfig{Key: key})
	defer cl.Close()
	data := bytes.Repeat([]byte("scrub me "), 100000)
	for _, ino := range []uint64{0x51, 0x7000} {
		if err := cl.Call(ctx, rpc.SWrite, &rpc.WriteReq{Chunk: rpc.ChunkID{Target: id, Ino: ino}, Data: data, Sync: true}, &rpc.WriteResp{}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the metadata service sees the server alive.
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := scrubCluster(ctx, metaAddr, key, scrubOptions{Repair: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) == 1 && res[0].Scrubbed {
			if res[0].Chunks != 2 || res[0].Bytes != uint64(2*len(data)) || res[0].BadBlocks != 0 || scrubVerdict(res, true) != nil {
				t.Fatalf("scrub of a clean target: %+v, %v", res[0], scrubVerdict(res, true))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("target never scrubbed: %+v", res)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var chunkFile string
	_ = filepath.WalkDir(tdir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "0000000000007000.data") {
			chunkFile = p
		}
		return err
	})
	if chunkFile == "" {
		t.Fatal("chunk file of inode 7000 not found")
	}
	f, err := os.OpenFile(chunkFile, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'#'}, 123456); err != nil {
		t.Fatal(err)
	}
	f.Close()

	res, err := scrubCluster(ctx, metaAddr, key, scrubOptions{Repair: true, RateBytes: 64 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if !r.Scrubbed || r.Chunks != 2 || r.BadBlocks != 1 || r.Unrepairable != 1 || r.Repaired != 0 ||
		len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "chunk 7000") {
		t.Fatalf("scrub of a target with a flipped byte: %+v", r)
	}
	if err := scrubVerdict(res, true); err == nil || !strings.Contains(err.Error(), "1 bad blocks cannot be repaired") {
		t.Fatalf("verdict: %v", err)
	}
	var out bytes.Buffer
	printScrub(&out, res, true)
	if !strings.Contains(out.String(), "2 chunks (1.7 MiB) verified: 1 bad blocks, 0 repaired, 1 unrepairable") {
		t.Fatalf("summary:\n%s", out.String())
	}
}
