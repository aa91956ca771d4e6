package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Units of Result.Value.
const (
	UnitMiBps = "MiB/s"
	UnitIOPS  = "IOPS"
	UnitOpsps = "ops/s"
)

// Report is the JSON document a run writes. It is a contract: other tools
// read "machine" and "results"; fields may be added, never renamed.
type Report struct {
	Machine Machine  `json:"machine"`
	Limit   *Limit   `json:"limit,omitempty"`
	Results []Result `json:"results"`
	// Notes are run-wide remarks (caches not dropped, a skipped system).
	Notes []string `json:"notes,omitempty"`
}

// Result is one data point: one phase of one workload at one sweep point.
type Result struct {
	System   string  `json:"system"` // label of the file system or run, e.g. "local", "glusterfs"
	Path     string  `json:"path,omitempty"`
	FSType   string  `json:"fstype,omitempty"`
	Workload string  `json:"workload"` // seq, random, shared, meta, smallfile
	Phase    string  `json:"phase"`    // write, read, create, stat, remove
	Threads  int     `json:"threads"`  // total threads over all clients
	Clients  int     `json:"clients"`  // client processes
	Value    float64 `json:"value"`    // median over repeats
	Unit     string  `json:"unit"`
	Verified bool    `json:"verified"` // every byte read back matched (reads), or the data was read back in a later phase (writes)
	Bytes    int64   `json:"bytes,omitempty"`
	Ops      int64   `json:"ops,omitempty"`
	Seconds  float64 `json:"seconds"` // of the median sample
	// CPUSeconds is the user+system CPU time of the phase's worker
	// processes (whole processes: start-up and set-up included) in the
	// median sample: the client-side cost of moving Bytes.
	CPUSeconds float64   `json:"cpu_seconds,omitempty"`
	Samples    []float64 `json:"samples,omitempty"`
	// RecordBytes is the I/O size (1 MiB for seq, 4 KiB random, transfer
	// size shared, the file size smallfile).
	RecordBytes int64 `json:"record_bytes,omitempty"`
	ODirect     *bool `json:"odirect,omitempty"`
	// Efficiency is Value ÷ the run's own measured physical limit for the
	// same pattern (see Limit), when one was measured.
	Efficiency float64  `json:"efficiency,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// Key identifies a result's series and point.
func (r Result) Key() string {
	return fmt.Sprintf("%s/%s/%s/t%d/c%d", r.System, r.Workload, r.Phase, r.Threads, r.Clients)
}

// MiBps converts bytes moved in seconds to MiB/s.
func MiBps(bytes int64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return float64(bytes) / (1 << 20) / seconds
}

// OpsPerSecond converts operations done in seconds to a rate.
func OpsPerSecond(ops int64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return float64(ops) / seconds
}

// MergeRepeats joins results of the same series and point (same Key) that
// separate runs measured — peers' repeats, interleaved over the systems —
// into one each, in the order of their first appearance: the samples of
// all, the median of them as Value, and bytes, ops, seconds, CPU time,
// O_DIRECT and notes of the constituent closest to that median.
func MergeRepeats(rs []Result) []Result {
	var order []string
	groups := map[string][]Result{}
	for _, r := range rs {
		k := r.Key()
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	out := make([]Result, 0, len(order))
	for _, k := range order {
		g := groups[k]
		if len(g) == 1 {
			out = append(out, g[0])
			continue
		}
		var vals []float64
		for _, r := range g {
			if len(r.Samples) > 0 {
				vals = append(vals, r.Samples...)
			} else {
				vals = append(vals, r.Value)
			}
		}
		med := Median(vals)
		best := g[0]
		for _, r := range g[1:] {
			if math.Abs(r.Value-med) < math.Abs(best.Value-med) {
				best = r
			}
		}
		m := best
		m.Value, m.Samples = med, vals
		m.Verified = true
		for _, r := range g {
			m.Verified = m.Verified && r.Verified
		}
		out = append(out, m)
	}
	return out
}

// Median returns the median of xs (mean of the middle two for even counts),
// 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Efficiency is delivered ÷ limit, 0 when no limit is known.
func Efficiency(delivered, limit float64) float64 {
	if limit <= 0 || math.IsNaN(limit) {
		return 0
	}
	return delivered / limit
}

// ParseSweep parses a comma-separated list of positive integers, with
// ranges written "1-8" doubling ("1,2,4,8") — e.g. "1,2,4" or "1-16".
// The result is sorted and without duplicates.
func ParseSweep(s string) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	add := func(n int) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty list")
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if lo, hi, ok := strings.Cut(part, "-"); ok {
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 1 || b < a {
				return nil, fmt.Errorf("bad range %q: want LOW-HIGH with 1 <= LOW <= HIGH", part)
			}
			for n := a; n <= b; n *= 2 {
				add(n)
			}
			add(b)
			continue
		}
		n, err := strconv.Atoi(part)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q: want a positive integer", part)
		}
		add(n)
	}
	sort.Ints(out)
	return out, nil
}

// ParseSize parses sizes like "4G", "512M", "64k", "1MiB", "1048576".
// Units are powers of 1024.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(t, "IB")
	t = strings.TrimSuffix(t, "B")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q: want e.g. 4G, 512M, 64K", s)
	}
	return n * mult, nil
}

// FormatSize prints bytes with a binary unit.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

// WriteJSON writes the report to path, indented.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadReport loads a report written by WriteJSON.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return &r, nil
}

// limitFor returns the physical limit matching a result's pattern.
func (l *Limit) limitFor(workload, phase string) float64 {
	if l == nil {
		return 0
	}
	switch workload + "/" + phase {
	case "seq/write", "shared/write":
		return l.SeqWriteMiBps
	case "seq/read", "shared/read":
		return l.SeqReadMiBps
	case "random/write":
		return l.RandWriteIOPS
	case "random/read":
		return l.RandReadIOPS
	}
	return 0
}

// ApplyEfficiency fills Result.Efficiency from the report's limit.
func (r *Report) ApplyEfficiency() {
	for i := range r.Results {
		res := &r.Results[i]
		res.Efficiency = Efficiency(res.Value, r.Limit.limitFor(res.Workload, res.Phase))
	}
}
