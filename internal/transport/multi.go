package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Caller is what Client and Multi have in common: a call to a service.
type Caller interface {
	Call(ctx context.Context, m rpc.Method, req, resp rpc.Message) error
}

var (
	_ Caller = (*Client)(nil)
	_ Caller = (*Multi)(nil)
)

// MultiConfig tunes a Multi.
type MultiConfig struct {
	ClientConfig // of the Client of each address
	// AttemptTimeout bounds one attempt at one address while the list
	// holds more than one, so that a voter that hangs with its sockets
	// open (SIGSTOP, a stalled disk) does not hold the call until its
	// deadline: the same request then goes to the next address. It must
	// exceed the longest a leader takes to answer (a lock wait, a log
	// sync). 0: no bound of its own.
	AttemptTimeout time.Duration
	// OnLeaderChange, when set, is called once calls are answered by
	// another address than before (not for the first answer): a leader
	// change the caller may want to act on (renew a session at once).
	// It runs on the calling goroutine and must not block.
	OnLeaderChange func(old, cur string)
}

// Backoff between rounds in which every address of a Multi failed: short,
// since a leader election takes about a second.
const (
	multiBackoffMin = 20 * time.Millisecond
	multiBackoffMax = 500 * time.Millisecond
)

// maxLearnedAddrs bounds the addresses a Multi adds to its list from
// leader hints.
const maxLearnedAddrs = 16

// Multi calls a service replicated over several addresses of which one
// leads — the metadata service's voters — with Client's Call signature.
// It sends each call to the address it takes for the leader and, when the
// answer is not a final one, sends the SAME request again elsewhere until
// it is answered or the call's deadline (the context's, else CallTimeout)
// passes:
//
//   - ENOTCONN naming the leader (rpc.NotLeader, rpc.LeaderHint): to that
//     address, also one outside the list (the group's membership changed;
//     logged once, then kept in the list);
//   - ENOTCONN without a hint (no leader elected yet), transport trouble
//     (ErrUnavailable: the voter is down, or did not answer within
//     AttemptTimeout), or a failed handshake (ErrAuth: not a voter of this
//     cluster): to the next address of the list — unless every address
//     refused the key, which is final;
//   - after every address failed in a round: a short backoff (20 ms,
//     doubling up to 500 ms), then the address taken for the leader again.
//
// Any other answer, success or errno, is final, and its address is taken
// for the leader from then on (by every caller sharing the Multi). The
// request object is sent unchanged every time: a mutating request repeated
// with its ReqHeader (client id, sequence) is applied once, by the
// replicated duplicate-request table. A call that runs out of time fails
// with the last error (ErrUnavailable or ENOTCONN stay testable with
// errors.Is), wrapped in a text naming every address tried and why it
// failed. Safe for concurrent use.
type Multi struct {
	cfg MultiConfig

	mu struct {
		sync.Mutex
		addrs   []string // the list given, then addresses learned from hints
		given   int      // len of the list given
		leader  string   // where the next call goes first
		served  string   // the address that answered last ("" before any)
		clients map[string]*Client
		closed  bool
	}
}

// NewMulti returns a caller of the service at addrs (at least one; see
// CheckAddrs), which dials lazily; the first address is tried first.
func NewMulti(addrs []string, cfg MultiConfig) *Multi {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	m := &Multi{cfg: cfg}
	m.mu.addrs = slices.Clone(addrs)
	m.mu.given = len(addrs)
	if len(addrs) > 0 {
		m.mu.leader = addrs[0]
	}
	m.mu.clients = map[string]*Client{}
	return m
}

// Addr is the address calls go to first: the one that answered last, or
// the one a hint named since.
func (m *Multi) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.leader
}

// Addrs is the list: the addresses given, then those learned from hints.
func (m *Multi) Addrs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.mu.addrs)
}

// String is the list as `--meta` takes it.
func (m *Multi) String() string { return strings.Join(m.Addrs(), ",") }

// Close closes the connections to every address; calls in flight fail.
func (m *Multi) Close() error {
	m.mu.Lock()
	m.mu.closed = true
	cs := m.mu.clients
	m.mu.clients = map[string]*Client{}
	m.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return nil
}

// errMultiClosed fails the calls on a closed Multi, at once.
var errMultiClosed = fmt.Errorf("%w: closed", ErrUnavailable)

// Retryable reports whether err leaves a call to a replicated service
// unanswered, so that the same request may go again, to the same address
// or another: transport trouble, or ENOTCONN (not the leader).
func Retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, syscall.ENOTCONN)
}

