package oncrpc

import "time"

// workers run the server's calls on goroutines that outlive a call: a
// worker serves a call, then waits up to workerIdle for the next before
// it exits. A goroutine started per call began each call on a fresh 8 KiB
// stack and grew it (the procedures, the XDR traversal and the client
// library's calls are deep): a quarter of a GETATTR's CPU was
// runtime.newstack copying stacks. The number of workers is bounded by
// the calls in flight (Config.MaxCalls), since a worker is either serving
// one or idle after one.
type workers struct {
	work chan func() // unbuffered: a send succeeds only to an idle worker
	done <-chan struct{}
}

// workerIdle is how long an idle worker waits for a call before it exits.
const workerIdle = 10 * time.Second

func newWorkers(done <-chan struct{}) *workers {
	return &workers{work: make(chan func()), done: done}
}

// run runs fn on an idle worker, or on a new one when none is idle.
func (w *workers) run(fn func()) {
	select {
	case w.work <- fn:
	default:
		go w.loop(fn)
	}
}

func (w *workers) loop(fn func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		fn()
		idle.Reset(workerIdle)
		select {
		case fn = <-w.work:
		case <-idle.C:
			return
		case <-w.done:
			return
		}
	}
}
