package main

import (
	"bytes"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/stratafs/strata/internal/meta"
)

func init() {
	d := meta.DefaultConfig()
	var (
		listen, data, raftAddr, keyFile, metricsAddr, nodeID string
		serverTimeout, sessionLease, orphanGrace, syncDelay  time.Duration
		failoverTimeout                                      time.Duration
		strictSync                                           bool
		diskReserve, peers                                   string
		tf                                                   tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "meta --listen ADDR --data DIR [--peers A,B,C]",
		Short: "Run the metadata service (namespace, locks, cluster registry) in the foreground",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				return usagef("meta: --data DIR is required")
			}
			if listen == "" {
				return usagef("meta: --listen ADDR must not be empty")
			}
			reserve, err := parseSize(diskReserve)
			if err != nil {
				return usagef("meta: --disk-reserve %q: %v", diskReserve, err)
			}
			cfg := meta.Config{
				DataDir: data, ListenAddr: listen, RaftAddr: raftAddr, NodeID: nodeID,
				ServerTimeout: serverTimeout, SessionLease: sessionLease, OrphanGrace: orphanGrace, FailoverTimeout: failoverTimeout,
				MetricsAddr: metricsAddr, StrictSync: strictSync, SyncDelay: syncDelay,
				DiskReserve: int64(reserve), Peers: splitPeers(peers),
			}
			if reserve == 0 {
				cfg.DiskReserve = -1 // --disk-reserve 0: none
			}
			if keyFile != "" {
				key, err := os.ReadFile(keyFile)
				if err != nil {
					return usagef("meta: --key-file: %v", err)
				}
				cfg.ClusterKey = bytes.TrimSpace(key)
			}
			if cfg.TLS, err = tf.load(); err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return usagef("meta: %v", err)
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sigs)
			if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
				return fmt.Errorf("create data dir: %w", err)
			}
			lock, err := lockDataDir(cfg.DataDir)
			if err != nil {
				return err
			}
			defer lock.release()
			svc, err := meta.Open(cfg)
			if err != nil {
				return err
			}
			if len(cfg.Peers) > 0 {
				fmt.Fprintf(os.Stderr, "strata meta: voter serving on %s (raft on the same port), peers %s, data in %s\n", svc.Addr(), peers, data)
			} else {
				fmt.Fprintf(os.Stderr, "strata meta: serving on %s (raft %s), data in %s\n", svc.Addr(), svc.RaftAddr(), data)
			}
			sig := <-sigs
			fmt.Fprintf(os.Stderr, "strata meta: %v: shutting down\n", sig)
			return svc.Close()
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usagef("meta: %v", err) })
	f := cmd.Flags()
	f.StringVar(&listen, "listen", d.ListenAddr, "rpc listen address (host:port)")
	f.StringVar(&data, "data", "", "data directory (required)")
	f.StringVar(&raftAddr, "raft-addr", "", "raft address of a single node without --peers (default: 127.0.0.1:0 on loopback, else listen port+1)")
	f.StringVar(&peers, "peers", "", "comma-separated --listen addresses of every voter of the metadata group, this one's included (raft then shares the --listen port); the first start of a fresh group bootstraps it")
	f.StringVar(&keyFile, "key-file", "", "file holding the cluster key (default: empty key)")
	metricsFlag(f, &metricsAddr)
	tf.register(f)
	f.StringVar(&nodeID, "node-id", "", "raft node id (default: saved in the data dir, or random)")
	f.DurationVar(&serverTimeout, "server-timeout", d.ServerTimeout, "storage server considered dead after this long without heartbeat")
	f.DurationVar(&sessionLease, "session-lease", d.SessionLease, "client session lease")
	f.DurationVar(&failoverTimeout, "failover-timeout", d.FailoverTimeout, failoverTimeoutUsage)
	f.BoolVar(&strictSync, "strict-sync", false, "answer every namespace change only once it is on stable storage (default: at the client's next fsync/close barrier, or within --sync-delay)")
	f.DurationVar(&syncDelay, "sync-delay", 5*time.Millisecond, "longest time an answered namespace change stays off stable storage when nobody waits for it")
	f.StringVar(&diskReserve, "disk-reserve", "256M", "free space kept on the data directory's disk: below it, creates, links, renames and xattrs fail with ENOSPC (0: none)")
	f.DurationVar(&orphanGrace, "orphan-grace", 0, "delay before deleting unlinked files' data after start (default: session lease)")
	rootCmd.AddCommand(cmd)
}

// failoverTimeoutUsage is the help of --failover-timeout (strata meta,
// strata up).
const failoverTimeoutUsage = "a mirror group's primary whose storage server sends no heartbeat for this long is replaced by its in-sync secondary (servers stop acting as primaries 2/3 of it after their last answered heartbeat)"

// splitPeers splits a comma-separated address list, dropping blanks.
func splitPeers(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
