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

	// The network faults need hosts (ClusterConfig.Hosts Netns).

	// PartitionLeader: the leader's host loses its link (both directions,
	// to the voters and to the stores and the mount) for a while.
	PartitionLeader Fault = "partition-leader"
	// OneWay: what the leader sends to the other voters is dropped, or
	// what they send to it (drawn), for a while; the stores and the mount
	// still reach every voter, the deposed leader included.
	OneWay Fault = "one-way"
	// LinkDown: a follower's host loses its link for a while.
	LinkDown Fault = "link-down"
	// Delay: what the leader's host sends waits Schedule.Delay more, for a
	// while (shaped links: ClusterConfig.Shaped).
	Delay Fault = "delay"
)

// Faults lists every fault, in the order of the help texts.
var Faults = []Fault{KillLeader, KillFollower, StopLeader, PartitionLeader, OneWay, LinkDown, Delay}

// OnNetwork reports whether f needs hosts in network namespaces.
func (f Fault) OnNetwork() bool {
	return f == PartitionLeader || f == OneWay || f == LinkDown || f == Delay
}

// onFollower: the victim is a follower, drawn at random.
func (f Fault) onFollower() bool { return f == KillFollower || f == LinkDown }

// deposes: after the fault the group must name a leader other than the
// victim (the others may not: the leader stays, or may).
func (f Fault) deposes() bool {
	return f == KillLeader || f == StopLeader || f == PartitionLeader || f == OneWay
}

// Schedule says which faults to draw from.
type Schedule struct {
	Seed   uint64
	Faults []Fault
	// Gap between trials, drawn uniformly from [MinGap, MaxGap].
	MinGap, MaxGap time.Duration
	// Hold: how long a stopped leader stays stopped, a partition or a
	// link down lasts, a delay is on.
	Hold time.Duration
	// Delay: what the delay fault adds to the leader's packets.
	Delay time.Duration
}

// Trial is one injected fault and what the load felt.
type Trial struct {
	N       int           `json:"n"`
	Fault   Fault         `json:"fault"`
	Victim  string        `json:"victim"`
	Detail  string        `json:"detail,omitempty"` // one-way: which direction is dropped
	At      time.Duration `json:"-"`
	AtSec   float64       `json:"at_seconds"`
	Leader  string        `json:"new_leader"`
	Elected float64       `json:"new_leader_seconds"` // from the fault until status named another leader
	// StallSeconds: the longest operation of the load that was under way
	// at the fault or began before the trial ended.
	StallSeconds float64 `json:"stall_seconds"`
	Ops          int     `json:"ops"`
	Errors       int     `json:"errors"`
	// Probe: what the deposed leader answered lookups sent to it alone
	// (probe.go); nil for the faults that kill it or do not depose it.
	Probe *Probe `json:"probe,omitempty"`
	end   time.Duration
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
	// ByFault: the stall figures of each kind of fault injected.
	ByFault map[Fault]Stalls `json:"by_fault"`
	// StaleReads: answers of a deposed leader from its stale state, and
	// ProbeErrors: probes that could not run (their marker's create failed).
	StaleReads  []string `json:"stale_reads"`
	ProbeErrors []string `json:"probe_errors"`
}

// Stalls summarizes the trials of one kind of fault.
type Stalls struct {
	Trials      int     `json:"trials"`
	MedianStall float64 `json:"median_stall_seconds"`
	MaxStall    float64 `json:"max_stall_seconds"`
	// MedianElected: from the fault until status named the leader after it.
	MedianElected float64 `json:"median_new_leader_seconds"`
}

