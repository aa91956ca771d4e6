package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/faultfs"
)

// The faults of a mirrored cluster (issue 21's list): each picks a group
// from `strata status --json` "mirror_groups" (all of them in sync when
// the trial starts) and hits the storage server of its primary or of its
// secondary, found by the --listen address status names.
const (
	// KillPrimary: kill -9 of a group primary's server; restarted once
	// status names another primary.
	KillPrimary Fault = "kill-primary"
	// KillSecondary: kill -9 of a group secondary's server; restarted
	// after Schedule.Hold.
	KillSecondary Fault = "kill-secondary"
	// StopPrimary: SIGSTOP of a primary's server for Schedule.StoreHold
	// (longer than the failover timeout), then SIGCONT: it must have been
	// fenced (its lease ran out, the group moved on to a new epoch).
	StopPrimary Fault = "stop-primary"
	// PartitionPrimary (netns): what the primary's host sends to the
	// metadata voters is dropped for StoreHold (so no TCP exchange with
	// them works); the mount and the other stores still reach it. Split
	// brain must not happen.
	PartitionPrimary Fault = "partition-primary"
	// HeartbeatLossPrimary: a primary's server sends no heartbeat for
	// StoreHold (its failpoint store/before-heartbeat, switched through
	// its STRATA_FAILPOINTS_FILE) and nothing else changes: it still
	// reaches the voters for its group map and reports, they reach it,
	// and the clients and the other stores reach it. Its lease lapses and
	// the group switches; split brain must not happen. (partition-primary
	// cuts all of that, not the heartbeats alone.)
	HeartbeatLossPrimary Fault = "heartbeat-loss-primary"
	// LinkDownStore (netns): a primary's host loses its link for StoreHold.
	LinkDownStore Fault = "link-down-store"
	// DiskEIOPrimary: every read, write and fsync of a primary's target
	// fails with EIO (faultfs) for StoreHold; then the disk is healed, and
	// the server restarted if its groups are not all in sync 30 s later.
	DiskEIOPrimary Fault = "disk-eio-primary"
	// DiskFullSecondary: a secondary's target is full (ENOSPC) for
	// StoreHold; then healed as DiskEIOPrimary.
	DiskFullSecondary Fault = "disk-full-secondary"
	// KillPrimaryLeader: kill -9 of a primary's server and, a second
	// later (before the failover timeout), of the metadata leader: the new
	// leader must make the switch. Both restarted once it is made.
	KillPrimaryLeader Fault = "kill-primary-leader"
	// DiskSlowPrimary: every data operation of a primary's target waits
	// Schedule.Delay first (faultfs slow mode) for StoreHold.
	DiskSlowPrimary Fault = "disk-slow-primary"
	// KillAll: a power loss. The load is paused between operations (each
	// writer's last one an acknowledged fsync), every voter, store and
	// the mount are killed with SIGKILL at once, restarted, and every
	// record acknowledged so far is read back before the load resumes.
	KillAll Fault = "kill-all"
)

// Mirrored reports whether f needs a mirrored cluster.
func (f Fault) Mirrored() bool {
	switch f {
	case KillPrimary, KillSecondary, StopPrimary, PartitionPrimary, LinkDownStore, DiskEIOPrimary, DiskFullSecondary,
		KillPrimaryLeader, DiskSlowPrimary, HeartbeatLossPrimary:
		return true
	}
	return false
}

// OnDisk reports whether f needs targets on fault file systems.
func (f Fault) OnDisk() bool {
	return f == DiskEIOPrimary || f == DiskFullSecondary || f == DiskSlowPrimary
}

// onSecondary: the victim is a group's secondary.
func (f Fault) onSecondary() bool { return f == KillSecondary || f == DiskFullSecondary }

// switches: the group must get another primary.
func (f Fault) switches() bool {
	return f == KillPrimary || f == StopPrimary || f == PartitionPrimary || f == LinkDownStore || f == KillPrimaryLeader ||
		f == HeartbeatLossPrimary
}

// Bounds of a mirror trial's waits.
const (
	switchBound = 60 * time.Second
	powerBound  = 120 * time.Second
	// diskBound: how long a disk fault's group may take to be in sync
	// again by itself once the disk is healed, before the server restarts.
	diskBound = 30 * time.Second
)

