package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// progress prints one line per phase on stderr: a live bar on a terminal,
// a plain start line and end line otherwise (logs, CI).
type progress struct {
	w   io.Writer
	tty bool

	mu struct {
		sync.Mutex
		label    string
		total    float64 // expected bytes, ops or seconds; 0 = unknown
		byTime   bool    // total is a duration in seconds
		start    time.Time
		lastDraw time.Time
	}
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if w == nil {
		p.w = io.Discard
	}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) begin(label string, total float64, byTime bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.label, p.mu.total, p.mu.byTime = label, total, byTime
	p.mu.start = time.Now()
	if !p.tty {
		fmt.Fprintf(p.w, "bench: %s ...\n", label)
	}
}

// update is called with the bytes (or ops) done so far.
func (p *progress) update(done float64) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.mu.lastDraw) < 100*time.Millisecond {
		return
	}
	p.mu.lastDraw = now
	frac := 0.0
	if p.mu.byTime {
		done = now.Sub(p.mu.start).Seconds()
	}
	if p.mu.total > 0 {
		frac = done / p.mu.total
	}
	if frac > 1 {
		frac = 1
	}
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r\033[K%-40s [%s%s] %3.0f%%", p.mu.label, strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100)
}

func (p *progress) end(result string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	secs := time.Since(p.mu.start).Seconds()
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%-40s %s (%.1fs)\n", p.mu.label, result, secs)
		return
	}
	fmt.Fprintf(p.w, "bench: %s: %s (%.1fs)\n", p.mu.label, result, secs)
}

func (p *progress) note(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "bench: "+format+"\n", args...)
}
