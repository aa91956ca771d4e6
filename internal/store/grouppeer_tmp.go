package store

// groupPeer is this server's view of one mirror group it holds a copy of.
// TEMPORARY: mirror.go (branch mirrorstore) defines the same struct; this
// file goes at the merge.
type groupPeer struct {
	Local, PeerTarget uint32 // this server's target and the other copy's
	PeerAddr          string // the other copy's server
	Epoch             uint64
	Primary, InSync   bool // this copy is the primary; the group is in sync
}
