// Package nfsha runs one gateway of an NFS HA pair (docs/design/0015 § HA
// pair): two `strata nfs` processes on two machines share one virtual
// address; the one holding the pair's lease in the metadata service (a
// raft-replicated record, rpc.MHALease) is active and has the address on
// its device, the other is standby and asks for the lease until it is
// free.
//
// # Why there is never a split brain
//
// Both gateways ask the same replicated lease: the metadata service grants
// it to one holder at a time, and to another only once the holder's TTL
// has passed without a renewal (also on the leader's own clock, so a new
// leader or a clock step never frees it early). The active counts its
// lease from before it sent each renewal and stops being active — removes
// the address, closes the connections that came to it — Margin before
// that count runs out, whether or not it can reach the service: so it has
// dropped the address before the standby can be granted the lease. A
// gateway killed with -9 cannot remove the address: the address is set
// with a kernel lifetime (valid_lft, whole seconds) renewed with every
// renewal and never longer than what is left of the lease, so the kernel
// removes it by itself within about a second of that. A gateway that
// starts removes the address from its device if a former life left it.
//
// # Becoming active
//
// The new active adds the address (ip addr replace … valid_lft N), sends
// gratuitous ARP (a request and a reply for the address from the device's
// MAC, through an AF_PACKET socket; again a second later, since Linux
// ignores a neighbour update within a second of the last), then calls
// Config.OnActive — where the gateway's NLM starts its grace period once
// it has one. The NFS server itself serves on its --listen address all
// along (both gateways of a pair): clients reach whichever is active
// through the address; handles are the same on both (same key, same
// exports), and the write verifier of the new active differs from the old
// one's, so clients resend the UNSTABLE writes they have not committed.
package nfsha
