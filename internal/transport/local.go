package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// In-process calls.
//
// `strata up` runs the metadata service, the storage servers and the client
// in one process. Sending their traffic through loopback TCP costs four
// system calls, two socket copies and two goroutine wake-ups per call, on a
// machine where the FUSE round trip already takes most of the CPU. So a
// Server registers itself under its listen address while it serves, and a
// Client whose peer address is registered in the same process calls the
// handler directly.
//
// Invariant: the semantics are the network path's. Requests and answers
// are still encoded and decoded (a handler never sees the caller's memory,
// a caller never sees the handler's — except for the two lent byte fields
// described below), the cluster key must match (TLS plays no part: nothing
// crosses a wire), requests over their method's limit fail alike, the
// handler runs in its own goroutine so the caller's deadline and
// cancellation still bound the wait — except for methods the server marked
// Inline (reads of its own memory or local store, done in microseconds),
// and for callers that bound their waiters' waits themselves (OnCaller),
// which run on the caller's goroutine — and a closed server is no longer
// registered, so calls fall back to dialling and fail as for a dead peer.
// Processes that host only one role (strata meta, strata store, strata
// mount) never take this path.
//
// Large requests (WriteReq) lend their data: the handler reads the caller's
// bytes in place during the call (handlers never keep request bytes after
// returning: on the network path the frame buffer is recycled then too).
// So a caller must not change or reuse a request's data until the call has
// returned. A handler reads lent bytes only between UseLent and DoneLent; a
// caller that gives up meanwhile waits for DoneLent before it returns (a
// wait as long as the handler's use: a write's pwrite), and once it gave
// up, UseLent refuses. So after any return, failed or not, the handler no
// longer reads the caller's bytes, and the caller may reuse them — as the
// FUSE layer does with its request buffers, which writes through (O_DIRECT,
// O_SYNC) lend, and the client with its write-behind buffers.
//
// Large answers (ReadResp) are not encoded into a fresh buffer: when the
// answer is an rpc.Tailer and the caller's resp copies out (ReadResp.Into), only
// the head is encoded and the caller copies the tail straight from the
// handler's buffer into its destination, and only then releases the
// handler's answer (Release). If the caller gives up first, the handler's
// goroutine releases it. So the caller still never aliases the handler's
// memory, and one copy and one allocation per MiB are saved. A caller that
// owns its destination outright (ReadResp.Direct) lets the handler read
// into it (LocalReadDest), which saves the remaining copy.

// LocalReadDest returns, inside the handler of an in-process read whose
// caller allowed it (ReadResp.Direct), the caller's destination buffer; the
// handler may place the answer's bytes there and answer Data aliasing it.
// Nil otherwise.
func LocalReadDest(ctx context.Context) []byte {
	b, _ := ctx.Value(readDestKey{}).([]byte)
	return b
}

type readDestKey struct{}

type lendKey struct{}

// lendGuard orders a handler's use of a request's lent bytes against its
// caller giving up (see UseLent).
type lendGuard struct {
	mu        sync.Mutex
	idle      *sync.Cond // signalled when using drops to 0
	using     int
	abandoned bool
}

// abandon marks the call given up, once no handler reads the lent bytes.
func (g *lendGuard) abandon() {
	g.mu.Lock()
	for g.using > 0 {
		g.idle.Wait()
	}
	g.abandoned = true
	g.mu.Unlock()
}

// UseLent reports whether a handler may read its request's lent bytes (an
// in-process caller's own memory: WriteReq.Data) now. If so, the caller
// cannot give up and reuse them until the handler calls DoneLent, which it
// must do once it no longer reads them, and before it returns. False once
// the caller gave up: the bytes may already serve another request, so the
// handler must not read them at all. Always true on the network path,
// where the bytes are the handler's own.
func UseLent(ctx context.Context) bool {
	g, _ := ctx.Value(lendKey{}).(*lendGuard)
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.abandoned {
		return false
	}
	g.using++
	return true
}

// DoneLent ends a use that UseLent allowed.
func DoneLent(ctx context.Context) {
	g, _ := ctx.Value(lendKey{}).(*lendGuard)
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.using--; g.using == 0 {
		g.idle.Broadcast()
	}
	g.mu.Unlock()
}

var localServers sync.Map // listen address (string) -> *Server

func registerLocal(addr string, s *Server) { localServers.Store(addr, s) }

func unregisterLocal(addr string, s *Server) { localServers.CompareAndDelete(addr, s) }

// ServedInProcess reports whether c's calls are served now by a server in
// this process (see Call): such a call cannot hang apart from its caller,
// and a read answer may be written straight into the caller's buffer
// (rpc.ReadResp.Direct).
func (c *Client) ServedInProcess() bool { return !c.cfg.NoLocal && lookupLocal(c.addr) != nil }

func lookupLocal(addr string) *Server {
	if v, ok := localServers.Load(addr); ok {
		return v.(*Server)
	}
	return nil
}

