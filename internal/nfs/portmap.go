package nfs

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// Where the local rpcbind listens: its Unix socket (rpcbind v4, which
// accepts registrations from any local process and records its uid as the
// owner) and the port mapper's TCP port on loopback (version 2, for a
// classic portmap, or an rpcbind whose socket this process cannot reach).
const (
	RpcbindSocket = "/run/rpcbind.sock"
	PortmapAddr   = "127.0.0.1:111"
)

// Procedure numbers of the port mapper (RFC 1833), the same in v2 and v4.
const (
	pmapProg      = 100000
	pmapProcSet   = 1
	pmapProcUnset = 2
)

// mapped is one program version the gateway maps to a port.
type mapped struct{ prog, vers, port uint32 }

// programs is what the gateway serves: NFS and MOUNT on the port of its
// listener, NLM and NSM on nlmPort (the same port unless --nlm-port).
func programs(port, nlmPort uint32) []mapped {
	return []mapped{{nfsProgram, nfsVersion, port}, {mountProgram, mountVersion, port},
		{nlmProgram, nlmVersion, nlmPort}, {nsmProgram, nsmVersion, nlmPort}}
}

// ErrNoPortmapper: neither rpcbind's socket nor the port mapper's port
// answers (the gateway serves anyway: clients are given the port).
var ErrNoPortmapper = errors.New("nfs: no rpcbind or portmapper on this host")

// Registration is the gateway's NFS and MOUNT mappings in the local
// rpcbind, until Unregister.
type Registration struct {
	rpcb   bool // registered through rpcbind v4 (else port mapper v2)
	sock   string
	addr   string
	netid  string
	host   string // the listener's address, as text (the universal address's front)
	port   uint32
	progs  []mapped
	Method string // "rpcbind v4 on /run/rpcbind.sock" or "portmapper v2 on 127.0.0.1:111"
}

// Register maps NFS v3, MOUNT v3, NLM v4 and NSM v1 over TCP to the port of
// listen (the listener's address) in the local rpcbind: rpcbind v4 on sock
// first, else the port mapper v2 on addr (empty: the defaults). Stale
// mappings of the same programs (a gateway killed without unregistering)
// are replaced. ErrNoPortmapper when neither answers.
func Register(listen net.Addr, sock, addr string) (*Registration, error) {
	return RegisterPorts(listen, 0, sock, addr)
}

// RegisterPorts is Register with NLM and NSM mapped to nlmPort (0: the
// port of listen).
func RegisterPorts(listen net.Addr, nlmPort int, sock, addr string) (*Registration, error) {
	if sock == "" {
		sock = RpcbindSocket
	}
	if addr == "" {
		addr = PortmapAddr
	}
	ap, err := netip.ParseAddrPort(listen.String())
	if err != nil {
		return nil, fmt.Errorf("nfs: register: listener address %s: %w", listen, err)
	}
	if nlmPort <= 0 || nlmPort > 65535 {
		nlmPort = int(ap.Port())
	}
	r := &Registration{sock: sock, addr: addr, port: uint32(ap.Port()), netid: "tcp",
		progs: programs(uint32(ap.Port()), uint32(nlmPort))}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		r.netid = "tcp6"
	}
	r.host = ip.String()
	if c, err := dialRPC("unix", sock); err == nil {
		defer c.Close()
		r.rpcb, r.Method = true, "rpcbind v4 on "+sock
		return r, r.each(c, true)
	}
	c, err := dialRPC("tcp", addr)
	if err != nil {
		return nil, ErrNoPortmapper
	}
	defer c.Close()
	r.Method = "portmapper v2 on " + addr
	return r, r.each(c, true)
}

func dialRPC(network, addr string) (*oncrpc.Client, error) {
	conn, err := net.DialTimeout(network, addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	c := oncrpc.NewClient(conn, &xdr.Authsys_parms{Machinename: host, Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
	c.Timeout = 5 * time.Second
	return c, nil
}

// each unsets every program's mapping and, when set, sets it again.
func (r *Registration) each(c *oncrpc.Client, set bool) error {
	for _, p := range r.progs {
		if err := r.call(c, pmapProcUnset, p); err != nil {
			return err
		}
		if !set {
			continue
		}
		if err := r.call(c, pmapProcSet, p); err != nil {
			return err
		}
	}
	return nil
}

// call sends one SET or UNSET; a SET answered false is an error (an
// UNSET of nothing is answered false too, and is not).
func (r *Registration) call(c *oncrpc.Client, proc uint32, m mapped) error {
	prog, vers := m.prog, m.vers
	var ok bool
	var err error
	if r.rpcb {
		// The owner is taken from the socket's credentials by rpcbind.
		// RFC 1833 universal address: the host's text, then the port's
		// two bytes.
		uaddr := fmt.Sprintf("%s.%d.%d", r.host, m.port>>8, m.port&0xff)
		args := xdr.Rpcb{R_prog: prog, R_vers: vers, R_netid: r.netid, R_addr: uaddr, R_owner: strconv.Itoa(os.Getuid())}
		if proc == pmapProcUnset {
			args.R_netid, args.R_addr = "", "" // every transport's mapping
		}
		err = c.Call(pmapProg, 4, proc, &args, xdr.XDR_bool(&ok))
	} else {
		args := xdr.Mapping{Prog: prog, Vers: vers, Prot: xdr.IPPROTO_TCP, Port: m.port}
		err = c.Call(pmapProg, 2, proc, &args, xdr.XDR_bool(&ok))
	}
	if err != nil {
		return fmt.Errorf("nfs: rpcbind %s of program %d v%d: %w", procName(proc), prog, vers, err)
	}
	if proc == pmapProcSet && !ok {
		return fmt.Errorf("nfs: rpcbind refused to map program %d v%d to port %d", prog, vers, m.port)
	}
	return nil
}

func procName(proc uint32) string {
	if proc == pmapProcSet {
		return "SET"
	}
	return "UNSET"
}

// Unregister removes the mappings Register made.
func (r *Registration) Unregister() error {
	network, addr := "tcp", r.addr
	if r.rpcb {
		network, addr = "unix", r.sock
	}
	c, err := dialRPC(network, addr)
	if err != nil {
		return fmt.Errorf("nfs: unregister: %w", err)
	}
	defer c.Close()
	return r.each(c, false)
}

// RegisterLogged registers as Register does and logs the outcome: serving
// goes on whatever it is (a client given the port needs no portmapper).
// nlmPort is where NLM and NSM are served (0: the port of listen).
func RegisterLogged(log *slog.Logger, listen net.Addr, nlmPort int) *Registration {
	r, err := RegisterPorts(listen, nlmPort, "", "")
	switch {
	case errors.Is(err, ErrNoPortmapper):
		log.Info("nfs: no rpcbind or portmapper running: not registered (clients must be given the port for NFS and MOUNT)", "port", portOf(listen))
		return nil
	case err != nil:
		log.Warn("nfs: rpcbind registration failed; serving anyway", "err", err)
		return nil
	}
	log.Info("nfs: registered NFS v3, MOUNT v3, NLM v4 and NSM v1 with rpcbind", "via", r.Method, "port", r.port, "nlm_port", r.progs[2].port)
	return r
}

func portOf(a net.Addr) int {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.Port
	}
	return 0
}
