package main

import (
	"log/slog"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on the default mux
)

// startPprof serves Go's profiles on addr in the background.
func startPprof(addr string) {
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			slog.Error("pprof server", "addr", addr, "err", err)
		}
	}()
}
