package nfsha

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// gratuitousARP announces that ip is at dev's MAC address: an ARP request
// and an ARP reply for ip from ip, broadcast on dev (RFC 5227 § 3), so
// that neighbours and switches update their tables at once.
func gratuitousARP(dev string, ip netip.Addr) error {
	if !ip.Is4() {
		return fmt.Errorf("gratuitous ARP: %v is not IPv4", ip)
	}
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return fmt.Errorf("gratuitous ARP: %w", err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return fmt.Errorf("gratuitous ARP: %s has no Ethernet address", dev)
	}
	proto := htons(unix.ETH_P_ARP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return fmt.Errorf("gratuitous ARP: AF_PACKET socket: %w", err)
	}
	defer unix.Close(fd)
	bcast := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	to := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index, Halen: 6, Addr: bcast}
	for _, op := range []uint16{1, 2} { // request, reply
		if err := unix.Sendto(fd, arpFrame(ifi.HardwareAddr, ip, op), 0, to); err != nil {
			return fmt.Errorf("gratuitous ARP on %s: %w", dev, err)
		}
	}
	return nil
}

// arpFrame is an Ethernet broadcast frame with an ARP packet (RFC 826) of
// operation op saying ip is at mac, sender and target address both ip.
func arpFrame(mac net.HardwareAddr, ip netip.Addr, op uint16) []byte {
	b := make([]byte, 0, 42)
	b = append(b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff) // destination: broadcast
	b = append(b, mac...)
	b = binary.BigEndian.AppendUint16(b, unix.ETH_P_ARP)
	b = binary.BigEndian.AppendUint16(b, 1)             // hardware: Ethernet
	b = binary.BigEndian.AppendUint16(b, unix.ETH_P_IP) // protocol: IPv4
	b = append(b, 6, 4)
	b = binary.BigEndian.AppendUint16(b, op)
	a := ip.As4()
	b = append(b, mac...)
	b = append(b, a[:]...)
	if op == 2 {
		b = append(b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	} else {
		b = append(b, 0, 0, 0, 0, 0, 0)
	}
	return append(b, a[:]...)
}

// htons is v in network byte order, as the socket calls take it.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
