package consensus

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// The election every start begins with is logged as info; one after a
// known leader went silent stays a warning.
func TestLogWriterLevels(t *testing.T) {
	var buf bytes.Buffer
	w := &logWriter{log: slog.New(slog.NewTextHandler(&buf, nil))}
	fmt.Fprintln(w, "2026-11-23T07:13:40.984Z [WARN]  raft: heartbeat timeout reached, starting election: last-leader-addr= last-leader-id=")
	fmt.Fprintln(w, "2026-11-23T07:13:41.984Z [WARN]  raft: heartbeat timeout reached, starting election: last-leader-addr=127.0.0.1:7000 last-leader-id=meta-1")
	fmt.Fprintln(w, "2026-11-23T07:13:42.984Z [ERROR] raft: failed to append to logs: error=\"disk\"")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"level=INFO", "level=WARN", "level=ERROR"}
	if len(lines) != len(want) {
		t.Fatalf("logged %q", lines)
	}
	for i, l := range lines {
		if !strings.Contains(l, want[i]) {
			t.Errorf("line %d %q: want %s", i, l, want[i])
		}
	}
}
