package main

import (
	"slices"
	"testing"

	"github.com/stratafs/strata/internal/meta"
)

// TestMetaVotersStartAndRestart: strata up's voters come up with a leader
// among them, reuse their addresses at the next start, and 3 voters' data
// is not opened as 5.
func TestMetaVotersStartAndRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := meta.DefaultConfig()
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.ClusterKey = []byte("k")
	svcs, err := startMetaVoters(cfg, dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	closeAll := func() {
		for _, s := range svcs {
			s.Close()
		}
	}
	defer func() { closeAll() }()
	if !slices.ContainsFunc(svcs, (*meta.Service).Serving) {
		t.Fatal("no voter leads")
	}
	addrs := []string{svcs[0].Addr(), svcs[1].Addr(), svcs[2].Addr()}
	closeAll()
	if svcs, err = startMetaVoters(cfg, dir, 3); err != nil {
		t.Fatal(err)
	}
	for i, s := range svcs {
		if s.Addr() != addrs[i] {
			t.Fatalf("voter %d at %s after a restart, was %s", i+1, s.Addr(), addrs[i])
		}
	}
	if _, err := startMetaVoters(cfg, dir, 5); err == nil {
		t.Fatal("3 voters' data opened as 5")
	}
}
