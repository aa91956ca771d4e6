package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/nfs"
	"github.com/stratafs/strata/internal/nfsha"
	"github.com/stratafs/strata/internal/transport"
)

func init() {
	ccfg := client.DefaultConfig()
	// NFS clients read ahead themselves, and a gateway's read-ahead would
	// keep bytes another client may overwrite before the file is released
	// (the gateway has no close-to-open point to drop them at).
	ccfg.ReadAheadBytes = 0
	ncfg := nfs.DefaultConfig()
	var keyFile, metaList, listen string
	var exports []string
	rpcbind := true
	nlmPort := 0
	var tf tlsFlags
	var haVIP string
	var hcfg nfsha.Config
	cmd := &cobra.Command{
		Use:   "nfs --meta ADDRS --key-file K --listen ADDR --export 'PATH=OPTIONS' [--export ...]",
		Short: "Serve the namespace over NFSv3 and MOUNT v3 (one TCP port) until SIGINT/SIGTERM",
		Long: "Serve the namespace over NFSv3 (RFC 1813) and MOUNT v3 on the one TCP port of --listen, through the client library.\n" +
			"Both are registered with the local rpcbind when one runs (and unregistered at a clean stop); without one, give clients the port for both\n" +
			"(libnfs: nfs://HOST/PATH?nfsport=P&mountport=P&version=3).\n" +
			"The lock manager (NLM v4) and status monitor (NSM v1) are served on the same port, or on --nlm-port, and registered too; their locks\n" +
			"are the cluster's fcntl locks (a FUSE mount's conflict with them). After a start, only lock reclaims are granted for --nlm-grace.\n" +
			"--export " + nfs.ExportSyntax + "\n" +
			"HA pair: start two gateways with the same --ha-vip, key and exports (--listen on the wildcard, e.g. 0.0.0.0:2049);\n" +
			"the one holding the pair's lease in the metadata service puts the address on --ha-dev and announces it (gratuitous ARP),\n" +
			"the other takes over within about --ha-ttl once it is gone, and starts an NLM grace period (docs/design/0015 § HA pair).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if metaList == "" {
				metaList = os.Getenv("STRATA_META")
			}
			if keyFile == "" {
				keyFile = os.Getenv("STRATA_KEY_FILE")
			}
			var problems []error
			if metaList == "" {
				problems = append(problems, errors.New("--meta ADDR[,ADDR...] is required (or set STRATA_META)"))
			} else if addrs, err := transport.ParseAddrList(metaList); err != nil {
				problems = append(problems, fmt.Errorf("--meta %v", err))
			} else {
				ccfg.MetaAddrs = addrs
			}
			if keyFile == "" {
				problems = append(problems, errors.New("--key-file FILE is required (or set STRATA_KEY_FILE)"))
			} else if key, err := readKeyFile(keyFile); err != nil {
				problems = append(problems, err)
			} else {
				ccfg.ClusterKey, ncfg.ClusterKey = key, key
			}
			if listen == "" {
				problems = append(problems, errors.New("--listen ADDR is required (e.g. 0.0.0.0:2049)"))
			}
			if nlmPort < 0 || nlmPort > 65535 {
				problems = append(problems, fmt.Errorf("--nlm-port %d: not a port", nlmPort))
			}
			if len(exports) == 0 {
				problems = append(problems, errors.New("--export 'PATH=OPTIONS' is required (repeatable)"))
			}
			for _, x := range exports {
				e, err := nfs.ParseExport(x)
				if err != nil {
					problems = append(problems, fmt.Errorf("--export: %w", err))
					continue
				}
				ncfg.Exports = append(ncfg.Exports, e)
			}
			if haVIP != "" || hcfg.Dev != "" {
				var err error
				if hcfg.VIP, err = netip.ParsePrefix(haVIP); err != nil {
					problems = append(problems, fmt.Errorf("--ha-vip ADDR/PREFIX: %v", err))
				} else if err := hcfg.Validate(); err != nil {
					problems = append(problems, fmt.Errorf("--ha-vip/--ha-dev: %w", err))
				} else if ap, err := netip.ParseAddrPort(listen); err == nil && ap.Addr().Unmap() == hcfg.VIP.Addr() {
					problems = append(problems, fmt.Errorf("--listen %s: with --ha-vip listen on the wildcard address (e.g. 0.0.0.0:%d): a standby does not have the virtual address", listen, ap.Port()))
				}
			}
			if err := errors.Join(problems...); err != nil {
				return usagef("nfs: %v\n--export %s", err, nfs.ExportSyntax)
			}
			var err error
			if ccfg.TLS, err = tf.load(); err != nil {
				return err
			}
			ccfg.MountPoint = "nfs://" + listen
			if err := ccfg.Validate(); err != nil {
				return usagef("nfs: %v", err)
			}
			if err := ncfg.Validate(); err != nil {
				return usagef("nfs: %v", err)
			}
			ncfg.Log = slog.Default() // as --log-level set it
			ncfg.RPC.Log = ncfg.Log
			var ha *nfsha.Config
			if hcfg.VIP.IsValid() {
				hcfg.Log = slog.Default()
				ha = &hcfg
			}
			return runNFS(ccfg, ncfg, listen, nlmPort, rpcbind, ha)
		},
	}
	f := cmd.Flags()
	f.StringVar(&metaList, "meta", "", metaFlagUsage+" (default $STRATA_META)")
	f.StringVar(&keyFile, "key-file", "", "cluster key file (default $STRATA_KEY_FILE)")
	f.StringVar(&listen, "listen", "", "TCP address serving both NFS (100003 v3) and MOUNT (100005 v3), e.g. 0.0.0.0:2049")
	f.StringArrayVar(&exports, "export", nil, "an exported directory: "+nfs.ExportSyntax+" (repeatable)")
	f.BoolVar(&rpcbind, "rpcbind", rpcbind, "register NFS v3, MOUNT v3, NLM v4 and NSM v1 with the local rpcbind/portmapper when one runs")
	f.IntVar(&nlmPort, "nlm-port", nlmPort, "TCP port of the lock manager (NLM v4) and status monitor (NSM v1), on the host of --listen (0: the --listen port)")
	f.DurationVar(&ncfg.NLMGrace, "nlm-grace", ncfg.NLMGrace, "after a start (or a fail-over to this gateway), grant only lock reclaims for this long")
	f.StringVar(&ncfg.NLMStateDir, "nlm-state-dir", "", "directory keeping the client hosts that took locks, told at the next start to reclaim them (as rpc.statd's /var/lib/nfs/sm; empty: nobody is told)")
	f.StringVar(&ncfg.NLMName, "nlm-name", "", "this gateway's name in its restart notifications (SM_NOTIFY): the name clients mount it by (default: the host name)")
	f.Uint16Var(&ncfg.NLMPortmapPort, "nlm-portmap-port", ncfg.NLMPortmapPort, "`PORT` of the client hosts' port mappers (tests: a client's port mapper on another port)")
	_ = f.MarkHidden("nlm-portmap-port")
	tf.register(f)
	f.StringVar(&haVIP, "ha-vip", "", "HA pair: the pair's virtual IPv4 address with its prefix, e.g. 10.0.0.100/24 (with --ha-dev)")
	f.StringVar(&hcfg.Dev, "ha-dev", "", "HA pair: the network device the virtual address goes on while this gateway is active")
	f.StringVar(&hcfg.Name, "ha-name", "", "HA pair: the pair's lease name in the metadata service, the same on both gateways (default nfs-ha/ADDR)")
	f.DurationVar(&hcfg.TTL, "ha-ttl", nfsha.DefaultTTL, "HA pair: the lease's length, the same on both gateways: the standby takes over about this long after the active is gone")
	f.DurationVar(&ccfg.IOTimeout, "io-timeout", ccfg.IOTimeout, "how long to wait for an unreachable server before failing with EIO")
	f.Int64Var(&ccfg.WriteBehindBytes, "write-behind-bytes", ccfg.WriteBehindBytes, "memory for buffered writes not yet on the servers")
	f.Int64Var(&ccfg.ReadAheadBytes, "read-ahead-bytes", ccfg.ReadAheadBytes, "the gateway's own read-ahead per file (0 = off: clients read ahead, and prefetched bytes could be stale for another client's writes)")
	f.DurationVar(&ncfg.IdleFileTimeout, "idle-file-timeout", ncfg.IdleFileTimeout, "release a file READ/WRITE has not touched for this long")
	f.DurationVar(&ncfg.AttrTimeout, "attr-timeout", ncfg.AttrTimeout, "READ, WRITE and COMMIT check permissions and file size with attributes up to this old (a change made elsewhere shows within it, as on a FUSE mount; GETATTR and ACCESS always ask); 0 = ask on every call")
	metricsFlag(f, &ccfg.MetricsAddr)
	rootCmd.AddCommand(cmd)
}

