package nfs

import (
	"crypto/sha256"
	"encoding/binary"
)

// File handles. A handle names an inode for as long as it exists, across
// gateway restarts and on any gateway of the cluster given the same
// exports, so it is built only from what those share:
//
//	offset  size  field
//	0       1     version (handleVersion)
//	1       3     zero
//	4       8     cluster id (clusterIDOf: from the cluster key)
//	12      8     export id (Export.id: a hash of its path)
//	20      8     inode number
//	28      4     generation: always 0
//
// Strata's metadata keeps no inode generation: it never needs one, since
// inode numbers come from a counter that only grows (NextIno), so a removed
// inode's number is never given to another file. A handle of a removed
// file therefore finds no inode (ENOENT), which the gateway answers
// NFS3ERR_STALE. The generation field is kept, zero, so that a namespace
// that one day reuses numbers can add one without a new handle version.
//
// Version history: 1 — the layout above.
const (
	handleVersion = 1
	handleBytes   = 32
)

// handle is a decoded file handle.
type handle struct {
	cluster, export, ino uint64
}

func (h handle) encode() []byte {
	b := make([]byte, handleBytes)
	b[0] = handleVersion
	binary.BigEndian.PutUint64(b[4:], h.cluster)
	binary.BigEndian.PutUint64(b[12:], h.export)
	binary.BigEndian.PutUint64(b[20:], h.ino)
	return b
}

// decodeHandle reads a handle; false when it is not one of ours (wrong
// size or version: NFS3ERR_BADHANDLE).
func decodeHandle(b []byte) (handle, bool) {
	if len(b) != handleBytes || b[0] != handleVersion || b[1]|b[2]|b[3] != 0 {
		return handle{}, false
	}
	return handle{
		cluster: binary.BigEndian.Uint64(b[4:]),
		export:  binary.BigEndian.Uint64(b[12:]),
		ino:     binary.BigEndian.Uint64(b[20:]),
	}, true
}

// clusterIDOf derives the handles' cluster id from the cluster key, which
// every gateway of a cluster holds and no other cluster does. (The
// metadata service's own cluster id is not on the wire yet; a key rotation
// therefore makes every handle stale.) It is also the file system id
// (fattr3.fsid) the gateway reports.
func clusterIDOf(key []byte) uint64 {
	h := sha256.New()
	h.Write([]byte("strata nfs handle v1\x00"))
	h.Write(key)
	return binary.BigEndian.Uint64(h.Sum(nil))
}
