// Package chaos drives a real multi-voter Strata cluster through faults
// while a file-system load runs on its mount, and reports what the load
// saw: every operation's duration (the longest is the stall a job felt),
// every error an application would have seen, and whether the files that
// exist afterwards are exactly those whose creates were acknowledged minus
// those whose removes were.
//
// # Concepts
//
// A Cluster is processes of the strata binary: N metadata voters (`strata
// meta --listen --data --peers --key-file`), storage servers and one FUSE
// mount, all given the voters' list with `--meta A,B,C`. It finds the
// leader through `strata status --json` (its "meta" member), so it uses
// the cluster the way an administrator's scripts do. The processes run on
// loopback, or (Hosts: Netns, hosts.go) each voter on a host of its own —
// a network namespace of package netns — and the stores, the mount and
// every `strata status` on one more, so that a voter's links can be cut.
//
// A Load runs on the mount: workers that create, stat and remove small
// files in their own directories, and a writer that appends 1 MiB records
// and fsyncs each. Every operation is timed.
//
// A Schedule is drawn from a seed (printed; the same seed replays it):
// which fault each trial injects (kill -9 of the leader; in the mixed
// schedule also of a follower, or SIGSTOP of the leader for a while; on
// netns hosts also the network faults: the leader's link down, a one-way
// drop between the leader and the other voters in a direction drawn, a
// follower's link down, a delay on what the leader sends) and how long the
// load runs between trials. A trial injects its fault, waits for the group
// to name a leader (other than the victim, for the faults that must depose
// it), undoes the fault after Schedule.Hold or restarts what it killed,
// and waits for the victim to catch up before the next one. A trial's
// new_leader_seconds is until a `strata status` that named the leader
// returned: with a voter unreachable that includes the status's own dial
// bound (3 s), so it overstates the election; the stall figures are the
// load's own.
//
// The deposed-leader probe (probe.go): for a fault that deposes a leader
// that still runs (stop-leader, partition-leader, one-way; and delay, which
// may depose it), once a leader is named a file is created through the
// mount, and the victim alone is asked to look it up, during the fault and
// for 2 s after it is undone; "no such file" is a stale read
// (Report.StaleReads). The load and the histories cannot see this: the
// mount follows the leader, so it hardly ever asks a deposed one.
//
// Mirror groups (issue 21; mirror.go, mirrorfaults.go, fence.go, disks.go):
// with ClusterConfig.Mirror the stores (several targets each; each on a host
// of its own on Netns) are paired into mirror groups with `strata mirror
// create --auto` once registered, and MirrorDirs are marked `strata stripe
// set --mirror`. The load then has several writers and readers that check
// every byte they read: of files written before the load, and of records
// whose fsync was acknowledged before the read began (a wrong answer there
// is a stale read). The mirror faults pick a group from `strata status
// --json` "mirror_groups" (all in sync when a trial starts) and hit the
// server of its primary or secondary, found by the --listen address status
// names; a trial waits for another primary (the faults that depose one),
// restarts or repairs, and times the resync until every group is in sync.
// kill-all is a power loss: the load and the history recorders pause
// between operations (Load.Pause: each writer's last operation was an
// acknowledged fsync), every process is killed with SIGKILL, restarted, and
// every acknowledged record still kept is read back. Disk faults need the
// targets on fault file systems (ClusterConfig.FaultDisks): one `strata
// faultfs` process per target, never killed by a fault.
//
// heartbeat-loss-primary drops a primary's heartbeats alone: every store
// is started with STRATA_FAILPOINTS_FILE naming a file of its own
// (logs/store-N.failpoints), and the fault writes
// "store/before-heartbeat=error" there for the hold. partition-primary is
// not that: it drops everything between the primary's host and the voters
// (heartbeats, and also the store's group map refreshes and mirror
// reports, and the orphan reaper's calls to the store).
//
// Locks (locks.go, lockfault.go): with LoadConfig.Lockers the load has
// lockers that take and release a write lock on a byte range of their
// files in a loop, timing each wait and checking mutual exclusion by
// stamping the range (HELD/FREE, fsync'ed). kill-lock-client needs
// ClusterConfig.LockClient, a second mount: a holder process on it takes
// the lockers' locks, its mount is killed with SIGKILL, and the lockers
// must be granted the locks again within the session lease + lockMargin,
// and not before the dead session could have expired.
//
// Cleanup: Stop deletes the namespaces (and with them the nftables rules
// of the packet faults); a run that dies without it (kill -9) leaves them
// named strata-chaos-PID-…, and the next netns run removes them, the
// processes in them and the mount one served (RemoveLeftovers).
//
// # Pitfalls
//
// The mount's client must not see any fault as an error: a create the
// client retried on the new leader with the same (client, seq) answers as
// the first attempt did. An error seen by the load is therefore a finding,
// not noise, and its operation's outcome is unknown: the exactly-once check
// accepts either outcome for it and reports it.
package chaos
