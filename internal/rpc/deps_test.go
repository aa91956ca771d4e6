package rpc

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestMessagesDoNotDependOnTheTransport pins the direction of the split:
// the transport (package transport) depends on the messages, never the
// other way round, and the messages touch no connection: no sockets, no
// TLS, no buffered readers, no logging.
func TestMessagesDoNotDependOnTheTransport(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := map[string]bool{"net": true, "crypto/tls": true, "bufio": true, "log/slog": true}
	for _, dep := range strings.Fields(string(out)) {
		if forbidden[dep] || strings.HasSuffix(dep, "/internal/transport") {
			t.Errorf("package rpc depends on %s", dep)
		}
	}
}
