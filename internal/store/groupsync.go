package store

import (
	"bufio"
	"bytes"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rounds"
)

// Group commit of chunk syncs (docs/design/0010)
//
// Concurrent syncs of chunks on one file system (of every target of this
// process on it) share one syncfs instead of each fdatasyncing its data, its sidecar
// and the directories on its path: for 64 small chunks that is one
// journal commit and device flush (2–5 ms on the development VM) against
// 10–24 ms of concurrent fdatasyncs. A sync joins the next round that
// starts after it asked — never the one running, which may have begun
// before the caller's writes — and the first caller with no round running
// runs it at once (nobody waits for company).
//
// syncfs also writes every other dirty page of the file system, so a round
// is used only while the machine's dirty and write-back pages stay below
// groupSyncDirtyBound; above it each chunk syncs its own files as before.
//
// syncfs reports a write-back error of the file system once per
// descriptor, so an error of chunk X may fail a round X's writer is not
// in, and X's own later round would succeed. A failed round therefore
// advances the target's error epoch, and a chunk that was dirty across a
// failed round (its dirtyEpoch differs, also when the failure ended while
// it waited) syncs its own files, whose fdatasync reports its own error
// exactly — the callers of the failed round too. Kernels before 5.8
// report no syncfs errors at all: there every chunk syncs its own files.
// So does a target on a FUSE file system: syncfs there does not reach the
// daemon (go-fuse and most servers do not implement FUSE_SYNCFS), so it
// would neither make the daemon's data durable nor report its errors.

// groupSyncDirtyBound: the most dirty and write-back bytes of the machine
// (/proc/meminfo) with which a sync still uses a syncfs round. A variable
// for tests.
var groupSyncDirtyBound atomic.Int64

func init() { groupSyncDirtyBound.Store(64 << 20) }

// syncfsReportsErrors: the kernel's syncfs returns write-back errors
// (Linux 5.8 and later).
var syncfsReportsErrors = func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	rel := string(bytes.TrimRight(u.Release[:], "\x00"))
	var major, minor int
	for i, part := range bytes.SplitN([]byte(rel), []byte("."), 3)[:2] {
		n := 0
		for _, ch := range part {
			if ch < '0' || ch > '9' {
				break
			}
			n = n*10 + int(ch-'0')
		}
		if i == 0 {
			major = n
		} else {
			minor = n
		}
	}
	return major > 5 || major == 5 && minor >= 8
}()

// groupSync is the state of the sync rounds of one file system, shared by
// the targets of this process on it (strata up runs several storage
// servers over one disk; a syncfs covers them all).
type groupSync struct {
	fd      int       // a descriptor on the file system, the group's own
	refs    int       // targets in the group; guarded by fsGroups
	targets []*target // guarded by fsGroups

	rounds rounds.Rounds[struct{}] // one syncAll per round
	// errEpoch counts failed rounds (see the essay above).
	errEpoch atomic.Uint64
	// blind: syncfs does nothing here (a FUSE file system).
	blind bool
}

// fsGroups maps a file system's id (statfs f_fsid) to its group. Targets
// whose file system has no id get a group of their own.
var fsGroups struct {
	sync.Mutex
	m map[uint64]*groupSync
}

