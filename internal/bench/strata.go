package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// DefaultStriper stripes the N-to-1 file's directory over all targets when
// the directory is on a Strata mount (as the seeds striped the IOR file over
// all OSTs), and does nothing elsewhere.
//
// It asks the strata binary running the harness, as a user would:
//
//	strata status --json --data DATA        the targets (only when DataDir is set)
//	strata stripe set --count N --size S DIR
//	strata stripe get --json DIR            what the directory now says, for the note
//
// N is the number of live targets when DataDir locates the cluster, else 0,
// which Strata reads as "all targets" (capped at 8, more than `strata up`
// starts by default).
type DefaultStriper struct {
	// Binary is the strata binary; empty = this executable.
	Binary string
	// DataDir is the --data directory of the `strata up` cluster behind
	// the mount; empty = unknown (stripe count 0).
	DataDir string
}

var _ Striper = DefaultStriper{}

func (s DefaultStriper) StripeAll(ctx context.Context, dir string, stripeBytes int64) (string, error) {
	if !OnStrata(dir) {
		return "", nil
	}
	bin := s.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return "", err
		}
	}
	count, how := 0, "all targets (count 0)"
	if s.DataDir != "" {
		out, err := exec.CommandContext(ctx, bin, statusArgs(s.DataDir)...).Output()
		if err != nil {
			return "", fmt.Errorf("strata status: %w", commandError(err))
		}
		if count, err = liveTargets(out); err != nil {
			return "", err
		}
		how = fmt.Sprintf("all %d live targets", count)
	}
	if b, err := exec.CommandContext(ctx, bin, stripeSetArgs(count, stripeBytes, dir)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("strata stripe set: %v: %s", err, strings.TrimSpace(string(b)))
	}
	note := fmt.Sprintf("shared file's directory striped over %s, stripe size %s", how, FormatSize(stripeBytes))
	if out, err := exec.CommandContext(ctx, bin, "stripe", "get", "--json", dir).Output(); err == nil {
		note += "; stripe get: " + strings.TrimSpace(string(out))
	}
	return note, nil
}

func statusArgs(dataDir string) []string { return []string{"status", "--json", "--data", dataDir} }

func stripeSetArgs(count int, stripeBytes int64, dir string) []string {
	return []string{"stripe", "set", "--count", strconv.Itoa(count), "--size", strconv.FormatInt(stripeBytes, 10), dir}
}

// liveTargets counts the live targets in `strata status --json` output
// (admin.Status).
func liveTargets(statusJSON []byte) (int, error) {
	var st struct {
		Targets []struct {
			ID    uint32 `json:"id"`
			Alive bool   `json:"alive"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(statusJSON, &st); err != nil {
		return 0, fmt.Errorf("strata status: unexpected output %q: %w", strings.TrimSpace(string(statusJSON)), err)
	}
	n := 0
	for _, t := range st.Targets {
		if t.Alive {
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("strata status: no live targets in %q", strings.TrimSpace(string(statusJSON)))
	}
	return n, nil
}

func commandError(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// NoCaches is the CacheDropper of file systems without caches of their own
// to drop (and, until Strata's cache API exists, of Strata).
type NoCaches struct{}

var _ CacheDropper = NoCaches{}

func (NoCaches) DropCaches(context.Context) error { return nil }
