package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
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

// Faults lists every fault, in the order of the help texts: the voters'
// (trials.go), then the mirrored cluster's and the power loss
// (mirrorfaults.go), then the lock client's (lockfault.go).
var Faults = []Fault{KillLeader, KillFollower, StopLeader, PartitionLeader, OneWay, LinkDown, Delay,
	KillPrimary, KillSecondary, StopPrimary, PartitionPrimary, LinkDownStore, DiskEIOPrimary, DiskFullSecondary,
	KillPrimaryLeader, DiskSlowPrimary, HeartbeatLossPrimary, KillAll, KillLockClient}

// OnNetwork reports whether f needs hosts in network namespaces.
func (f Fault) OnNetwork() bool {
	return f == PartitionLeader || f == OneWay || f == LinkDown || f == Delay || f == PartitionPrimary || f == LinkDownStore
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
	// Delay: what the delay fault adds to the leader's packets, and
	// disk-slow-primary to every data operation of the target.
	Delay time.Duration
	// StoreHold: how long a store stays stopped, cut off or on a failing
	// disk (default 6 s: longer than the default failover timeout, 3 s).
	StoreHold time.Duration
	// ResyncBound: how long a mirror trial waits for every group to be in
	// sync again (default 180 s).
	ResyncBound time.Duration
	// SessionLease: the voters' client session lease (default 15 s, the
	// metadata service's): kill-lock-client's bound is this + lockMargin.
	SessionLease time.Duration
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
	// at the fault or began before the trial ended (but the lockers' waits
	// for a lock, except in kill-lock-client trials: see LockStallSeconds).
	StallSeconds float64 `json:"stall_seconds"`
	// StallOp: which operation that was, and when it began.
	StallOp string `json:"stall_op,omitempty"`
	// OtherStallSeconds: the longest operation other than the lockers'
	// waits for a lock, which is what StallBar applies to; LockStallSeconds:
	// the longest of those waits (one going on into a later
	// kill-lock-client trial's hold counted until its holder started),
	// bounded by the session lease + lockMargin instead (a dead client's
	// locks, or a new leader's grace period for sessions that do not
	// reclaim, last up to a lease).
	OtherStallSeconds float64 `json:"other_stall_seconds"`
	LockStallSeconds  float64 `json:"lock_stall_seconds,omitempty"`
	Ops               int     `json:"ops"`
	Errors            int     `json:"errors"`
	// Probe: what the deposed leader answered lookups sent to it alone
	// (probe.go); nil for the faults that kill it or do not depose it.
	Probe *Probe `json:"probe,omitempty"`
	// Mirror faults (mirrorfaults.go): the group hit and its epoch before
	// the fault, its primary after it, from the fault until status named
	// another primary (the faults that depose one), and from the restart
	// or repair until every group was in sync again.
	Group         uint32  `json:"group,omitempty"`
	Epoch         uint64  `json:"epoch_before,omitempty"`
	NewPrimary    string  `json:"new_primary,omitempty"`
	SwitchSeconds float64 `json:"switch_seconds,omitempty"`
	ResyncSeconds float64 `json:"resync_seconds,omitempty"`
	// Fence: what the deposed primary answered writes sent to it alone in
	// its old epoch (fence.go: stop-primary, partition-primary,
	// heartbeat-loss-primary).
	Fence *Fence `json:"fence,omitempty"`
	// LockWaitSeconds (kill-lock-client): from the lock client's kill
	// until every locker held its lock again.
	LockWaitSeconds float64 `json:"lock_wait_seconds,omitempty"`
	// Problems: what went wrong in the trial without ending the run (no
	// switch, no resync within the bound, records bad after a power loss,
	// a dead client's locks not released within the bound).
	Problems []string `json:"problems,omitempty"`
	end      time.Duration
	holderAt time.Duration // kill-lock-client: when its holder started
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
	// SplitBrain: writes a deposed primary acknowledged in its old epoch
	// (the fence probe).
	SplitBrain []string `json:"split_brain"`
	// Totals: faults injected, trials whose stall reached StallBar (the
	// lockers' waits aside: their bound is the session lease, and a wait
	// beyond it is one of Problems), fsync'ed
	// records lost or not as written, reads of wrong bytes, the trials'
	// problems.
	FaultsInjected int      `json:"faults_injected"`
	StallsOverBar  int      `json:"stalls_over_bar"`
	LostRecords    int      `json:"lost_records"`
	CorruptReads   int      `json:"corrupt_reads"`
	Problems       []string `json:"problems"`
	// StuckThreads: threads of the chaos process (its load) or of its
	// children found in state D or waiting for a FUSE answer, without a
	// context switch, through a whole sampling window after a trial
	// (dstate.go).
	StuckThreads []string `json:"stuck_threads"`
	// MedianResync, MaxResync: the mirror trials' resync_seconds.
	MedianResync float64 `json:"median_resync_seconds"`
	MaxResync    float64 `json:"max_resync_seconds"`
}

