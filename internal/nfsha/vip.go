package nfsha

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ipTimeout bounds one ip(8) command.
const ipTimeout = 5 * time.Second

// ipCmd runs ip(8) with args.
func ipCmd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// setVIP puts vip on dev, or renews its lifetime there: the kernel removes
// it after life (whole seconds, at least 1) unless set again.
func setVIP(vip netip.Prefix, dev string, life time.Duration) error {
	secs := strconv.Itoa(max(int(life/time.Second), 1))
	_, err := ipCmd("addr", "replace", vip.String(), "dev", dev, "valid_lft", secs, "preferred_lft", secs)
	return err
}

// hasVIP reports whether vip's address is on dev.
func hasVIP(vip netip.Prefix, dev string) (bool, error) {
	out, err := ipCmd("-o", "addr", "show", "dev", dev)
	if err != nil {
		return false, err
	}
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr() == vip.Addr() {
			return true, nil
		}
	}
	return false, nil
}

// removeVIP takes vip off dev; an address that is not there is no error.
func removeVIP(vip netip.Prefix, dev string) error {
	on, err := hasVIP(vip, dev)
	if err != nil || !on {
		return err
	}
	_, err = ipCmd("addr", "del", vip.String(), "dev", dev)
	if err != nil {
		if on, err2 := hasVIP(vip, dev); err2 == nil && !on {
			return nil // gone meanwhile (its lifetime ran out)
		}
	}
	return err
}
