package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Net is a set of test hosts: one network namespace per host, each with an
// interface eth0 whose other end (a veth pair) is on a bridge in a further
// namespace of its own. Nothing touches the machine's own network
// namespace, so the subnet (NetSubnet) cannot clash with a real network,
// and several Nets (tests in parallel) are isolated from each other.
type Net struct {
	t      testing.TB
	prefix string
	bridge string // namespace of the bridge
	Hosts  []*Host
}

// Host is one test host of a Net.
type Host struct {
	Name string // as given to NewNet
	NS   string // the network namespace's name (ip netns)
	Addr string // its IPv4 address on the Net
	n    *Net
	peer string   // its link's other end, on the bridge
	link *tapLink // NewShapedNet's link; nil for a veth pair
}

// NetSubnet is the /24 every Net's hosts are numbered in: host i of NewNet
// gets NetSubnet.(i+1).
const NetSubnet = "10.213.7"

// faultTable is the nftables table the packet faults of a host live in.
const faultTable = "strata_faults"

var netSeq atomic.Int32

// NewNet creates one network namespace per name, joined by a bridge, with
// addresses NetSubnet.1, .2, … in the order given and the loopback up.
// Everything is deleted at test cleanup. It skips the test where network
// namespaces cannot be made (not root, no iproute2).
func NewNet(t testing.TB, names ...string) *Net {
	t.Helper()
	return newNet(t, false, names)
}

// NewShapedNet is NewNet with links that this process forwards (a TAP
// device at each end, see tapLink) instead of veth pairs, so that Delay
// works on kernels without netem. The links carry everything a veth
// does; they end with the test.
func NewShapedNet(t testing.TB, names ...string) *Net {
	t.Helper()
	return newNet(t, true, names)
}

func newNet(t testing.TB, shaped bool, names []string) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) not installed")
	}
	if len(names) > 250 {
		t.Fatalf("NewNet: %d hosts do not fit a /24", len(names))
	}
	if shaped {
		f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
		if err != nil {
			t.Skipf("shaped links need TAP devices: %v", err)
		}
		f.Close()
	}
	n := &Net{t: t, prefix: fmt.Sprintf("strt%d-%d", os.Getpid()%100000, netSeq.Add(1))}
	n.bridge = n.prefix + "-br"
	all := []string{n.bridge}
	for i, name := range names {
		h := &Host{Name: name, NS: n.prefix + "-" + name, Addr: fmt.Sprintf("%s.%d", NetSubnet, i+1), n: n, peer: fmt.Sprintf("vb%d", i)}
		n.Hosts = append(n.Hosts, h)
		all = append(all, h.NS)
	}
	t.Cleanup(func() {
		for _, ns := range all {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range all {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Skipf("cannot create network namespaces: %v %s", err, out)
		}
	}
	n.ip("-n", n.bridge, "link", "add", "br0", "type", "bridge")
	n.ip("-n", n.bridge, "link", "set", "br0", "up")
	for _, h := range n.Hosts {
		if shaped {
			l, err := newTapLink(h.NS, n.bridge, h.peer)
			if err != nil {
				t.Fatalf("link of %s: %v", h.Name, err)
			}
			t.Cleanup(l.close)
			h.link = l
		} else {
			n.ip("-n", h.NS, "link", "add", "eth0", "type", "veth", "peer", "name", h.peer, "netns", n.bridge)
		}
		n.ip("-n", h.NS, "addr", "add", h.Addr+"/24", "dev", "eth0")
		n.ip("-n", h.NS, "link", "set", "eth0", "up")
		n.ip("-n", h.NS, "link", "set", "lo", "up")
		n.ip("-n", n.bridge, "link", "set", h.peer, "master", "br0", "up")
	}
	return n
}

// Host returns the host of that name (the test fails if there is none).
func (n *Net) Host(name string) *Host {
	for _, h := range n.Hosts {
		if h.Name == name {
			return h
		}
	}
	n.t.Fatalf("no host %q", name)
	return nil
}

func (n *Net) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %v: %v %s", args, err, out)
	}
}

// Prefix is the command prefix that runs a program in the host's network
// namespace (and only that: the mount namespace stays the test's, so a
// FUSE mount made there is visible to the test; `ip netns exec` would
// make a private one). The program is exec'ed, so its PID is the one
// started.
func (h *Host) Prefix() []string {
	return []string{"nsenter", "--net=/run/netns/" + h.NS, "--"}
}

// Start runs bin with args as a real process on the host (see StartProc).
func (h *Host) Start(t testing.TB, dir, name, bin string, args ...string) *Proc {
	t.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter (util-linux) not installed")
	}
	return StartProc(t, dir, name, h.Prefix(), bin, args...)
}

// Command returns a command that runs on the host.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	all := append(h.Prefix(), append([]string{name}, args...)...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// Do runs f on an OS thread that is in the host's network namespace:
// sockets f creates (net.Listen, net.Dial) belong to the host and keep
// doing so after Do returns, so a test process can be a client or a server
// on any of its hosts.
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

// LinkDown takes the host's interface down: it can reach no host and no
// host can reach it (its processes keep running, their sockets open).
func (h *Host) LinkDown() { h.n.ip("-n", h.NS, "link", "set", "eth0", "down") }

// LinkUp brings the host's interface back.
func (h *Host) LinkUp() { h.n.ip("-n", h.NS, "link", "set", "eth0", "up") }

// RequireNft skips the test when nft (nftables), which the packet faults
// (DropFrom, Loss) use, is not installed.
func RequireNft(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (apt-get install nftables; scripts/install-deps.sh does)")
	}
}

// nft runs one nft command in the host's namespace.
func (h *Host) nft(args ...string) error {
	all := append(h.Prefix(), append([]string{"nft"}, args...)...)
	if out, err := exec.Command(all[0], all[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("nft %s on %s: %v %s", strings.Join(args, " "), h.Name, err, out)
	}
	return nil
}

// faultRule adds one rule to the host's fault table (made on first use,
// with a chain on the output hook and one on the input hook).
func (h *Host) faultRule(chain string, rule ...string) {
	h.n.t.Helper()
	RequireNft(h.n.t)
	setup := []string{"add table inet " + faultTable,
		"add chain inet " + faultTable + " out { type filter hook output priority 0 ; }",
		"add chain inet " + faultTable + " in { type filter hook input priority 0 ; }"}
	for _, s := range setup {
		if err := h.nft(strings.Fields(s)...); err != nil {
			h.n.t.Fatal(err)
		}
	}
	if err := h.nft(append([]string{"add", "rule", "inet", faultTable, chain}, rule...)...); err != nil {
		h.n.t.Fatal(err)
	}
}

// DropFrom makes a one-way partition: every packet from host a to host b
// is dropped (a nftables rule on a's output), while b's packets still
// reach a. TCP needs both directions, so connections between the two fail
// either way round once a segment or acknowledgement from a is needed;
// datagrams from b to a still arrive. Heal removes it.
func (n *Net) DropFrom(a, b *Host) {
	n.t.Helper()
	a.faultRule("out", "ip", "daddr", b.Addr, "drop")
}

// Loss drops pct percent of the packets the host sends and of those it
// receives, at random (nftables numgen).
func (h *Host) Loss(pct int) {
	h.n.t.Helper()
	if pct < 0 || pct > 100 {
		h.n.t.Fatalf("Loss(%d): not a percentage", pct)
	}
	cond := []string{"ip", "saddr", NetSubnet + ".0/24", "ip", "daddr", NetSubnet + ".0/24", "numgen", "random", "mod", "100", "<", fmt.Sprint(pct), "drop"}
	h.faultRule("out", cond...)
	h.faultRule("in", cond...)
}

// ErrNoNetem is returned by Delay on a NewNet host when the kernel has no
// netem qdisc (CONFIG_NET_SCH_NETEM), as on this project's machines: a
// NewShapedNet's hosts delay without it.
var ErrNoNetem = errors.New("the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): use NewShapedNet")

// Delay makes every packet the host sends wait d more: a round trip to any
// other host takes d longer. On a NewShapedNet the link's forwarder holds
// the frames; on a NewNet it is tc netem on eth0, and Delay returns
// ErrNoNetem where the kernel lacks netem.
func (h *Host) Delay(d time.Duration) error {
	if h.link != nil {
		h.link.delay.Store(int64(d))
		return nil
	}
	all := append(h.Prefix(), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", fmt.Sprintf("%dus", d.Microseconds()))
	out, err := exec.Command(all[0], all[1:]...).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "qdisc kind is unknown") {
			return ErrNoNetem
		}
		return fmt.Errorf("tc netem on %s: %v %s", h.Name, err, out)
	}
	return nil
}

// Heal undoes every packet fault on every host: the one-way partitions,
// loss and delay (links taken down stay down: LinkUp).
func (n *Net) Heal() {
	n.t.Helper()
	for _, h := range n.Hosts {
		if h.link != nil {
			h.link.delay.Store(0)
		}
		if _, err := exec.LookPath("nft"); err == nil {
			// Absent table: nothing to heal on this host.
			_ = h.nft("delete", "table", "inet", faultTable)
		}
		all := append(h.Prefix(), "tc", "qdisc", "del", "dev", "eth0", "root")
		_ = exec.Command(all[0], all[1:]...).Run() // absent qdisc: nothing to heal
	}
}

// Pause stops the process with SIGSTOP: it hangs, its sockets stay open
// (peers' connections neither fail nor get answers). Resume undoes it;
// so does test cleanup, so that stopping the process works.
func (p *Proc) Pause(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", p.Name, err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
}

// Resume continues a paused process (SIGCONT).
func (p *Proc) Resume(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT %s: %v", p.Name, err)
	}
}

// StopAtCleanup stops the processes in *procs at test cleanup, the last
// started first, then detaches the mounts left; when the test failed it
// logs the end of each process's log.
func StopAtCleanup(t testing.TB, procs *[]*Proc, mounts ...string) {
	t.Cleanup(func() {
		ps := *procs
		for i := len(ps) - 1; i >= 0; i-- {
			_ = ps[i].Stop(10 * time.Second)
		}
		for _, m := range mounts {
			ForceUnmount(m)
		}
		if t.Failed() {
			for _, p := range ps {
				t.Logf("---- %s ----\n%s", p.Name, p.Tail(30))
			}
		}
	})
}
