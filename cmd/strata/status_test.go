package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/rpc"
)

// TestStatusShowsUnsynced: the target table says per target what is
// written and not yet durable.
func TestStatusShowsUnsynced(t *testing.T) {
	st := &rpc.ClusterStatusResp{
		Targets:  []rpc.TargetInfo{{ID: 1, ServerID: 1, Path: "/a", Alive: true}, {ID: 2, ServerID: 1, Path: "/b", Alive: true}},
		Unsynced: []rpc.TargetUnsynced{{Chunks: 123, Bytes: 4718592, OldestMs: 3400}, {}},
	}
	var out bytes.Buffer
	printStatus(&out, st, admin.Capacity{}, false)
	lines := strings.Split(out.String(), "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line starting %q in\n%s", prefix, out.String())
		return ""
	}
	if l := find("TARGET"); !strings.HasSuffix(strings.TrimSpace(l), "UNSYNCED") {
		t.Errorf("header %q has no UNSYNCED column", l)
	}
	if l := find("1 "); !strings.HasSuffix(l, "123 chunks, 4.5 MiB, oldest 3s") {
		t.Errorf("target 1: %q", l)
	}
	if l := find("2 "); !strings.HasSuffix(l, "none") {
		t.Errorf("target 2: %q", l)
	}
}
