package nfs

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"path"
	"strconv"
	"strings"
)

// Squash says which callers' ids an export replaces by its anonymous ids.
type Squash int

const (
	// SquashRoot maps uid 0 to AnonUID and gid 0 to AnonGID (also in the
	// supplementary groups): root_squash, the default.
	SquashRoot Squash = iota
	// SquashNone keeps every id: no_root_squash.
	SquashNone
	// SquashAll maps every caller to AnonUID/AnonGID: all_squash.
	SquashAll
)

// Export is one exported directory and its options, as
// `--export 'PATH=OPTIONS'` gives them.
type Export struct {
	// Path is the exported directory in the Strata namespace, absolute
	// and clean; MNT asks for it by this name.
	Path string
	// ReadOnly refuses every change with NFS3ERR_ROFS (ro; rw clears it).
	// The default is ro, as exports(5).
	ReadOnly bool
	// Async answers UNSTABLE writes from the gateway's memory and namespace
	// changes before the metadata log's sync (async); the default, sync,
	// answers only what is on stable storage.
	Async  bool
	Squash Squash
	// AnonUID, AnonGID: the ids squashed callers get (65534 by default).
	AnonUID, AnonGID uint32
	// Clients may mount and use the export: addresses and CIDRs. Any
	// matches every address (clients=*).
	Clients []netip.Prefix
	Any     bool
	// Secure refuses callers whose source port is not privileged (< 1024).
	Secure bool
	// ClientsText is the clients= value as given (EXPORT lists it).
	ClientsText []string
}

// String is the export as --export takes it, with every option spelt out
// (PATH=rw|ro,sync|async,SQUASH,anonuid=N,anongid=N,secure|insecure,clients=…).
func (e *Export) String() string {
	opts := []string{"ro", "sync", "root_squash"}
	if !e.ReadOnly {
		opts[0] = "rw"
	}
	if e.Async {
		opts[1] = "async"
	}
	switch e.Squash {
	case SquashNone:
		opts[2] = "no_root_squash"
	case SquashAll:
		opts[2] = "all_squash"
	}
	opts = append(opts, fmt.Sprintf("anonuid=%d", e.AnonUID), fmt.Sprintf("anongid=%d", e.AnonGID))
	if e.Secure {
		opts = append(opts, "secure")
	} else {
		opts = append(opts, "insecure")
	}
	opts = append(opts, "clients="+strings.Join(e.ClientsText, "+"))
	return e.Path + "=" + strings.Join(opts, ",")
}

// id names the export inside file handles: a hash of its path, the same
// on every gateway serving it and across restarts.
func (e *Export) id() uint64 {
	h := fnv.New64a()
	h.Write([]byte(e.Path))
	return h.Sum64()
}

// allows reports whether a caller at addr may use the export (clients=
// and secure).
func (e *Export) allows(addr netip.AddrPort) bool {
	if e.Secure && addr.Port() >= 1024 {
		return false
	}
	if e.Any {
		return true
	}
	a := addr.Addr().Unmap()
	for _, p := range e.Clients {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ExportSyntax is the help text of --export.
const ExportSyntax = `PATH=OPTIONS, OPTIONS comma-separated: rw|ro (default ro), sync|async (default sync), ` +
	`root_squash (default)|no_root_squash|all_squash, anonuid=N, anongid=N (default 65534), secure|insecure (default insecure), ` +
	`clients=LIST (required): addresses and CIDRs separated by '+' or ',' (the items after clients= that are not options), or * for every client; no host names`

// ParseExport parses one --export value. Every problem is reported at
// once.
func ParseExport(s string) (Export, error) {
	e := Export{ReadOnly: true, AnonUID: 65534, AnonGID: 65534}
	p, opts, ok := strings.Cut(s, "=")
	if !ok {
		return e, fmt.Errorf("export %q: want PATH=OPTIONS", s)
	}
	var errs []error
	if !strings.HasPrefix(p, "/") {
		errs = append(errs, fmt.Errorf("path %q is not absolute", p))
	}
	e.Path = path.Clean(p)
	seenClients := false
	items := strings.Split(opts, ",")
	for i := 0; i < len(items); i++ {
		opt := strings.TrimSpace(items[i])
		key, val, hasVal := strings.Cut(opt, "=")
		if set := flagOptions[opt]; set != nil {
			set(&e)
			continue
		}
		switch {
		case hasVal && (key == "anonuid" || key == "anongid"):
			n, err := strconv.ParseUint(val, 10, 32)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: not a number", key, val))
				continue
			}
			if key == "anonuid" {
				e.AnonUID = uint32(n)
			} else {
				e.AnonGID = uint32(n)
			}
		case hasVal && key == "clients":
			seenClients = true
			list := strings.Split(val, "+")
			// Commas also separate clients: the items after clients=
			// that are not options continue its list.
			for i+1 < len(items) && !isOption(strings.TrimSpace(items[i+1])) {
				i++
				list = append(list, strings.Split(strings.TrimSpace(items[i]), "+")...)
			}
			for _, c := range list {
				c = strings.TrimSpace(c)
				if c == "*" {
					e.Any = true
					e.ClientsText = append(e.ClientsText, c)
					continue
				}
				pfx, err := parseClient(c)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				e.Clients = append(e.Clients, pfx)
				e.ClientsText = append(e.ClientsText, c)
			}
		default:
			errs = append(errs, fmt.Errorf("unknown option %q", opt))
		}
	}
	if !seenClients {
		errs = append(errs, errors.New("clients= is required (clients=* for every client)"))
	}
	if err := errors.Join(errs...); err != nil {
		return e, fmt.Errorf("export %q: %w", s, err)
	}
	return e, nil
}

// flagOptions are the options without a value.
var flagOptions = map[string]func(*Export){
	"rw":             func(e *Export) { e.ReadOnly = false },
	"ro":             func(e *Export) { e.ReadOnly = true },
	"sync":           func(e *Export) { e.Async = false },
	"async":          func(e *Export) { e.Async = true },
	"root_squash":    func(e *Export) { e.Squash = SquashRoot },
	"no_root_squash": func(e *Export) { e.Squash = SquashNone },
	"all_squash":     func(e *Export) { e.Squash = SquashAll },
	"secure":         func(e *Export) { e.Secure = true },
	"insecure":       func(e *Export) { e.Secure = false },
}

// isOption: s is an export option (a keyword, or KEY=VALUE), not a client.
func isOption(s string) bool { return flagOptions[s] != nil || strings.Contains(s, "=") }

// parseClient reads an address (a /32 or /128) or a CIDR.
func parseClient(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("client %q: not a CIDR", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("client %q: not an address or CIDR (host names are not supported)", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
