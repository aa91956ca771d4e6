package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/fuse"
	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/transport"
)

func init() {
	cfg := client.DefaultConfig()
	var keyFile, metaList string
	var tf tlsFlags
	var debugFuse bool
	kernelReadAhead := int64(fuse.DefaultKernelReadAhead)
	cmd := &cobra.Command{
		Use:   "mount --meta ADDR[,ADDR...] [--key-file FILE] MOUNTPOINT",
		Short: "Mount the Strata file system (FUSE) and serve it until SIGINT/SIGTERM",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("mount: want exactly one MOUNTPOINT, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if metaList == "" {
				metaList = os.Getenv("STRATA_META")
			}
			if keyFile == "" {
				keyFile = os.Getenv("STRATA_KEY_FILE")
			}
			if metaList == "" {
				return usagef("mount: --meta ADDR[,ADDR...] is required (or set STRATA_META)")
			}
			var err error
			if cfg.MetaAddrs, err = transport.ParseAddrList(metaList); err != nil {
				return usagef("mount: --meta %v", err)
			}
			if keyFile == "" {
				return usagef("mount: --key-file FILE is required (or set STRATA_KEY_FILE)")
			}
			key, err := readKeyFile(keyFile)
			if err != nil {
				return usagef("mount: %v", err)
			}
			if kernelReadAhead < 0 {
				return usagef("mount: --kernel-read-ahead-bytes %d: must not be negative", kernelReadAhead)
			}
			cfg.ClusterKey = key
			if cfg.TLS, err = tf.load(); err != nil {
				return err
			}
			cfg.MountPoint = args[0]
			if abs, err := filepath.Abs(args[0]); err == nil {
				cfg.MountPoint = abs // as `strata status` shows it
			}
			if cfg.SyncPolicy == client.SyncPolicyStrict && !cmd.Flags().Changed("create-delegation") {
				cfg.CreateDelegation = false // on by default, but not for strict
			}
			if err := cfg.Validate(); err != nil {
				return usagef("mount: %v", err)
			}
			return runMount(cfg, keyFile, args[0], fuse.Options{Debug: debugFuse, KernelReadAhead: kernelReadAheadOption(kernelReadAhead)})
		},
	}
	f := cmd.Flags()
	f.StringVar(&metaList, "meta", "", metaFlagUsage+" (default $STRATA_META)")
	f.StringVar(&keyFile, "key-file", "", "cluster key file (default $STRATA_KEY_FILE)")
	tf.register(f)
	f.DurationVar(&cfg.IOTimeout, "io-timeout", cfg.IOTimeout, "how long to wait for an unreachable server before failing with EIO")
	f.StringVar(&cfg.SyncPolicy, "sync-policy", cfg.SyncPolicy, syncPolicyUsage)
	f.BoolVar(&cfg.CreateDelegation, "create-delegation", true, createDelegationUsage)
	f.IntVar(&cfg.InlineBytes, "inline-bytes", defaultInlineBytes, inlineBytesUsage)
	f.Int64Var(&cfg.WriteBehindBytes, "write-behind-bytes", cfg.WriteBehindBytes, "memory for buffered writes not yet on the servers")
	f.Int64Var(&cfg.ReadAheadBytes, "read-ahead-bytes", cfg.ReadAheadBytes, "how far ahead of a sequential reader to prefetch (0 = off)")
	f.Int64Var(&cfg.WriteThroughBytes, "write-through-bytes", cfg.WriteThroughBytes, "while several handles write, writes this large go to the servers from the request without a copy (0 = buffer all)")
	f.Int64Var(&kernelReadAhead, "kernel-read-ahead-bytes", kernelReadAhead, kernelReadAheadUsage)
	metricsFlag(f, &cfg.MetricsAddr)
	f.BoolVar(&debugFuse, "debug-fuse", false, "log every FUSE request")
	rootCmd.AddCommand(cmd)
}

// metaFlagUsage is the help of --meta (store, mount, the admin commands).
const metaFlagUsage = "metadata service: its voters' addresses, host:port[,host:port...] (calls go to the leader among them)"

// createDelegationUsage explains --create-delegation (mount and up).
const createDelegationUsage = "after a run of creates in a directory, hold its create delegation (docs/design/0016): this mount then answers lookups of new names and creates there itself " +
	"and sends the creates in batches; given back on another mount's access, when idle and at unmount; off under --sync-policy strict"

// defaultInlineBytes is --inline-bytes' default (mount and up): files of
// up to one 4 KiB block.
const defaultInlineBytes = 4096

// inlineBytesUsage explains --inline-bytes (mount and up).
const inlineBytesUsage = "a file created under a create delegation and closed at no more than this many bytes keeps its data with its inode in the metadata service " +
	"(docs/design/0017: no chunk file, reads answered with the open; moved to the storage servers at its first write); 0: never"

// syncPolicyUsage explains --sync-policy (mount and up).
const syncPolicyUsage = "sync: close puts written data on stable storage and commits the size durably (a close that wrote nothing waits for nothing; names are durable within 5 ms or at fsync); " +
	"strict: every close is an fsync, also for the file's create; async: close only hands data to the servers (scratch-grade)"

// runMount mounts and serves until a signal or an external unmount.
func runMount(cfg client.Config, keyFile, mountpoint string, opts fuse.Options) error {
	if abs, err := filepath.Abs(mountpoint); err == nil {
		if err := fuse.PrepareMountPoint(abs, false); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.IOTimeout)
	c, err := client.New(ctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := fuse.Mount(c, mountpoint, opts)
	if err != nil {
		return err
	}
	if abs, err := filepath.Abs(keyFile); err == nil && keyFile != "" {
		keyFile = abs
	}
	removeRecord, err := mountinfo.WriteRecord(mountinfo.Record{Mount: cfg.MountPoint, Meta: c.Config().MetaAddr, KeyFile: keyFile})
	if err != nil {
		slog.Warn("admin commands will not find this mount's key file", "err", err)
	} else {
		defer removeRecord()
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	go func() { m.Wait(); close(done) }()
	select {
	case s := <-sigs:
		slog.Info("unmounting", "signal", s, "mountpoint", mountpoint)
		errc := make(chan error, 1)
		go func() { errc <- m.Stop() }()
		select {
		case err := <-errc:
			if err != nil {
				return err
			}
		case <-sigs:
			return fmt.Errorf("unmount of %s interrupted", mountpoint)
		case <-time.After(cfg.IOTimeout + 10*time.Second):
			return fmt.Errorf("unmount of %s timed out", mountpoint)
		}
	case <-done:
		slog.Info("file system was unmounted externally", "mountpoint", mountpoint)
	}
	return nil
}

// metricsFlag registers --metrics-addr, the one name of every daemon, and
// the old --metrics of meta and store as a hidden deprecated alias.
func metricsFlag(f *pflag.FlagSet, addr *string) {
	f.StringVar(addr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
	f.StringVar(addr, "metrics", "", "old name of --metrics-addr")
	_ = f.MarkDeprecated("metrics", "use --metrics-addr")
}

const kernelReadAheadUsage = "the kernel's read-ahead window for the mount: at least 1 MiB lets sequential reads travel as 1 MiB requests (0 = keep the kernel's 128 KiB; setting it needs root)"

// kernelReadAheadOption maps the flag (0 = keep the kernel's) to
// fuse.Options.KernelReadAhead (0 = default, negative = keep).
func kernelReadAheadOption(flag int64) int64 {
	if flag == 0 {
		return -1
	}
	return flag
}
