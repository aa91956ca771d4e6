package nfs_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/meta"
)

// TestSyncExportGroupCommit: concurrent namespace changes on a sync export
// share metadata log syncs (durable's group commit) and are each answered
// only once on stable storage; on an async export they are not waited for.
// The metadata service syncs its log only when asked (SyncDelay of an
// hour), so what is durable is what the gateway's barriers made so.
func TestSyncExportGroupCommit(t *testing.T) {
	cl := startClusterWith(t, func(c *meta.Config) { c.SyncDelay = time.Hour })
	g := cl.startGateway("/=rw,sync,no_root_squash,clients=127.0.0.1", "/scratch=rw,async,no_root_squash,clients=127.0.0.1")
	node := cl.meta.Node()
	root := mount(t, g.dial(t, "", 0, 0), "/")
	if _, err := g.dial(t, "", 0, 0).Mkdir(root, "scratch", 0o755); err != nil {
		t.Fatal(err)
	}
	const streams, files = 8, 10
	run := func(dir []byte, check bool) error {
		var wg sync.WaitGroup
		errs := make([]error, streams)
		for i := range streams {
			c := g.dial(t, "", 0, 0)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < files && errs[i] == nil; k++ {
					name := fmt.Sprintf("s%d-f%d", i, k)
					// Whatever was in the log before the call went out
					// is durable once its answer is back.
					before := node.Raft().LastIndex()
					if _, err := c.Create(dir, name, 0o644); err != nil {
						errs[i] = err
						break
					}
					errs[i] = c.Remove(dir, name)
					if d := node.DurableIndex(); check && errs[i] == nil && d < before {
						errs[i] = fmt.Errorf("REMOVE of %s answered with the log durable up to %d of %d", name, d, before)
					}
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	syncs := cl.c.Calls("meta", 27) // rpc.MSync
	if err := run(root, true); err != nil {
		t.Fatal(err)
	}
	if d, last := node.DurableIndex(), node.Raft().LastIndex(); d < last {
		t.Fatalf("after the sync export's changes the log is durable up to %d of %d", d, last)
	}
	n := cl.c.Calls("meta", 27) - syncs
	t.Logf("%d creates and removes on a sync export: %d metadata syncs", 2*streams*files, n)
	if n == 0 || n > 2*streams*files {
		t.Fatalf("%d metadata syncs for %d changes", n, 2*streams*files)
	}

	mnt := g.dial(t, "", 0, 0)
	scratch := mount(t, mnt, "/scratch")
	if err := run(scratch, false); err != nil {
		t.Fatal(err)
	}
	if d, last := node.DurableIndex(), node.Raft().LastIndex(); d >= last {
		t.Fatalf("an async export's changes were synced (log durable up to %d of %d)", d, last)
	}
}