type localResult struct {
	body []byte
	tail []byte      // with a handed-over answer: its tail, in the handler's memory
	out  rpc.Message // handed-over answer, released by whoever consumes the result
	err  error
}

// release releases a handed-over answer.
func (r *localResult) release() {
	if r.out != nil {
		if rel, ok := r.out.(Releaser); ok {
			rel.Release()
		}
		r.out, r.tail = nil, nil
	}
}

// callLocal runs method m of s for the client c.
func (c *Client) callLocal(ctx context.Context, s *Server, deadline time.Time, m rpc.Method, req, resp rpc.Message) error {
	if !keysEqual(s.Key, c.cfg.Key) {
		return fmt.Errorf("connect %s: %w", c.addr, ErrAuth)
	}
	h, ok := s.handlers[m]
	if !ok {
		return &rpc.Error{Errno: syscall.ENOSYS, Msg: fmt.Sprintf("method %d not served here", m)}
	}
	t, isTailer := req.(rpc.Tailer)
	if !isTailer && (s.inline[m] || onCaller(ctx)) {
		return c.callInline(ctx, s, h, deadline, m, req, resp)
	}
	var e rpc.Enc
	var lentTail []byte
	var lent *lendGuard
	if isTailer {
		lentTail = t.EncodeHead(&e) // the write's data is lent, not copied
		if len(lentTail) > 0 {
			lent = &lendGuard{}
			lent.idle = sync.NewCond(&lent.mu)
		}
	} else {
		req.Encode(&e)
	}
	if err := checkRequestSize(m, len(e.B)+len(lentTail)); err != nil {
		return err
	}
	dec := rpc.NewDecTail(e.B, lentTail)
	// The handler's context carries the deadline. When the caller's ctx
	// already ends by then (the usual case: clients set one per call),
	// ctx serves as both the handler's bound and ours — no second timer.
	hctx := handlerCtx(ctx, lent, resp)
	var timeout <-chan time.Time
	if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadline(hctx, deadline)
		defer cancel()
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		timeout = timer.C
	}
	// handOver: the answer's tail may be passed to resp without encoding.
	td, handOver := tailDecoder(resp)
	var mu sync.Mutex // orders the hand-over against the caller giving up
	abandoned := false
	done := make(chan localResult, 1)
	run := func() {
		start := time.Now()
		out, err := h(hctx, dec)
		var r localResult
		if err != nil {
			en := rpc.ErrnoOf(err)
			if en == 0 {
				en = syscall.EIO
			}
			r.err = &rpc.Error{Errno: en, Msg: err.Error()}
		} else if out != nil {
			var oe rpc.Enc
			if t, ok := out.(rpc.Tailer); ok && handOver {
				r.tail = t.EncodeHead(&oe)
				r.out = out
			} else {
				out.Encode(&oe)
			}
			r.body = oe.B
		}
		if s.Observe != nil {
			s.Observe(m, time.Since(start), err)
		}
		if r.out == nil {
			if rel, ok := out.(Releaser); ok {
				rel.Release()
			}
		}
		mu.Lock()
		if abandoned {
			mu.Unlock()
			r.release()
			return
		}
		done <- r
		mu.Unlock()
	}
	goLocal(run)
	giveUp := func() {
		if lent != nil {
			lent.abandon() // waits while the handler reads our bytes
		}
		mu.Lock()
		abandoned = true
		mu.Unlock()
		select {
		case r := <-done: // sent before we gave up
			r.release()
		default:
		}
	}
	select {
	case r := <-done:
		defer r.release()
		if r.err != nil {
			return r.err
		}
		if resp == nil {
			return nil
		}
		d := rpc.NewDec(r.body)
		if r.out != nil {
			td.DecodeTail(d, r.tail)
		} else {
			resp.Decode(d)
		}
		if d.Err() != nil {
			return fmt.Errorf("response %d from %s: %w", m, c.addr, d.Err())
		}
		return nil
	case <-ctx.Done():
		giveUp()
		return fmt.Errorf("%w: call %d to %s: %v", ErrUnavailable, m, c.addr, ctx.Err())
	case <-timeout:
		giveUp()
		return fmt.Errorf("%w: call %d to %s timed out", ErrUnavailable, m, c.addr)
	}
}

// handlerCtx is the context of an in-process handler: the caller's, with
// the in-process peer, the lent request bytes' guard and the caller's read
// destination.
func handlerCtx(ctx context.Context, lent *lendGuard, resp rpc.Message) context.Context {
	hctx := context.WithValue(ctx, peerKey{}, inProcessPeer)
	if lent != nil {
		hctx = context.WithValue(hctx, lendKey{}, lent)
	}
	if dd, ok := resp.(rpc.DirectDecoder); ok {
		if b := dd.DirectDest(); b != nil {
			hctx = context.WithValue(hctx, readDestKey{}, b)
		}
	}
	return hctx
}

