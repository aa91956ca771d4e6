// Package peers runs the benchmark suite side by side on the file systems a
// user would pick instead of Strata, set up on this one machine:
//
//	local        a directory on the backing disk
//	passthrough  `strata passthrough` (go-fuse loopback, data through the daemon)
//	glusterfs    glusterd + 2 bricks (distribute volume), FUSE mount
//	moosefs      mfsmaster + 2 mfschunkservers, mfsmount
//	strata       `strata up` (meta + stores + FUSE mount, fuse.strata), shared dir striped over all live targets
//
// and, when named (Optional), the NFS row: strata-nfs (`strata up --nfs`)
// and ganesha (NFS-Ganesha with its VFS FSAL on a directory of the work
// directory, on 127.0.0.1, rpcbind started if none runs). There is no
// kernel NFS client here, so both are driven by driveNFS (nfsdrive.go),
// one Go NFSv3 client on internal/nfs/nfstest, with their own workloads
// (NFSWorkloads), after the suite's.
//
// When the suite includes smallfile without --smallfile-fsync, the local
// directory also runs it as the series local-fsync, with an fsync before
// each close: the durable baseline of a small-file create.
//
// # Turns
//
// Every workload runs on each system in turn before the next workload, and
// with Repeat N it goes round the systems N times (one repeat per turn, the
// median of a system's N samples reported), so that drift of the machine —
// this VM's disk flushes took 100 µs one hour and 170 the next — hits all
// systems alike instead of the one whose repeats ran last; the turns take
// the systems in the orders of a Williams design (turnOrder), so that no
// system always runs right after the same other one. The random workload's
// files are written once per system and serve every turn.
// Before each turn the run waits until the CPUs and disks are quiet
// (settle.go), so that background work a system leaves behind is not
// charged to the system measured next. (MooseFS keeps the chunks of
// removed files: its master's chunk loop, 5 minutes by default, deleted
// none within 10 minutes in our runs, so there is no deletion to wait for.)
//
// # Isolation and cleanup
//
// Network daemons run in network namespaces this package creates, all named
// with the prefix "strata-bench-" and joined by veth pairs to a bridge in a
// hub namespace; their addresses (10.203.0.0/24) exist only inside those
// namespaces, so no traffic leaves them. The FUSE clients enter a namespace
// with nsenter --net (not ip netns exec, which would also give them a mount
// namespace of their own and hide the mount from the host).
//
// Every daemon started here is a child process with a known PID or a
// process inside one of these namespaces (`ip netns pids`); teardown stops
// exactly those, unmounts everything under the work directory and deletes
// the namespaces. Teardown runs deferred, on SIGINT/SIGTERM (the caller's
// context), and — for leftovers of a crashed run, recognised by the same
// names — at the start of every run. Every wait is bounded.
package peers