// injectMirror runs one trial of a mirror fault (or a power loss): the
// fault, the wait for the switch, the repair, the wait for the resync.
// What went wrong without making the cluster unusable goes to
// Trial.Problems; an error ends the run.
func (c *Cluster) injectMirror(ctx context.Context, l *Load, h *Histories, p *prober, rng *rand.Rand, n int, fault Fault, s Schedule) (*Trial, error) {
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return nil, err
	}
	t := &Trial{N: n, Fault: fault, Leader: leader}
	if fault == KillAll {
		return t, c.powerLoss(ctx, l, h, t, s)
	}
	gs, err := c.WaitInSync(ctx, 1, s.ResyncBound)
	if err != nil {
		return nil, err
	}
	g := gs[rng.IntN(len(gs))]
	t.Group, t.Epoch = g.ID, g.Epoch
	t.Victim = g.PrimaryServer
	target := g.PrimaryTarget
	if fault.onSecondary() {
		t.Victim, target = g.SecondaryServer, g.SecondaryTarget
	}
	i := c.StoreIndex(t.Victim)
	if i < 0 {
		return nil, fmt.Errorf("status names server %q for group %d, not one of %v", t.Victim, g.ID, c.StoreAddrs)
	}
	var fence *fenceProbe
	if fault == StopPrimary || fault == PartitionPrimary || fault == HeartbeatLossPrimary {
		if fence, err = p.prepareFence(l, t.Victim, g.ID, g.Epoch); err != nil {
			t.Problems = append(t.Problems, err.Error())
		}
	}
	t.At = l.Now()
	t.AtSec = t.At.Seconds()
	start := time.Now()
	var undo func() error // after the hold; nil: restart the killed server
	switch fault {
	case KillPrimary, KillSecondary:
		err = c.SignalStore(i, syscall.SIGKILL)
	case KillPrimaryLeader:
		if err = c.SignalStore(i, syscall.SIGKILL); err == nil {
			time.Sleep(time.Second)
			if li := c.VoterIndex(leader); li < 0 {
				err = fmt.Errorf("status names leader %q, not one of %v", leader, c.MetaAddrs)
			} else {
				err = c.Signal(li, syscall.SIGKILL)
				t.note(fmt.Sprintf("metadata leader %s killed 1 s later", leader))
			}
		}
	case StopPrimary:
		err = c.SignalStore(i, syscall.SIGSTOP)
		undo = func() error { return c.SignalStore(i, syscall.SIGCONT) }
	case PartitionPrimary:
		err = c.hosts.cutFromVoters(c.storeHost(i))
		undo = c.hosts.net.Heal
	case HeartbeatLossPrimary:
		err = c.setStoreFailpoints(i, "store/before-heartbeat=error")
		undo = func() error { return c.setStoreFailpoints(i, "") }
	case LinkDownStore:
		err = c.storeHost(i).LinkDown()
		undo = c.storeHost(i).LinkUp
	case DiskEIOPrimary, DiskFullSecondary, DiskSlowPrimary:
		mode := map[Fault]faultfs.Mode{DiskEIOPrimary: faultfs.EIO, DiskFullSecondary: faultfs.Full, DiskSlowPrimary: faultfs.Slow(s.Delay)}[fault]
		var j int
		if j, err = c.targetIndex(ctx, i, target); err == nil {
			t.note(fmt.Sprintf("target %d: %s", target, mode))
			err = c.setDisk(i, j, mode)
		}
		undo = func() error { return c.setDisk(i, j, faultfs.OK) }
	default:
		err = fmt.Errorf("unknown fault %q", fault)
	}
	if err != nil {
		if undo != nil {
			undo()
		}
		return nil, err
	}
	if d := time.Since(start); d > time.Second { // a partition's nft rules take a while
		t.note(fmt.Sprintf("in place after %.2fs", d.Seconds()))
	}
	var newEpoch uint64
	if fault.switches() {
		newEpoch = c.waitSwitch(ctx, t, g, start)
	}
	var repaired time.Time // when the fault was undone or the server restarted
	switch {
	case fence != nil && newEpoch > 0:
		if err := fence.run(start.Add(s.StoreHold), l.Now, newEpoch, undo); err != nil {
			return t, err
		}
		t.Fence = fence.r
		repaired, undo = fence.undone, func() error { return nil }
	case undo == nil: // a kill: restart once switched (a secondary: after the hold)
		if !fault.switches() {
			sleepUntil(start.Add(s.Hold))
		}
	default:
		sleepUntil(start.Add(s.StoreHold))
	}
	if !fault.switches() {
		// What the fault did to the group (informative: a secondary's
		// loss degrades the group only once a write finds it gone).
		if gs, err := c.MirrorGroups(ctx); err == nil {
			if g2, ok := group(gs, g.ID); ok {
				t.note(fmt.Sprintf("group %s, epoch %d, primary %s", g2.State, g2.Epoch, g2.PrimaryServer))
			}
		}
	}
	if repaired.IsZero() {
		repaired = time.Now()
	}
	if undo != nil {
		err = undo()
	} else {
		err = c.StartStore(i)
	}
	if err != nil {
		return t, err
	}
	if fault == KillPrimaryLeader {
		li := c.VoterIndex(leader)
		if err := c.StartVoter(li); err != nil {
			return t, err
		}
		if err := c.WaitCaughtUp(ctx, leader, 1000, 60*time.Second); err != nil {
			return t, err
		}
	}
	if fault.OnDisk() {
		// A healed disk under a running server: does the group come back
		// by itself? If not, restart the server, as an operator would.
		if _, err := c.WaitInSync(ctx, 0, diskBound); err != nil {
			t.note(fmt.Sprintf("not in sync %v after the disk healed (%v): server restarted", diskBound, err))
			if err := c.restartStore(i); err != nil {
				return t, err
			}
		}
	}
	if _, err := c.WaitInSync(ctx, 0, s.ResyncBound); err != nil {
		t.Problems = append(t.Problems, err.Error())
	} else {
		t.ResyncSeconds = time.Since(repaired).Seconds()
	}
	t.end = l.Now()
	return t, nil
}

