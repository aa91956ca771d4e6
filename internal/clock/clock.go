// Package clock is the time a service's timers follow, injectable so that
// tests drive time instead of sleeping.
//
// Real is the system clock (package time). Fake is a clock that stands
// still until a test moves it with Advance, which fires every timer,
// ticker and AfterFunc that falls due, in the order of their times:
//
//	fc := clock.NewFake(time.Now())
//	cfg.Clock = fc                       // e.g. meta.Config.Clock
//	...
//	fc.Advance(16 * time.Second)         // a 15 s lease has run out
//
// # Delivery
//
// A timer's value waits in its channel for its reader, as a real timer's
// does. A ticker's tick is handed over: where a real ticker keeps one tick
// and drops the ones its reader is too slow for, a Fake ticker delivers
// each due tick and Advance waits until the reader has received it (or the
// ticker is stopped, or 5 s of real time pass: then the tick is dropped).
// So when Advance returns, a reader that handles its ticks one at a time
// (a select loop) has received every tick due and finished with all but
// the last. AfterFunc's function runs in Advance, on the caller's
// goroutine, before Advance goes on: when Advance returns it has run. A
// function must not call Advance.
//
// # Locking
//
// A Fake is safe for concurrent use. Advance calls should not overlap
// (time would interleave); Now may be called at any time.
package clock

import "time"

// Clock tells the time and makes timers.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// NewTicker delivers the time every d on its channel (d > 0).
	NewTicker(d time.Duration) Ticker
	// NewTimer delivers the time once, after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f after d (the returned Timer has a nil channel).
	AfterFunc(d time.Duration, f func()) Timer
}

// Ticker is a time.Ticker of a Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Timer is a time.Timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; false if it had already fired
	// or been stopped.
	Stop() bool
}

// Real is the system clock.
var Real Clock = realClock{}

// OrReal is c, or Real when c is nil.
func OrReal(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }
