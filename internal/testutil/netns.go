package testutil

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/netns"
)

// Net is a set of test hosts: one network namespace per host, each with an
// interface eth0 whose other end (a veth pair) is on a bridge in a further
// namespace of its own (package netns, which this wraps for tests: errors
// fail the test, what cannot be made here skips it, t.Cleanup deletes it).
// Nothing touches the machine's own network namespace, so the subnet
// (NetSubnet) cannot clash with a real network, and several Nets (tests in
// parallel) are isolated from each other.
type Net struct {
	t     testing.TB
	n     *netns.Net
	Hosts []*Host
}

// Host is one test host of a Net.
type Host struct {
	*netns.Host
	n *Net
}

// NetSubnet is the /24 every Net's hosts are numbered in: host i of NewNet
// gets NetSubnet.(i+1).
const NetSubnet = "10.213.7"

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
// device at each end) instead of veth pairs, so that Delay works on
// kernels without netem. The links carry everything a veth does; they end
// with the test.
func NewShapedNet(t testing.TB, names ...string) *Net {
	t.Helper()
	return newNet(t, true, names)
}

func newNet(t testing.TB, shaped bool, names []string) *Net {
	t.Helper()
	nn, err := netns.New(netns.Config{Prefix: fmt.Sprintf("strt%d-%d-", os.Getpid()%100000, netSeq.Add(1)), Subnet: NetSubnet, Shaped: shaped}, names...)
	if errors.Is(err, netns.ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("NewNet: %v", err)
	}
	t.Cleanup(func() { _ = nn.Close() })
	n := &Net{t: t, n: nn}
	for _, h := range nn.Hosts {
		n.Hosts = append(n.Hosts, &Host{Host: h, n: n})
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

// Start runs bin with args as a real process on the host (see StartProc).
func (h *Host) Start(t testing.TB, dir, name, bin string, args ...string) *Proc {
	t.Helper()
	return StartProc(t, dir, name, h.Prefix(), bin, args...)
}

// LinkDown takes the host's interface down: it can reach no host and no
// host can reach it (its processes keep running, their sockets open).
func (h *Host) LinkDown() {
	h.n.t.Helper()
	h.n.check(h.Host.LinkDown())
}

// LinkUp brings the host's interface back.
func (h *Host) LinkUp() {
	h.n.t.Helper()
	h.n.check(h.Host.LinkUp())
}

// check fails the test on err, or skips it when err says a tool is missing.
func (n *Net) check(err error) {
	n.t.Helper()
	if errors.Is(err, netns.ErrUnavailable) {
		n.t.Skip(err)
	}
	if err != nil {
		n.t.Fatal(err)
	}
}

// RequireNft skips the test when nft (nftables), which the packet faults
// (DropFrom, Loss) use, is not installed.
func RequireNft(t testing.TB) {
	t.Helper()
	if err := netns.CheckNft(); err != nil {
		t.Skip(err)
	}
}

// DropFrom makes a one-way partition: every packet from host a to host b
// is dropped (see netns.Net.DropFrom). Heal removes it.
func (n *Net) DropFrom(a, b *Host) {
	n.t.Helper()
	n.check(n.n.DropFrom(a.Host, b.Host))
}

// Loss drops pct percent of the packets the host sends and of those it
// receives, at random (nftables numgen).
func (h *Host) Loss(pct int) {
	h.n.t.Helper()
	h.n.check(h.Host.Loss(pct))
}

// ErrNoNetem is returned by Delay on a NewNet host when the kernel has no
// netem qdisc (CONFIG_NET_SCH_NETEM), as on this project's machines: a
// NewShapedNet's hosts delay without it.
var ErrNoNetem = netns.ErrNoNetem

// Heal undoes every packet fault on every host: the one-way partitions,
// loss and delay (links taken down stay down: LinkUp).
func (n *Net) Heal() {
	n.t.Helper()
	n.check(n.n.Heal())
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
