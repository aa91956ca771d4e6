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
