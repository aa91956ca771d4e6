package nfsha

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// TestARPFrame: the gratuitous ARP frames are RFC 826 packets in an
// Ethernet broadcast, sender and target address both the virtual address.
func TestARPFrame(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	ip := netip.MustParseAddr("10.1.2.3")
	req := arpFrame(mac, ip, 1)
	want := []byte{
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 9, 0x08, 0x06, // Ethernet
		0, 1, 0x08, 0x00, 6, 4, 0, 1, // Ethernet/IPv4, request
		2, 0, 0, 0, 0, 9, 10, 1, 2, 3, // sender
		0, 0, 0, 0, 0, 0, 10, 1, 2, 3, // target
	}
	if !bytes.Equal(req, want) {
		t.Fatalf("request frame\n% x\nwant\n% x", req, want)
	}
	rep := arpFrame(mac, ip, 2)
	if rep[21] != 2 || !bytes.Equal(rep[32:38], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) || len(rep) != 42 {
		t.Fatalf("reply frame % x", rep)
	}
	if b := binary.NativeEndian.AppendUint16(nil, htons(0x0806)); !bytes.Equal(b, []byte{0x08, 0x06}) {
		t.Fatalf("htons(0x0806) is % x in memory, want network order", b)
	}
}

// TestConfigValidate: defaults, and the refusals.
func TestConfigValidate(t *testing.T) {
	c := Config{VIP: netip.MustParsePrefix("10.0.0.100/24"), Dev: "eth0"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.TTL != DefaultTTL || c.Margin != DefaultMargin || c.Name != "nfs-ha/10.0.0.100" || !strings.Contains(c.Holder, "/") {
		t.Fatalf("defaults: %+v", c)
	}
	d := Config{VIP: netip.MustParsePrefix("10.0.0.100/24"), Dev: "eth0"}
	d.Validate()
	if d.Holder == c.Holder {
		t.Fatal("two configurations got the same holder id")
	}
	for _, bad := range []Config{
		{VIP: netip.MustParsePrefix("fd00::1/64"), Dev: "eth0"},
		{VIP: netip.MustParsePrefix("10.0.0.1/24")},
		{VIP: netip.MustParsePrefix("10.0.0.1/24"), Dev: "eth0", TTL: 2 * time.Second},
		{VIP: netip.MustParsePrefix("10.0.0.1/24"), Dev: "eth0", TTL: 4 * time.Second, Margin: 2 * time.Second},
		{VIP: netip.MustParsePrefix("10.0.0.1/24"), Dev: "eth0", TTL: 4 * time.Second, Margin: 500 * time.Millisecond},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
	if _, err := New(Config{VIP: netip.MustParsePrefix("10.0.0.1/24"), Dev: "eth0"}); err == nil {
		t.Error("New without a lease call: accepted")
	}
	lease := func(context.Context, string, string, time.Duration, bool) (rpc.HALeaseResp, error) {
		return rpc.HALeaseResp{}, nil
	}
	if _, err := New(Config{VIP: netip.MustParsePrefix("10.0.0.1/24"), Dev: "eth0", Lease: lease}); err != nil {
		t.Error(err)
	}
}
