package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/fuse"
	"github.com/stratafs/strata/internal/meta"
	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/nfs"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/transport"
)

func init() {
	var (
		dataDir, mountDir, metaListen, syncPolicy        string
		strictMetaSync, createDeleg                      bool
		stores, targetsPerStore, metaVoters, inlineBytes int
		writeThrough, kernelReadAhead                    int64
		pprofAddr, metaDiskReserve                       string
		syncInterval                                     time.Duration
		debugFuse, ha, mirrorRoot, serveNFS              bool
		nfsPort                                          int
		nfsExport                                        string
		haRestartDelay, failoverTimeout                  time.Duration
		tf                                               tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the embedded local cluster (metadata service, storage servers, FUSE mount) in the foreground",
		Long: `up starts one metadata service, --stores storage servers with --targets-per-store
targets each, all under --data, and mounts the file system at --mount. It runs in the
foreground; Ctrl-C (SIGINT) or SIGTERM unmounts and stops everything cleanly. Started again
on the same --data it serves the same files.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if ha {
				// The HA shape unless set otherwise: three voters, four
				// servers of two targets, paired across servers.
				if !cmd.Flags().Changed("meta-voters") {
					metaVoters = 3
				}
				if !cmd.Flags().Changed("stores") {
					stores = 4
				}
				if stores < 2 {
					return usagef("--ha needs --stores 2 or more: a mirror group pairs targets of two servers")
				}
			}
			if haRestartDelay < 0 || failoverTimeout < 0 {
				return usagef("--ha-restart-delay and --failover-timeout must not be negative")
			}
			if stores < 1 || stores > 16 {
				return usagef("--stores %d: want 1..16", stores)
			}
			if metaVoters != 1 && metaVoters != 3 && metaVoters != 5 {
				return usagef("--meta-voters %d: want 1, 3 or 5", metaVoters)
			}
			if targetsPerStore < 1 || targetsPerStore > 16 {
				return usagef("--targets-per-store %d: want 1..16", targetsPerStore)
			}
			if !client.ValidSyncPolicy(syncPolicy) {
				return usagef("--sync-policy %q: want sync, strict or async", syncPolicy)
			}
			if createDeleg && syncPolicy == client.SyncPolicyStrict {
				if cmd.Flags().Changed("create-delegation") {
					return usagef("--create-delegation is not for --sync-policy strict")
				}
				createDeleg = false // on by default, but not for strict
			}
			if writeThrough < 0 {
				return usagef("--write-through-bytes %d: must not be negative", writeThrough)
			}
			if kernelReadAhead < 0 {
				return usagef("--kernel-read-ahead-bytes %d: must not be negative", kernelReadAhead)
			}
			if inlineBytes < 0 || inlineBytes > rpc.MaxInlineBytes {
				return usagef("--inline-bytes %d: want 0..%d", inlineBytes, rpc.MaxInlineBytes)
			}
			if syncInterval < 0 {
				return usagef("--sync-interval %v: must not be negative (0 disables the background sync)", syncInterval)
			}
			reserve, err := parseSize(metaDiskReserve)
			if err != nil {
				return usagef("--meta-disk-reserve %q: %v", metaDiskReserve, err)
			}
			if cmd.Flags().Changed("nfs-export") {
				if !serveNFS {
					return usagef("--nfs-export: only with --nfs")
				}
				if _, err := nfs.ParseExport(nfsExport); err != nil {
					return usagef("--nfs-export: %v", err)
				}
			}
			tc, err := tf.load()
			if err != nil {
				return err
			}
			if pprofAddr != "" {
				startPprof(pprofAddr)
			}
			err = runUp(cmd.Context(), upOptions{
				dataDir: dataDir, mountDir: mountDir, metaListen: metaListen, syncPolicy: syncPolicy,
				stores: stores, targetsPerStore: targetsPerStore, metaVoters: metaVoters, strictMetaSync: strictMetaSync,
				createDelegation: createDeleg, inlineBytes: inlineBytes,
				writeThrough: writeThrough, kernelReadAhead: kernelReadAhead, metaDiskReserve: int64(reserve),
				tls: tc, syncInterval: syncInterval, pprof: pprofAddr != "", debugFuse: debugFuse,
				ha: ha, haRestartDelay: haRestartDelay, failoverTimeout: failoverTimeout, tlsFiles: tf, mirrorRoot: mirrorRoot,
				nfs: serveNFS, nfsPort: nfsPort, nfsPortSet: cmd.Flags().Changed("nfs-port"), nfsExport: nfsExport,
			})
			if err == nil {
				fmt.Fprintln(os.Stderr, "strata: stopped cleanly: unmounted, every service closed")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data", "./strata-data", "directory holding all cluster state")
	cmd.Flags().StringVar(&mountDir, "mount", "./mnt", "mount point (created if missing)")
	cmd.Flags().StringVar(&metaListen, "meta-listen", "127.0.0.1:0", "metadata service address (port 0: any free port; strata status finds it without flags)")
	cmd.Flags().IntVar(&stores, "stores", 2, "number of storage servers")
	cmd.Flags().IntVar(&metaVoters, "meta-voters", 1, "metadata voters (1, 3 or 5), on consecutive loopback ports from --meta-listen's, in --data/meta, --data/meta-2, ...")
	cmd.Flags().IntVar(&targetsPerStore, "targets-per-store", 2, "targets per storage server")
	cmd.Flags().StringVar(&syncPolicy, "sync-policy", "sync", syncPolicyUsage)
	cmd.Flags().BoolVar(&createDeleg, "create-delegation", true, createDelegationUsage)
	cmd.Flags().IntVar(&inlineBytes, "inline-bytes", defaultInlineBytes, inlineBytesUsage)
	cmd.Flags().BoolVar(&strictMetaSync, "strict-meta-sync", false, "answer every namespace change only once it is on stable storage (default: at the next fsync/close barrier, or within 5 ms)")
	cmd.Flags().Int64Var(&writeThrough, "write-through-bytes", client.DefaultConfig().WriteThroughBytes, "while several handles write, writes this large go to the servers from the request without a copy (0 = buffer all)")
	cmd.Flags().Int64Var(&kernelReadAhead, "kernel-read-ahead-bytes", fuse.DefaultKernelReadAhead, kernelReadAheadUsage)
	cmd.Flags().StringVar(&metaDiskReserve, "meta-disk-reserve", "256M", "free space the metadata service keeps on the disk under --data: below it, creates, links, renames and xattrs fail with ENOSPC (0: none)")
	cmd.Flags().DurationVar(&syncInterval, "sync-interval", store.DefaultSyncInterval, syncIntervalUsage)
	cmd.Flags().StringVar(&pprofAddr, "pprof", "", "serve Go profiles (net/http/pprof) on this address, for performance work")
	_ = cmd.Flags().MarkHidden("pprof")
	cmd.Flags().BoolVar(&ha, "ha", false, "high availability: each metadata voter (3 unless --meta-voters) and storage server (4 unless --stores) a process of its own, every target paired into mirror groups across servers, new files mirrored")
	cmd.Flags().BoolVar(&mirrorRoot, "mirror-root", true, "with --ha: at the first start, mark the root directory mirrored (strata stripe set --mirror), so that every new file is; false leaves files unmirrored until a directory is marked")
	cmd.Flags().DurationVar(&haRestartDelay, "ha-restart-delay", 10*time.Second, "with --ha: start a voter or storage server that died again after this long (0: leave it dead)")
	cmd.Flags().DurationVar(&failoverTimeout, "failover-timeout", 0, "a mirror group primary's server silent this long is replaced by its secondary (0: the metadata service's default, 3s)")
	cmd.Flags().BoolVar(&serveNFS, "nfs", false, "also serve the namespace over NFSv3 and MOUNT v3 on 127.0.0.1 (export "+upNFSExport+"; registered with rpcbind when one runs)")
	cmd.Flags().StringVar(&nfsExport, "nfs-export", upNFSExport, "with --nfs: the export, PATH=OPTIONS as strata nfs --export takes it (e.g. /=rw,async,no_root_squash,clients=127.0.0.1)")
	cmd.Flags().IntVar(&nfsPort, "nfs-port", 2049, fmt.Sprintf("with --nfs: the TCP port for NFS and MOUNT (if the default is taken: %d)", upNFSFallbackPort))
	cmd.Flags().BoolVar(&debugFuse, "debug-fuse", false, "log every FUSE request (very verbose)")
	_ = cmd.Flags().MarkHidden("debug-fuse")
	tf.register(cmd.Flags())
	rootCmd.AddCommand(cmd)
}

type upOptions struct {
	dataDir, mountDir, metaListen, syncPolicy string
	stores, targetsPerStore                   int
	metaVoters                                int // 1: a single node, as before
	strictMetaSync                            bool
	createDelegation                          bool // client.Config.CreateDelegation
	inlineBytes                               int  // client.Config.InlineBytes
	writeThrough, kernelReadAhead             int64
	metaDiskReserve                           int64       // 0: none
	tls                                       *tls.Config // mutual TLS of the services and the client (nil: none)
	// syncInterval is the stores' background sync period (0: none).
	syncInterval time.Duration
	pprof        bool // --pprof: also serve the client's metrics there, at /metrics/client
	debugFuse    bool // log every FUSE request
	// ha: voters and stores as child processes (upha.go), targets
	// paired into mirror groups; haRestartDelay restarts a dead child
	// (0: never); failoverTimeout is the voters' (0: their default);
	// tlsFiles are passed on to the children.
	ha, mirrorRoot                  bool
	haRestartDelay, failoverTimeout time.Duration
	tlsFiles                        tlsFlags
	// nfs: also serve NFS on loopback (upnfs.go), on nfsPort (when not
	// nfsPortSet and taken: upNFSFallbackPort).
	nfs, nfsPortSet bool
	nfsPort         int
	nfsExport       string // PATH=OPTIONS ("": upNFSExport)
}

func runUp(ctx context.Context, o upOptions) (err error) {
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	mountDir, err := filepath.Abs(o.mountDir)
	if err != nil {
		return fmt.Errorf("mount dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return err
	}
	defer lock.release()
	if err := fuse.PrepareMountPoint(mountDir, true); err != nil {
		return err
	}
	keyFile := filepath.Join(dataDir, "cluster.key")
	key, err := ensureKeyFile(keyFile)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	// Stop everything started so far, in reverse order, whatever happens;
	// a part that fails to stop cleanly (its store could not be flushed)
	// makes the exit status non-zero.
	var stops []func() error
	defer func() {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			if e := stops[i](); e != nil {
				errs = append(errs, e)
			}
		}
		if len(errs) > 0 && err == nil {
			err = fmt.Errorf("stopped with errors: %w", errors.Join(errs...))
		}
	}()

	var metaAddrs []string
	refused := func() error { return nil }
	if o.ha {
		var h *haCluster
		if metaAddrs, h, err = startHA(o, dataDir, keyFile); err != nil {
			return err
		}
		stops = append(stops, h.stop)
	} else if metaAddrs, refused, err = startLocal(o, dataDir, key, &stops); err != nil {
		return err
	}
	metaList := strings.Join(metaAddrs, ",")
	if err := waitTargets(ctx, metaAddrs, key, o.stores*o.targetsPerStore, refused); err != nil {
		return err
	}
	if o.ha {
		groups, err := haPairAll(ctx, metaAddrs, key, o.mirrorRoot)
		if err != nil {
			return err
		}
		slog.Info("mirror groups", "groups", len(groups), "root mirrored", o.mirrorRoot)
	}

	ccfg := client.DefaultConfig()
	ccfg.MetaAddrs = metaAddrs
	ccfg.ClusterKey = key
	ccfg.TLS = o.tls
	ccfg.SyncPolicy = o.syncPolicy
	ccfg.CreateDelegation = o.createDelegation
	ccfg.InlineBytes = o.inlineBytes
	ccfg.WriteThroughBytes = o.writeThrough
	ccfg.MountPoint = mountDir
	cl, err := client.New(ctx, ccfg)
	if err != nil {
		return fmt.Errorf("start client: %w", err)
	}
	stops = append(stops, func() error { cl.Close(); return nil })
	if o.pprof {
		http.Handle("/metrics/client", promhttp.HandlerFor(cl.Registry(), promhttp.HandlerOpts{}))
	}
	m, err := fuse.Mount(cl, mountDir, fuse.Options{KernelReadAhead: kernelReadAheadOption(o.kernelReadAhead), Debug: o.debugFuse})
	if err != nil {
		return fmt.Errorf("mount %s: %w", mountDir, err)
	}
	stops = append(stops, func() error {
		if err := m.Stop(); err != nil {
			slog.Error("unmount failed", "mount", mountDir, "err", err)
			return err
		}
		return nil
	})

	info := admin.UpInfo{Meta: metaList, KeyFile: keyFile, Mount: mountDir, Pid: os.Getpid()}
	if o.nfs {
		if info.NFS, err = startUpNFS(ctx, ccfg, o.nfsPort, o.nfsPortSet, o.nfsExport, &stops); err != nil {
			return err
		}
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(dataDir, "cluster.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write cluster.json: %w", err)
	}
	stops = append(stops, func() error { os.Remove(filepath.Join(dataDir, "cluster.json")); return nil })
	removeRecord, err := mountinfo.WriteRecord(mountinfo.Record{Mount: mountDir, Meta: metaList, KeyFile: keyFile, Data: dataDir})
	if err != nil {
		return err
	}
	stops = append(stops, func() error { removeRecord(); return nil })
	fmt.Fprintf(os.Stderr, "strata: mounted at %s (metadata %s, %d storage servers × %d targets, data in %s). Ctrl-C to stop.\n",
		mountDir, metaList, o.stores, o.targetsPerStore, dataDir)

	unmounted := make(chan struct{})
	go func() { m.Wait(); close(unmounted) }()
	select {
	case s := <-sigs:
		slog.Info("stopping", "signal", s.String())
	case <-unmounted:
		slog.Warn("mount ended from outside (fusermount -u?); stopping")
	}
	return nil
}

// startLocal opens the metadata voters and the storage servers of o in
// this process, appending their closing to stops, and returns the voters'
// addresses and a check of the stores' registration refusals.
func startLocal(o upOptions, dataDir string, key []byte, stops *[]func() error) (metaAddrs []string, refused func() error, err error) {
	mcfg := meta.DefaultConfig()
	mcfg.DataDir = filepath.Join(dataDir, "meta")
	mcfg.ListenAddr = o.metaListen
	mcfg.ClusterKey = key
	mcfg.TLS = o.tls
	mcfg.StrictSync = o.strictMetaSync
	if o.failoverTimeout > 0 {
		mcfg.FailoverTimeout = o.failoverTimeout
	}
	mcfg.DiskReserve = o.metaDiskReserve
	if o.metaDiskReserve == 0 {
		mcfg.DiskReserve = -1 // none
	}
	var voters []*meta.Service
	if o.metaVoters > 1 {
		voters, err = startMetaVoters(mcfg, dataDir, o.metaVoters)
	} else {
		var s *meta.Service
		if s, err = meta.Open(mcfg); err == nil {
			voters = []*meta.Service{s}
		}
	}
	for i := len(voters) - 1; i >= 0; i-- { // voter 1 stops first
		v := voters[i]
		*stops = append(*stops, func() error {
			if err := v.Close(); err != nil {
				return fmt.Errorf("metadata service: %w", err)
			}
			return nil
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("start metadata service: %w", err)
	}

	// The metadata service's voters, as stores and the mount are given
	// them (--meta A,B,C): they follow whichever leads.
	metaAddrs = make([]string, len(voters))
	for i, v := range voters {
		metaAddrs[i] = v.Addr()
	}
	slog.Info("metadata service up", "voters", metaAddrs)

	var servers []*store.Server
	for i := 0; i < o.stores; i++ {
		scfg := store.DefaultConfig()
		scfg.MetaAddrs = metaAddrs
		scfg.ListenAddr = "127.0.0.1:0"
		scfg.ClusterKey = key
		scfg.TLS = o.tls
		scfg.SyncInterval = o.syncInterval
		for t := 0; t < o.targetsPerStore; t++ {
			dir := filepath.Join(dataDir, fmt.Sprintf("store%d", i), fmt.Sprintf("target%d", t))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, nil, fmt.Errorf("create target dir: %w", err)
			}
			scfg.Targets = append(scfg.Targets, dir)
		}
		srv, err := store.Open(scfg)
		if err != nil {
			return nil, nil, fmt.Errorf("start storage server %d: %w", i, err)
		}
		*stops = append(*stops, func() error {
			if err := srv.Close(); err != nil {
				return fmt.Errorf("storage server %d: %w", i, err)
			}
			return nil
		})
		slog.Info("storage server up", "addr", srv.Addr(), "targets", scfg.Targets)
		servers = append(servers, srv)
	}
	refused = func() error {
		for i, srv := range servers {
			if err := srv.Refused(); err != nil {
				return fmt.Errorf("storage server %d: %w", i, err)
			}
		}
		return nil
	}
	return metaAddrs, refused, nil
}

// waitTargets waits, bounded, until the metadata service lists n live
// targets; refused ends the wait early with a refusal that will not pass.
func waitTargets(ctx context.Context, metaAddrs []string, key []byte, n int, refused func() error) error {
	c := transport.NewMulti(metaAddrs, transport.MultiConfig{ClientConfig: transport.ClientConfig{Key: key, TLS: adminTLS, Conns: 1}})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	var last int
	for time.Now().Before(deadline) {
		var lt rpc.ListTargetsResp
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.Call(cctx, rpc.MListTargets, &rpc.Empty{}, &lt)
		cancel()
		if err == nil {
			last = 0
			for _, t := range lt.Targets {
				if t.Alive {
					last++
				}
			}
			if last >= n {
				return nil
			}
		}
		if err := refused(); err != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("only %d of %d targets registered within 20 s", last, n)
}