// waitSwitch waits (switchBound) until status names a primary of group g
// other than its server before the fault, in a newer epoch, and returns
// that epoch (0: none within the bound, a problem of the trial).
func (c *Cluster) waitSwitch(ctx context.Context, t *Trial, g MirrorGroup, start time.Time) uint64 {
	deadline := start.Add(switchBound)
	var last string
	for {
		gs, err := c.MirrorGroups(ctx)
		if err == nil {
			if g2, ok := group(gs, g.ID); ok && g2.PrimaryServer != g.PrimaryServer && g2.Epoch > g.Epoch {
				t.NewPrimary = g2.PrimaryServer
				t.SwitchSeconds = time.Since(start).Seconds()
				return g2.Epoch
			} else if ok {
				last = fmt.Sprintf("primary %s, %s, epoch %d", g2.PrimaryServer, g2.State, g2.Epoch)
			} else {
				last = "group not listed"
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Problems = append(t.Problems, fmt.Sprintf("group %d: no other primary within %v of the fault (%s)", g.ID, switchBound, last))
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// powerLoss is the kill-all trial.
func (c *Cluster) powerLoss(ctx context.Context, l *Load, h *Histories, t *Trial, s Schedule) error {
	t.Victim = "every process"
	if h != nil {
		h.Pause()
		defer h.Resume()
	}
	l.Pause()
	paused := true
	defer func() {
		if paused {
			l.Resume()
		}
	}()
	t.At = l.Now()
	t.AtSec = t.At.Seconds()
	start := time.Now()
	if err := c.KillAll(); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, powerBound)
	defer cancel()
	if err := c.RestartAll(rctx); err != nil {
		return fmt.Errorf("restart after the power loss: %w", err)
	}
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	t.Leader, t.Elected = leader, time.Since(start).Seconds()
	repaired := time.Now()
	if c.cfg.Mirror {
		if _, err := c.WaitInSync(ctx, 0, s.ResyncBound); err != nil {
			t.Problems = append(t.Problems, err.Error())
		} else {
			t.ResyncSeconds = time.Since(repaired).Seconds()
		}
	}
	bad := l.checkAcked()
	t.Detail = fmt.Sprintf("%d acknowledged records read back, %d bad", bad.checked, len(bad.bad))
	t.Problems = append(t.Problems, bad.bad...)
	// The trial's operations: the first ones on the restarted cluster.
	l.Resume()
	paused = false
	time.Sleep(2 * time.Second)
	t.end = l.Now()
	return nil
}

// targetIndex is the index among store i's targets of target id, from the
// target's path in status.
func (c *Cluster) targetIndex(ctx context.Context, i int, id uint32) (int, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	for _, tg := range st.Targets {
		if tg.ID != id {
			continue
		}
		for j := range c.targetsPerStore() {
			if tg.Path == c.targetDir(i, j) {
				return j, nil
			}
		}
		return 0, fmt.Errorf("target %d at %s is not one of store %s's", id, tg.Path, c.StoreAddrs[i])
	}
	return 0, fmt.Errorf("status lists no target %d", id)
}

// restartStore stops store i if it still runs (SIGKILL) and starts it.
func (c *Cluster) restartStore(i int) error {
	c.mu.Lock()
	p := c.stores[i]
	c.mu.Unlock()
	if p != nil && !p.exited() {
		if err := p.signal(syscall.SIGKILL); err != nil {
			return err
		}
	}
	return c.StartStore(i)
}

// note appends what happened to the trial's detail.
func (t *Trial) note(s string) {
	if t.Detail != "" {
		t.Detail += "; "
	}
	t.Detail += s
}

func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}
