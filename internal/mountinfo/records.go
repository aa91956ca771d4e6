package mountinfo

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Record describes a running mount daemon (strata mount or strata up).
type Record struct {
	Pid     int    `json:"pid"`
	Mount   string `json:"mount"`              // absolute mount point
	Meta    string `json:"meta"`               // metadata service: its voters' addresses, comma-separated (one: no comma)
	KeyFile string `json:"key_file,omitempty"` // cluster key file ("" = none given)
	Data    string `json:"data,omitempty"`     // strata up's data directory
}

// MetaAddrs returns the addresses r.Meta lists (a record of an older
// version holds one).
func (r Record) MetaAddrs() []string { return splitAddrs(r.Meta) }

// splitAddrs splits a comma-separated address list, dropping empty
// elements.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// runtimeEnv overrides the runtime directory (tests, unusual setups).
const runtimeEnv = "STRATA_RUNTIME_DIR"

// RuntimeDir is where this process writes its record: $STRATA_RUNTIME_DIR,
// else /run/strata for root, else $XDG_RUNTIME_DIR/strata, else
// TMPDIR/strata-UID.
func RuntimeDir() string {
	if d := os.Getenv(runtimeEnv); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/run/strata"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "strata")
	}
	return filepath.Join(os.TempDir(), "strata-"+strconv.Itoa(os.Geteuid()))
}

// runtimeDirs are the directories searched for records: this user's and
// root's (a cluster started by root is found by every user).
func runtimeDirs() []string {
	own := RuntimeDir()
	if os.Getenv(runtimeEnv) != "" || own == "/run/strata" {
		return []string{own}
	}
	return []string{own, "/run/strata"}
}

// WriteRecord records r (r.Pid defaults to this process) and returns the
// function that removes the record again, for a clean stop.
func WriteRecord(r Record) (remove func(), err error) {
	if r.Pid == 0 {
		r.Pid = os.Getpid()
	}
	if p, err := filepath.EvalSymlinks(r.Mount); err == nil && r.Mount != "" {
		r.Mount = p // as the mount table shows it
	}
	dir := RuntimeDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("runtime directory: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, fmt.Sprintf("mount-%d.json", r.Pid))
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("write runtime record: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("write runtime record: %w", err)
	}
	return func() { os.Remove(p) }, nil
}

// Records returns the records of running mount daemons, by pid. A record
// whose process is gone, or whose mount point is no longer a Strata mount,
// is skipped (and removed when it is ours to remove).
func Records() []Record {
	mounts, _ := strataMounts()
	var out []Record
	seen := map[int]bool{}
	for _, dir := range runtimeDirs() {
		names, _ := filepath.Glob(filepath.Join(dir, "mount-*.json"))
		for _, name := range names {
			b, err := os.ReadFile(name)
			if err != nil {
				continue
			}
			var r Record
			if json.Unmarshal(b, &r) != nil || r.Pid <= 0 || seen[r.Pid] {
				continue
			}
			if !alive(r.Pid) || (r.Mount != "" && mounts != nil && !mounts[r.Mount]) {
				if !alive(r.Pid) {
					os.Remove(name) // left by a kill -9; fails harmlessly if not ours
				}
				continue
			}
			seen[r.Pid] = true
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// RecordFor returns the record of the daemon serving the mount at point.
func RecordFor(point string) (Record, bool) {
	for _, r := range Records() {
		if r.Mount == point {
			return r, true
		}
	}
	return Record{}, false
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// Holder names the process serving the Strata mount at point, for
// messages: "pid N (strata up, data in DIR)", or "" when unknown.
func Holder(point string) string {
	r, ok := RecordFor(point)
	if !ok {
		return ""
	}
	what := "strata mount"
	if r.Data != "" {
		what = "strata up, data in " + r.Data
	}
	comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(r.Pid), "comm"))
	if c := strings.TrimSpace(string(comm)); c != "" && c != "strata" {
		what += ", command " + c
	}
	return fmt.Sprintf("pid %d (%s)", r.Pid, what)
}
