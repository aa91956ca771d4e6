// Package testprogress turns `go test -json` into what a person watching a
// long suite wants: a line as each package starts, the output of failing
// tests only, a periodic line naming the tests still running, and every
// package's closing line (ok / FAIL / no test files) exactly as go test
// prints it, so that CI and people reading the end see the usual summary.
package testprogress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// event is one record of `go test -json` (cmd/test2json).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

// Format copies the event stream in to out as readable progress. On each
// tick it names the tests that have run longer than slow. It returns
// whether a package or build failed, once in ends.
func Format(in io.Reader, out io.Writer, tick <-chan time.Time, slow time.Duration) (failed bool, err error) {
	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		readErr <- sc.Err()
		close(lines)
	}()
	f := &formatter{out: out, buf: map[key][]string{}, started: map[key]time.Time{}}
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return f.failed, <-readErr
			}
			f.line(line)
		case now := <-tick:
			f.stillRunning(now, slow)
		}
	}
}

type key struct{ pkg, test string }

type formatter struct {
	out     io.Writer
	failed  bool
	buf     map[key][]string  // output of running tests
	started map[key]time.Time // running tests (and packages, test "")
}

func (f *formatter) line(line string) {
	var e event
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
		fmt.Fprintln(f.out, line) // not an event: a message of go itself
		return
	}
	k := key{e.Package, e.Test}
	switch {
	case e.Action == "build-output":
		fmt.Fprint(f.out, e.Output)
	case e.Action == "build-fail":
		f.failed = true
	case e.Test == "":
		f.packageEvent(e)
	case e.Action == "run":
		f.started[k] = e.Time
	case e.Action == "output":
		f.buf[k] = append(f.buf[k], e.Output)
	case e.Action == "fail":
		for _, o := range f.buf[k] {
			fmt.Fprint(f.out, o)
		}
		fallthrough
	case e.Action == "pass" || e.Action == "skip":
		delete(f.buf, k)
		delete(f.started, k)
	}
}

// packageEvent handles the events of a whole package: its start, and its
// own output, which ends with go test's closing line for it.
func (f *formatter) packageEvent(e event) {
	k := key{e.Package, ""}
	switch e.Action {
	case "start":
		f.started[k] = e.Time
		fmt.Fprintf(f.out, "run   %s\n", e.Package)
	case "output":
		if e.Output == "PASS\n" {
			return // go test without -json prints only the ok line
		}
		fmt.Fprint(f.out, e.Output)
	case "fail":
		f.failed = true
		// Tests still running when their package failed (a timeout's
		// panic, with every goroutine's stack, is in their output) get
		// no fail event of their own: print what they wrote.
		for tk, out := range f.buf {
			if tk.pkg == e.Package {
				for _, o := range out {
					fmt.Fprint(f.out, o)
				}
				delete(f.buf, tk)
			}
		}
		fallthrough
	case "pass", "skip":
		delete(f.started, k)
	}
}

// stillRunning names the tests (and packages without a running test) that
// have run longer than slow.
func (f *formatter) stillRunning(now time.Time, slow time.Duration) {
	var parts []string
	busy := map[string]bool{}
	for k, at := range f.started {
		if k.test != "" {
			busy[k.pkg] = true
			if now.Sub(at) >= slow {
				parts = append(parts, fmt.Sprintf("%s %s (%s)", short(k.pkg), k.test, now.Sub(at).Round(time.Second)))
			}
		}
	}
	for k, at := range f.started {
		if k.test == "" && !busy[k.pkg] && now.Sub(at) >= slow {
			parts = append(parts, fmt.Sprintf("%s (%s)", short(k.pkg), now.Sub(at).Round(time.Second)))
		}
	}
	if len(parts) == 0 {
		return
	}
	sort.Strings(parts)
	fmt.Fprintf(f.out, "still running: %s\n", strings.Join(parts, ", "))
}

// short drops the module path from a package path.
func short(pkg string) string {
	if i := strings.Index(pkg, "/internal/"); i >= 0 {
		return pkg[i+1:]
	}
	if i := strings.LastIndex(pkg, "/"); i >= 0 {
		return pkg[i+1:]
	}
	return pkg
}
