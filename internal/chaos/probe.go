package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// The deposed-leader probe. The mount follows the leader, so the load and
// the history recorders hardly ever ask a deposed leader anything: when a
// write fails there the mount moves on, and every later operation goes to
// the new leader. The probe asks the deposed leader directly. Once the
// group has named a new leader, a file is created through the mount (so
// the new leader has committed it), and then the victim is asked, on a
// connection of its own made before the fault, to look the file up — while
// the fault lasts, and for a while after it is undone (a resumed SIGSTOP'ed
// leader still believes it leads until it hears of the new term; a request
// sent while it was stopped is the first thing it reads). A correct voter
// answers "not the leader" (or nothing); the file itself is a correct
// answer too; "no such file" is a stale read from a deposed leader's state.

// probeRoot is the root directory's inode number.
const probeRoot = 1

// Probe counts what a trial's deposed leader answered the probe.
type Probe struct {
	Asked    int `json:"asked"`
	Refused  int `json:"refused"`   // not the leader: correct
	Found    int `json:"found"`     // the new leader's file: correct
	NoAnswer int `json:"no_answer"` // timed out, unreachable
	// FirstNoAnswer: the first failure to get an answer.
	FirstNoAnswer string   `json:"first_no_answer,omitempty"`
	Stale         []string `json:"stale"`           // "no such file": stale reads
	Error         string   `json:"error,omitempty"` // the marker could not be created
}

// prober holds one connection per voter, to the voter alone.
type prober struct {
	c   *Cluster
	key []byte

	mu      sync.Mutex
	clients map[string]*transport.Client
}

func newProber(c *Cluster) (*prober, error) {
	b, err := os.ReadFile(c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	return &prober{c: c, key: bytes.TrimSpace(b), clients: map[string]*transport.Client{}}, nil
}

func (p *prober) client(addr string) *transport.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	cl := p.clients[addr]
	if cl == nil {
		cl = transport.NewClient(addr, transport.ClientConfig{Key: p.key, Conns: 1, DialTimeout: time.Second, NoLocal: true})
		p.clients[addr] = cl
	}
	return cl
}

// lookup asks voter addr for name in the root directory, from the client
// host (where its connection is dialed), within d.
func (p *prober) lookup(addr, name string, d time.Duration) error {
	var resp rpc.AttrResp
	return p.call(addr, rpc.MLookup, &rpc.LookupReq{Parent: probeRoot, Name: name}, &resp, d)
}

// record records one answer of victim to a lookup of name.
func (r *Probe) record(victim, name string, err error, at time.Duration) {
	r.Asked++
	switch {
	case err == nil:
		r.Found++
	case isAnswer(err, syscall.ENOTCONN):
		r.Refused++
	case isAnswer(err, syscall.ENOENT):
		r.Stale = append(r.Stale, fmt.Sprintf("%.1fs: deposed leader %s answered that %s does not exist after the new leader committed it", at.Seconds(), victim, name))
	default:
		r.NoAnswer++
		if r.FirstNoAnswer == "" {
			r.FirstNoAnswer = err.Error()
		}
	}
}

// isAnswer: err is the voter's answer (an rpc error it sent) with errno e,
// not the transport's failure to get one.
func isAnswer(err error, e syscall.Errno) bool {
	var re *rpc.Error
	return errors.As(err, &re) && re.Errno == e
}

// close ends the connections.
func (p *prober) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cl := range p.clients {
		cl.Close()
	}
}

// marker creates name in the mount's root (committed by whichever leader
// the mount reaches), bounded by d.
func (c *Cluster) marker(name string, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(c.Mount, name), nil, 0o644) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("create %s through the mount: no answer within %v", name, d)
	}
}

// probeDeposed runs the probe of a trial whose fault deposed victim and
// keeps it running: the marker, then lookups until the hold ends, undo,
// and lookups for a while after. A request is sent before undo so that a
// stopped process finds it waiting when it resumes.
func (p *prober) probeDeposed(n int, victim string, start time.Time, hold time.Duration, now func() time.Duration, undo func() error) (*Probe, error) {
	r := &Probe{}
	name := fmt.Sprintf("chaos-probe-%d", n)
	if err := p.c.marker(name, 30*time.Second); err != nil {
		r.Error = err.Error()
	}
	ask := func(d time.Duration) {
		err := p.lookup(victim, name, d)
		if r.Error == "" {
			r.record(victim, name, err, now())
		}
	}
	for time.Since(start) < hold {
		ask(500 * time.Millisecond)
		time.Sleep(100 * time.Millisecond)
	}
	queued := make(chan error, 1)
	go func() { queued <- p.lookup(victim, name, 5*time.Second) }()
	time.Sleep(50 * time.Millisecond) // let it be sent
	if err := undo(); err != nil {
		return r, err
	}
	if err := <-queued; r.Error == "" {
		r.record(victim, name, err, now())
	}
	for after := time.Now(); time.Since(after) < 2*time.Second; {
		ask(500 * time.Millisecond)
		time.Sleep(50 * time.Millisecond)
	}
	return r, nil
}
