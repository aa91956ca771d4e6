package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"syscall"
	"time"
)

// Fault is what one trial injects.
type Fault string

const (
	// KillLeader: kill -9 of the leader, restarted after the group serves again.
	KillLeader Fault = "kill-leader"
	// KillFollower: kill -9 of a follower.
	KillFollower Fault = "kill-follower"
	// StopLeader: SIGSTOP of the leader (a hung process whose sockets stay
	// open) for a while, then SIGCONT.
	StopLeader Fault = "stop-leader"
)

// Schedule says which faults to draw from.
type Schedule struct {
	Seed   uint64
	Faults []Fault
	// Gap between trials, drawn uniformly from [MinGap, MaxGap].
	MinGap, MaxGap time.Duration
	// Hold: how long a stopped leader stays stopped.
	Hold time.Duration
}

// Trial is one injected fault and what the load felt.
type Trial struct {
	N       int           `json:"n"`
	Fault   Fault         `json:"fault"`
	Victim  string        `json:"victim"`
	At      time.Duration `json:"-"`
	AtSec   float64       `json:"at_seconds"`
	Leader  string        `json:"new_leader"`
	Elected float64       `json:"new_leader_seconds"` // from the fault until status named another leader
	// StallSeconds: the longest operation of the load that was under way
	// at the fault or began before the trial ended.
	StallSeconds float64 `json:"stall_seconds"`
	Ops          int     `json:"ops"`
	Errors       int     `json:"errors"`
	end          time.Duration
}

// Report is the outcome of Run.
type Report struct {
	Seed        uint64   `json:"seed"`
	Trials      []Trial  `json:"trials"`
	MedianStall float64  `json:"median_stall_seconds"`
	MaxStall    float64  `json:"max_stall_seconds"`
	Ops         int      `json:"ops"`
	ErrorsSeen  []string `json:"errors"` // first few, "kind: error"
	ErrorCount  int      `json:"error_count"`
	Check       Check    `json:"check"`
	// Linearizable: every history segment checked linearizable and
	// exactly-once (nil: no histories recorded).
	Linearizable    *bool    `json:"linearizable,omitempty"`
	HistorySegments int      `json:"history_segments"`
	HistoryOps      int      `json:"history_ops"`
	HistoryFailures []string `json:"history_failures"`
}

