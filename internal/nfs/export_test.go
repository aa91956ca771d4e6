package nfs

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseExport(t *testing.T) {
	e, err := ParseExport("/scratch/=rw,async,no_root_squash,anonuid=7,anongid=8,secure,clients=10.0.0.0/16,10.0.1.5+::1")
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "/scratch" || e.ReadOnly || !e.Async || e.Squash != SquashNone || e.AnonUID != 7 || e.AnonGID != 8 || !e.Secure {
		t.Fatalf("parsed %+v", e)
	}
	if len(e.Clients) != 3 || e.Clients[1] != netip.MustParsePrefix("10.0.1.5/32") || e.Clients[2] != netip.MustParsePrefix("::1/128") {
		t.Fatalf("clients %v", e.Clients)
	}
	d, err := ParseExport("/=clients=*")
	if err != nil || !d.ReadOnly || d.Async || d.Squash != SquashRoot || d.AnonUID != 65534 || !d.Any || d.Secure {
		t.Fatalf("defaults: %+v %v", d, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"/", "want PATH=OPTIONS"},
		{"rel=clients=*", "not absolute"},
		{"/=rw", "clients= is required"},
		{"/=rw,bogus,clients=*", `unknown option "bogus"`},
		{"/=anonuid=x,clients=*", "not a number"},
		{"/=clients=10.0.0.0/33", "not a CIDR"},
		{"/=clients=host.example", "host names are not supported"},
		{"/=rw,clients=10.0.0.1,nope", `"nope": not an address`},
	} {
		if _, err := ParseExport(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseExport(%q) = %v, want an error with %q", tc.in, err, tc.want)
		}
	}
}

func TestAllows(t *testing.T) {
	e, err := ParseExport("/=secure,clients=10.0.0.0/8+192.168.1.7")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"10.1.2.3:700", true},
		{"10.1.2.3:2000", false}, // secure: unprivileged port
		{"192.168.1.7:1", true},
		{"192.168.1.8:1", false},
		{"[::ffff:10.0.0.1]:5", true},
	} {
		if got := e.allows(netip.MustParseAddrPort(tc.addr)); got != tc.ok {
			t.Errorf("allows(%s) = %v", tc.addr, got)
		}
	}
}
