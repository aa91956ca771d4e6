package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/testutil"
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, tdir := startStore(ctx, t, metaAddr, key)
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

	flipByte(t, chunkFile(t, tdir, 0x7000), 123456)

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

// TestScrubMirrorGroups: against a real metadata service with mirror
// groups and two storage servers paired by `mirror create --auto`, strata
// scrub compares the two copies of every chunk of the group: 100 blocks
// flipped on the secondary are found, repaired with --repair, and a second
// scrub finds nothing. Skipped against a metadata service without mirror
// groups (ENOSYS).
func TestScrubMirrorGroups(t *testing.T) {
	metaAddr, keyFile := startMeta(t)
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stores []*store.Server
	var dirs []string
	for i := 0; i < 2; i++ {
		s, dir := startStore(ctx, t, metaAddr, key)
		stores, dirs = append(stores, s), append(dirs, dir)
	}
	mc := adminMetaClient(metaAddr, key)
	defer mc.Close()
	var made rpc.ListGroupsResp
	err = mc.Call(ctx, rpc.MMirrorCreate, &rpc.MirrorCreateReq{Auto: true}, &made)
	if errors.Is(err, syscall.ENOSYS) {
		t.Skip("the metadata service has no mirror groups")
	}
	if err != nil || len(made.Groups) != 1 {
		t.Fatalf("mirror create --auto: %v, %d groups", err, len(made.Groups))
	}
	g := made.Groups[0]
	dirOf := map[uint32]string{}
	for i, s := range stores {
		dirOf[s.TargetIDs()[0]] = dirs[i]
	}
	pc := transport.NewClient(g.PrimaryAddr, transport.ClientConfig{Key: key})
	defer pc.Close()
	sizes := map[uint64]int{0x71: 5<<20 + 333, 0x72: 2 << 20, 0x8803: 30 << 10}
	for ino, n := range sizes {
		req := &rpc.WriteReq{Chunk: rpc.ChunkID{Target: rpc.GroupBit | g.ID, Ino: ino}, Data: bytes.Repeat([]byte{byte(ino), 7, 1}, n/3+1)[:n], Sync: true}
		// The stores learn the group from their next heartbeat answers.
		if err := testutil.WaitFor(20*time.Second, func() error {
			var gl rpc.ListGroupsResp
			if err := mc.Call(ctx, rpc.MListGroups, &rpc.Empty{}, &gl); err != nil {
				return err
			}
			req.Chunk.Epoch = gl.Groups[0].Epoch
			return pc.Call(ctx, rpc.SWrite, req, &rpc.WriteResp{})
		}); err != nil {
			t.Fatalf("write to group %d: %v", g.ID, err)
		}
	}
	// 100 blocks flipped on the secondary's copies.
	rng := rand.New(rand.NewPCG(5, 21))
	flipped := map[[2]uint64]bool{}
	inos := []uint64{0x71, 0x72, 0x8803}
	for len(flipped) < 100 {
		ino := inos[rng.IntN(len(inos))]
		b := uint64(rng.IntN((sizes[ino] + 4095) / 4096))
		if flipped[[2]uint64{ino, b}] {
			continue
		}
		flipped[[2]uint64{ino, b}] = true
		flipByte(t, chunkFile(t, dirOf[g.Secondary], ino), int64(b)*4096+int64(rng.IntN(min(4096, sizes[ino]-int(b)*4096))))
	}
	find := func(res []*scrubTarget) *scrubTarget {
		for _, r := range res {
			if r.Group == g.ID {
				return r
			}
		}
		t.Fatalf("no group %d in the scrub: %+v", g.ID, res)
		return nil
	}
	res, err := scrubCluster(ctx, metaAddr, key, scrubOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := find(res); !r.Scrubbed || r.Chunks != 3 || r.BadBlocks != 100 || r.Repaired != 0 || r.Unrepairable != 0 || scrubVerdict(res, false) == nil {
		t.Fatalf("scrub: %+v, verdict %v", r, scrubVerdict(res, false))
	}
	res, err = scrubCluster(ctx, metaAddr, key, scrubOptions{Repair: true, RateBytes: 100 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := find(res); r.BadBlocks != 100 || r.Repaired != 100 || scrubVerdict(res, true) != nil {
		t.Fatalf("scrub --repair: %+v, verdict %v", r, scrubVerdict(res, true))
	}
	res, err = scrubCluster(ctx, metaAddr, key, scrubOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := find(res); r.BadBlocks != 0 || r.Chunks != 3 || scrubVerdict(res, false) != nil {
		t.Fatalf("scrub after the repair: %+v, verdict %v", r, scrubVerdict(res, false))
	}
}

// chunkFile finds the data file of chunk ino under target directory dir.
func chunkFile(t *testing.T, dir string, ino uint64) string {
	t.Helper()
	var found string
	name := fmt.Sprintf("%016x.data", ino)
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			found = p
		}
		return err
	})
	if found == "" {
		t.Fatalf("no data file of chunk %x under %s", ino, dir)
	}
	return found
}

// startStore runs a storage server of one target in this process,
// registered with the metadata service at metaAddr (heartbeats every
// 100 ms), and answers it with its target directory.
func startStore(ctx context.Context, t *testing.T, metaAddr string, key []byte) (*store.Server, string) {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.MetaAddr = metaAddr
	cfg.ClusterKey = key
	cfg.SyncInterval = 0
	cfg.HeartbeatInterval = 100 * time.Millisecond
	dir := t.TempDir()
	cfg.Targets = []string{dir}
	s, err := store.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// flipByte changes the byte at off of the file at path.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var one [1]byte
	if _, err := f.ReadAt(one[:], off); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0x40
	if _, err := f.WriteAt(one[:], off); err != nil {
		t.Fatal(err)
	}
}
