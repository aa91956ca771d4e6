package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/stratafs/strata/internal/faultfs"
)

func init() {
	var source, control, mode string
	cmd := &cobra.Command{
		Use:    "faultfs --source DIR --control SOCKET MOUNTPOINT",
		Short:  "Mount a loopback of DIR whose operations fail on demand (a disk that fails; for tests)",
		Hidden: true,
		Long: `Mounts a FUSE loopback of --source at MOUNTPOINT whose operations fail the way a
failing disk's do, in a mode switched at run time through the unix socket --control (send
a mode's name on a line; the answer is "ok MODE"): ok, eio-write, eio-fsync, eio, erofs,
enospc, hang-fsync, hang (see internal/faultfs). Runs in the foreground until SIGINT or SIGTERM, then unmounts.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("faultfs: want MOUNTPOINT, got %d arguments", len(args))
			}
			if source == "" || control == "" {
				return usagef("faultfs: --source and --control are required")
			}
			for _, d := range []string{source, args[0]} {
				if st, err := os.Stat(d); err != nil || !st.IsDir() {
					return usagef("faultfs: %s is not a directory", d)
				}
			}
			_ = os.Remove(control) // a socket left by an earlier run
			ln, err := net.Listen("unix", control)
			if err != nil {
				return fmt.Errorf("faultfs: control socket: %w", err)
			}
			defer ln.Close()
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			srv, f, err := faultfs.Mount(source, args[0], os.Geteuid() == 0)
			if err != nil {
				return err
			}
			if err := f.SetMode(faultfs.Mode(mode)); err != nil {
				_ = srv.Unmount()
				return usagef("%v", err)
			}
			go func() {
				if err := faultfs.Serve(ln, f); err != nil {
					slog.Error("faultfs control", "err", err)
				}
			}()
			slog.Info("faultfs mounted", "source", source, "mnt", args[0], "control", control, "mode", mode, "pid", os.Getpid())
			return serveUntilSignal(srv, args[0], sigs)
		},
	}
	cmd.Flags().StringVar(&source, "source", "", "directory whose contents the mount shows")
	cmd.Flags().StringVar(&control, "control", "", "unix socket on which to take mode switches")
	cmd.Flags().StringVar(&mode, "mode", string(faultfs.OK), "mode at start")
	rootCmd.AddCommand(cmd)
}
