package meta

import (
	"context"
	"errors"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/rpc"
)

func lockErrno(err error) syscall.Errno {
	var re *rpc.Error
	if errors.As(err, &re) {
		return re.Errno
	}
	return 0
}

// returns waits up to 60 s of real time for the answer of a call under
// test that should come without the fake clock moving (or, answers, on a
// failing disk): the test fails rather than hangs.
func returns(t *testing.T, what string, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: no answer after 60 s", what)
		return nil
	}
}

// TestLockGrace: after startGrace only reclaims and unlocks pass until
// every earlier session has reported the new epoch (or the time is up);
// a client that has not reclaimed is told so at once (EBUSY), others wait
// (lockWait, on a fake clock).
func TestLockGrace(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Now())
	tb := newLockTable(slog.Default(), fc)
	old := tb.epoch()
	tb.startGrace([]uint64{1, 2}, time.Hour)
	epoch := tb.epoch()
	if epoch == old || epoch == 0 {
		t.Fatalf("epoch %d after grace start, was %d", epoch, old)
	}
	w := func(client uint64, start, end uint64) *rpc.LockReq {
		return &rpc.LockReq{ClientID: client, Ino: 5, Owner: 1, Start: start, End: end, Type: rpc.LockWrite, Pid: uint32(client)}
	}

	// Client 1 has not reclaimed: a new lock is refused at once (the
	// clock stands still: a wait would never end).
	done := make(chan error, 1)
	go func() {
		_, err := tb.set(ctx, w(1, 100, 199))
		done <- err
	}()
	if err := returns(t, "new lock of a pending client", done); lockErrno(err) != syscall.EBUSY {
		t.Fatalf("new lock of a pending client in grace: %v, want EBUSY", err)
	}
	// Its reclaim passes, and a conflicting reclaim of client 2 is refused.
	rc := w(1, 0, 9)
	rc.Reclaim = true
	if e, err := tb.set(ctx, rc); err != nil || e != epoch {
		t.Fatalf("reclaim: epoch %d err %v, want epoch %d", e, err, epoch)
	}
	rc2 := w(2, 5, 5)
	rc2.Reclaim = true
	if _, err := tb.set(ctx, rc2); lockErrno(err) != syscall.EAGAIN {
		t.Fatalf("conflicting reclaim: %v, want EAGAIN", err)
	}
	// Unlocks pass during grace.
	un := w(2, 0, 1000)
	un.Type = rpc.LockUnlock
	if _, err := tb.set(ctx, un); err != nil {
		t.Fatalf("unlock in grace: %v", err)
	}
	// Client 3 (not pending) waits; a report with a stale epoch ends nothing.
	// The grace period's own timer (an hour) is pending; the waiter adds
	// its grace wait's.
	go func() {
		_, err := tb.set(ctx, w(3, 5, 5))
		done <- err
	}()
	if !fc.WaitPending(2, 10*time.Second) {
		t.Fatalf("the waiter never waited on the clock (%d timers pending)", fc.Pending())
	}
	tb.reclaimed(1, epoch)
	tb.reclaimed(2, old)
	fc.Advance(lockWait - time.Millisecond)
	if n := fc.Pending(); n != 2 {
		t.Fatalf("%d timers pending just before the end of the wait, want 2 (the waiter's fired early?)", n)
	}
	select {
	case err := <-done:
		t.Fatalf("new lock in grace answered %v before its wait was over", err)
	default:
	}
	fc.Advance(time.Millisecond)
	if err := returns(t, "new lock in grace after lockWait", done); lockErrno(err) != syscall.EBUSY {
		t.Fatalf("new lock while client 2 has not reported: %v, want EBUSY after waiting", err)
	}
	go func() {
		_, err := tb.set(ctx, w(3, 5, 5))
		done <- err
	}()
	if !fc.WaitPending(2, 10*time.Second) {
		t.Fatalf("the waiter never waited on the clock (%d timers pending)", fc.Pending())
	}
	tb.reclaimed(2, epoch) // the last one: grace over, the waiter goes on
	if err := returns(t, "the waiter after the end of grace", done); lockErrno(err) != syscall.EAGAIN {
		t.Fatalf("lock conflicting with a reclaimed one after grace: %v, want EAGAIN", err)
	}
	if _, err := tb.set(ctx, w(3, 10, 20)); err != nil {
		t.Fatalf("free range after grace: %v", err)
	}
	r, err := tb.get(ctx, w(3, 0, 100))
	if err != nil || r.Type != rpc.LockWrite || r.Start != 0 || r.End != 9 || r.Pid != 1 {
		t.Fatalf("getlk after grace: %+v %v, want client 1's reclaimed lock 0..9", r, err)
	}
}

