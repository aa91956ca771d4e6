package main

import (
	"testing"
	"time"

	"github.com/stratafs/strata/internal/meta"
)

// TestMetaVotersKeepVoter1Leading: strata up's voters come up with voter 1
// leading, reuse their addresses at the next start, and voter 1 takes the
// lead back after another voter took it.
func TestMetaVotersKeepVoter1Leading(t *testing.T) {
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
	if !svcs[0].Serving() {
		t.Fatal("voter 1 does not lead")
	}
	stop := make(chan struct{})
	go keepVoter1Leading(svcs, stop)
	defer close(stop)
	if err := svcs[0].Node().TransferLeadership(svcs[1].Addr()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !svcs[0].Serving() {
		if time.Now().After(deadline) {
			t.Fatal("voter 1 did not take the lead back within 15s")
		}
		time.Sleep(20 * time.Millisecond)
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
