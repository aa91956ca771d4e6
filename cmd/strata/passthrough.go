package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"
	"github.com/stratafs/strata/internal/passthrough"
)

func init() {
	var debug bool
	cmd := &cobra.Command{
		Use:   "passthrough SRC MNT",
		Short: "Mount a minimal FUSE loopback of SRC at MNT (data through the daemon; the FUSE baseline)",
		Long: `Mounts a go-fuse loopback of SRC at MNT whose file data goes through this daemon
(kernel FUSE passthrough is off), with 1 MiB requests; as root the mount admits all users
(allow_other, default_permissions). Runs in the foreground until SIGINT or SIGTERM, then unmounts.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("passthrough: want SRC and MNT, got %d arguments", len(args))
			}
			for _, d := range args {
				if st, err := os.Stat(d); err != nil || !st.IsDir() {
					return usagef("passthrough: %s is not a directory", d)
				}
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			srv, err := passthrough.Mount(args[0], args[1], &passthrough.Options{
				AllowOther: os.Geteuid() == 0,
				Debug:      debug,
			})
			if err != nil {
				return fmt.Errorf("mount %s: %w", args[1], err)
			}
			slog.Info("passthrough mounted", "src", args[0], "mnt", args[1], "pid", os.Getpid())
			return serveUntilSignal(srv, args[1], sigs)
		},
	}
	cmd.Flags().BoolVar(&debug, "debug", false, "log every FUSE request")
	rootCmd.AddCommand(cmd)
}

// serveUntilSignal serves the mount at mnt until a signal on sigs (then
// unmounts it) or until it is unmounted from outside (fusermount -u).
func serveUntilSignal(srv *fuse.Server, mnt string, sigs <-chan os.Signal) error {
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case s := <-sigs:
		slog.Info("unmounting", "signal", s.String())
		if err := srv.Unmount(); err != nil {
			return fmt.Errorf("unmount %s: %w", mnt, err)
		}
		<-done
	case <-done:
	}
	return nil
}
