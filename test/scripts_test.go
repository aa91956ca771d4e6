package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpScriptInstallsStrata: scripts/up.sh leaves strata where a shell
// finds it (here $STRATA_BIN_DIR instead of /usr/local/bin), so that the
// README's `strata status` works from any directory.
func TestUpScriptInstallsStrata(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain on PATH")
	}
	bin := t.TempDir()
	cmd := exec.Command("bash", filepath.Join("..", "scripts", "up.sh"), "--help")
	cmd.Env = append(os.Environ(), "STRATA_SKIP_DEPS=1", "STRATA_BIN_DIR="+bin)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage:") {
		t.Fatalf("scripts/up.sh --help: %v\n%s", err, out)
	}
	cmd = exec.Command("/bin/bash", "-c", "strata --version") // found through PATH, as in a shell
	cmd.Env = append(os.Environ(), "PATH="+bin)
	ver, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(ver), "wire protocol") {
		t.Fatalf("strata from the PATH after up.sh: %v\n%s\n(up.sh said:\n%s)", err, ver, out)
	}
}
