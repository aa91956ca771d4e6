package transport

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// ParseAddrList parses a comma-separated list of host:port addresses, the
// form of `--meta A,B,C` (the metadata service's voters; one address is a
// list of one). Spaces around an element are dropped. An empty element, a
// host:port without a host or with a port outside 1..65535, and an address
// given twice are refused, naming the element.
func ParseAddrList(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("no address given (want host:port, or a comma-separated list host:port,host:port,…)")
	}
	parts := strings.Split(s, ",")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("%q: element %d of %d is empty", s, i+1, len(parts))
		}
		out = append(out, p)
	}
	if err := CheckAddrs(out); err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	return out, nil
}

// CheckAddrs checks a list of dial addresses (host:port, port 1..65535),
// none given twice, at least one.
func CheckAddrs(addrs []string) error {
	if len(addrs) == 0 {
		return errors.New("no address given")
	}
	seen := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if err := checkDialAddr(a); err != nil {
			return err
		}
		if seen[a] {
			return fmt.Errorf("address %s given twice", a)
		}
		seen[a] = true
	}
	return nil
}

// checkDialAddr checks one host:port to dial.
func checkDialAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("address %q: %v", a, err)
	}
	if host == "" {
		return fmt.Errorf("address %q: no host", a)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("address %q: port %q is not a number 1..65535", a, port)
	}
	return nil
}

// AddrsOf returns the address list a configuration gives in either of two
// forms, checked: list when it is not empty (text must then be empty or
// list joined with commas), else text parsed by ParseAddrList. Both empty:
// nil, and no error.
func AddrsOf(list []string, text string) ([]string, error) {
	switch {
	case len(list) > 0:
		if text != "" && text != strings.Join(list, ",") {
			return nil, fmt.Errorf("the address %q and the list %v disagree (give one)", text, list)
		}
		if err := CheckAddrs(list); err != nil {
			return nil, err
		}
		return list, nil
	case text == "":
		return nil, nil
	}
	return ParseAddrList(text)
}