// TestLockGraceEnds: the grace period ends when its time is up even if a
// client never reports, and when the last pending session goes away.
func TestLockGraceEnds(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Now())
	tb := newLockTable(slog.Default(), fc)
	tb.startGrace([]uint64{1}, 100*time.Millisecond)
	req := &rpc.LockReq{ClientID: 2, Ino: 1, Owner: 1, End: 10, Type: rpc.LockRead}
	done := make(chan error, 1)
	go func() {
		_, err := tb.set(ctx, req)
		done <- err
	}()
	if !fc.WaitPending(2, 10*time.Second) { // grace, grace wait
		t.Fatalf("the lock never waited for the grace period (%d timers pending)", fc.Pending())
	}
	fc.Advance(99 * time.Millisecond)
	if !tb.status(0).grace {
		t.Fatal("grace period over before its time")
	}
	fc.Advance(time.Millisecond)
	if tb.status(0).grace {
		t.Fatal("grace period still on when its time is up")
	}
	if err := returns(t, "lock waiting for the grace period", done); err != nil {
		t.Fatalf("lock after the grace time: %v", err)
	}
	tb.startGrace([]uint64{1}, time.Hour)
	go func() {
		_, err := tb.set(ctx, req)
		done <- err
	}()
	if !fc.WaitPending(2, 10*time.Second) {
		t.Fatalf("the lock never waited for the grace period (%d timers pending)", fc.Pending())
	}
	tb.releaseClient(1) // session expired
	if err := returns(t, "lock waiting for the grace period", done); err != nil {
		t.Fatalf("lock after the last pending session ended: %v", err)
	}
	// No sessions: no grace at all.
	tb.startGrace(nil, time.Hour)
	cctx, cancel := context.WithTimeout(ctx, lockWait/4)
	defer cancel()
	if _, err := tb.get(cctx, req); err != nil {
		t.Fatalf("getlk with no sessions to wait for: %v", err)
	}
}

