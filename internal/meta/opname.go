package meta

import "strconv"

// opNames are the commands' names in logs and failpoints
// ("meta/before-reply/create"); indexed by op.
var opNames = [...]string{
	opInit: "init", opCreate: "create", opSetAttr: "setattr", opUnlink: "unlink",
	opRmdir: "rmdir", opRename: "rename", opLink: "link", opSetXattr: "setxattr",
	opRemoveXattr: "removexattr", opCommitSize: "commitsize", opSetDirLayout: "setdirlayout",
	opSessionOpen: "sessionopen", opSessionClose: "sessionclose", opRegister: "register",
	opReap: "reap", opReapMany: "reapmany", opRaiseIno: "raiseino", opTmpfile: "tmpfile",
	opSetAtimes: "setatimes",
}

// String is the command's name, e.g. "create".
func (o op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "op" + strconv.Itoa(int(o))
}
