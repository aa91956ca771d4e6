package clock

import (
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)

// recv returns what ch holds now, or false.
func recv(ch <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeStandsStillUntilAdvanced(t *testing.T) {
	f := NewFake(t0)
	if !f.Now().Equal(t0) {
		t.Fatalf("Now = %v, want %v", f.Now(), t0)
	}
	f.Advance(1500 * time.Millisecond)
	if got := f.Now().Sub(t0); got != 1500*time.Millisecond {
		t.Fatalf("after Advance(1.5s) the clock moved %v", got)
	}
	f.Advance(-time.Second) // time does not run backwards
	if got := f.Now().Sub(t0); got != 1500*time.Millisecond {
		t.Fatalf("a negative Advance moved the clock to %v", got)
	}
}

// Events fire in the order of their times, each seeing the clock at its
// own time; AfterFunc has run when Advance returns; a timer not yet due
// stays pending.
func TestFakeFiresInTimeOrder(t *testing.T) {
	f := NewFake(t0)
	var (
		mu  sync.Mutex
		log []string
	)
	note := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
	tm := f.NewTimer(3 * time.Second)
	got := make(chan time.Time, 1)
	go func() { got <- <-tm.C() }()
	f.AfterFunc(2*time.Second, func() { note("func@" + f.Now().Sub(t0).String()) })
	f.AfterFunc(time.Second, func() { note("func@" + f.Now().Sub(t0).String()) })
	late := f.NewTimer(10 * time.Second)
	f.Advance(5 * time.Second)
	if v := <-got; !v.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("timer delivered %v, want t0+3s", v)
	}
	mu.Lock()
	if len(log) != 2 || log[0] != "func@1s" || log[1] != "func@2s" {
		t.Fatalf("AfterFunc calls = %q, want func@1s then func@2s, both before Advance returned", log)
	}
	mu.Unlock()
	if _, ok := recv(late.C()); ok {
		t.Fatal("a timer due at 10s fired at 5s")
	}
	if f.Pending() != 1 {
		t.Fatalf("pending = %d, want the 10s timer only", f.Pending())
	}
	if !late.Stop() || late.Stop() {
		t.Fatal("Stop of a pending timer: want true once, then false")
	}
	f.Advance(time.Hour) // nothing left to fire: does not block
}

// A ticker delivers every period that passes, each value received before
// Advance returns; a stopped ticker delivers nothing and blocks nothing.
func TestFakeTickerDeliversEveryTick(t *testing.T) {
	f := NewFake(t0)
	tk := f.NewTicker(100 * time.Millisecond)
	var ticks []time.Duration
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case v := <-tk.C():
				ticks = append(ticks, v.Sub(t0))
			case <-stop:
				return
			}
		}
	}()
	f.Advance(350 * time.Millisecond)
	close(stop)
	<-done
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	if len(ticks) != len(want) {
		t.Fatalf("ticks %v, want %v", ticks, want)
	}
	for i := range want {
		if ticks[i] != want[i] {
			t.Fatalf("ticks %v, want %v", ticks, want)
		}
	}
	tk.Stop()
	start := time.Now()
	f.Advance(time.Second)
	if d := time.Since(start); d > deliverWait/2 {
		t.Fatalf("Advance past a stopped ticker waited %v", d)
	}
	if _, ok := recv(tk.C()); ok {
		t.Fatal("stopped ticker ticked")
	}
}

// A tick nobody receives is dropped after deliverWait, as a real ticker
// drops ticks for a slow reader: Advance does not hang.
func TestFakeDropsUnreceivedTick(t *testing.T) {
	old := deliverWait
	deliverWait = 50 * time.Millisecond
	t.Cleanup(func() { deliverWait = old })
	f := NewFake(t0)
	tk := f.NewTicker(time.Second)
	defer tk.Stop()
	done := make(chan struct{})
	go func() { f.Advance(3 * time.Second); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Advance hung on a tick nobody receives")
	}
	if got := f.Now().Sub(t0); got != 3*time.Second {
		t.Fatalf("clock at %v after the drops, want 3s", got)
	}
}

// WaitPending tells a test when the code under test waits on the clock.
func TestFakeWaitPending(t *testing.T) {
	f := NewFake(t0)
	if f.WaitPending(1, 10*time.Millisecond) {
		t.Fatal("WaitPending(1) with nothing pending")
	}
	res := make(chan time.Time, 1)
	go func() {
		tm := f.NewTimer(time.Minute)
		defer tm.Stop()
		res <- <-tm.C()
	}()
	if !f.WaitPending(1, 10*time.Second) {
		t.Fatal("the goroutine's timer never showed as pending")
	}
	f.Advance(time.Minute)
	if v := <-res; !v.Equal(t0.Add(time.Minute)) {
		t.Fatalf("timer delivered %v", v)
	}
}

func TestOrReal(t *testing.T) {
	if OrReal(nil) != Real {
		t.Fatal("OrReal(nil) is not Real")
	}
	f := NewFake(t0)
	if OrReal(f) != Clock(f) {
		t.Fatal("OrReal(fake) is not the fake")
	}
	if d := time.Since(Real.Now()); d < 0 || d > time.Minute {
		t.Fatalf("Real.Now is %v off", d)
	}
}

// A timer that fires while nobody reads keeps its value for its reader,
// and Advance does not wait for one.
func TestFakeTimerValueWaits(t *testing.T) {
	f := NewFake(t0)
	tm := f.NewTimer(time.Second)
	start := time.Now()
	f.Advance(2 * time.Second)
	if d := time.Since(start); d > deliverWait/2 {
		t.Fatalf("Advance waited %v for a timer's reader", d)
	}
	if v, ok := recv(tm.C()); !ok || !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("timer value after firing unread: %v %v, want t0+1s", v, ok)
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported it active")
	}
}
