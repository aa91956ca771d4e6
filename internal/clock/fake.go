package clock

import (
	"sync"
	"time"
)

// deliverWait bounds how long (in real time) Advance waits for a reader to
// receive a due tick or timer value before dropping it (a variable for
// this package's tests).
var deliverWait = 5 * time.Second

// Fake is a Clock that moves only when Advance moves it. See the package
// doc for how it delivers.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64 // orders timers due at the same time by creation
	pending map[*fakeTimer]struct{}
	// changed is closed (and replaced) whenever a timer is added.
	changed chan struct{}
	// patience, when set (SetPatience), replaces deliverWait.
	patience time.Duration
}

// SetPatience sets how long (in real time) Advance waits for a reader to
// take a due tick before dropping it, instead of 5 s: for a test whose
// code under test is meant to be held (in a call to a hung server) while
// its ticker goes on, as a real ticker drops the ticks of a busy reader.
func (f *Fake) SetPatience(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patience = d
}

// NewFake is a Fake clock that reads start until advanced.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start.Round(0), pending: map[*fakeTimer]struct{}{}, changed: make(chan struct{})}
}

type fakeTimer struct {
	f      *Fake
	at     time.Time
	seq    uint64
	period time.Duration // a ticker's; 0 for a timer
	fn     func()        // AfterFunc's
	c      chan time.Time
	// stopped is closed by Stop: a delivery under way gives up.
	stopped  chan struct{}
	stopOnce sync.Once
}

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	return fakeTicker{f.add(d, d, nil)}
}

// fakeTicker is a ticker: its Stop returns nothing.
type fakeTicker struct{ t *fakeTimer }

func (t fakeTicker) C() <-chan time.Time { return t.t.c }
func (t fakeTicker) Stop()               { t.t.Stop() }

func (f *Fake) NewTimer(d time.Duration) Timer { return f.add(d, 0, nil) }

func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer { return f.add(d, 0, fn) }

func (f *Fake) add(d, period time.Duration, fn func()) *fakeTimer {
	t := &fakeTimer{f: f, period: period, fn: fn, stopped: make(chan struct{})}
	switch {
	case fn != nil:
	case period > 0:
		t.c = make(chan time.Time) // handed over: see fire
	default:
		t.c = make(chan time.Time, 1) // waits for its reader, as a real timer's
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	t.at, t.seq = f.now.Add(max(d, 0)), f.seq
	f.pending[t] = struct{}{}
	close(f.changed)
	f.changed = make(chan struct{})
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	_, active := t.f.pending[t]
	delete(t.f.pending, t)
	t.f.mu.Unlock()
	t.stopOnce.Do(func() { close(t.stopped) })
	return active
}

// Advance moves the clock forward by d, firing what falls due on the way
// in the order of its times (at equal times, in the order made).
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	end := f.now.Add(max(d, 0))
	f.mu.Unlock()
	for {
		f.mu.Lock()
		var next *fakeTimer
		for t := range f.pending {
			if !t.at.After(end) && (next == nil || t.at.Before(next.at) || (t.at.Equal(next.at) && t.seq < next.seq)) {
				next = t
			}
		}
		if next == nil {
			f.now = end
			f.mu.Unlock()
			return
		}
		at := next.at
		f.now = at
		if next.period > 0 {
			next.at = at.Add(next.period)
			f.seq++
			next.seq = f.seq
		} else {
			delete(f.pending, next)
		}
		f.mu.Unlock()
		next.fire(at)
	}
}

func (t *fakeTimer) fire(at time.Time) {
	switch {
	case t.fn != nil:
		t.fn()
		return
	case t.period == 0:
		t.c <- at // buffered; a timer fires once
		return
	}
	t.f.mu.Lock()
	patience := t.f.patience
	t.f.mu.Unlock()
	if patience <= 0 {
		patience = deliverWait
	}
	wait := time.NewTimer(patience)
	defer wait.Stop()
	select {
	case t.c <- at:
	case <-t.stopped:
	case <-wait.C:
	}
}

// Pending is the number of timers and tickers that have not fired (tickers
// until stopped).
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// WaitPending waits until at least n timers and tickers are pending (code
// under test has reached the point where it waits on the clock), or real
// time within has passed; it reports whether they are.
func (f *Fake) WaitPending(n int, within time.Duration) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		ok, changed := len(f.pending) >= n, f.changed
		f.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}
