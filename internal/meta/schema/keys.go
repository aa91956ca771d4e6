package schema

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt marks a key or value that does not decode.
var ErrCorrupt = errors.New("schema: corrupt record")

// ErrNewer marks a value of a format version newer than this build reads:
// written by a newer Strata, not corrupt.
var ErrNewer = errors.New("schema: record of a newer format")

// Key prefixes (see doc.go).
const (
	prefixCounters = 'c'
	prefixCluster  = 'C'
	prefixDentry   = 'd'
	prefixInode    = 'i'
	prefixOrphan   = 'o'
	prefixDedupe   = 'r'
	prefixSession  = 's'
	prefixRegistry = 'R'

	regServer = 'S'
	regTarget = 'T'
	regUUID   = 'U'
	regGroup  = 'G'
	regLease  = 'H'

	xattrMark = 'x'
)

// ClusterIDKey is the key of the namespace's cluster id (raw bytes).
func ClusterIDKey() []byte { return []byte{prefixCluster} }

// CountersKey is the key of the one Counters record.
func CountersKey() []byte { return []byte{prefixCounters} }

func be64(b []byte, p byte, v uint64) []byte {
	b = append(b, p)
	return binary.BigEndian.AppendUint64(b, v)
}

// InodeKey is 'i' ino.
func InodeKey(ino uint64) []byte { return be64(make([]byte, 0, 9), prefixInode, ino) }

// InodeRange covers an inode's record and all its xattrs: [start, end).
func InodeRange(ino uint64) (start, end []byte) {
	start = InodeKey(ino)
	end = append(InodeKey(ino), 0xff)
	return start, end
}

// InodePrefix covers every inode record.
func InodePrefix() []byte { return []byte{prefixInode} }

// XattrKey is 'i' ino 'x' name.
func XattrKey(ino uint64, name string) []byte {
	b := be64(make([]byte, 0, 10+len(name)), prefixInode, ino)
	b = append(b, xattrMark)
	return append(b, name...)
}

// XattrPrefix covers the xattrs of ino.
func XattrPrefix(ino uint64) []byte { return append(InodeKey(ino), xattrMark) }

