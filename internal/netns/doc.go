// Package netns makes hosts out of Linux network namespaces: a Net is one
// namespace per host, each with an interface eth0 whose other end is a
// port of a bridge in a further namespace of its own, all numbered in one
// /24. Nothing is added to the machine's own namespace, so the subnet
// cannot clash with a real network and several Nets are isolated from
// each other. It is used by `strata chaos --hosts netns` and, through
// internal/testutil's NewNet, by the tests.
//
// # Concepts
//
// A process runs on a host through nsenter --net (Host.Prefix): only the
// network namespace changes, so a FUSE mount made there is visible to the
// caller, and the program is exec'ed, so its PID is the one started.
// Host.Do runs a function on an OS thread inside the namespace, for
// sockets of the calling process.
//
// Faults: Host.LinkDown/LinkUp (the host reaches no one and no one reaches
// it; its processes keep running), Net.DropFrom (a one-way partition: an
// nftables rule on the sender's output), Host.Loss (random drops both
// ways), Host.Delay (tc netem, or the forwarder of a shaped link: a TAP
// device pair whose frames this process copies, so delay works on kernels
// without netem), Net.Heal (undoes the packet faults).
//
// # Cleanup
//
// Close deletes the namespaces (their veth pairs and nftables rules go
// with them) and stops the shaped links' forwarders. Namespaces are named
// by the caller's prefix; a caller whose prefix is Base+PID+"-" lets a
// later run find the leftovers of one that died without Close
// (Leftovers, RemoveLeftovers): namespaces whose PID no longer runs.
//
// # Pitfalls
//
//   - A namespace holds running processes: delete it only after they
//     ended (RemoveLeftovers stops them first, by the PIDs the namespace
//     lists, never by name).
//   - TCP needs both directions: a one-way drop breaks new connections
//     either way round, while segments on an established connection still
//     arrive in the open direction (their acknowledgements do not).
//   - The shaped links' forwarders live in this process: they end with
//     it, and so does the hosts' connectivity.
package netns