// StallBar is issue 21's bound on a failover's longest pause.
const StallBar = 5 * time.Second

// Stalls summarizes the trials of one kind of fault.
type Stalls struct {
	Trials      int     `json:"trials"`
	MedianStall float64 `json:"median_stall_seconds"`
	MaxStall    float64 `json:"max_stall_seconds"`
	// MedianElected: from the fault until status named the leader after it.
	MedianElected float64 `json:"median_new_leader_seconds"`
	// MedianSwitch: from the fault until status named another primary;
	// MedianResync, MaxResync: until every group was in sync again.
	MedianSwitch float64 `json:"median_switch_seconds,omitempty"`
	MedianResync float64 `json:"median_resync_seconds,omitempty"`
	MaxResync    float64 `json:"max_resync_seconds,omitempty"`
	// MedianLockWait, MaxLockWait (kill-lock-client): from the kill until
	// the lockers held the dead client's locks.
	MedianLockWait float64 `json:"median_lock_wait_seconds,omitempty"`
	MaxLockWait    float64 `json:"max_lock_wait_seconds,omitempty"`
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
	if s.StoreHold <= 0 {
		s.StoreHold = 6 * time.Second
	}
	if s.ResyncBound <= 0 {
		s.ResyncBound = 180 * time.Second
	}
	if s.SessionLease <= 0 {
		s.SessionLease = 15 * time.Second
	}
	for _, f := range s.Faults {
		if f.OnNetwork() && c.hosts == nil {
			return nil, fmt.Errorf("fault %s needs hosts in network namespaces (--hosts %s)", f, Netns)
		}
		if f.Mirrored() && !c.cfg.Mirror {
			return nil, fmt.Errorf("fault %s needs a mirrored cluster (--mirror)", f)
		}
		if f.OnDisk() && c.disks == nil {
			return nil, fmt.Errorf("fault %s needs targets on fault file systems", f)
		}
		if f == KillLockClient && (!c.cfg.LockClient || len(l.lockers) == 0) {
			return nil, fmt.Errorf("fault %s needs a second mount (ClusterConfig.LockClient) and lockers in the load", f)
		}
	}
	rep := &Report{Seed: s.Seed, StaleReads: []string{}, ProbeErrors: []string{}, Problems: []string{}, SplitBrain: []string{}, StuckThreads: []string{}}
	p, err := newProber(c)
	if err != nil {
		return nil, err
	}
	defer p.close()
	fmt.Fprintf(out, "chaos: seed %d (replay with --seed %d)\n", s.Seed, s.Seed)
	var runErr error
	var checkStart time.Time // the last trial's check for hung threads
	for n := 1; trials == 0 || n <= trials; n++ {
		gap := s.MinGap + time.Duration(rng.Int64N(int64(s.MaxGap-s.MinGap)+1))
		if !checkStart.IsZero() {
			gap = max(gap-time.Since(checkStart), 0)
		}
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
		var t *Trial
		var err error
		switch {
		case fault == KillLockClient:
			t, err = c.injectLockClient(context.WithoutCancel(ctx), l, n, s)
		case fault.Mirrored() || fault == KillAll:
			t, err = c.injectMirror(context.WithoutCancel(ctx), l, h, p, rng, n, fault, s)
		default:
			t, err = c.inject(context.WithoutCancel(ctx), l, p, rng, n, fault, s)
		}
		if err != nil {
			runErr = fmt.Errorf("trial %d (%s): %w", n, fault, err)
			break
		}
		// No thread may be left hanging once the trial is over (sampled
		// through the next gap's load time).
		checkStart = time.Now()
		if stuck, err := stuckTasks("/proc", os.Getpid(), stuckSamples, stuckEvery); err != nil {
			t.Problems = append(t.Problems, fmt.Sprintf("sample threads for D state: %v", err))
		} else {
			for _, d := range stuck {
				if _, locker := l.lockerThreads.Load(d.tid); locker && d.pid == os.Getpid() {
					continue
				}
				rep.StuckThreads = append(rep.StuckThreads, fmt.Sprintf("trial %d (%s): %s", n, fault, d))
				t.Problems = append(t.Problems, d.String())
			}
		}
		rep.Trials = append(rep.Trials, *t)
		switch {
		case fault == KillLockClient:
			fmt.Fprintf(out, "chaos: trial %d: %s at %.1fs; the locks granted again %.2fs after the kill; %s\n", n, fault, t.AtSec, t.LockWaitSeconds, t.Detail)
		case fault == KillAll:
			fmt.Fprintf(out, "chaos: trial %d: %s at %.1fs; leader %s after %.2fs%s; %s\n", n, fault, t.AtSec, t.Leader, t.Elected, resyncText(c.cfg.Mirror, t), t.Detail)
		case fault.switches():
			fmt.Fprintf(out, "chaos: trial %d: %s%s of %s (group %d, epoch %d) at %.1fs; primary %s after %.2fs; resync %.2fs\n",
				n, fault, detail(t.Detail), t.Victim, t.Group, t.Epoch, t.AtSec, t.NewPrimary, t.SwitchSeconds, t.ResyncSeconds)
		case fault.Mirrored():
			fmt.Fprintf(out, "chaos: trial %d: %s%s of %s (group %d, epoch %d) at %.1fs; resync %.2fs\n",
				n, fault, detail(t.Detail), t.Victim, t.Group, t.Epoch, t.AtSec, t.ResyncSeconds)
		default:
			fmt.Fprintf(out, "chaos: trial %d: %s%s of %s at %.1fs; leader %s after %.2fs\n", n, fault, detail(t.Detail), t.Victim, t.AtSec, t.Leader, t.Elected)
		}
		if t.Fence != nil {
			rep.SplitBrain = append(rep.SplitBrain, t.Fence.Accepted...)
			fmt.Fprintf(out, "chaos: trial %d: fence probe of the deposed primary: %d writes in the old epoch, %d refused (%s), %d unanswered, %d ACKNOWLEDGED\n",
				n, t.Fence.Asked, t.Fence.Refused, t.Fence.FirstRefusal, t.Fence.NoAnswer, len(t.Fence.Accepted))
		}
		for _, pr := range t.Problems {
			rep.Problems = append(rep.Problems, fmt.Sprintf("trial %d (%s): %s", n, fault, pr))
			fmt.Fprintf(out, "chaos: trial %d: PROBLEM: %s\n", n, pr)
		}
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
		t.measure(ops, end, rep.Trials[i+1:])
		// A lock waits for its holder, or for a dead session's locks (a
		// lease at most, also in a new leader's grace period after a
		// power loss, for the sessions of mounts that died): its bound is
		// the lease. (kill-lock-client checks its wait from the kill.)
		if bound := s.SessionLease + lockMargin; t.LockStallSeconds > bound.Seconds() && t.Fault != KillLockClient {
			p := fmt.Sprintf("a locker waited %.2fs for its lock, beyond %v (session lease %v + %v)", t.LockStallSeconds, bound, s.SessionLease, lockMargin)
			t.Problems = append(t.Problems, p)
			rep.Problems = append(rep.Problems, fmt.Sprintf("trial %d (%s): %s", t.N, t.Fault, p))
			fmt.Fprintf(out, "chaos: trial %d: PROBLEM: %s\n", t.N, p)
		}
	}
	stalls := make([]float64, 0, len(rep.Trials))
	var resyncs []float64
	kinds := map[Fault][4][]float64{} // stalls, elected, switched or lock waits, resynced
	for _, t := range rep.Trials {
		stalls = append(stalls, t.StallSeconds)
		if t.OtherStallSeconds >= StallBar.Seconds() {
			rep.StallsOverBar++
		}
		k := kinds[t.Fault]
		k[0], k[1] = append(k[0], t.StallSeconds), append(k[1], t.Elected)
		if t.SwitchSeconds > 0 {
			k[2] = append(k[2], t.SwitchSeconds)
		}
		if t.LockWaitSeconds > 0 {
			k[2] = append(k[2], t.LockWaitSeconds)
		}
		if t.ResyncSeconds > 0 {
			k[3] = append(k[3], t.ResyncSeconds)
			resyncs = append(resyncs, t.ResyncSeconds)
		}
		kinds[t.Fault] = k
		fmt.Fprintf(out, "chaos: trial %d (%s%s): longest operation %.2fs (%s) over %d ops, %d errors%s\n", t.N, t.Fault, detail(t.Detail), t.StallSeconds, t.StallOp, t.Ops, t.Errors,
			resyncText(c.cfg.Mirror && (t.Fault.Mirrored() || t.Fault == KillAll), &t))
	}
	rep.FaultsInjected = len(rep.Trials)
	if len(stalls) > 0 {
		rep.MedianStall = median(stalls)
		rep.MaxStall = stalls[len(stalls)-1] // sorted by median
	}
	if len(resyncs) > 0 {
		rep.MedianResync = median(resyncs)
		rep.MaxResync = resyncs[len(resyncs)-1]
	}
	rep.ByFault = map[Fault]Stalls{}
	for _, f := range Faults {
		k, ok := kinds[f]
		if !ok {
			continue
		}
		st := Stalls{Trials: len(k[0]), MedianStall: median(k[0]), MedianElected: median(k[1]), MedianSwitch: median(k[2]), MedianResync: median(k[3])}
		st.MaxStall = k[0][len(k[0])-1] // sorted by median
		if len(k[3]) > 0 {
			st.MaxResync = k[3][len(k[3])-1]
		}
		rep.ByFault[f] = st
		if f == KillLockClient {
			st.MedianSwitch, st.MedianLockWait = 0, st.MedianSwitch
			st.MaxLockWait = k[2][len(k[2])-1] // sorted by median
			rep.ByFault[f] = st
			fmt.Fprintf(out, "chaos: %s: %d trials, stall median %.2fs max %.2fs, locks granted again after %.2fs (median) max %.2fs (bound: session lease %v + %v)\n",
				f, st.Trials, st.MedianStall, st.MaxStall, st.MedianLockWait, st.MaxLockWait, s.SessionLease, lockMargin)
		} else if f.Mirrored() {
			switched := ""
			if f.switches() {
				switched = fmt.Sprintf(", new primary after %.2fs (median)", st.MedianSwitch)
			}
			fmt.Fprintf(out, "chaos: %s: %d trials, stall median %.2fs max %.2fs%s, resync median %.2fs max %.2fs\n",
				f, st.Trials, st.MedianStall, st.MaxStall, switched, st.MedianResync, st.MaxResync)
		} else {
			fmt.Fprintf(out, "chaos: %s: %d trials, stall median %.2fs max %.2fs, leader named after %.2fs (median)\n", f, st.Trials, st.MedianStall, st.MaxStall, st.MedianElected)
		}
	}
	chk, err := l.Verify()
	if err != nil {
		return rep, fmt.Errorf("verify: %w", err)
	}
	rep.Check = chk
	rep.LostRecords, rep.CorruptReads = len(chk.Bad), chk.CorruptReads
	fmt.Fprintf(out, "chaos: %d trials, stall median %.2fs max %.2fs; %d ops, %d errors; %d files expected, %d lost, %d extra, %d ambiguous; %d records checked, %d bad\n",
		len(rep.Trials), rep.MedianStall, rep.MaxStall, rep.Ops, rep.ErrorCount, chk.Files, len(chk.Lost), len(chk.Extra), chk.Ambiguous, chk.Records, len(chk.Bad))
	if chk.LockGrants > 0 {
		fmt.Fprintf(out, "chaos: locks: %d critical sections of the lockers, %d mutual-exclusion violations\n", chk.LockGrants, len(chk.LockViolations))
	}
	if chk.Reads > 0 || len(resyncs) > 0 || chk.LockGrants > 0 {
		fmt.Fprintf(out, "chaos: totals: %d faults injected, %d stalls ≥ %v, %d errors, %d records lost or bad, %d of %d reads corrupt or stale, resync median %.2fs max %.2fs, %d lock violations, %d history segments checked, %d threads hung, %d problems\n",
			rep.FaultsInjected, rep.StallsOverBar, StallBar, rep.ErrorCount, rep.LostRecords, chk.CorruptReads, chk.Reads, rep.MedianResync, rep.MaxResync, len(chk.LockViolations), rep.HistorySegments, len(rep.StuckThreads), len(rep.Problems))
	}
	return rep, runErr
}