// median of xs (sorted in place); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 0 {
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return xs[len(xs)/2]
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
	if s.Delay <= 0 {
		s.Delay = 300 * time.Millisecond
	}
	for _, f := range s.Faults {
		if f.OnNetwork() && c.hosts == nil {
			return nil, fmt.Errorf("fault %s needs hosts in network namespaces (--hosts %s)", f, Netns)
		}
	}
	rep := &Report{Seed: s.Seed, StaleReads: []string{}, ProbeErrors: []string{}}
	p, err := newProber(c)
	if err != nil {
		return nil, err
	}
	defer p.close()
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
		t, err := c.inject(context.WithoutCancel(ctx), l, p, rng, n, fault, s)
		if err != nil {
			runErr = fmt.Errorf("trial %d (%s): %w", n, fault, err)
			break
		}
		rep.Trials = append(rep.Trials, *t)
		fmt.Fprintf(out, "chaos: trial %d: %s%s of %s at %.1fs; leader %s after %.2fs\n", n, fault, detail(t.Detail), t.Victim, t.AtSec, t.Leader, t.Elected)
		if t.Probe != nil {
			rep.StaleReads = append(rep.StaleReads, t.Probe.Stale...)
			if t.Probe.Error != "" {
				rep.ProbeErrors = append(rep.ProbeErrors, fmt.Sprintf("trial %d: %s", n, t.Probe.Error))
			}
			fmt.Fprintf(out, "chaos: trial %d: probe of the deposed leader: %d asked, %d refused, %d found, %d unanswered, %d stale\n",
				n, t.Probe.Asked, t.Probe.Refused, t.Probe.Found, t.Probe.NoAnswer, len(t.Probe.Stale))
		}
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
	kinds := map[Fault][2][]float64{} // stalls, elected
	for _, t := range rep.Trials {
		stalls = append(stalls, t.StallSeconds)
		k := kinds[t.Fault]
		kinds[t.Fault] = [2][]float64{append(k[0], t.StallSeconds), append(k[1], t.Elected)}
		fmt.Fprintf(out, "chaos: trial %d (%s%s): longest operation %.2fs over %d ops, %d errors\n", t.N, t.Fault, detail(t.Detail), t.StallSeconds, t.Ops, t.Errors)
	}
	if len(stalls) > 0 {
		rep.MedianStall = median(stalls)
		rep.MaxStall = stalls[len(stalls)-1] // sorted by median
	}
	rep.ByFault = map[Fault]Stalls{}
	for _, f := range Faults {
		k, ok := kinds[f]
		if !ok {
			continue
		}
		st := Stalls{Trials: len(k[0]), MedianStall: median(k[0]), MedianElected: median(k[1])}
		st.MaxStall = k[0][len(k[0])-1] // sorted by median
		rep.ByFault[f] = st
		fmt.Fprintf(out, "chaos: %s: %d trials, stall median %.2fs max %.2fs, leader named after %.2fs (median)\n", f, st.Trials, st.MedianStall, st.MaxStall, st.MedianElected)
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

// detail formats a trial's detail for the progress lines.
func detail(d string) string {
	if d == "" {
		return ""
	}
	return " (" + d + ")"
}

// inject runs one trial: the fault, the wait for a leader, the repair.
func (c *Cluster) inject(ctx context.Context, l *Load, p *prober, rng *rand.Rand, n int, fault Fault, s Schedule) (*Trial, error) {
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return nil, err
	}
	victim := leader
	if fault.onFollower() {
		var others []string
		for _, a := range c.MetaAddrs {
			if a != leader {
				others = append(others, a)
			}
		}
		if len(others) == 0 {
			return nil, fmt.Errorf("no follower for %s", fault)
		}
		victim = others[rng.IntN(len(others))]
	}
	i := c.VoterIndex(victim)
	if i < 0 {
		return nil, fmt.Errorf("status names leader %q, not one of %v", victim, c.MetaAddrs)
	}
	// The probe (probe.go) for the faults that depose a leader that keeps
	// running, and for a delay, which may depose it (if not, the victim
	// answers with the file: as correct as a refusal).
	probing := fault.deposes() && fault != KillLeader || fault == Delay
	if probing {
		p.lookup(victim, "chaos-probe-warm", 2*time.Second) // its connection, made before the fault
	}
	t := &Trial{N: n, Fault: fault, Victim: victim, At: l.Now()}
	t.AtSec = t.At.Seconds()
	start := time.Now()
	// The fault, and what undoes it after the hold (nil: restart the
	// voter it killed).
	var undo func() error
	switch fault {
	case KillLeader, KillFollower:
		err = c.Signal(i, syscall.SIGKILL)
	case StopLeader:
		err = c.Signal(i, syscall.SIGSTOP)
		undo = func() error { return c.Signal(i, syscall.SIGCONT) }
	case PartitionLeader, LinkDown:
		err = c.hosts.partition(i, true)
		undo = func() error { return c.hosts.partition(i, false) }
	case OneWay:
		out := rng.IntN(2) == 0
		t.Detail = map[bool]string{true: "leader→voters dropped", false: "voters→leader dropped"}[out]
		err = c.hosts.oneWay(i, out)
		undo = c.hosts.net.Heal
	case Delay:
		t.Detail = fmt.Sprintf("+%v", s.Delay)
		err = c.hosts.voters[i].Delay(s.Delay)
		undo = c.hosts.net.Heal
	default:
		err = fmt.Errorf("unknown fault %q", fault)
	}
	if err != nil {
		if undo != nil {
			undo()
		}
		return nil, err
	}
	// Wait for the group to name a leader: for the faults that depose the
	// leader, one that is not the victim.
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := c.Status(ctx)
		if err == nil && st.Meta.Leader != "" && (st.Meta.Leader != victim || !fault.deposes()) {
			t.Leader = st.Meta.Leader
			t.Elected = time.Since(start).Seconds()
			break
		}
		if time.Now().After(deadline) {
			if undo != nil {
				undo()
			}
			return t, fmt.Errorf("no leader other than %s within 60s of the fault: %v", victim, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if probing {
		if t.Probe, err = p.probeDeposed(n, victim, start, s.Hold, l.Now, undo); err != nil {
			return t, err
		}
	} else if undo != nil {
		if rest := s.Hold - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
		if err := undo(); err != nil {
			return t, err
		}
	} else if err := c.StartVoter(i); err != nil {
		return t, err
	}
	if err := c.WaitCaughtUp(ctx, victim, 1000, 60*time.Second); err != nil {
		return t, err
	}
	t.end = l.Now()
	return t, nil
}
