package nfs

import (
	"slices"
	"syscall"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// cred is the identity an operation runs as, after the export's squash.
type cred struct {
	uid, gid uint32
	gids     []uint32
}

// credOf applies e's squash to a call's credential. AUTH_NONE is the
// anonymous user.
func (e *Export) credOf(c *oncrpc.Cred) cred {
	anon := cred{uid: e.AnonUID, gid: e.AnonGID}
	if c.Flavor != xdr.AUTH_SYS || e.Squash == SquashAll {
		return anon
	}
	out := cred{uid: c.UID, gid: c.GID, gids: c.GIDs}
	if e.Squash == SquashRoot {
		if out.uid == 0 {
			out.uid = e.AnonUID
		}
		if out.gid == 0 {
			out.gid = e.AnonGID
		}
		if slices.Contains(out.gids, 0) {
			gids := slices.Clone(out.gids)
			for i, g := range gids {
				if g == 0 {
					gids[i] = e.AnonGID
				}
			}
			out.gids = gids
		}
	}
	return out
}

func (c cred) inGroup(g uint32) bool { return c.gid == g || slices.Contains(c.gids, g) }

// Permission bits asked of may.
const (
	mayRead  = 4
	mayWrite = 2
	mayExec  = 1
)

// may reports whether c may access an inode with attributes a as want
// (mayRead|mayWrite|mayExec), as the kernel decides for a local file
// system (generic_permission, without ACLs): root may read and write
// anything and execute anything some execute bit allows (directories
// always); others get the owner's, the group's or the others' bits,
// whichever class they fall in first.
//
// Permissions are checked here, in the gateway, because the metadata
// service does not check them: a FUSE mount has the kernel check them
// (default_permissions), with the same rules.
func (c cred) may(a *rpc.Attr, want uint32) bool {
	if c.uid == 0 {
		if want&mayExec == 0 || a.Mode&syscall.S_IFMT == syscall.S_IFDIR || a.Mode&0o111 != 0 {
			return true
		}
		return false
	}
	var bits uint32
	switch {
	case c.uid == a.Uid:
		bits = a.Mode >> 6 & 7
	case c.inGroup(a.Gid):
		bits = a.Mode >> 3 & 7
	default:
		bits = a.Mode & 7
	}
	return bits&want == want
}

// owns: c is the owner of a, or root.
func (c cred) owns(a *rpc.Attr) bool { return c.uid == 0 || c.uid == a.Uid }

// mayDelete reports whether c may remove or rename away victim from dir
// (write and search permission on dir, and the sticky bit's rule).
func (c cred) mayDelete(dir, victim *rpc.Attr) bool {
	if !c.may(dir, mayWrite|mayExec) {
		return false
	}
	if dir.Mode&syscall.S_ISVTX != 0 && victim != nil {
		return c.uid == 0 || c.uid == dir.Uid || c.uid == victim.Uid
	}
	return true
}

// accessBits answers ACCESS: the asked bits c holds on a.
func (c cred) accessBits(a *rpc.Attr, asked uint32, readOnly bool) uint32 {
	isDir := a.Mode&syscall.S_IFMT == syscall.S_IFDIR
	var got uint32
	if asked&xdr.ACCESS3_READ != 0 && c.may(a, mayRead) {
		got |= xdr.ACCESS3_READ
	}
	if isDir {
		if asked&xdr.ACCESS3_LOOKUP != 0 && c.may(a, mayExec) {
			got |= xdr.ACCESS3_LOOKUP
		}
		if asked&xdr.ACCESS3_DELETE != 0 && !readOnly && c.may(a, mayWrite|mayExec) {
			got |= xdr.ACCESS3_DELETE
		}
	} else if asked&xdr.ACCESS3_EXECUTE != 0 && c.may(a, mayExec) {
		got |= xdr.ACCESS3_EXECUTE
	}
	if !readOnly && c.may(a, mayWrite) {
		got |= asked & (xdr.ACCESS3_MODIFY | xdr.ACCESS3_EXTEND)
	}
	return got
}
