package meta

import (
	"strconv"

	"github.com/hashicorp/raft"
)

// opNames are the commands' names in logs and failpoints
// ("meta/before-reply/create"); indexed by op.
var opNames = [...]string{
	opInit: "init", opCreate: "create", opSetAttr: "setattr", opUnlink: "unlink",
	opRmdir: "rmdir", opRename: "rename", opLink: "link", opSetXattr: "setxattr",
	opRemoveXattr: "removexattr", opCommitSize: "commitsize", opSetDirLayout: "setdirlayout",
	opSessionOpen: "sessionopen", opSessionClose: "sessionclose", opRegister: "register",
	opReap: "reap", opReapMany: "reapmany", opRaiseIno: "raiseino", opTmpfile: "tmpfile",
	opSetAtimes: "setatimes", opHALease: "halease",
	opReserveInos: "reserveinos", opCreateBatch: "createbatch", opDelegate: "delegate", opReturn: "return",
	opUninline: "uninline",
}

// String is the command's name, e.g. "create".
func (o op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "op" + strconv.Itoa(int(o))
}

// lastOp is the op of the last command in logs (0 without one): what the
// FSM's failpoints are armed for ("meta/after-apply/create"). The op is
// the command format's byte at offset 1 (command.go).
func lastOp(logs []*raft.Log) op {
	for i := len(logs) - 1; i >= 0; i-- {
		if l := logs[i]; l.Type == raft.LogCommand && len(l.Data) > 1 {
			return op(l.Data[1])
		}
	}
	return 0
}
