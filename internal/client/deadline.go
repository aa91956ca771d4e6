package client

import (
	"context"
	"sync"
	"time"
)

// withDeadline is context.WithDeadline for the client's calls, whose
// timer is made only when somebody waits on Done. Most calls of a mount
// in `strata up` are quick reads that the metadata service runs on the
// caller's goroutine (transport: Server.Inline) and that never wait on
// their context: for them a deadline context's timer — armed, then
// stopped, on the runtime's timer heap, per call — was ~5 % of the CPU of
// a small-file read. Deadline and Err answer as the real one would; the
// first Done makes it (a deadline already passed: closed at once). cancel
// must be called, as context.WithDeadline's.
func withDeadline(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	if pd, ok := parent.Deadline(); ok && !pd.After(d) {
		return parent, func() {} // parent ends first: nothing to add
	}
	c := &lazyDeadline{Context: parent, d: d}
	return c, c.cancel
}

type lazyDeadline struct {
	context.Context // the parent
	d               time.Time

	mu       sync.Mutex
	inner    context.Context // made by the first Done
	stop     context.CancelFunc
	canceled bool
}

func (c *lazyDeadline) Deadline() (time.Time, bool) { return c.d, true }

func (c *lazyDeadline) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner, c.stop = context.WithDeadline(c.Context, c.d)
		if c.canceled {
			c.stop()
		}
	}
	return c.inner.Done()
}

// Value answers from the deadline context once it exists, so that a
// context derived from this one after a Done finds it as its parent to
// cancel (no watcher goroutine); its values are the parent's.
func (c *lazyDeadline) Value(key any) any {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return c.Context.Value(key)
}

func (c *lazyDeadline) Err() error {
	c.mu.Lock()
	inner, canceled := c.inner, c.canceled
	c.mu.Unlock()
	switch {
	case inner != nil:
		return inner.Err()
	case canceled:
		return context.Canceled
	}
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.d) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *lazyDeadline) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.canceled {
		return
	}
	c.canceled = true
	if c.stop != nil {
		c.stop()
	}
}
