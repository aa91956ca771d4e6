// Package lockrange is the range algebra of POSIX record locks, shared by
// the metadata service (which grants locks) and the client (which keeps the
// locks it holds, to reclaim them from a restarted service).
//
// A Lock covers [Start, End] inclusive (End = EOF: to the end of the file)
// for one owner: a (Client, Owner) pair — a process or an open file
// description on one mount. An owner's locks on a file never overlap each
// other: Replace keeps them split and merged the way fcntl(2) does.
//
// Each lock also remembers the open (Handle, a client's number for one open
// file description) it was taken through. An owner's locks through
// different opens are still one owner's — they never conflict, and an
// unlock through any open removes them — but they are not merged, so that
// the close of one open drops what was taken through it and nothing else
// (DropHandle). The kernel names owners by addresses that are reused: a
// late close of an old open must not take the locks of a newer open whose
// owner got the old one's name.
//
// No I/O, no locking: callers guard their lists.
package lockrange

// EOF is the End of a lock that reaches the end of the file, however long.
const EOF = ^uint64(0)

// Lock types, as on the wire (rpc.LockRead, rpc.LockWrite, rpc.LockUnlock).
const (
	Read   uint32 = 0
	Write  uint32 = 1
	Unlock uint32 = 2
)

// Lock is one granted lock (or, as a request, the state wanted over a
// range: Type Unlock removes).
type Lock struct {
	Client, Owner uint64
	Start, End    uint64 // inclusive
	Type          uint32
	Pid           uint32
	Handle        uint64 // the open it was taken through (0: not known)
}

// SameOwner reports whether l belongs to (client, owner).
func (l *Lock) SameOwner(client, owner uint64) bool {
	return l.Client == client && l.Owner == owner
}

// Overlaps reports whether the ranges of a and b intersect.
func Overlaps(a, b *Lock) bool { return a.Start <= b.End && b.Start <= a.End }

// Conflicts reports whether a and b exclude each other: different owners,
// overlapping ranges, at least one of them a write lock.
func Conflicts(a, b *Lock) bool {
	return !a.SameOwner(b.Client, b.Owner) && Overlaps(a, b) && (a.Type == Write || b.Type == Write)
}

// Replace sets want's owner's lock state over [want.Start, want.End] to
// want.Type in list (Unlock removes) and returns the new list: the owner's
// overlapping locks are cut around the range (a lock spanning it splits in
// two), whatever open they were taken through, then the new lock is merged
// with the owner's adjacent or overlapping locks of the same type taken
// through the same open (Handle). Other owners' locks are kept as they
// are — checking conflicts is the caller's business. released reports
// whether any lock was removed or weakened (from write to read), which may
// let a waiter in. The input list is not modified.
func Replace(list []Lock, want Lock) (out []Lock, released bool) {
	out = make([]Lock, 0, len(list)+2)
	for _, l := range list {
		if !l.SameOwner(want.Client, want.Owner) || !Overlaps(&l, &want) {
			out = append(out, l)
			continue
		}
		if l.Type == Write && want.Type != Write || want.Type == Unlock {
			released = true
		}
		if l.Start < want.Start {
			left := l
			left.End = want.Start - 1
			out = append(out, left)
		}
		if l.End > want.End {
			right := l
			right.Start = want.End + 1
			out = append(out, right)
		}
	}
	if want.Type == Unlock {
		return out, released
	}
	merged := out[:0]
	for _, l := range out {
		adjacent := l.SameOwner(want.Client, want.Owner) && l.Type == want.Type && l.Handle == want.Handle &&
			(Overlaps(&l, &want) || (l.End != EOF && l.End+1 == want.Start) || (want.End != EOF && want.End+1 == l.Start))
		if adjacent {
			want.Start = min(want.Start, l.Start)
			want.End = max(want.End, l.End)
			continue
		}
		merged = append(merged, l)
	}
	return append(merged, want), released
}

// DropHandle removes from list every lock that client took through open
// handle (any owner, any range): that open file description was closed.
// released reports whether any was removed. The input list is not
// modified.
func DropHandle(list []Lock, client, handle uint64) (out []Lock, released bool) {
	out = make([]Lock, 0, len(list))
	for _, l := range list {
		if l.Client == client && l.Handle == handle {
			released = true
			continue
		}
		out = append(out, l)
	}
	return out, released
}
