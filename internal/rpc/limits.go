package rpc

// Frame limits per method.
//
// A receiver checks a frame's announced length against its method's limit
// before it reads the body, and closes the connection when it is over: no
// legitimate peer sends such a frame. The limits follow the messages'
// own bounds (names of 255 bytes, symlink targets of 4 KiB, xattr values
// of 64 KiB, MaxStripeCount targets, MaxDataBytes of data); the messages
// whose length grows with the cluster or a directory (lists of inodes,
// targets, clients, entries, xattr names) get maxListFrameBytes. The
// membership messages (member_msgs.go) list at most MaxVoters servers of
// a few addresses each, and stay within maxSmallFrameBytes.

// MaxDataBytes bounds the data of one WriteReq or ReadResp (one store I/O).
const MaxDataBytes = 64 << 20

const (
	// maxSmallFrameBytes bounds every message not listed below: one
	// xattr value (64 KiB) or symlink target (4 KiB) with a few names
	// and numbers, or an error text.
	maxSmallFrameBytes = 256 << 10
	// maxListFrameBytes bounds the messages carrying lists.
	maxListFrameBytes = 16 << 20
	// maxDataFrameBytes is MaxDataBytes with its message's few fields.
	maxDataFrameBytes = MaxDataBytes + 4<<10
)

// MaxMessageBytes bounds every message: the largest of the per-method
// limits below.
const MaxMessageBytes = maxDataFrameBytes

// RequestLimit is the largest request body accepted for method m. A
// receiver checks a frame's announced length against it before reading the
// body; a sender refuses a larger request before sending it.
func RequestLimit(m Method) int {
	switch m {
	case SWrite:
		return maxDataFrameBytes
	case MInodesKnown, MSessionHeartbeat, MRegisterServer, MServerHeartbeat, SRemoveMany, MMirrorCreate, SMirrorSuspects,
		MCreateBatch:
		return maxListFrameBytes
	}
	return maxSmallFrameBytes
}

// ResponseLimit is the largest response body accepted for method m.
func ResponseLimit(m Method) int {
	switch m {
	case SRead, SChunkSums:
		return maxDataFrameBytes
	case MReadDir, MListXattr, MInodesKnown, MClusterStatus, MListTargets, MRegisterServer, SListChunks,
		MListGroups, MMirrorCreate, MServerHeartbeat,
		MCreateBatch, MDelegate, MWaitRecall:
		return maxListFrameBytes
	}
	return maxSmallFrameBytes
}
