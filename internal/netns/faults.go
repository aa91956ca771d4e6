package netns

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// faultTable is the nftables table the packet faults of a host live in.
const faultTable = "strata_faults"

// LinkDown takes the host's interface down: it can reach no host and no
// host can reach it (its processes keep running, their sockets open).
func (h *Host) LinkDown() error { return ip("-n", h.NS, "link", "set", "eth0", "down") }

// LinkUp brings the host's interface back.
func (h *Host) LinkUp() error { return ip("-n", h.NS, "link", "set", "eth0", "up") }

// CheckNft says whether nft (nftables), which the packet faults (DropFrom,
// Loss) use, is installed; the error wraps ErrUnavailable.
func CheckNft() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("%w: nft not installed (apt-get install nftables; scripts/install-deps.sh does)", ErrUnavailable)
	}
	return nil
}

// faultRule adds one rule to the host's fault table (made on first use,
// with a chain on the output hook and one on the input hook).
func (h *Host) faultRule(chain string, rule ...string) error {
	if err := CheckNft(); err != nil {
		return err
	}
	for _, s := range []string{"add table inet " + faultTable,
		"add chain inet " + faultTable + " out { type filter hook output priority 0 ; }",
		"add chain inet " + faultTable + " in { type filter hook input priority 0 ; }"} {
		if err := h.run("nft", strings.Fields(s)...); err != nil {
			return err
		}
	}
	return h.run("nft", append([]string{"add", "rule", "inet", faultTable, chain}, rule...)...)
}

// DropFrom makes a one-way partition: every packet from host a to host b
// is dropped (a nftables rule on a's output), while b's packets still
// reach a. TCP needs both directions, so new connections between the two
// fail either way round; on an established one, b's segments still reach
// a but a's acknowledgements do not. Heal removes it.
func (n *Net) DropFrom(a, b *Host) error {
	return a.faultRule("out", "ip", "daddr", b.Addr, "drop")
}

// Loss drops pct percent of the packets the host sends and of those it
// receives, at random (nftables numgen).
func (h *Host) Loss(pct int) error {
	if pct < 0 || pct > 100 {
		return fmt.Errorf("loss %d: not a percentage", pct)
	}
	cond := []string{"ip", "saddr", h.n.cfg.Subnet + ".0/24", "ip", "daddr", h.n.cfg.Subnet + ".0/24", "numgen", "random", "mod", "100", "<", fmt.Sprint(pct), "drop"}
	if err := h.faultRule("out", cond...); err != nil {
		return err
	}
	return h.faultRule("in", cond...)
}

// ErrNoNetem is returned by Delay on a host of an unshaped Net when the
// kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), as on this project's
// machines: the hosts of a shaped Net delay without it.
var ErrNoNetem = errors.New("the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): use shaped links")

// Delay makes every packet the host sends wait d more: a round trip to any
// other host takes d longer. On a shaped link the forwarder holds the
// frames; otherwise it is tc netem on eth0, and Delay returns ErrNoNetem
// where the kernel lacks netem.
func (h *Host) Delay(d time.Duration) error {
	if h.link != nil {
		h.link.delay.Store(int64(d))
		return nil
	}
	err := h.run("tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", fmt.Sprintf("%dus", d.Microseconds()))
	if err != nil && strings.Contains(err.Error(), "qdisc kind is unknown") {
		return ErrNoNetem
	}
	return err
}

// Heal undoes every packet fault on every host: the one-way partitions,
// loss and delay (links taken down stay down: LinkUp). An absent table or
// qdisc is nothing to heal; the error is the first other failure.
func (n *Net) Heal() error {
	var first error
	for _, h := range n.Hosts {
		if err := h.heal(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (h *Host) heal() error {
	if h.link != nil {
		h.link.delay.Store(0)
	}
	var first error
	if CheckNft() == nil {
		if err := h.run("nft", "list", "table", "inet", faultTable); err == nil {
			first = h.run("nft", "delete", "table", "inet", faultTable)
		}
	}
	if h.link == nil {
		_ = h.run("tc", "qdisc", "del", "dev", "eth0", "root") // absent qdisc: nothing to heal
	}
	return first
}
