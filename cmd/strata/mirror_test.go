package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// registerFakeServers registers n storage servers of two targets each
// (no store behind them: the metadata service only hears them) and
// returns their addresses.
func registerFakeServers(t *testing.T, addr, keyFile string, n int) []string {
	t.Helper()
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	c := transport.NewClient(addr, transport.ClientConfig{Key: key, Conns: 1})
	defer c.Close()
	var addrs []string
	for i := range n {
		a := fmt.Sprintf("10.9.0.%d:7401", i+1)
		req := &rpc.RegisterServerReq{Addr: a, Host: a}
		for j := range 2 {
			u := fmt.Sprintf("%s-%d", a, j)
			req.Targets = append(req.Targets, rpc.TargetReg{UUID: u, Path: "/t/" + u, TotalBytes: 1 << 40, FreeBytes: 1 << 39})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.Call(ctx, rpc.MRegisterServer, req, &rpc.RegisterServerResp{})
		cancel()
		if err != nil {
			t.Fatalf("register %s: %v", a, err)
		}
		addrs = append(addrs, a)
	}
	return addrs
}

// TestMirrorCommands drives strata mirror create --auto, list and
// fail-over against a real metadata service, and checks the contract of
// strata status --json's "mirror_groups".
func TestMirrorCommands(t *testing.T) {
	addr, key := startMeta(t)
	servers := registerFakeServers(t, addr, key, 2)
	flags := []string{"--meta", addr, "--key-file", key}

	out, errOut, code := strata(t, nil, append([]string{"mirror", "create", "--auto"}, flags...)...)
	if code != 0 || !strings.Contains(out, "created 2 mirror group(s)") {
		t.Fatalf("mirror create --auto: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = strata(t, nil, append([]string{"mirror", "create", "--targets", "1,2"}, flags...)...)
	if code != 1 || !strings.Contains(errOut, "in mirror group") {
		t.Fatalf("mirror create of paired targets: exit %d (want 1)\n%s%s", code, out, errOut)
	}
	out, errOut, code = strata(t, nil, append([]string{"mirror", "create", "--targets", "1"}, flags...)...)
	if code != 2 {
		t.Fatalf("mirror create --targets 1: exit %d (want 2: a usage error)\n%s%s", code, out, errOut)
	}

	out, errOut, code = strata(t, nil, append([]string{"status", "--json"}, flags...)...)
	if code != 0 {
		t.Fatalf("status --json: exit %d\n%s", code, errOut)
	}
	var doc struct {
		Groups []map[string]any `json:"mirror_groups"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Groups) != 2 {
		t.Fatalf("mirror_groups: %v", doc.Groups)
	}
	for i, g := range doc.Groups {
		for _, k := range []string{"id", "epoch", "primary_target", "secondary_target", "resync_done_bytes", "resync_total_bytes", "resync_percent"} {
			if _, ok := g[k].(float64); !ok {
				t.Errorf("group %d: %q = %v, want a number", i, k, g[k])
			}
		}
		for _, k := range []string{"primary_server", "secondary_server", "state", "since"} {
			if _, ok := g[k].(string); !ok {
				t.Errorf("group %d: %q = %v, want a string", i, k, g[k])
			}
		}
		if g["id"] != float64(i+1) || g["state"] != "in_sync" || g["epoch"] != float64(1) {
			t.Errorf("group %d: %v", i, g)
		}
		ps, ss := g["primary_server"], g["secondary_server"]
		if ps == ss || (ps != servers[0] && ps != servers[1]) || (ss != servers[0] && ss != servers[1]) {
			t.Errorf("group %d: servers %v and %v, want the two registered (%v), one each", i, ps, ss, servers)
		}
		if _, err := time.Parse(time.RFC3339, g["since"].(string)); err != nil {
			t.Errorf("group %d: since %v: %v", i, g["since"], err)
		}
	}
	before := doc.Groups[0]

	out, errOut, code = strata(t, nil, append([]string{"mirror", "fail-over", "1"}, flags...)...)
	if code != 0 || !strings.Contains(out, "epoch 2") {
		t.Fatalf("mirror fail-over 1: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = strata(t, nil, append([]string{"mirror", "list", "--json"}, flags...)...)
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
		t.Fatalf("mirror list --json: exit %d %v\n%s%s", code, err, out, errOut)
	}
	if list[0]["primary_server"] != before["secondary_server"] || list[0]["epoch"] != float64(2) {
		t.Fatalf("after fail-over: %v (before %v)", list[0], before)
	}
	out, errOut, code = strata(t, nil, append([]string{"mirror", "list"}, flags...)...)
	if code != 0 || !strings.Contains(out, "GROUP") || !strings.Contains(out, "in sync") {
		t.Fatalf("mirror list: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = strata(t, nil, append([]string{"mirror", "replace", "1", "--target", "3"}, flags...)...)
	if code != 1 || !strings.Contains(errOut, "in sync") {
		t.Fatalf("mirror replace of an in-sync group: exit %d (want 1)\n%s%s", code, out, errOut)
	}
}

// TestStatusShowsGroups: the text status has one line per group with its
// copies, state (in sync / degraded since T / resyncing N%) and epoch.
func TestStatusShowsGroups(t *testing.T) {
	since := time.Date(2026, 11, 27, 13, 0, 0, 0, time.UTC)
	st := &rpc.ClusterStatusResp{Groups: []rpc.GroupInfo{
		{ID: 1, Epoch: 1, Primary: 1, Secondary: 3, PrimaryAddr: "a:1", SecondaryAddr: "b:1", PrimaryAlive: true, SecondaryAlive: true},
		{ID: 2, Epoch: 4, Primary: 4, Secondary: 2, State: rpc.GroupDegraded, SinceMs: since.UnixMilli(), PrimaryAddr: "b:1", SecondaryAddr: "a:1", PrimaryAlive: true},
		{ID: 3, Epoch: 7, Primary: 5, Secondary: 6, State: rpc.GroupResyncing, ResyncDone: 43, ResyncTotal: 100, PrimaryAddr: "c:1", SecondaryAddr: "a:1", PrimaryAlive: true, SecondaryAlive: true},
	}}
	var out bytes.Buffer
	printStatus(&out, st, admin.Capacity{}, false)
	for _, want := range []string{
		"GROUP", "target 1 on a:1", "in sync",
		"target 2 on a:1 (DOWN)", "degraded since 2026-11-27T13:00:00Z",
		"resyncing 43%",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status text lacks %q:\n%s", want, out.String())
		}
	}
	j := admin.StatusOf(st, rpc.StatFSResp{}, false)
	if g := j.MirrorGroups[2]; g.State != "resyncing" || g.ResyncPercent != 43 || g.Epoch != 7 {
		t.Errorf("JSON of a resyncing group: %+v", g)
	}
	if empty := admin.StatusOf(&rpc.ClusterStatusResp{}, rpc.StatFSResp{}, false); empty.MirrorGroups == nil {
		t.Error("no groups: mirror_groups should be [], not null")
	}
}
