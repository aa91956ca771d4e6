package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnavailable marks an error of Check or New that says network
// namespaces cannot be made here (not root, a tool missing, no TAP
// devices): callers that may do without them (tests) skip.
var ErrUnavailable = errors.New("network namespaces unavailable")

// Config says how to make a Net.
type Config struct {
	// Prefix starts every namespace's name: the bridge's is Prefix+"br",
	// a host's Prefix+its name.
	Prefix string
	// Subnet is the first three octets of the /24 the hosts are numbered
	// in: host i gets Subnet.(i+1).
	Subnet string
	// Shaped links are TAP device pairs this process forwards (Delay on
	// any kernel) instead of veth pairs.
	Shaped bool
}

// Net is a set of hosts joined by a bridge.
type Net struct {
	cfg    Config
	bridge string // namespace of the bridge
	Hosts  []*Host
	all    []string // namespaces created, the bridge's first
}

// Host is one host of a Net.
type Host struct {
	Name string // as given to New
	NS   string // the network namespace's name (ip netns)
	Addr string // its IPv4 address on the Net
	n    *Net
	peer string   // its link's other end, on the bridge
	link *tapLink // a shaped link; nil for a veth pair
}

// Check says whether Nets can be made here: root, ip and nsenter, and for
// shaped links /dev/net/tun. Its errors wrap ErrUnavailable.
func Check(shaped bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root", ErrUnavailable)
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not installed (iproute2, util-linux)", ErrUnavailable, tool)
		}
	}
	if shaped {
		f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("%w: shaped links need TAP devices: %v", ErrUnavailable, err)
		}
		f.Close()
	}
	return nil
}

// New creates one network namespace per name, joined by a bridge, with
// addresses Subnet.1, .2, … in the order given and the loopback up. On
// error everything it made is deleted; an error creating the first
// namespace wraps ErrUnavailable.
func New(cfg Config, names ...string) (n *Net, err error) {
	if len(names) > 250 {
		return nil, fmt.Errorf("netns: %d hosts do not fit a /24", len(names))
	}
	if err := Check(cfg.Shaped); err != nil {
		return nil, err
	}
	n = &Net{cfg: cfg, bridge: cfg.Prefix + "br"}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	for i, name := range names {
		h := &Host{Name: name, NS: cfg.Prefix + name, Addr: fmt.Sprintf("%s.%d", cfg.Subnet, i+1), n: n, peer: fmt.Sprintf("vb%d", i)}
		n.Hosts = append(n.Hosts, h)
	}
	for i, ns := range append([]string{n.bridge}, hostNS(n.Hosts)...) {
		if err := ip("netns", "add", ns); err != nil {
			if i == 0 {
				return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
			}
			return nil, err
		}
		n.all = append(n.all, ns)
	}
	if err := ip("-n", n.bridge, "link", "add", "br0", "type", "bridge"); err != nil {
		return nil, err
	}
	if err := ip("-n", n.bridge, "link", "set", "br0", "up"); err != nil {
		return nil, err
	}
	for _, h := range n.Hosts {
		if cfg.Shaped {
			if h.link, err = newTapLink(h.NS, n.bridge, h.peer); err != nil {
				return nil, fmt.Errorf("link of %s: %w", h.Name, err)
			}
		} else if err := ip("-n", h.NS, "link", "add", "eth0", "type", "veth", "peer", "name", h.peer, "netns", n.bridge); err != nil {
			return nil, err
		}
		for _, args := range [][]string{
			{"-n", h.NS, "addr", "add", h.Addr + "/24", "dev", "eth0"},
			{"-n", h.NS, "link", "set", "eth0", "up"},
			{"-n", h.NS, "link", "set", "lo", "up"},
			{"-n", n.bridge, "link", "set", h.peer, "master", "br0", "up"},
		} {
			if err := ip(args...); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

func hostNS(hs []*Host) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.NS)
	}
	return out
}

// Close deletes the namespaces (processes still running in them keep
// their sockets but lose the links) and stops the shaped links. It
// returns the first error; it tries every namespace.
func (n *Net) Close() error {
	var first error
	for _, h := range n.Hosts {
		if h.link != nil {
			h.link.close()
			h.link = nil
		}
	}
	for _, ns := range n.all {
		if err := ip("netns", "del", ns); err != nil && first == nil {
			first = err
		}
	}
	n.all = nil
	return first
}

// Host returns the host of that name, or nil.
func (n *Net) Host(name string) *Host {
	for _, h := range n.Hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// Namespaces lists the namespaces the Net made (the bridge's first).
func (n *Net) Namespaces() []string { return append([]string(nil), n.all...) }

func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Prefix is the command prefix that runs a program in the host's network
// namespace (and only that: the mount namespace stays the caller's, so a
// FUSE mount made there is visible to it; `ip netns exec` would make a
// private one). The program is exec'ed, so its PID is the one started.
func (h *Host) Prefix() []string {
	return []string{"nsenter", "--net=/run/netns/" + h.NS, "--"}
}

// Command returns a command that runs on the host.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	all := append(h.Prefix(), append([]string{name}, args...)...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// run runs a command on the host, bounded, and wraps its output in the error.
func (h *Host) run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := h.Command(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s on %s: %v %s", name, strings.Join(args, " "), h.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Do runs f on an OS thread that is in the host's network namespace:
// sockets f creates (net.Listen, net.Dial) belong to the host and keep
// doing so after Do returns.
func (h *Host) Do(f func() error) error { return inNetns(h.NS, f) }

// inNetns runs f on an OS thread in the network namespace ns.
func inNetns(ns string, f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter namespace %s: %w", ns, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and so ends with this goroutine: it
		// must not run other goroutines in the wrong namespace.
		return fmt.Errorf("leave namespace %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Listen opens a listener on the host (see Do).
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() (err error) { ln, err = net.Listen(network, addr); return })
	return ln, err
}

// ListenPacket opens a packet socket on the host (see Do).
func (h *Host) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := h.Do(func() (err error) { pc, err = net.ListenPacket(network, addr); return })
	return pc, err
}

// Dial connects from the host, giving up after timeout (see Do).
func (h *Host) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() (err error) { c, err = net.DialTimeout(network, addr, timeout); return })
	return c, err
}
