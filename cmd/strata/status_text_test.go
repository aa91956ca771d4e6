package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/rpc"
)

// The metadata line of `strata status` says how many applied log entries
// are not yet durable.
func TestStatusTextUnsyncedEntries(t *testing.T) {
	st := &rpc.ClusterStatusResp{MetaAddr: "127.0.0.1:7400", RaftState: "Leader", Term: 2, CommitIndex: 9, AppliedIndex: 9, DurableIndex: 6}
	var b bytes.Buffer
	printStatus(&b, st, admin.Capacity{}, false)
	line, _, _ := strings.Cut(b.String(), "\n")
	if !strings.Contains(line, "durable 6 (3 not yet synced)") {
		t.Fatalf("metadata line %q does not say 3 entries are not yet synced", line)
	}
}

// Sessions opened by NFS gateways are listed as gateways below the
// clients; a status without any prints no such line.
func TestStatusTextNFSGateways(t *testing.T) {
	st := &rpc.ClusterStatusResp{MetaAddr: "127.0.0.1:7400", Clients: []rpc.ClientInfo{
		{ID: 1, Host: "a", MountPoint: "/mnt/strata"},
		{ID: 2, Host: "gw", MountPoint: "nfs://0.0.0.0:2049"},
	}}
	var b bytes.Buffer
	printStatus(&b, st, admin.Capacity{}, false)
	if !strings.Contains(b.String(), "nfs gateways: 0.0.0.0:2049 (client 2 on gw)\n") {
		t.Fatalf("no gateway line in:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "no gateway has reported") {
		t.Fatalf("a gateway without a report is not said to have none:\n%s", b.String())
	}
	// Its report: exports, NFS clients, calls.
	st.Gateways = []rpc.GatewayStatus{{Client: 2, Report: rpc.GatewayReport{Address: "0.0.0.0:2049",
		Exports: []string{"/=rw,sync,root_squash,anonuid=65534,anongid=65534,insecure,clients=10.0.0.0/16"}, Clients: 3, Ops: 12345, OpsPerSec: 17}}}
	b.Reset()
	printStatus(&b, st, admin.Capacity{}, false)
	var row string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "0.0.0.0:2049") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) != 6 || f[1] != "2" || f[2] != "3" || f[3] != "17" || f[4] != "12345" || !strings.HasPrefix(f[5], "/=rw,sync,") {
		t.Fatalf("gateway row %q (want address, client 2, 3 NFS clients, 17 ops/s, 12345 calls, the export) in:\n%s", row, b.String())
	}
	doc := admin.StatusOf(st, rpc.StatFSResp{}, false)
	if len(doc.NFSGateways) != 1 || doc.NFSGateways[0].Host != "gw" || doc.NFSGateways[0].OpsPerSecond != 17 || len(doc.NFSGateways[0].Exports) != 1 {
		t.Fatalf("status --json nfs_gateways: %+v", doc.NFSGateways)
	}
	st.Gateways = nil
	st.Clients = st.Clients[:1]
	b.Reset()
	printStatus(&b, st, admin.Capacity{}, false)
	if strings.Contains(b.String(), "nfs gateways") {
		t.Fatalf("a gateway line without gateways:\n%s", b.String())
	}
}

// Directory create delegations are listed below the clients, recalled
// ones said so; a status without any prints no such line.
func TestStatusTextDelegations(t *testing.T) {
	st := &rpc.ClusterStatusResp{MetaAddr: "127.0.0.1:7400", Clients: []rpc.ClientInfo{{ID: 1, Host: "a", MountPoint: "/mnt/strata"}}}
	var b bytes.Buffer
	printStatus(&b, st, admin.Capacity{}, false)
	if strings.Contains(b.String(), "delegations") {
		t.Fatalf("a delegation line without delegations:\n%s", b.String())
	}
	st.Delegations = []rpc.DelegationInfo{{Client: 1, Dir: 12, Epoch: 9}, {Client: 1, Dir: 13, Recalled: true}}
	b.Reset()
	printStatus(&b, st, admin.Capacity{}, false)
	if !strings.Contains(b.String(), "create delegations: directory 12 (client 1), directory 13 (client 1, recalled)\n") {
		t.Fatalf("no delegation line in:\n%s", b.String())
	}
}
