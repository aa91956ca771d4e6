package meta

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// tableFaults is a switch that makes the given operations on the state
// machine store's table files (*.sst) fail with errorfs.ErrInjected.
func tableFaults(kinds ...errorfs.OpKind) *errorfs.Toggle {
	return &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if slices.Contains(kinds, op.Kind) && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	})}
}

// answers runs f and fails the test if it has not returned within 60 s:
// a failing disk under the state machine's store must give answers (errors
// where the store cannot serve), never a hang.
func answers(t *testing.T, what string, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return returns(t, what, ch)
}

// TestStoreFaultsAnswerErrors runs the metadata service with its state
// machine's store on pebble's errorfs (Config.FS). With reads of the
// store's tables failing, a getattr that needs one answers EIO; with
// writes of tables failing, changes still answer (the raft log holds
// them), cluster status names the failing store, and a raft snapshot —
// which must first make the store durable — fails with the disk's error
// rather than hang. Once the faults stop, everything answers again and
// nothing acknowledged is lost.
func TestStoreFaultsAnswerErrors(t *testing.T) {
	reads := tableFaults(errorfs.OpFileRead, errorfs.OpFileReadAt)
	writes := tableFaults(errorfs.OpCreate, errorfs.OpFileWrite, errorfs.OpFileWriteAt)
	cfg := testConfig(t, "")
	cfg.FS = errorfs.Wrap(vfs.Default, errorfs.Any(reads, writes))
	// The flush's give-up time (10 s) passes in real time; on a fake clock
	// the registered storage server does not time out meanwhile.
	fakeClock(t, &cfg)
	s := openService(t, cfg)
	c := newClient(t, s.Addr())
	c.registerTargets("127.0.0.1:1", "u1")
	old := c.mustCreate(1, "old", fileMode)
	if err := s.db.Flush(); err != nil { // old's inode now lives in a table
		t.Fatal(err)
	}
	s.fsm.cache.clearAll() // and only there: not in the record cache the create filled

	reads.On()
	err := answers(t, "getattr with table reads failing", func() error {
		_, err := c.getattr(old.Ino)
		return err
	})
	wantErrno(t, err, syscall.EIO, "getattr of an inode in a table that cannot be read")
	if !strings.Contains(err.Error(), "injected") {
		t.Errorf("EIO does not carry the disk's error: %v", err)
	}
	reads.Off()
	if a := c.mustGetattr(old.Ino); a.Ino != old.Ino {
		t.Fatalf("getattr after the reads recovered = %+v", a)
	}

	writes.On()
	during := c.mustCreate(1, "during", fileMode)
	err = answers(t, "snapshot with table writes failing", s.node.Snapshot)
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("snapshot with table writes failing: %v, want the injected disk error", err)
	}
	if err := testutil.WaitFor(10*time.Second, func() error {
		var cs rpc.ClusterStatusResp
		if err := c.call(rpc.MClusterStatus, &rpc.Empty{}, &cs); err != nil {
			return err
		}
		for _, p := range cs.Problems {
			if strings.HasPrefix(p, "metadata store: ") && strings.Contains(p, "injected") {
				return nil
			}
		}
		return fmt.Errorf("problems %q do not name the failing store", cs.Problems)
	}); err != nil {
		t.Fatal(err)
	}
	also := c.mustCreate(1, "also", fileMode) // changes answer while the store cannot flush

	writes.Off()
	if err := answers(t, "snapshot after the disk recovered", s.node.Snapshot); err != nil {
		t.Fatalf("snapshot after the disk recovered: %v", err)
	}
	for _, f := range []rpc.Attr{old, during, also} {
		if a := c.mustGetattr(f.Ino); a.Ino != f.Ino || a.Nlink != 1 {
			t.Fatalf("inode %d after the faults = %+v", f.Ino, a)
		}
	}
}