// runNFS serves until a signal.
func runNFS(ccfg client.Config, ncfg nfs.Config, listen string, nlmPort int, rpcbind bool, ha *nfsha.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), ccfg.IOTimeout)
	c, err := client.New(ctx, ccfg)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := nfs.New(c, ncfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("nfs: listen: %w", err)
	}
	var ctl *nfsha.Controller
	stopHA := func() {}
	if ha != nil {
		ha.Lease = c.HALease
		ha.OnActive = s.BeginGrace
		if ctl, err = nfsha.New(*ha); err != nil {
			ln.Close()
			s.Close()
			return err
		}
		if err := ctl.Start(); err != nil {
			ln.Close()
			s.Close()
			return err
		}
		stopHA = sync.OnceFunc(ctl.Stop) // before the server's Close: the address goes first
		defer stopHA()
		ln = ctl.Listener(ln)
	}
	errc := make(chan error, 2)
	if p := ln.Addr().(*net.TCPAddr).Port; nlmPort != 0 && nlmPort != p {
		host, _, _ := net.SplitHostPort(listen)
		nln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(nlmPort)))
		if err != nil {
			ln.Close()
			return fmt.Errorf("nfs: listen for NLM (--nlm-port): %w", err)
		}
		if ctl != nil {
			nln = ctl.Listener(nln)
		}
		slog.Info("nfs: serving NLM v4 and NSM v1", "addr", nln.Addr().String())
		go func() { errc <- s.ServeNLM(nln) }()
	}
	for _, e := range ncfg.Exports {
		slog.Info("nfs: exporting", "path", e.Path, "read_only", e.ReadOnly, "async", e.Async, "clients", e.ClientsText)
	}
	slog.Info("nfs: serving NFSv3 and MOUNT v3", "addr", ln.Addr().String())
	var reg *nfs.Registration
	if rpcbind {
		reg = nfs.RegisterLogged(slog.Default(), ln.Addr(), nlmPort)
	}
	go func() { errc <- s.Serve(ln) }()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	select {
	case sig := <-sigs:
		slog.Info("nfs: stopping", "signal", sig)
		if reg != nil {
			if err := reg.Unregister(); err != nil {
				slog.Warn("nfs: rpcbind unregistration failed", "err", err)
			}
		}
		stopHA()
		return s.Close()
	case err := <-errc:
		stopHA()
		s.Close()
		return err
	}
}
