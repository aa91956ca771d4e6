package store

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Group commit of chunk syncs (docs/design/0010)
//
// Concurrent syncs of chunks on one target share one syncfs of the
// target's file system instead of each fdatasyncing its data, its sidecar
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

// groupSync is a target's state of sync rounds.
type groupSync struct {
	mu      sync.Mutex
	running bool
	next    *syncRound // the round new callers join; nil: none yet
	// errEpoch counts failed rounds (see the essay above).
	errEpoch atomic.Uint64
}

// syncRound is one syncfs that its callers wait for.
type syncRound struct {
	done    chan struct{}
	err     error // set before done is closed
	callers int   // guarded by groupSync.mu
}

// canGroupSync reports whether a chunk that became dirty in epoch may be
// made durable by a round now.
func (t *target) canGroupSync(epoch uint64) bool {
	return syncfsReportsErrors && epoch == t.gs.errEpoch.Load() && dirtyPagesBelow(groupSyncDirtyBound.Load())
}

// syncRoundWait makes everything written on the target before the call
// durable, data, sidecars and directory entries alike: it joins the next
// round and waits for its end, running it when no round runs.
func (t *target) syncRoundWait() error {
	g := &t.gs
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{done: make(chan struct{})}
		g.next = r
	}
	r.callers++
	if g.running {
		g.mu.Unlock()
		<-r.done
		return r.err
	}
	g.running = true
	g.next = nil
	g.mu.Unlock()
	t.runRound(r)
	return r.err
}

// runRound runs r, then hands the round joined meanwhile to a goroutine
// of its own, so that r's caller returns at once.
func (t *target) runRound(r *syncRound) {
	r.err = t.syncAll()
	close(r.done)
	g := &t.gs
	g.mu.Lock()
	next := g.next
	g.next = nil
	g.running = next != nil
	g.mu.Unlock()
	if next != nil {
		go t.runRound(next)
	}
}

// syncAll syncfs's the target's file system and forgets the directory
// changes it covered.
func (t *target) syncAll() error {
	t.unsyncedDirs.Lock()
	dirs := make(map[string]uint64, len(t.unsyncedDirs.m))
	for d, n := range t.unsyncedDirs.m {
		dirs[d] = n
	}
	t.unsyncedDirs.Unlock()
	if h := testHookSyncfs.Load(); h != nil {
		(*h)()
	}
	if err := unix.Syncfs(t.lockFd); err != nil {
		t.gs.errEpoch.Add(1)
		return err
	}
	t.unsyncedDirs.Lock()
	for d, n := range dirs {
		if t.unsyncedDirs.m[d] == n {
			delete(t.unsyncedDirs.m, d)
		}
	}
	t.unsyncedDirs.Unlock()
	return nil
}

// testHookSyncfs, when set (tests), runs before every round's syncfs.
var testHookSyncfs atomic.Pointer[func()]

// dirtyPagesBelow reports whether the machine's Dirty + Writeback pages
// (/proc/meminfo) are below bound bytes; false when unreadable.
func dirtyPagesBelow(bound int64) bool {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return false
	}
	defer f.Close()
	var total int64
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
			return false
		}
		total += kb << 10
	}
	return seen == 2 && total < bound
}
