package peers

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Network namespaces. All names start with nsPrefix so that a later run can
// find and remove the leftovers of a crashed one.
const (
	nsPrefix = "strata-bench-"
	nsHub    = nsPrefix + "hub"
	bridge   = "sbbr0"
	subnet   = "10.203.0." // /24, exists only inside our namespaces
)

// netNode is one namespace on the hub bridge with one address.
type netNode struct {
	ns   string
	addr string
}

func nsPath(ns string) string { return "/run/netns/" + ns }

// inNS prefixes argv so that it runs in ns's network namespace only (the
// mount namespace stays the host's, so FUSE mounts are visible).
func inNS(ns string, argv ...string) []string {
	return append([]string{"nsenter", "--net=" + nsPath(ns), "--"}, argv...)
}

// ensureHub creates the hub namespace and its bridge.
func ensureHub(ctx context.Context) error {
	if _, err := os.Stat(nsPath(nsHub)); err == nil {
		return nil
	}
	for _, argv := range [][]string{
		{"ip", "netns", "add", nsHub},
		{"ip", "-n", nsHub, "link", "set", "lo", "up"},
		{"ip", "-n", nsHub, "link", "add", bridge, "type", "bridge"},
		{"ip", "-n", nsHub, "link", "set", bridge, "up"},
	} {
		if _, err := run(ctx, 20*time.Second, argv[0], argv[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// addNode creates namespace name with address subnet+host on a veth pair
// whose other end is a port of the hub bridge.
func addNode(ctx context.Context, name string, host int) (netNode, error) {
	n := netNode{ns: nsPrefix + name, addr: subnet + strconv.Itoa(host)}
	if err := ensureHub(ctx); err != nil {
		return n, err
	}
	port := fmt.Sprintf("sbp%d", host)
	for _, argv := range [][]string{
		{"ip", "netns", "add", n.ns},
		{"ip", "-n", n.ns, "link", "set", "lo", "up"},
		{"ip", "-n", n.ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", nsHub},
		{"ip", "-n", nsHub, "link", "set", port, "master", bridge},
		{"ip", "-n", nsHub, "link", "set", port, "up"},
		{"ip", "-n", n.ns, "addr", "add", n.addr + "/24", "dev", "eth0"},
		{"ip", "-n", n.ns, "link", "set", "eth0", "up"},
	} {
		if _, err := run(ctx, 20*time.Second, argv[0], argv[1:]...); err != nil {
			return n, err
		}
	}
	return n, nil
}

// ourNamespaces lists existing namespaces with our prefix.
func ourNamespaces() []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), nsPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// killNamespace stops every process in ns (they are ours: nothing else
// runs in a namespace we created), then deletes it.
func killNamespace(ctx context.Context, ns string) error {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		pids := nsPIDs(ctx, ns)
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			syscall.Kill(p, sig)
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(nsPIDs(ctx, ns)) > 0 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
	}
	_, err := run(ctx, 20*time.Second, "ip", "netns", "delete", ns)
	return err
}

func nsPIDs(ctx context.Context, ns string) []int {
	out, err := run(ctx, 10*time.Second, "ip", "netns", "pids", ns)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if p, err := strconv.Atoi(f); err == nil && p != os.Getpid() {
			pids = append(pids, p)
		}
	}
	return pids
}