// joinGroup gives t the sync-round group of its file system.
func (t *target) joinGroup() error {
	fsGroups.Lock()
	defer fsGroups.Unlock()
	id := t.fsid.Load()
	g := fsGroups.m[id]
	if g == nil || id == 0 {
		// Its own open, not a dup of the lock's descriptor: a dup would
		// hold the target's flock past the target's close.
		fd, err := unix.Open(t.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		var st unix.Statfs_t
		blind := unix.Fstatfs(fd, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC
		g = &groupSync{fd: fd, blind: blind}
		if id != 0 {
			if fsGroups.m == nil {
				fsGroups.m = map[uint64]*groupSync{}
			}
			fsGroups.m[id] = g
		}
	}
	g.refs++
	g.targets = append(g.targets, t)
	t.gs = g
	return nil
}

// leaveGroup undoes joinGroup; the last target closes the group.
func (t *target) leaveGroup() {
	g := t.gs
	if g == nil {
		return
	}
	fsGroups.Lock()
	defer fsGroups.Unlock()
	g.targets = slices.DeleteFunc(g.targets, func(o *target) bool { return o == t })
	if g.refs--; g.refs == 0 {
		if fsGroups.m[t.fsid.Load()] == g {
			delete(fsGroups.m, t.fsid.Load())
		}
		unix.Close(g.fd)
	}
	t.gs = nil
}

// canGroupSync reports whether a chunk that became dirty in epoch may be
// made durable by a round now.
func (t *target) canGroupSync(epoch uint64) bool {
	return syncfsReportsErrors && !t.gs.blind && epoch == t.gs.errEpoch.Load() && dirtyPagesBelow(groupSyncDirtyBound.Load())
}

// wait makes everything written on the file system before the call
// durable, data, sidecars and directory entries alike: one syncfs round
// (rounds) that started after the call.
func (g *groupSync) wait() error {
	return g.rounds.Join(struct{}{}, func([]struct{}) error { return g.syncAll() })
}

// syncAll syncfs's the file system and forgets the directory changes of
// the group's targets that it covered.
func (g *groupSync) syncAll() error {
	fsGroups.Lock()
	targets := slices.Clone(g.targets)
	fsGroups.Unlock()
	dirs := make([]map[string]uint64, len(targets))
	for i, t := range targets {
		t.unsyncedDirs.Lock()
		dirs[i] = maps.Clone(t.unsyncedDirs.m)
		t.unsyncedDirs.Unlock()
	}
	if h := testHookSyncfs.Load(); h != nil {
		(*h)()
	}
	if err := unix.Syncfs(g.fd); err != nil {
		g.errEpoch.Add(1)
		return err
	}
	for i, t := range targets {
		t.unsyncedDirs.Lock()
		for d, n := range dirs[i] {
			if t.unsyncedDirs.m[d] == n {
				delete(t.unsyncedDirs.m, d)
			}
		}
		t.unsyncedDirs.Unlock()
	}
	return nil
}

// testHookSyncfs, when set (tests), runs before every round's syncfs.
var testHookSyncfs atomic.Pointer[func()]

// dirtyPagesBelow reports whether the machine's Dirty + Writeback pages
// (/proc/meminfo) are below bound bytes; false when unreadable. Chunk
// syncs that ask within dirtyReadingTTL of each other (a background round
// syncs up to syncBatch at once) share one reading of the file.
func dirtyPagesBelow(bound int64) bool {
	dirtyReading.Lock()
	defer dirtyReading.Unlock()
	if now := time.Now(); now.Sub(dirtyReading.at) >= dirtyReadingTTL {
		dirtyReading.bytes, dirtyReading.ok = readDirtyPages()
		dirtyReading.at = now
	}
	return dirtyReading.ok && dirtyReading.bytes < bound
}

// dirtyReadingTTL is how long a reading of /proc/meminfo serves.
const dirtyReadingTTL = 5 * time.Millisecond

// dirtyReading is the last reading of readDirtyPages and its time.
var dirtyReading struct {
	sync.Mutex
	at    time.Time
	bytes int64
	ok    bool
}

// readDirtyPages reads Dirty + Writeback from /proc/meminfo, in bytes; ok
// false when unreadable.
func readDirtyPages() (total int64, ok bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() && seen < 2 {
		line := sc.Bytes()
		var rest []byte
		switch {
		case bytes.HasPrefix(line, []byte("Dirty:")):
			rest = line[len("Dirty:"):]
		case bytes.HasPrefix(line, []byte("Writeback:")):
			rest = line[len("Writeback:"):]
		default:
			continue
		}
		seen++
		kb, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
		if err != nil {
			return 0, false
		}
		total += kb << 10
	}
	return total, seen == 2
}
