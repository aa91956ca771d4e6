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
// It asks the strata binary running the harness: `strata stripe get --json
// DIR` gives the directory's layout (whose default count is already "all
// targets, capped at 8"), then `strata stripe set --count N --size S DIR`
// fixes it to every listed target with the transfer size as stripe size.
type DefaultStriper struct {
	// Binary is the strata binary; empty = this executable.
	Binary string
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
	out, err := exec.CommandContext(ctx, bin, "stripe", "get", "--json", dir).Output()
	if err != nil {
		return "", fmt.Errorf("strata stripe get: %w", err)
	}
	var lay struct {
		Targets []json.RawMessage `json:"targets"`
	}
	if err := json.Unmarshal(out, &lay); err != nil || len(lay.Targets) == 0 {
		return "", fmt.Errorf("strata stripe get: unexpected output %q", strings.TrimSpace(string(out)))
	}
	n := strconv.Itoa(len(lay.Targets))
	if b, err := exec.CommandContext(ctx, bin, "stripe", "set", "--count", n, "--size", FormatSize(stripeBytes), dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("strata stripe set: %v: %s", err, strings.TrimSpace(string(b)))
	}
	return fmt.Sprintf("shared file striped over %s targets, stripe size %s", n, FormatSize(stripeBytes)), nil
}

// NoCaches is the CacheDropper of file systems without caches of their own
// to drop (and, until Strata's cache API exists, of Strata).
type NoCaches struct{}

var _ CacheDropper = NoCaches{}

func (NoCaches) DropCaches(context.Context) error { return nil }
