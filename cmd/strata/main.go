// Command strata is the one binary of Strata: every daemon and admin tool is
// a subcommand. This package stays thin: flags -> Config -> Run. Only here
// may code call os.Exit or log.Fatal.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// rootCmd gathers the subcommands; each subcommand's file adds itself in init.
var rootCmd = &cobra.Command{
	Use:           "strata",
	Short:         "Strata: a parallel file system for HPC clusters",
	SilenceUsage:  true,
	SilenceErrors: true,
	PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
		return setupLogging(cmd)
	},
}

var logLevel string

func init() {
	rootCmd.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
}

func setupLogging(cmd *cobra.Command) error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
	return nil
}

// usageError marks errors caused by bad flags or arguments (exit code 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func main() {
	// The daemons' Go heaps are small (pebble's caches live outside it) and
	// churn per request, so the default GOGC=100 collects several times a
	// second under load; measured on the metadata workload, 400 saves
	// 10–15% of the local cluster's CPU. GOGC in the environment wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	// A FUSE daemon spends much of its time in blocking system calls (reads
	// of /dev/fuse, fdatasync of the raft log). With GOMAXPROCS at 2 a
	// goroutine returning from one waits for a P that another goroutine
	// blocked in a system call still holds until the runtime takes it back;
	// 4 Ps let the kernel's scheduler sort it out. Measured on the metadata
	// load with 2 cores (4 runs each): 4,600–5,400 creates/s with 4 Ps,
	// 3,800–4,400 with 2; 8 Ps were worse again. The benchmark harness
	// keeps the default so that it measures every file system alike.
	if os.Getenv("GOMAXPROCS") == "" && runtime.NumCPU() < 4 && (len(os.Args) < 2 || os.Args[1] != "bench") {
		runtime.GOMAXPROCS(4)
	}
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
