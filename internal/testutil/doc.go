// Package testutil is the harness of Strata's tests that run real parts:
// real processes on loopback, FUSE mounts, and the faults the high
// availability tests inject.
//
//   - procs.go: Binary (the strata binary: $STRATA_BIN or a fresh build),
//     StartProc/Proc (one real process, its log in a file; Kill is kill -9,
//     Stop is SIGTERM then kill), ProcCluster (a metadata service, storage
//     servers and mounts, each a process), WaitFor (bounded polling).
//   - netns.go: NewNet (package netns wrapped for tests) makes hosts as
//     network namespaces joined by a bridge in a namespace of its own,
//     addresses NetSubnet.1, .2, … (nothing is
//     added to the machine's own namespace); Host.Start runs a daemon on a
//     host, Host.Do/Dial/Listen give the test process sockets on it.
//     Faults: Proc.Pause/Resume (SIGSTOP/SIGCONT: a hung process whose
//     sockets stay open), Host.LinkDown/LinkUp, Net.DropFrom (one-way
//     partition) and Host.Loss (nftables rules in the namespace, nft must
//     be installed: RequireNft), Host.Delay, Net.Heal (undoes the packet
//     faults). Delay needs tc netem on a NewNet (ErrNoNetem where the kernel
//     lacks it, as on this project's machines); NewShapedNet's links are
//     TAP device pairs whose frames the test process forwards, and delay
//     there works on any kernel.
//   - faultfs.go: MountFaultFS mounts a disk that fails on demand (the
//     hidden `strata faultfs`, package internal/faultfs) for a daemon's
//     data directory; FaultFS.SetMode switches it between ok, eio-write,
//     eio-fsync, eio, erofs, enospc, hang-fsync and hang while mounted.
//
// Everything a helper makes (processes, mounts, namespaces) is undone by
// t.Cleanup; processes are ended by their PID only.
//
// # Pitfalls
//
//   - A FUSE mount served by the test process itself (faultfs.Mount in
//     process) must have no file left open when the process exits: the
//     exit's flush would wait for a server that is gone.
//   - syncfs(2) does not reach a FUSE daemon: only fsync and fdatasync see
//     the fault file system's eio-fsync.
//   - Namespaces are named after the test process's PID, so tests of
//     several packages may run at once; their addresses may repeat (each
//     Net is isolated).
package testutil
