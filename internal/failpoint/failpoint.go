package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvVar names the environment variable read at process start.
const EnvVar = "STRATA_FAILPOINTS"

// FileEnvVar names a file whose content, a specification as in EnvVar,
// arms points while the process runs (a test harness switching a fault
// on and off in a real process): it is read every FilePoll, and whenever
// it changes, the points it armed before are disarmed and what it says
// now is armed. A missing file arms nothing.
const FileEnvVar = "STRATA_FAILPOINTS_FILE"

// FilePoll is how often the FileEnvVar file is read.
const FilePoll = 100 * time.Millisecond

// ErrInjected is wrapped by every error an armed point returns.
var ErrInjected = errors.New("injected failure")

type kind uint8

const (
	kindOff kind = iota
	kindPanic
	kindExit
	kindSleep
	kindError
)

// action is what an armed point does.
type action struct {
	kind  kind
	sleep time.Duration
	nth   int64 // 0: every hit; else the nth hit (1-based)
	from  bool  // with nth: that hit and every later one
	hits  atomic.Int64
}

var (
	// armed is 0 while no point is armed: the whole cost of an unarmed call.
	armed  atomic.Int32
	mu     sync.RWMutex
	points = map[string]*action{}
)

func init() {
	if spec := os.Getenv(EnvVar); spec != "" {
		if err := ArmSpec(spec); err != nil {
			fmt.Fprintf(os.Stderr, "strata: ignoring %s: %v\n", EnvVar, err)
		}
	}
	if path := os.Getenv(FileEnvVar); path != "" {
		go watchFile(path, nil)
	}
}

// watchFile applies the file at path every FilePoll until stop is closed
// (nil: for the life of the process).
func watchFile(path string, stop <-chan struct{}) {
	var last string
	var names []string // what the file armed
	for {
		b, err := os.ReadFile(path)
		if err != nil && !os.IsNotExist(err) {
			b = []byte(last) // unreadable for now: keep what is armed
		}
		if spec := strings.TrimSpace(string(b)); spec != last {
			for _, n := range names {
				Disarm(n)
			}
			names = nil
			if err := ArmSpec(spec); err != nil {
				fmt.Fprintf(os.Stderr, "strata: ignoring %s %s: %v\n", FileEnvVar, path, err)
			} else {
				names = specNames(spec)
				fmt.Fprintf(os.Stderr, "strata: failpoints from %s now: %q\n", path, spec)
			}
			last = spec
		}
		select {
		case <-stop:
			return
		case <-time.After(FilePoll):
		}
	}
}

// specNames lists the point names of a well-formed specification.
func specNames(spec string) []string {
	var out []string
	for item := range strings.SplitSeq(spec, ",") {
		if name, _, ok := strings.Cut(strings.TrimSpace(item), "="); ok {
			out = append(out, strings.TrimSpace(name))
		}
	}
	return out
}

// Hit runs the action armed at name, if any. An error action panics: use
// Eval where the call site can return an error.
func Hit(name string) {
	if armed.Load() == 0 {
		return
	}
	if err := fire(name); err != nil {
		panic(fmt.Sprintf("failpoint %s: %v", name, err))
	}
}

// Eval runs the action armed at name, if any, and returns the error of an
// error action (nil otherwise).
func Eval(name string) error {
	if armed.Load() == 0 {
		return nil
	}
	return fire(name)
}

// HitSub is Hit for a point with a sub-name (see EvalSub).
func HitSub(name string, sub fmt.Stringer) {
	if armed.Load() == 0 {
		return
	}
	if err := fire(subName(name, sub)); err != nil {
		panic(fmt.Sprintf("failpoint %s: %v", name, err))
	}
}

// EvalSub is Eval for a point with a sub-name: the action armed at
// name+"/"+sub.String() if there is one, else the one armed at name. sub's
// String is called only when some point is armed.
func EvalSub(name string, sub fmt.Stringer) error {
	if armed.Load() == 0 {
		return nil
	}
	return fire(subName(name, sub))
}

