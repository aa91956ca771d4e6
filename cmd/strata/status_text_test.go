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
	st.Clients = st.Clients[:1]
	b.Reset()
	printStatus(&b, st, admin.Capacity{}, false)
	if strings.Contains(b.String(), "nfs gateways") {
		t.Fatalf("a gateway line without gateways:\n%s", b.String())
	}
}