// TestLockCloseHandle: closing an open drops the locks taken through it
// and nothing else — not what the same owner (the kernel reuses owner
// names) took through a newer open — and wakes waiters.
func TestLockCloseHandle(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Now()) // for WaitPending: no wait ends on time
	tb := newLockTable(slog.Default(), fc)
	req := func(client, owner, handle uint64, typ uint32, flock bool) *rpc.LockReq {
		return &rpc.LockReq{ClientID: client, Ino: 5, Owner: owner, Start: 0, End: ^uint64(0), Type: typ, Handle: handle, Flock: flock}
	}
	closeReq := func(client, handle uint64) *rpc.LockReq {
		return &rpc.LockReq{ClientID: client, Ino: 5, Type: rpc.LockUnlock, Handle: handle, CloseHandle: true}
	}
	for _, flock := range []bool{false, true} {
		// Owner 7 locks through open 1, then (a new open that got the
		// same owner name) through open 2 before open 1's close arrives.
		if _, err := tb.set(ctx, req(1, 7, 1, rpc.LockWrite, flock)); err != nil {
			t.Fatal(err)
		}
		if _, err := tb.set(ctx, req(1, 7, 2, rpc.LockWrite, flock)); err != nil {
			t.Fatalf("flock %v: same owner through a newer open: %v", flock, err)
		}
		if _, err := tb.set(ctx, closeReq(1, 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := tb.set(ctx, req(2, 7, 1, rpc.LockWrite, flock)); lockErrno(err) != syscall.EAGAIN {
			t.Fatalf("flock %v: after the close of the old open, another client's lock: %v, want EAGAIN", flock, err)
		}
		// Closing another client's open of the same number changes nothing.
		if _, err := tb.set(ctx, closeReq(2, 2)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		wait := req(2, 7, 1, rpc.LockWrite, flock)
		wait.Wait = true
		go func() {
			_, err := tb.set(ctx, wait)
			done <- err
		}()
		if !fc.WaitPending(1, 10*time.Second) { // the waiter waits on a conflict
			t.Fatalf("flock %v: the waiter never waited", flock)
		}
		if _, err := tb.set(ctx, closeReq(1, 2)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("flock %v: waiter after the close of the open holding the lock: %v", flock, err)
			}
		case <-time.After(lockWait / 2):
			t.Fatalf("flock %v: closing the open did not wake the waiter", flock)
		}
		if _, err := tb.set(ctx, closeReq(2, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if st := tb.status(10); st.total != 0 {
		t.Fatalf("locks left: %+v", st.locks)
	}
	if _, err := tb.set(ctx, &rpc.LockReq{ClientID: 1, Ino: 5, Type: rpc.LockUnlock, CloseHandle: true}); lockErrno(err) != syscall.EINVAL {
		t.Fatalf("closing handle 0: %v, want EINVAL", err)
	}
}

// TestLockResetAnswersNotLeader: requests waiting when this node stops
// leading (reset) — on a conflicting lock, or for the grace period — are
// answered "not the leader" (ENOTCONN), never granted from the emptied
// table; so are requests until the next term of office (startGrace), and a
// waiter whose leadership check fails is not granted either.
func TestLockResetAnswersNotLeader(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Now())
	tb := newLockTable(slog.Default(), fc)
	w := func(client uint64, wait bool) *rpc.LockReq {
		return &rpc.LockReq{ClientID: client, Ino: 7, Owner: 1, Start: 0, End: 99, Type: rpc.LockWrite, Pid: uint32(client), Wait: wait}
	}
	if _, err := tb.set(ctx, w(1, false)); err != nil {
		t.Fatal(err)
	}
	conflict := make(chan error, 1)
	go func() {
		_, err := tb.set(ctx, w(2, true)) // waits on client 1's lock
		conflict <- err
	}()
	if !fc.WaitPending(1, 10*time.Second) {
		t.Fatal("the conflicting request never waited")
	}
	tb.reset()
	if err := returns(t, "a waiter when leadership is lost", conflict); lockErrno(err) != syscall.ENOTCONN {
		t.Fatalf("waiter on a conflict after reset: %v, want ENOTCONN (not the leader)", err)
	}
	if _, err := tb.set(ctx, w(3, false)); lockErrno(err) != syscall.ENOTCONN {
		t.Fatalf("new lock on a deposed node: %v, want ENOTCONN", err)
	}
	if _, err := tb.get(ctx, w(3, false)); lockErrno(err) != syscall.ENOTCONN {
		t.Fatalf("getlk on a deposed node: %v, want ENOTCONN", err)
	}

	// The next term: a grace period for session 1; session 2 waits for it.
	tb.startGrace([]uint64{1}, time.Hour)
	grace := make(chan error, 1)
	go func() {
		_, err := tb.set(ctx, w(2, true))
		grace <- err
	}()
	if !fc.WaitPending(2, 10*time.Second) {
		t.Fatal("the request never waited for the grace period")
	}
	tb.reset()
	if err := returns(t, "a grace waiter when leadership is lost", grace); lockErrno(err) != syscall.ENOTCONN {
		t.Fatalf("grace waiter after reset: %v, want ENOTCONN", err)
	}

	// A term without grace; a waiter whose leadership check fails when
	// the conflict goes is not granted.
	tb.startGrace(nil, 0)
	if _, err := tb.set(ctx, w(1, false)); err != nil {
		t.Fatalf("lock in the new term: %v", err)
	}
	tb.verify = func() error { return errors.New("lease lost") }
	pending := fc.Pending() // the second grace period's timer is still there
	go func() {
		_, err := tb.set(ctx, w(2, true))
		conflict <- err
	}()
	if !fc.WaitPending(pending+1, 10*time.Second) {
		t.Fatal("the conflicting request never waited")
	}
	un := w(1, false)
	un.Type = rpc.LockUnlock
	if _, err := tb.set(ctx, un); err != nil {
		t.Fatal(err)
	}
	if err := returns(t, "a waiter whose leadership check fails", conflict); lockErrno(err) != syscall.ENOTCONN {
		t.Fatalf("waiter after a failed leadership check: %v, want ENOTCONN", err)
	}
}
