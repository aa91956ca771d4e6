package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Mirror groups (docs/design/0014), as the cluster's scripts see them:
// `strata mirror create --auto` pairs the targets, `strata stripe set
// --mirror DIR` makes the files under DIR mirrored, and `strata status
// --json` lists the groups under "mirror_groups" with the stores' --listen
// addresses, which is how a fault finds the process to kill.

// Group states as `strata status --json` names them.
const (
	InSync    = "in_sync"
	Degraded  = "degraded"
	Resyncing = "resyncing"
)

// MirrorGroup is one entry of "mirror_groups" (the fields chaos reads).
type MirrorGroup struct {
	ID              uint32 `json:"id"`
	PrimaryServer   string `json:"primary_server"`
	SecondaryServer string `json:"secondary_server"`
	PrimaryTarget   uint32 `json:"primary_target"`
	SecondaryTarget uint32 `json:"secondary_target"`
	State           string `json:"state"`
	Epoch           uint64 `json:"epoch"`
}

// MirrorGroups reads the groups from `strata status --json`.
func (c *Cluster) MirrorGroups(ctx context.Context) ([]MirrorGroup, error) {
	out, err := c.admin(ctx, "status", "--json")
	if err != nil {
		return nil, err
	}
	var doc struct {
		Groups *[]MirrorGroup `json:"mirror_groups"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("strata status --json: %w", err)
	}
	if doc.Groups == nil {
		return nil, fmt.Errorf("strata status --json has no \"mirror_groups\" (a binary without mirror groups?)")
	}
	return *doc.Groups, nil
}

// group finds group id in gs.
func group(gs []MirrorGroup, id uint32) (MirrorGroup, bool) {
	for _, g := range gs {
		if g.ID == id {
			return g, true
		}
	}
	return MirrorGroup{}, false
}

// setUpMirror pairs the targets, waits (60 s) until every target is in
// an in-sync group, and marks the MirrorDirs mirrored.
func (c *Cluster) setUpMirror(ctx context.Context) error {
	if _, err := c.admin(ctx, "mirror", "create", "--auto"); err != nil {
		return err
	}
	want := c.cfg.Stores * c.targetsPerStore() / 2
	if _, err := c.WaitInSync(ctx, want, 60*time.Second); err != nil {
		return err
	}
	for _, d := range c.cfg.MirrorDirs {
		dir := filepath.Join(c.Mount, d)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("mirrored directory: %w", err)
		}
		if out, err := c.command(ctx, "stripe", "set", "--mirror", dir); err != nil {
			return fmt.Errorf("strata stripe set --mirror %s: %w: %s", dir, err, out)
		}
	}
	return nil
}

// command runs `strata ARGS` (no cluster flags) on the client host, 10 s
// at most, and returns its combined output.
func (c *Cluster) command(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := c.clientCommand(ctx, args...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// WaitInSync waits, bounded by d, until status lists at least n groups
// (0: any number) and every one is in sync with both servers named, and
// returns them.
func (c *Cluster) WaitInSync(ctx context.Context, n int, d time.Duration) ([]MirrorGroup, error) {
	deadline := time.Now().Add(d)
	var last string
	for {
		gs, err := c.MirrorGroups(ctx)
		if err == nil {
			var out []string
			for _, g := range gs {
				if g.State != InSync {
					out = append(out, fmt.Sprintf("group %d %s (epoch %d)", g.ID, g.State, g.Epoch))
				}
			}
			if len(gs) >= n && len(gs) > 0 && len(out) == 0 {
				return gs, nil
			}
			last = fmt.Sprintf("%d groups; %s", len(gs), strings.Join(out, ", "))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return gs, fmt.Errorf("mirror groups not all in sync within %v: %s", d, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// KillAll is a power loss: kill -9 of the mounts, every store and every
// voter, at once (the fault file systems, the disks, stay).
func (c *Cluster) KillAll() error {
	c.mu.Lock()
	ps := append([]*proc{c.mount, c.mount2}, c.stores...)
	ps = append(ps, c.voters...)
	c.mu.Unlock()
	for _, p := range ps {
		if p != nil && !p.exited() {
			syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	for _, p := range ps {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s (pid %d) did not die within 10s of SIGKILL", p.name, p.cmd.Process.Pid)
		}
	}
	return nil
}

// RestartAll starts what KillAll killed: the voters, then (once a leader
// is named) the stores and the mount.
func (c *Cluster) RestartAll(ctx context.Context) error {
	// The killed mount's daemon is gone: detach what it left. (Its
	// successor's own check — a stat of the mount point failing with
	// ENOTCONN — can be answered from the attributes the kernel cached,
	// and then refuses the mount point as a live Strata mount.)
	for _, m := range []string{c.Mount, c.LockMount} {
		if m != "" && fuseMounted(m) {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("detach the dead mount at %s: %w", m, err)
			}
		}
	}
	for i := range c.MetaAddrs {
		if err := c.StartVoter(i); err != nil {
			return err
		}
	}
	if _, err := c.WaitLeader(ctx, 60*time.Second); err != nil {
		return err
	}
	return c.startServing(ctx)
}
