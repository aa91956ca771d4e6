package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// The tests run this test binary as the strata command: with
// STRATA_CLI_TEST_MAIN set, TestMain runs main instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("STRATA_CLI_TEST_MAIN") == "1" {
		os.Args = append([]string{"strata"}, os.Args[1:]...)
		main()
		return
	}
	os.Exit(m.Run())
}

// strata runs the command line args and returns its output and exit status.
func strata(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "STRATA_CLI_TEST_MAIN=1", "STRATA_RUNTIME_DIR="+t.TempDir(), "STRATA_META=", "STRATA_KEY_FILE="), env...)
	cmd.Dir = t.TempDir()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run strata %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// allCommands lists every command below c, c included.
func allCommands(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		out = append(out, allCommands(sub)...)
	}
	return out
}

// placeholderOK: the placeholder pflag shows after a flag's name is its
// type, or a word put in backticks on purpose (upper case, like `DIR`).
// A backtick-quoted phrase in a usage text otherwise becomes the
// placeholder ("--data strata up"), which garbles the help.
var placeholderOK = regexp.MustCompile(`^(|string|strings|stringArray|int|int64|uint|uint32|uint64|float64|duration|[A-Z][A-Z0-9_]*)$`)

// TestHelpHasNoStrayPlaceholders: every flag of every command shows a
// placeholder that is its type (or a deliberate one), and every command's
// --help prints and exits 0.
func TestHelpHasNoStrayPlaceholders(t *testing.T) {
	for _, c := range allCommands(rootCmd) {
		check := func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			if !placeholderOK.MatchString(name) {
				t.Errorf("%s --%s: help shows the placeholder %q (a backtick-quoted phrase in its usage text)", c.CommandPath(), f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		if c.Hidden {
			continue
		}
		args := append(strings.Fields(c.CommandPath())[1:], "--help")
		out, errOut, code := strata(t, nil, args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("strata %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		// Each flag line: "  -x, --name placeholder   text" with a known placeholder.
		for _, line := range strings.Split(out, "\n") {
			m := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?: (\S+(?: \S+)*?))?\s{2,}\S`).FindStringSubmatch(line)
			if m != nil && !placeholderOK.MatchString(m[2]) {
				t.Errorf("strata %s: flag line %q has the placeholder %q", strings.Join(args, " "), line, m[2])
			}
		}
	}
}

// TestExitStatus: usage errors exit 2, runtime failures 1, everywhere.
func TestExitStatus(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want int
		says string
	}{
		{[]string{"--version"}, 0, "wire protocol"},
		{[]string{"no-such-command"}, 2, "unknown command"},
		{[]string{"status", "--no-such-flag"}, 2, "unknown flag"},
		{[]string{"status", "extra-argument"}, 2, "unknown command"},
		{[]string{"stripe", "set", "--count", "2"}, 2, "arg"},
		{[]string{"stripe", "get"}, 2, "arg"},
		{[]string{"stripe", "set", "--count", "x", "/"}, 2, "invalid argument"},
		{[]string{"bench", "calibrate"}, 2, "directory"},
		{[]string{"fsck", "--meta", "127.0.0.1:1"}, 1, "127.0.0.1:1"},
		{[]string{"status", "--meta", "127.0.0.1:1"}, 1, "127.0.0.1:1"},
		{[]string{"status", "--data", "/nonexistent"}, 2, "/nonexistent: does not exist"},
		{[]string{"stripe", "get", file}, 2, "not on a Strata mount"},
		{[]string{"--log-level", "loud", "status"}, 2, "log-level"},
		{[]string{"meta", "--data", t.TempDir(), "--disk-reserve", "lots"}, 2, "disk-reserve"},
		{[]string{"mount", "--meta", "127.0.0.1:1"}, 2, "MOUNTPOINT"},
		{[]string{"store", "--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--target", t.TempDir(), "--sync-interval", "-1s"}, 2, "--sync-interval"},
		{[]string{"up", "--sync-interval", "-1s"}, 2, "--sync-interval"},
		{[]string{"nfs", "--meta", "127.0.0.1:1", "--key-file", file, "--listen", "0.0.0.0:2049", "--export", "/=rw,clients=*",
			"--ha-vip", "10.0.0.100", "--ha-dev", "eth0"}, 2, "--ha-vip ADDR/PREFIX"},
		{[]string{"nfs", "--meta", "127.0.0.1:1", "--key-file", file, "--listen", "0.0.0.0:2049", "--export", "/=rw,clients=*",
			"--ha-vip", "10.0.0.100/24"}, 2, "device"},
		{[]string{"nfs", "--meta", "127.0.0.1:1", "--key-file", file, "--listen", "10.0.0.100:2049", "--export", "/=rw,clients=*",
			"--ha-vip", "10.0.0.100/24", "--ha-dev", "eth0"}, 2, "wildcard"},
		{[]string{"nfs", "--meta", "127.0.0.1:1", "--key-file", file, "--listen", "0.0.0.0:2049", "--export", "/=rw,clients=*",
			"--ha-vip", "10.0.0.100/24", "--ha-dev", "eth0", "--ha-ttl", "1s"}, 2, "TTL"},
	} {
		out, errOut, code := strata(t, nil, tc.args...)
		if code != tc.want || !strings.Contains(out+errOut, tc.says) {
			t.Errorf("strata %s: exit %d (want %d), output should say %q:\n%s%s", strings.Join(tc.args, " "), code, tc.want, tc.says, out, errOut)
		}
	}
}

// TestVersion: --version names the commit and every format version.
func TestVersion(t *testing.T) {
	out, _, code := strata(t, nil, "--version")
	for _, want := range []string{"strata ", "commit:", "wire protocol:", "metadata format:", "chunk format:", "raft log format:"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("strata --version: exit %d, no %q in\n%s", code, want, out)
		}
	}
}

// TestStripeSetRefusesOtherFileSystems: a layout set on a directory that
// is not on Strata is refused, and no xattr is left there.
func TestStripeSetRefusesOtherFileSystems(t *testing.T) {
	dir := t.TempDir()
	out, errOut, code := strata(t, nil, "stripe", "set", "--count", "2", dir)
	if code != 2 || !strings.Contains(errOut, "not on a Strata mount") {
		t.Fatalf("stripe set on %s: exit %d\n%s%s", dir, code, out, errOut)
	}
	buf := make([]byte, 256)
	if n, err := unix.Getxattr(dir, "user.strata.layout", buf); err == nil {
		t.Fatalf("stripe set left the xattr %q on %s", buf[:n], dir)
	}
}

// TestRefusedUpRemovesItsLockFile: a strata up refused after it took the
// data directory (here: its mount point is a file) leaves no lock file.
func TestRefusedUpRemovesItsLockFile(t *testing.T) {
	dir := t.TempDir()
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	if err := os.WriteFile(mnt, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := strata(t, nil, "up", "--data", data, "--mount", mnt)
	if code != 1 || !strings.Contains(errOut, "mount point") {
		t.Fatalf("strata up on a file as mount point: exit %d\n%s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(data, dataLockName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused strata up left %s behind (%v)", dataLockName, err)
	}
}

// TestMetricsFlagOneName: every daemon takes --metrics-addr; meta and
// store keep the old --metrics as a hidden, deprecated alias.
func TestMetricsFlagOneName(t *testing.T) {
	for _, name := range []string{"meta", "store", "mount"} {
		c, _, err := rootCmd.Find([]string{name})
		if err != nil || c.Name() != name {
			t.Fatalf("no command %s: %v", name, err)
		}
		if c.Flags().Lookup("metrics-addr") == nil {
			t.Errorf("strata %s has no --metrics-addr", name)
		}
		if old := c.Flags().Lookup("metrics"); old != nil && (!old.Hidden || old.Deprecated == "") {
			t.Errorf("strata %s --metrics is shown in help; it should be a hidden deprecated alias", name)
		}
	}
	out, errOut, _ := strata(t, nil, "store", "--metrics", "127.0.0.1:0")
	if !strings.Contains(out+errOut, "--metrics-addr") {
		t.Errorf("strata store --metrics does not point to --metrics-addr:\n%s%s", out, errOut)
	}
}

// TestFsckJSONNames: fsck --json and scrub --json follow the JSON
// convention (snake_case; "address" as in status).
func TestFsckJSONNames(t *testing.T) {
	for _, v := range []any{fsckTarget{}, scrubTarget{Group: 1, Skipped: "x", Problems: []string{"p"}}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
		for k := range m {
			if !snake.MatchString(k) {
				t.Errorf("%T JSON name %q is not snake_case", v, k)
			}
		}
		if _, ok := m["address"]; !ok {
			t.Errorf("%T JSON has no \"address\": %s", v, b)
		}
		if _, ok := m["chunks"]; !ok {
			t.Errorf("%T JSON has no \"chunks\": %s", v, b)
		}
	}
}

// TestShortHelpCapitalized: the command list reads alike.
func TestShortHelpCapitalized(t *testing.T) {
	for _, c := range allCommands(rootCmd) {
		if c.Hidden || c.Short == "" {
			continue
		}
		if r := c.Short[0]; r < 'A' || r > 'Z' {
			t.Errorf("%s: short help %q does not start with a capital", c.CommandPath(), c.Short)
		}
	}
}
