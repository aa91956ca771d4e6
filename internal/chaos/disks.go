package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/faultfs"
	"github.com/stratafs/strata/internal/mountinfo"
)

// The disks of a cluster with FaultDisks: every target directory is the
// mount point of a `strata faultfs` process (a loopback of a directory
// beside it whose operations fail on demand, package faultfs), started
// before the stores and left running through every fault — a disk is not
// a process a power loss kills. The disk faults switch a target's mode
// (eio: every read, write and fsync fails; enospc: writes fail as on a
// full disk) and back to ok.

// disk is one target's fault file system.
type disk struct {
	dir, source, control string
	proc                 *proc
}

// startDisks mounts a fault file system on every target directory and
// waits (20 s each) until it answers on its control socket.
func (c *Cluster) startDisks() error {
	if err := os.MkdirAll(filepath.Join(c.cfg.Dir, "disks"), 0o755); err != nil {
		return err
	}
	c.disks = make([][]*disk, len(c.StoreAddrs))
	for i := range c.StoreAddrs {
		for j := range c.targetsPerStore() {
			name := fmt.Sprintf("s%dt%d", i+1, j)
			d := &disk{dir: c.targetDir(i, j), source: filepath.Join(c.cfg.Dir, "disks", name+".src"),
				control: filepath.Join(c.cfg.Dir, "disks", name+".ctl")}
			for _, p := range []string{d.dir, d.source} {
				if err := os.MkdirAll(p, 0o755); err != nil {
					return err
				}
			}
			p, err := c.start("faultfs-"+name, nil, "faultfs", "--source", d.source, "--control", d.control, d.dir)
			if err != nil {
				return err
			}
			d.proc = p
			c.mu.Lock()
			c.faulty = append(c.faulty, p)
			c.mu.Unlock()
			c.disks[i] = append(c.disks[i], d)
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, err := faultfs.Send(d.control, "")
				if err == nil && fuseMounted(d.dir) {
					break
				}
				if p.exited() || time.Now().After(deadline) {
					return fmt.Errorf("fault file system at %s did not come up: %v (see logs/faultfs-%s.log)", d.dir, err, name)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return nil
}

// setDisk switches the fault file system of store i's target j to m.
func (c *Cluster) setDisk(i, j int, m faultfs.Mode) error {
	if i >= len(c.disks) || j >= len(c.disks[i]) {
		return fmt.Errorf("store %d target %d has no fault file system (disk faults need FaultDisks)", i+1, j)
	}
	got, err := faultfs.Send(c.disks[i][j].control, m)
	if err != nil {
		return err
	}
	if got != m {
		return fmt.Errorf("fault file system of store %d target %d: asked for %s, got %s", i+1, j, m, got)
	}
	return nil
}

// stopDisks lets held operations go, stops the fault file systems and
// detaches what they leave mounted (after the stores stopped).
func (c *Cluster) stopDisks() {
	for _, ds := range c.disks {
		for _, d := range ds {
			faultfs.Send(d.control, faultfs.OK)
		}
	}
	for _, p := range c.faulty {
		p.stop(10 * time.Second)
	}
	for _, ds := range c.disks {
		for _, d := range ds {
			if fuseMounted(d.dir) {
				syscall.Unmount(d.dir, syscall.MNT_DETACH)
			}
		}
	}
	c.faulty, c.disks = nil, nil
}

// fuseMounted reports whether dir is the mount point of a FUSE file system.
func fuseMounted(dir string) bool {
	ms, err := mountinfo.Read()
	if err != nil {
		return false
	}
	for _, m := range ms {
		if m.Point == dir && strings.HasPrefix(m.FSType, "fuse") {
			return true
		}
	}
	return false
}