// Call sends req to the leader, following hints and trying the list until
// the call is answered or its deadline passes (see Multi).
func (m *Multi) Call(ctx context.Context, method rpc.Method, req, resp rpc.Message) error {
	start := time.Now()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.CallTimeout)
		defer cancel()
	}
	var tried attempts
	failed := map[string]bool{} // in this round
	backoff := multiBackoffMin
	addr := m.Addr()
	authOnly := true // every failure of this round was ErrAuth
	for {
		err := m.attempt(ctx, addr, method, req, resp)
		if err == errMultiClosed {
			return err
		}
		auth := errors.Is(err, ErrAuth)
		if err == nil || !Retryable(err) && !auth {
			m.answered(addr)
			return err
		}
		authOnly = authOnly && auth
		tried.note(addr, err)
		failed[addr] = true
		// Where to go next, also when giving up: the leader guess moves
		// on from addr for the next call.
		next, ok := rpc.LeaderHint(err), true
		if next != "" && !failed[next] {
			m.follow(addr, next)
		} else {
			next, ok = m.next(addr, failed)
		}
		if ctx.Err() != nil {
			return tried.giveUp(method, time.Since(start), err)
		}
		if ok {
			addr = next
			continue
		}
		// Every address failed in this round. If each refused the key,
		// that will not pass; else wait a little, then start a new round
		// where the leader is thought to be.
		if authOnly {
			return tried.giveUp(method, time.Since(start), err)
		}
		authOnly = true
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return tried.giveUp(method, time.Since(start), err)
		}
		backoff = min(2*backoff, multiBackoffMax)
		clear(failed)
		addr = m.Addr()
	}
}

// attempt makes one call at addr, bounded by AttemptTimeout while there
// is another address to try.
func (m *Multi) attempt(ctx context.Context, addr string, method rpc.Method, req, resp rpc.Message) error {
	c, n := m.client(addr)
	if c == nil {
		return errMultiClosed
	}
	if n > 1 && m.cfg.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.AttemptTimeout)
		defer cancel()
	}
	return c.Call(ctx, method, req, resp)
}

// client returns the Client of addr (nil once closed) and the length of
// the list.
func (m *Multi) client(addr string) (*Client, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.closed {
		return nil, len(m.mu.addrs)
	}
	c := m.mu.clients[addr]
	if c == nil {
		c = NewClient(addr, m.cfg.ClientConfig)
		m.mu.clients[addr] = c
	}
	return c, len(m.mu.addrs)
}

// answered takes addr, which gave a final answer, for the leader.
func (m *Multi) answered(addr string) {
	m.mu.Lock()
	old := m.mu.served
	m.mu.leader, m.mu.served = addr, addr
	m.mu.Unlock()
	if old != "" && old != addr {
		log.Info("metadata calls answered by another voter", "old", old, "leader", addr)
		if m.cfg.OnLeaderChange != nil {
			m.cfg.OnLeaderChange(old, addr)
		}
	}
}

// follow takes hint, named by from as the leader, for the leader unless
// another caller already moved on from from. A hint outside the list is
// added to it.
func (m *Multi) follow(from, hint string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.mu.addrs, hint) {
		if len(m.mu.addrs) >= m.mu.given+maxLearnedAddrs {
			// Keep the list bounded: drop the oldest learned address.
			m.mu.addrs = slices.Delete(m.mu.addrs, m.mu.given, m.mu.given+1)
		}
		m.mu.addrs = append(m.mu.addrs, hint)
		log.Warn("metadata voter names a leader outside the list given; following it (the group's membership changed?)",
			"voter", from, "leader", hint, "list", strings.Join(m.mu.addrs[:m.mu.given], ","))
	}
	if m.mu.leader == from {
		m.mu.leader = hint
	}
}

// next returns the address after addr in the list that has not failed in
// this round, and moves the leader guess there if it was addr.
func (m *Multi) next(addr string, failed map[string]bool) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.mu.addrs)
	i := slices.Index(m.mu.addrs, addr) // -1 for an address dropped meanwhile: start at the first
	for k := 1; k <= n; k++ {
		a := m.mu.addrs[(i+k+n)%n]
		if !failed[a] {
			if m.mu.leader == addr {
				m.mu.leader = a
			}
			return a, true
		}
	}
	return "", false
}

// attempts records the failures of one call, per address in order of
// first failure, for the message of a call that runs out of time.
type attempts struct {
	order []string
	last  map[string]error
	n     int
}

func (a *attempts) note(addr string, err error) {
	if a.last == nil {
		a.last = map[string]error{}
	}
	if _, ok := a.last[addr]; !ok {
		a.order = append(a.order, addr)
	}
	a.last[addr] = err
	a.n++
}

// giveUp is the error of a call that ran out of time; last is its last
// attempt's error, which it wraps.
func (a *attempts) giveUp(method rpc.Method, took time.Duration, last error) error {
	var b strings.Builder
	for i, addr := range a.order {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %v", addr, a.last[addr])
	}
	return fmt.Errorf("method %d: no metadata voter answered as leader in %v (%d attempts; tried %s): %w",
		method, took.Round(time.Millisecond), a.n, b.String(), last)
}
