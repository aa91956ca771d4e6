package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/nfs"
)

// upNFSExport is what `strata up --nfs` exports: the whole namespace,
// read-write, to this host only, root as root (the mount's own user
// is root's equal on the FUSE side too).
const upNFSExport = "/=rw,sync,no_root_squash,clients=127.0.0.1"

// upNFSFallbackPort is the port `strata up --nfs` takes when the
// default 2049 is in use (a kernel nfsd, another gateway).
const upNFSFallbackPort = 20490

// startUpNFS serves the namespace over NFS on loopback for strata up
// --nfs, with a client of its own (no read-ahead, as strata nfs), appending
// its closing to stops; it returns the address served.
func startUpNFS(ctx context.Context, base client.Config, port int, portSet bool, export string, stops *[]func() error) (string, error) {
	if export == "" {
		export = upNFSExport
	}
	e, err := nfs.ParseExport(export)
	if err != nil {
		return "", usagef("--nfs-export: %v", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	fallback := false
	if err != nil && !portSet {
		fallback = true
		slog.Info("nfs: default port taken, using the fallback", "port", port, "fallback", upNFSFallbackPort, "err", err)
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(upNFSFallbackPort)))
	}
	if err != nil {
		return "", fmt.Errorf("nfs: listen: %w", err)
	}
	ccfg := base
	ccfg.ReadAheadBytes = 0
	ccfg.MountPoint = "nfs://" + ln.Addr().String()
	c, err := client.New(ctx, ccfg)
	if err != nil {
		ln.Close()
		return "", fmt.Errorf("nfs: start client: %w", err)
	}
	ncfg := nfs.DefaultConfig()
	ncfg.ClusterKey = ccfg.ClusterKey
	ncfg.Exports = []nfs.Export{e}
	// No state directory: no client host to tell of a restart, so no
	// reclaims to wait for.
	ncfg.NLMGrace = 0
	ncfg.Log = slog.Default()
	ncfg.RPC.Log = ncfg.Log
	s, err := nfs.New(c, ncfg)
	if err != nil {
		ln.Close()
		c.Close()
		return "", err
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	// On the fallback port another server holds 2049 and, likely, the
	// rpcbind mappings, which registering would replace.
	var reg *nfs.Registration
	if fallback {
		slog.Info("nfs: not registering with rpcbind: another server holds the default port (and its mappings)")
	} else {
		reg = nfs.RegisterLogged(slog.Default(), ln.Addr(), 0)
	}
	*stops = append(*stops, func() error {
		var errs []error
		if reg != nil {
			errs = append(errs, reg.Unregister())
		}
		errs = append(errs, s.Close())
		<-served
		c.Close()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("nfs gateway: %w", err)
		}
		return nil
	})
	addr := ln.Addr().(*net.TCPAddr)
	fmt.Fprintf(os.Stderr, "strata: NFSv3 on %s (export %s)\n  libnfs: nfs://127.0.0.1/%s?nfsport=%d&mountport=%d&version=3\n  kernel: mount -t nfs -o vers=3,proto=tcp,port=%d,mountport=%d 127.0.0.1:%s /mnt/point\n",
		addr, export, e.Path, addr.Port, addr.Port, addr.Port, addr.Port, e.Path)
	return addr.String(), nil
}
