package chaos

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/netns"
)

// Where the processes run (ClusterConfig.Hosts).
const (
	// Loopback: every process on 127.0.0.1 of the machine's namespace.
	Loopback = "loopback"
	// Netns: each voter on a host of its own (a network namespace), the
	// stores and the mount on one more, all joined by a bridge (package
	// netns), so that the network faults can cut a voter's links.
	Netns = "netns"
)

// nsBase starts the names of the namespaces chaos makes: nsBase+PID+"-"
// and the host's name, so a later run finds a dead run's leftovers.
const nsBase = "strata-chaos-"

// nsSubnet numbers the hosts (it exists only inside the namespaces).
const nsSubnet = "10.213.8"

// hosts are the namespaces of a Netns cluster: voters[i] runs voter i,
// stores[i] store i (mirrored clusters; else the stores run on client),
// client the mount and every `strata status`.
type hosts struct {
	net    *netns.Net
	voters []*netns.Host
	stores []*netns.Host
	client *netns.Host
}

// newHosts makes n voter hosts, stores store hosts and the client host,
// with shaped links (Delay) if asked.
func newHosts(n, stores int, shaped bool) (*hosts, error) {
	var names, storeNames []string
	for i := range n {
		names = append(names, fmt.Sprintf("m%d", i+1))
	}
	for i := range stores {
		storeNames = append(storeNames, fmt.Sprintf("s%d", i+1))
	}
	net, err := netns.New(netns.Config{Prefix: netns.OwnedPrefix(nsBase, os.Getpid()), Subnet: nsSubnet, Shaped: shaped},
		append(append(names, storeNames...), "c")...)
	if err != nil {
		return nil, fmt.Errorf("hosts as network namespaces: %w", err)
	}
	h := &hosts{net: net, client: net.Host("c")}
	for _, name := range names {
		h.voters = append(h.voters, net.Host(name))
	}
	for _, name := range storeNames {
		h.stores = append(h.stores, net.Host(name))
	}
	return h, nil
}

// cutFromVoters drops every packet host s sends to the voters (Heal
// undoes it): no TCP exchange between them works either way, since s's
// segments and acknowledgements are lost, while s keeps reaching the
// client and the other stores. (Rules on s alone: each nft run in a
// namespace takes a while, and the fault is in place only after all.)
func (h *hosts) cutFromVoters(s *netns.Host) error {
	for _, v := range h.voters {
		if err := h.net.DropFrom(s, v); err != nil {
			return err
		}
	}
	return nil
}

// RemoveLeftovers removes what a chaos run that died without cleaning up
// (kill -9, a crash) left: the namespaces named after a PID that no longer
// runs, the processes in them, and the FUSE mount such a process served.
// Namespaces of runs still going are left alone.
func RemoveLeftovers(log *slog.Logger) error {
	var mounts []string
	removed, err := netns.RemoveLeftovers(nsBase, 30*time.Second, func(pid int) {
		if m := mountPointOf(pid); m != "" {
			mounts = append(mounts, m)
		}
	})
	for _, m := range mounts {
		if onStrata(m) {
			syscall.Unmount(m, syscall.MNT_DETACH)
		}
	}
	if len(removed) > 0 {
		log.Info("chaos: removed the leftovers of an earlier run", "namespaces", removed, "mounts", mounts)
	}
	return err
}

// mountPointOf is the mount point of a `strata mount … DIR` process (its
// last argument), or "".
func mountPointOf(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return ""
	}
	argv := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	if len(argv) < 3 || string(argv[1]) != "mount" {
		return ""
	}
	return string(argv[len(argv)-1])
}

// partition cuts host i's link (both directions) or brings it back.
func (h *hosts) partition(i int, down bool) error {
	if down {
		return h.voters[i].LinkDown()
	}
	return h.voters[i].LinkUp()
}

// oneWay drops what voter i sends to the other voters (out) or what they
// send to it (!out). The client host keeps reaching every voter.
func (h *hosts) oneWay(i int, out bool) error {
	for j, o := range h.voters {
		if j == i {
			continue
		}
		from, to := h.voters[i], o
		if !out {
			from, to = o, h.voters[i]
		}
		if err := h.net.DropFrom(from, to); err != nil {
			return err
		}
	}
	return nil
}
