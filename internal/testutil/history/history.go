package history

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is one recorded operation. Times are nanoseconds on the monotonic
// clock since the history began; Return is -1 while the operation runs.
type Op struct {
	Client int
	In     Input
	Out    Output
	Call   int64
	Return int64
	// Final marks the read-back of every name after the recorders stopped
	// (what ExactlyOnce compares with).
	Final bool
}

// History is a concurrent-safe record of operations.
type History struct {
	start time.Time
	mu    struct {
		sync.Mutex
		ops []Op // guarded by mu
	}
}

// New starts a history: times count from now.
func New() *History { return &History{start: time.Now()} }

func (h *History) now() int64 { return int64(time.Since(h.start)) }

// Begin records that client invokes in and returns the operation's id for
// End. An operation never ended counts as Unknown.
func (h *History) Begin(client int, in Input) int { return h.begin(client, in, false) }

func (h *History) begin(client int, in Input, final bool) int {
	t := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.ops = append(h.mu.ops, Op{Client: client, In: in, Call: t, Return: -1, Final: final})
	return len(h.mu.ops) - 1
}

// End records the outcome of the operation id.
func (h *History) End(id int, out Output) {
	t := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.ops[id].Out, h.mu.ops[id].Return = out, t
}

// Add appends a complete operation (synthetic histories in tests).
func (h *History) Add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.ops = append(h.mu.ops, op)
}

// Ops returns a copy of the operations so far; those still running have
// Return -1 and an Unknown outcome.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Op, len(h.mu.ops))
	copy(out, h.mu.ops)
	for i := range out {
		if out[i].Return < 0 {
			out[i].Out = Output{Status: Unknown, Err: "still running when the history was taken"}
		}
	}
	return out
}

// Counts summarises a history: operations by outcome.
func Counts(ops []Op) map[Status]int {
	c := map[Status]int{}
	for _, op := range ops {
		c[op.Out.Status]++
	}
	return c
}

// checkTimeout bounds one check; partitions are small, so a check that
// runs this long is itself a finding.
const checkTimeout = 60 * time.Second

// ErrNotLinearizable is wrapped by Check's error for a history that is not.
var ErrNotLinearizable = errors.New("history is not linearizable")

// Check reports whether ops are linearizable against Model. On a failure
// (or an inconclusive check) it writes porcupine's visualisation to
// $STRATA_HISTORY_DIR or a kept directory under os.TempDir, as
// <label>.html, and names the file in the error.
func Check(ops []Op, label string) error {
	if len(ops) == 0 {
		return nil
	}
	var end int64
	for _, op := range ops {
		end = max(end, op.Call, op.Return)
	}
	pops := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		ret := op.Return
		if op.Out.Status == Unknown || ret < 0 {
			// It may take effect at any time after its call: it
			// returns after everything else.
			ret = end + 1
		}
		pops = append(pops, porcupine.Operation{ClientId: op.Client, Input: op.In, Call: op.Call, Output: op.Out, Return: ret})
	}
	model := Model()
	res, info := porcupine.CheckOperationsVerbose(model, pops, checkTimeout)
	if res == porcupine.Ok {
		return nil
	}
	path, werr := visualise(model, info, label)
	where := "visualisation: " + path
	if werr != nil {
		where = fmt.Sprintf("could not write the visualisation: %v", werr)
	}
	if res == porcupine.Illegal {
		return fmt.Errorf("%s (%d operations); %s; %s: %w", label, len(ops), illegalParts(model, pops), where, ErrNotLinearizable)
	}
	return fmt.Errorf("%s: linearizability check of %d operations inconclusive after %v (%v); %s", label, len(ops), checkTimeout, res, where)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func visualise(model porcupine.Model, info porcupine.LinearizationInfo, label string) (string, error) {
	dir := os.Getenv("STRATA_HISTORY_DIR")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "strata-history-"); err != nil {
			return "", err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, unsafeChars.ReplaceAllString(label, "_")+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// illegalParts names the partitions that are not linearizable and, for
// the first, shows where every linearization got stuck: the end of the
// longest one found, then the first operations (by invocation) it could
// not place.
func illegalParts(model porcupine.Model, pops []porcupine.Operation) string {
	var bad []string
	var first []porcupine.Operation
	single := porcupine.Model{Init: model.Init, Step: model.Step, Hash: model.Hash}
	for _, part := range model.Partition(pops) {
		if !porcupine.CheckOperations(single, part) {
			bad = append(bad, part[0].Input.(Input).Part)
			if first == nil {
				first = part
			}
		}
	}
	if first == nil {
		return "no single partition fails"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "partitions %v fail; in %s (%d operations)", bad, bad[0], len(first))
	_, info := porcupine.CheckOperationsVerbose(single, first, checkTimeout)
	var best []porcupine.Operation
	for _, l := range info.PartialLinearizationsOperations()[0] {
		if len(l) > len(best) {
			best = l
		}
	}
	if len(best) == 0 {
		return b.String()
	}
	placed := map[int64]bool{}
	for _, o := range best {
		placed[o.Call] = true
	}
	line := func(tag string, o porcupine.Operation) {
		fmt.Fprintf(&b, "\n  %s client %d [%.3f ms, %.3f ms] %v → %v", tag, o.ClientId, float64(o.Call)/1e6, float64(o.Return)/1e6, o.Input, o.Output)
	}
	b.WriteString(", the longest linearization ends:")
	for _, o := range best[max(0, len(best)-6):] {
		line("placed ", o)
	}
	sorted := slices.Clone(first)
	slices.SortFunc(sorted, func(x, y porcupine.Operation) int { return cmp.Compare(x.Call, y.Call) })
	n := 0
	for _, o := range sorted {
		if !placed[o.Call] && n < 8 {
			line("stuck  ", o)
			n++
		}
	}
	return b.String()
}