// measure sets what the load felt during trial t from the operations under
// way at its fault or begun before end; later are the trials after it.
func (t *Trial) measure(ops []Op, end time.Duration, later []Trial) {
	var longest, other Op
	for _, op := range ops {
		if op.End < t.At || op.Start > end {
			continue
		}
		t.Ops++
		if op.Err != nil {
			t.Errors++
		}
		if op.End-op.Start > longest.End-longest.Start {
			longest = op
		}
		if op.Kind != "lock" {
			if op.End-op.Start > other.End-other.Start {
				other = op
			}
			continue
		}
		// A wait that went on into a later kill-lock-client's hold
		// counts here until that trial's holder started.
		waitEnd := op.End
		for _, u := range later {
			if u.Fault == KillLockClient && u.holderAt > op.Start {
				waitEnd = min(waitEnd, u.holderAt)
				break
			}
		}
		t.LockStallSeconds = max(t.LockStallSeconds, (waitEnd - op.Start).Seconds())
	}
	// The stall: the longest operation other than the lockers' waits
	// (their bound is the session lease, not StallBar); for
	// kill-lock-client, whose lock wait it is, the longest of all.
	t.OtherStallSeconds = (other.End - other.Start).Seconds()
	stallOp := other
	if t.Fault == KillLockClient {
		stallOp = longest
	}
	t.StallSeconds = (stallOp.End - stallOp.Start).Seconds()
	if stallOp.Kind != "" {
		t.StallOp = fmt.Sprintf("%s at %.1fs", stallOp.Kind, stallOp.Start.Seconds())
	}
}

// resyncText is ", resync S" for a trial of a mirrored cluster's fault.
func resyncText(mirrored bool, t *Trial) string {
	if !mirrored {
		return ""
	}
	return fmt.Sprintf(", resync %.2fs", t.ResyncSeconds)
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