// Run injects trials faults (or, with trials 0, until ctx ends) into c
// while l (and h, if not nil) run, then stops them and checks what they
// recorded. Progress goes to out.
func Run(ctx context.Context, c *Cluster, l *Load, h *Histories, s Schedule, trials int, out io.Writer) (*Report, error) {
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x5eed))
	if len(s.Faults) == 0 {
		s.Faults = []Fault{KillLeader}
	}
	if s.MaxGap < s.MinGap {
		s.MaxGap = s.MinGap
	}
	if s.Hold <= 0 {
		s.Hold = 3 * time.Second
	}
	rep := &Report{Seed: s.Seed}
	fmt.Fprintf(out, "chaos: seed %d (replay with --seed %d)\n", s.Seed, s.Seed)
	var runErr error
	for n := 1; trials == 0 || n <= trials; n++ {
		gap := s.MinGap + time.Duration(rng.Int64N(int64(s.MaxGap-s.MinGap)+1))
		select {
		case <-ctx.Done():
		case <-time.After(gap):
		}
		if ctx.Err() != nil {
			break
		}
		fault := s.Faults[rng.IntN(len(s.Faults))]
		// A trial runs to its end even when ctx ends meanwhile (its
		// waits are bounded): a voter is never left killed or stopped.
		t, err := c.inject(context.WithoutCancel(ctx), l, rng, n, fault, s.Hold)
		if err != nil {
			runErr = fmt.Errorf("trial %d (%s): %w", n, fault, err)
			break
		}
		rep.Trials = append(rep.Trials, *t)
		fmt.Fprintf(out, "chaos: trial %d: %s of %s at %.1fs; new leader %s after %.2fs\n", n, fault, t.Victim, t.AtSec, t.Leader, t.Elected)
	}
	// Let the last trial's operations finish before stopping the load.
	time.Sleep(time.Second)
	l.Stop()
	if h != nil {
		rep.HistorySegments, rep.HistoryOps, rep.HistoryFailures = h.Stop()
		lin := len(rep.HistoryFailures) == 0
		rep.Linearizable = &lin
		fmt.Fprintf(out, "chaos: %d history segments, %d operations checked: %s\n", rep.HistorySegments, rep.HistoryOps,
			map[bool]string{true: "linearizable, exactly-once", false: fmt.Sprintf("%d FAILED", len(rep.HistoryFailures))}[lin])
	}
	ops := l.Ops()
	rep.Ops = len(ops)
	for _, op := range ops {
		if op.Err != nil {
			rep.ErrorCount++
			if len(rep.ErrorsSeen) < 20 {
				rep.ErrorsSeen = append(rep.ErrorsSeen, fmt.Sprintf("%.1fs %s: %v", op.Start.Seconds(), op.Kind, op.Err))
			}
		}
	}
	for i := range rep.Trials {
		t := &rep.Trials[i]
		end := t.end
		if i+1 < len(rep.Trials) {
			end = min(end, rep.Trials[i+1].At)
		}
		for _, op := range ops {
			if op.End < t.At || op.Start > end {
				continue
			}
			t.Ops++
			if op.Err != nil {
				t.Errors++
			}
			t.StallSeconds = max(t.StallSeconds, (op.End - op.Start).Seconds())
		}
	}
	stalls := make([]float64, 0, len(rep.Trials))
	for _, t := range rep.Trials {
		stalls = append(stalls, t.StallSeconds)
		fmt.Fprintf(out, "chaos: trial %d: longest operation %.2fs over %d ops, %d errors\n", t.N, t.StallSeconds, t.Ops, t.Errors)
	}
	if len(stalls) > 0 {
		slices.Sort(stalls)
		rep.MedianStall = stalls[len(stalls)/2]
		if len(stalls)%2 == 0 {
			rep.MedianStall = (stalls[len(stalls)/2-1] + stalls[len(stalls)/2]) / 2
		}
		rep.MaxStall = stalls[len(stalls)-1]
	}
	chk, err := l.Verify()
	if err != nil {
		return rep, fmt.Errorf("verify: %w", err)
	}
	rep.Check = chk
	fmt.Fprintf(out, "chaos: %d trials, stall median %.2fs max %.2fs; %d ops, %d errors; %d files expected, %d lost, %d extra, %d ambiguous; %d records checked, %d bad\n",
		len(rep.Trials), rep.MedianStall, rep.MaxStall, rep.Ops, rep.ErrorCount, chk.Files, len(chk.Lost), len(chk.Extra), chk.Ambiguous, chk.Records, len(chk.Bad))
	return rep, runErr
}

// inject runs one trial: the fault, the wait for a leader, the repair.
func (c *Cluster) inject(ctx context.Context, l *Load, rng *rand.Rand, n int, fault Fault, hold time.Duration) (*Trial, error) {
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return nil, err
	}
	victim := leader
	if fault == KillFollower {
		var others []string
		for _, a := range c.MetaAddrs {
			if a != leader {
				others = append(others, a)
			}
		}
		if len(others) == 0 {
			return nil, fmt.Errorf("no follower to kill")
		}
		victim = others[rng.IntN(len(others))]
	}
	i := c.VoterIndex(victim)
	if i < 0 {
		return nil, fmt.Errorf("status names leader %q, not one of %v", victim, c.MetaAddrs)
	}
	t := &Trial{N: n, Fault: fault, Victim: victim, At: l.Now()}
	t.AtSec = t.At.Seconds()
	start := time.Now()
	sig := syscall.SIGKILL
	if fault == StopLeader {
		sig = syscall.SIGSTOP
	}
	if err := c.Signal(i, sig); err != nil {
		return nil, err
	}
	// Wait for the group to name a leader that is not the victim (for a
	// follower's death the leader stays).
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := c.Status(ctx)
		if err == nil && st.Meta.Leader != "" && (st.Meta.Leader != victim || fault == KillFollower) {
			t.Leader = st.Meta.Leader
			t.Elected = time.Since(start).Seconds()
			break
		}
		if time.Now().After(deadline) {
			return t, fmt.Errorf("no leader other than %s within 60s of the fault: %v", victim, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	switch fault {
	case StopLeader:
		if rest := hold - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
		if err := c.Signal(i, syscall.SIGCONT); err != nil {
			return t, err
		}
	default:
		if err := c.StartVoter(i); err != nil {
			return t, err
		}
	}
	if err := c.WaitCaughtUp(ctx, victim, 1000, 60*time.Second); err != nil {
		return t, err
	}
	t.end = l.Now()
	return t, nil
}
