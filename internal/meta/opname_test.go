package meta

import (
	"testing"

	"github.com/hashicorp/raft"
)

// The FSM's failpoints are armed per command ("meta/after-apply/create"):
// lastOp reads the op of a batch's last command from its encoding.
func TestLastOpNamesTheBatchsLastCommand(t *testing.T) {
	cmd := func(o op) *raft.Log {
		return &raft.Log{Type: raft.LogCommand, Data: (&command{Op: o, Name: "x"}).encode(nil)}
	}
	logs := []*raft.Log{cmd(opUnlink), cmd(opCreate), {Type: raft.LogNoop}}
	if got := lastOp(logs).String(); got != "create" {
		t.Errorf("lastOp = %q, want create", got)
	}
	if got := lastOp([]*raft.Log{{Type: raft.LogNoop}}); got != 0 {
		t.Errorf("lastOp of no command = %v, want 0", got)
	}
	for o := opInit; o <= opSetAtimes; o++ {
		if opNames[o] == "" {
			t.Errorf("op %d has no name", o)
		}
	}
}