// subName is name+"/"+sub when a point of that name is armed, else name.
func subName(name string, sub fmt.Stringer) string {
	full := name + "/" + sub.String()
	mu.RLock()
	_, ok := points[full]
	mu.RUnlock()
	if ok {
		return full
	}
	return name
}

func fire(name string) error {
	mu.RLock()
	a := points[name]
	mu.RUnlock()
	if a == nil || a.kind == kindOff {
		return nil
	}
	n := a.hits.Add(1)
	if a.nth != 0 && (n < a.nth || (!a.from && n != a.nth)) {
		return nil
	}
	switch a.kind {
	case kindPanic:
		panic(fmt.Sprintf("failpoint %s: injected panic (hit %d)", name, n))
	case kindExit:
		fmt.Fprintf(os.Stderr, "strata: failpoint %s: killing the process (hit %d)\n", name, n)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not deliverable late; never return
	case kindSleep:
		time.Sleep(a.sleep)
	case kindError:
		return fmt.Errorf("failpoint %s (hit %d): %w", name, n, ErrInjected)
	}
	return nil
}

// Arm arms name with an action written as in STRATA_FAILPOINTS ("exit",
// "2*error", "sleep(50ms)", "off"), replacing what was armed there, with a
// fresh hit count.
func Arm(name, act string) error {
	a, err := parseAction(act)
	if err != nil {
		return fmt.Errorf("failpoint %s: %w", name, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if _, was := points[name]; !was {
		armed.Add(1)
	}
	points[name] = a
	return nil
}

// Disarm removes the action armed at name.
func Disarm(name string) {
	mu.Lock()
	defer mu.Unlock()
	if _, was := points[name]; was {
		delete(points, name)
		armed.Add(-1)
	}
}

// DisarmAll removes every action (tests: t.Cleanup(failpoint.DisarmAll)).
func DisarmAll() {
	mu.Lock()
	defer mu.Unlock()
	clear(points)
	armed.Store(0)
}

// Armed lists the armed points as "name=hits" (hits so far), sorted by
// nothing in particular: for tests and logs.
func Armed() map[string]int64 {
	mu.RLock()
	defer mu.RUnlock()
	out := make(map[string]int64, len(points))
	for n, a := range points {
		out[n] = a.hits.Load()
	}
	return out
}

// ArmSpec arms every "name=action" of a comma-separated list. Nothing is
// armed when any of them is malformed.
func ArmSpec(spec string) error {
	type pair struct{ name, act string }
	var ps []pair
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, act, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return fmt.Errorf("%q: want name=action", item)
		}
		if _, err := parseAction(act); err != nil {
			return fmt.Errorf("%q: %w", item, err)
		}
		ps = append(ps, pair{strings.TrimSpace(name), strings.TrimSpace(act)})
	}
	for _, p := range ps {
		if err := Arm(p.name, p.act); err != nil {
			return err
		}
	}
	return nil
}

func parseAction(s string) (*action, error) {
	a := &action{}
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "*+"); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("count %q: want a positive integer", s[:i])
		}
		a.nth, a.from = n, s[i] == '+'
		s = s[i+1:]
	}
	switch {
	case s == "off":
		a.kind = kindOff
	case s == "panic":
		a.kind = kindPanic
	case s == "exit":
		a.kind = kindExit
	case s == "error":
		a.kind = kindError
	case strings.HasPrefix(s, "sleep(") && strings.HasSuffix(s, ")"):
		d, err := time.ParseDuration(s[len("sleep(") : len(s)-1])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("sleep duration %q: want e.g. sleep(100ms)", s)
		}
		a.kind, a.sleep = kindSleep, d
	default:
		return nil, fmt.Errorf("action %q: want panic, exit, sleep(D), error or off, optionally N*action or N+action", s)
	}
	return a, nil
}
