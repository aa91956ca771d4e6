package admin

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
)

// Version describes this build: the module version, the commit it was
// built from (with "+dirty" for uncommitted changes) and the versions of
// the wire protocol and of each on-disk format, which decide what it can
// run alongside and read.
func Version() string {
	version, commit, goVersion := "(devel)", "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && commit != "unknown" {
			commit += "+dirty"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "strata %s\n", version)
	fmt.Fprintf(&b, "commit:          %s\n", commit)
	fmt.Fprintf(&b, "go:              %s\n", goVersion)
	fmt.Fprintf(&b, "wire protocol:   %d\n", rpc.WireVersion)
	fmt.Fprintf(&b, "metadata format: %d\n", meta.FormatVersion)
	fmt.Fprintf(&b, "chunk format:    %d\n", store.ChunkFormatVersion)
	fmt.Fprintf(&b, "raft log format: %d\n", consensus.WALVersion)
	return b.String()
}