// DecodeXattrKey returns the inode and attribute name of an xattr key.
func DecodeXattrKey(k []byte) (ino uint64, name string, err error) {
	if len(k) < 10 || k[0] != prefixInode || k[9] != xattrMark {
		return 0, "", fmt.Errorf("%w: xattr key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:9]), string(k[10:]), nil
}

// DecodeInodeKey returns the inode of an inode record key ('i' ino, exactly).
func DecodeInodeKey(k []byte) (uint64, error) {
	if len(k) != 9 || k[0] != prefixInode {
		return 0, fmt.Errorf("%w: inode key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}

// DentryKey is 'd' parent name.
func DentryKey(parent uint64, name string) []byte {
	return AppendDentryKey(make([]byte, 0, 9+len(name)), parent, name)
}

// AppendDentryKey appends 'd' parent name to b.
func AppendDentryKey(b []byte, parent uint64, name string) []byte {
	b = be64(b, prefixDentry, parent)
	return append(b, name...)
}

// DentryPrefix covers the entries of directory parent.
func DentryPrefix(parent uint64) []byte { return be64(make([]byte, 0, 9), prefixDentry, parent) }

// DecodeDentryKey splits a directory-entry key.
func DecodeDentryKey(k []byte) (parent uint64, name string, err error) {
	if len(k) < 10 || k[0] != prefixDentry {
		return 0, "", fmt.Errorf("%w: dentry key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:9]), string(k[9:]), nil
}

// DentryName returns the name part of a dentry key without copying.
func DentryName(k []byte) []byte {
	if len(k) < 9 {
		return nil
	}
	return k[9:]
}

// OrphanKey is 'o' ino.
func OrphanKey(ino uint64) []byte { return be64(make([]byte, 0, 9), prefixOrphan, ino) }

// OrphanPrefix covers every orphan record.
func OrphanPrefix() []byte { return []byte{prefixOrphan} }

// DecodeOrphanKey returns the inode of an orphan key.
func DecodeOrphanKey(k []byte) (uint64, error) {
	if len(k) != 9 || k[0] != prefixOrphan {
		return 0, fmt.Errorf("%w: orphan key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}

// SessionKey is 's' client.
func SessionKey(client uint64) []byte { return be64(make([]byte, 0, 9), prefixSession, client) }

// SessionPrefix covers every session record.
func SessionPrefix() []byte { return []byte{prefixSession} }

// DecodeSessionKey returns the client id of a session key.
func DecodeSessionKey(k []byte) (uint64, error) {
	if len(k) != 9 || k[0] != prefixSession {
		return 0, fmt.Errorf("%w: session key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}

// DedupeKey is 'r' client seq.
func DedupeKey(client, seq uint64) []byte {
	b := be64(make([]byte, 0, 17), prefixDedupe, client)
	return binary.BigEndian.AppendUint64(b, seq)
}

// DedupePrefix covers every dedupe record of client.
func DedupePrefix(client uint64) []byte { return be64(make([]byte, 0, 9), prefixDedupe, client) }

// DecodeDedupeKey splits a dedupe key.
func DecodeDedupeKey(k []byte) (client, seq uint64, err error) {
	if len(k) != 17 || k[0] != prefixDedupe {
		return 0, 0, fmt.Errorf("%w: dedupe key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[9:]), nil
}

// ServerKey is 'R' 'S' id.
func ServerKey(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{prefixRegistry, regServer}, id)
}

// ServerPrefix covers every server record.
func ServerPrefix() []byte { return []byte{prefixRegistry, regServer} }

// TargetKey is 'R' 'T' id.
func TargetKey(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{prefixRegistry, regTarget}, id)
}

// TargetPrefix covers every target record.
func TargetPrefix() []byte { return []byte{prefixRegistry, regTarget} }

// TargetUUIDKey is 'R' 'U' uuid.
func TargetUUIDKey(uuid string) []byte {
	return append([]byte{prefixRegistry, regUUID}, uuid...)
}

// DecodeRegistryID returns the id of a server or target key.
func DecodeRegistryID(k []byte) (uint32, error) {
	if len(k) != 6 || k[0] != prefixRegistry || (k[1] != regServer && k[1] != regTarget) {
		return 0, fmt.Errorf("%w: registry key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint32(k[2:]), nil
}

// GroupKey is 'R' 'G' id: a mirror group.
func GroupKey(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{prefixRegistry, regGroup}, id)
}

// GroupPrefix covers every mirror group record, in id order.
func GroupPrefix() []byte { return []byte{prefixRegistry, regGroup} }

// DecodeGroupKey returns the id of a group key.
func DecodeGroupKey(k []byte) (uint32, error) {
	if len(k) != 6 || k[0] != prefixRegistry || k[1] != regGroup {
		return 0, fmt.Errorf("%w: group key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint32(k[2:]), nil
}

// HALeaseKey is 'R' 'H' name: a named lease (an NFS gateway HA pair's).
func HALeaseKey(name string) []byte {
	return append([]byte{prefixRegistry, regLease}, name...)
}

// Client-session keys for inode ranges and create delegations
// (docs/design/0016): everything a session holds besides its record and
// dedupe table lives under 'n' client, so that the session's end drops it
// with one range deletion.
const (
	prefixSessionHeld = 'n'
	prefixDelegation  = 'D'

	heldRange = 'r'
	heldDeleg = 'd'
)

// SessionHeldPrefix covers every inode range and delegation index entry of
// client.
func SessionHeldPrefix(client uint64) []byte {
	return be64(make([]byte, 0, 9), prefixSessionHeld, client)
}

// SessionRangeKey is 'n' client(8) 'r' start(8): an inode range reserved
// for the session, starting at start (SessionRange has its end).
func SessionRangeKey(client, start uint64) []byte {
	b := append(SessionHeldPrefix(client), heldRange)
	return binary.BigEndian.AppendUint64(b, start)
}

// SessionRangePrefix covers the inode ranges of client, in start order.
func SessionRangePrefix(client uint64) []byte { return append(SessionHeldPrefix(client), heldRange) }

// DecodeSessionRangeKey returns the client and start of a range key.
func DecodeSessionRangeKey(k []byte) (client, start uint64, err error) {
	if len(k) != 18 || k[0] != prefixSessionHeld || k[9] != heldRange {
		return 0, 0, fmt.Errorf("%w: session range key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[10:]), nil
}

// SessionDelegKey is 'n' client(8) 'd' dir(8): the index entry of a
// delegation the session holds on dir (the record is DelegationKey(dir)).
func SessionDelegKey(client, dir uint64) []byte {
	b := append(SessionHeldPrefix(client), heldDeleg)
	return binary.BigEndian.AppendUint64(b, dir)
}

// SessionDelegPrefix covers the delegation index entries of client.
func SessionDelegPrefix(client uint64) []byte { return append(SessionHeldPrefix(client), heldDeleg) }

// DecodeSessionDelegKey returns the client and directory of an index key.
func DecodeSessionDelegKey(k []byte) (client, dir uint64, err error) {
	if len(k) != 18 || k[0] != prefixSessionHeld || k[9] != heldDeleg {
		return 0, 0, fmt.Errorf("%w: session delegation key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[10:]), nil
}

// DelegationKey is 'D' dir(8): the create delegation on directory dir.
func DelegationKey(dir uint64) []byte { return be64(make([]byte, 0, 9), prefixDelegation, dir) }

// DelegationPrefix covers every delegation record, in directory order.
func DelegationPrefix() []byte { return []byte{prefixDelegation} }

// DecodeDelegationKey returns the directory of a delegation key.
func DecodeDelegationKey(k []byte) (uint64, error) {
	if len(k) != 9 || k[0] != prefixDelegation {
		return 0, fmt.Errorf("%w: delegation key %x", ErrCorrupt, k)
	}
	return binary.BigEndian.Uint64(k[1:]), nil
}
