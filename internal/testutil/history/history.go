package history

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
		return fmt.Errorf("%s (%d operations); %s: %w", label, len(ops), where, ErrNotLinearizable)
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
