package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The lazy deadline context behaves as context.WithDeadline's: its
// deadline, Err before and after it, Done closing at it (also when first
// asked after it), a parent's cancellation, cancel, and contexts derived
// from it ending with it.
func TestWithDeadline(t *testing.T) {
	start := time.Now()
	ctx, cancel := withDeadline(context.Background(), start.Add(50*time.Millisecond))
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(start.Add(50*time.Millisecond)) {
		t.Fatalf("deadline %v %v", d, ok)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("err before the deadline: %v", err)
	}
	child, cc := context.WithCancel(ctx)
	defer cc()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a derived context did not end at the deadline")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("errs after the deadline: %v, %v", ctx.Err(), child.Err())
	}

	past, cancel2 := withDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Fatalf("err of a passed deadline: %v", past.Err())
	}
	select {
	case <-past.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done of a passed deadline is not closed")
	}

	parent, pcancel := context.WithCancel(context.Background())
	c3, cancel3 := withDeadline(parent, time.Now().Add(time.Hour))
	defer cancel3()
	pcancel()
	if !errors.Is(c3.Err(), context.Canceled) {
		t.Fatalf("err after the parent's cancel: %v", c3.Err())
	}
	select {
	case <-c3.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done after the parent's cancel is not closed")
	}

	c4, cancel4 := withDeadline(context.Background(), time.Now().Add(time.Hour))
	cancel4()
	if !errors.Is(c4.Err(), context.Canceled) {
		t.Fatalf("err after cancel: %v", c4.Err())
	}
	select {
	case <-c4.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done after cancel is not closed")
	}

	// A parent that ends first is used as it is.
	c5, cancel5 := withDeadline(ctx, time.Now().Add(time.Hour))
	defer cancel5()
	if c5 != ctx {
		t.Fatal("a parent ending before the deadline was wrapped")
	}
}