// tailDecoder returns resp as a TailDecoder when an in-process answer's
// tail may be handed to it without encoding (it copies out).
func tailDecoder(resp rpc.Message) (rpc.TailDecoder, bool) {
	td, ok := resp.(rpc.TailDecoder)
	if co, cok := resp.(rpc.CopyingDecoder); !ok || !cok || !co.CopiesOut() {
		return nil, false
	}
	return td, true
}

// OnCaller marks ctx as a caller's that may run an in-process handler
// on its own goroutine, as for an Inline method, whatever the method: a
// background goroutine (a client's read-ahead) whose waiters bound their
// own waits, so that nobody needs it to give up while a handler is stuck
// in a system call. It saves the hand-over to a worker and back.
func OnCaller(ctx context.Context) context.Context {
	return context.WithValue(ctx, onCallerKey{}, true)
}

type onCallerKey struct{}

func onCaller(ctx context.Context) bool {
	v, _ := ctx.Value(onCallerKey{}).(bool)
	return v
}

// inlineBufs recycles the request encodings of Inline calls: the handler
// has returned before the buffer goes back, and handlers keep no request
// bytes after returning.
var inlineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// callInline runs the handler of an Inline method (or any method, for a
// caller marked OnCaller) on the caller's goroutine (no goroutine
// hand-over, no channel, no result to hand over, since nobody can give up
// while it runs) and decodes its answer into resp. A handler that waits
// does so within its context, which ends by deadline.
func (c *Client) callInline(ctx context.Context, s *Server, h HandlerFunc, deadline time.Time, m rpc.Method, req, resp rpc.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: call %d to %s: %v", ErrUnavailable, m, c.addr, err)
	}
	bp := inlineBufs.Get().(*[]byte)
	e := rpc.Enc{B: (*bp)[:0]}
	defer func() {
		if cap(e.B) <= 64<<10 { // large ones are left to the collector
			*bp = e.B[:0]
			inlineBufs.Put(bp)
		}
	}()
	req.Encode(&e)
	if err := checkRequestSize(m, len(e.B)); err != nil {
		return err
	}
	dec := rpc.NewDec(e.B)
	hctx := handlerCtx(ctx, nil, resp)
	if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadline(hctx, deadline)
		defer cancel()
	}
	var start time.Time
	if s.Observe != nil {
		start = time.Now()
	}
	out, err := h(hctx, dec)
	if s.Observe != nil {
		s.Observe(m, time.Since(start), err)
	}
	if rel, ok := out.(Releaser); ok {
		defer rel.Release()
	}
	if err != nil {
		en := rpc.ErrnoOf(err)
		if en == 0 {
			en = syscall.EIO
		}
		return &rpc.Error{Errno: en, Msg: err.Error()}
	}
	if resp == nil {
		return nil
	}
	var oe rpc.Enc
	if t, ok := out.(rpc.Tailer); ok {
		if td, ok := tailDecoder(resp); ok {
			// A read's bytes go straight from the handler's buffer (or
			// the caller's own, ReadResp.Direct) into the destination.
			tail := t.EncodeHead(&oe)
			d := rpc.NewDec(oe.B)
			td.DecodeTail(d, tail)
			if d.Err() != nil {
				return fmt.Errorf("response %d from %s: %w", m, c.addr, d.Err())
			}
			return nil
		}
	}
	if out != nil {
		out.Encode(&oe)
	}
	d := rpc.NewDec(oe.B)
	resp.Decode(d)
	if d.Err() != nil {
		return fmt.Errorf("response %d from %s: %w", m, c.addr, d.Err())
	}
	return nil
}

// Handlers of in-process calls run on a pool of long-lived goroutines
// rather than one new goroutine per call: a handler's stack grows deep
// (pebble, raft), and a fresh goroutine grows it again by copying on every
// call — measured at 5% of the local cluster's CPU under a metadata load.
// Up to localWorkersMax workers wait for work; beyond that a call gets a
// goroutine of its own, as before.
const localWorkersMax = 64

var (
	localWork    = make(chan func())
	localWorkers atomic.Int32 // long-lived workers started so far
)

// Go runs f on one of the same pool's long-lived goroutines (or a goroutine
// of its own when none is idle and the pool is full): for callers that
// start short background work per request, such as the client's
// read-ahead, whose goroutines would otherwise grow a fresh stack each time.
func Go(f func()) { goLocal(f) }

func goLocal(f func()) {
	select {
	case localWork <- f: // an idle worker took it
		return
	default:
	}
	if localWorkers.Add(1) > localWorkersMax {
		localWorkers.Add(-1)
		go f()
		return
	}
	go func() {
		f()
		for f := range localWork {
			f()
		}
	}()
}

func keysEqual(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	var x byte
	for i := range a {
		x |= a[i] ^ b[i]
	}
	return x == 0
}
