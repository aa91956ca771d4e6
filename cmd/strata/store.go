package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/store"
	"github.com/stratafs/strata/internal/transport"
)

func init() {
	var (
		metaAddr, listenAddr, advertise, keyFile, metricsAddr, domain string
		targets                                                       []string
		heartbeat, syncInterval                                       time.Duration
		tf                                                            tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "store --meta ADDR[,ADDR...] --listen ADDR --target DIR [--target DIR ...]",
		Short: "Run a storage server: serve chunk data from target directories",
		Long: `Run a storage server in the foreground until SIGINT or SIGTERM.

Each --target is a directory, ideally the root of its own disk. An empty
directory is formatted on first use; a directory of another format version
or one already served by another process is refused. The server registers
its targets with the metadata service at --meta (the leader among the
voters listed; retrying while it is down) and serves clients at --listen.
Data written and not yet synced (under --sync-policy async) becomes
durable within --sync-interval: each target syncs it in a background
round; strata status shows what waits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if metaAddr == "" {
				return usagef("store: --meta ADDR[,ADDR...] is required (the metadata service's voters, host:port each)")
			}
			metaAddrs, err := transport.ParseAddrList(metaAddr)
			if err != nil {
				return usagef("store: --meta %v", err)
			}
			if listenAddr == "" {
				return usagef("store: --listen ADDR is required (the data-path address, host:port)")
			}
			if len(targets) == 0 {
				return usagef("store: at least one --target DIR is required")
			}
			cfg := store.DefaultConfig()
			cfg.MetaAddrs = metaAddrs
			cfg.ListenAddr = listenAddr
			cfg.AdvertiseAddr = advertise
			cfg.Targets = targets
			cfg.Domain = domain
			cfg.MetricsAddr = metricsAddr
			cfg.HeartbeatInterval = heartbeat
			cfg.SyncInterval = syncInterval
			key, err := readKeyFile(keyFile)
			if err != nil {
				return usagef("store: --key-file: %v", err)
			}
			cfg.ClusterKey = key
			if cfg.TLS, err = tf.load(); err != nil {
				return err
			}
			if heartbeat <= 0 {
				return usagef("store: --heartbeat-interval must be positive, got %v", heartbeat)
			}
			if syncInterval < 0 {
				return usagef("store: --sync-interval must not be negative, got %v (0 disables the background sync)", syncInterval)
			}
			if err := cfg.Validate(); err != nil {
				return usagef("store: %v", err)
			}
			s, err := store.Open(cfg)
			if err != nil {
				return fmt.Errorf("store: %w", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			refused := refusedTargets(ctx, s)
			select {
			case <-ctx.Done():
			case err := <-refused:
				s.Close()
				return fmt.Errorf("store: %w", err)
			}
			stop() // a second signal kills the process the default way
			if err := s.Close(); err != nil {
				return fmt.Errorf("store: close: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&metaAddr, "meta", "", metaFlagUsage)
	f.StringVar(&listenAddr, "listen", "", "address to serve the data path on (host:port)")
	f.StringVar(&advertise, "advertise", "", "address clients dial (default: the listen address)")
	f.StringArrayVar(&targets, "target", nil, "target directory (repeat for several)")
	f.StringVar(&domain, "domain", "", "failure domain of this server (a rack, a power feed): strata mirror create --auto --domain pairs targets across domains")
	f.StringVar(&keyFile, "key-file", "", "file holding the cluster key (whitespace trimmed; default: empty key)")
	metricsFlag(f, &metricsAddr)
	tf.register(f)
	f.DurationVar(&heartbeat, "heartbeat-interval", time.Second, "period of heartbeats to the metadata service")
	f.DurationVar(&syncInterval, "sync-interval", store.DefaultSyncInterval, syncIntervalUsage)
	rootCmd.AddCommand(cmd)
}

// syncIntervalUsage is the help of --sync-interval (strata store, strata up).
const syncIntervalUsage = "period of each target's background sync round: data written and not yet synced (under --sync-policy async, or not yet closed) becomes durable within it; strata status shows what is waiting (0: no background sync, only fsync, close under sync and a clean stop sync)"

// refusedTargets delivers the registration error of s once the metadata
// service has refused one of its targets as another file system's — a
// refusal that retrying does not change.
func refusedTargets(ctx context.Context, s *store.Server) <-chan error {
	ch := make(chan error, 1)
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := s.Refused(); err != nil {
					ch <- err
					return
				}
			}
		}
	}()
	return ch
}
