package store

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// Target directory layout, format version 4:
//
//	strata-target       identity file (JSON, below), written once at format
//	                    time and rewritten (atomically) when the metadata
//	                    service assigns an id (the directory itself is
//	                    flock'ed while served)
//	chunks/XX/YY/       fan-out directories in two lower-case hex digits,
//	                    created on demand; which one holds an inode's chunk
//	                    is the target's chunk layout (chunkLayout)
//	chunks/XX/YY/<ino>.data, .sum   one chunk (format.go); on a target
//	                    whose chunk_sums is 2, a chunk of up to 12 blocks
//	                    is its .data alone, its sums in an extended
//	                    attribute (inlinesums.go)
//	dirty.log           intent log: the chunks that may differ from their
//	                    sums on disk (dirtylog.go)
//	mirror.log          what changed here while the target's mirror group
//	                    was degraded with it as primary (mirrorlog.go); made
//	                    at open, so no format version bump: older releases
//	                    never read it
//
// Version history: 1 — initial: chunks/XX/YY with XX = ino&0xff, YY =
// (ino>>8)&0xff. 2 — dirty.log: the first mutation of a clean chunk is
// recorded there rather than by a sync of its sidecar's dirty flag.
// 3 — the identity names the chunk layout (chunk_layout): 2 for new
// targets (XX = (ino>>16)&0xff, YY = (ino>>8)&0xff), 1 (format 1's) for
// the targets upgraded from versions 1 and 2. 4 — the identity names the
// chunk sums form (chunk_sums): 2 (inline sums for small chunks) when the
// file system keeps user extended attributes, else 1 (a sidecar for every
// chunk, as before); targets upgraded from versions 1 to 3 get the same
// choice for the chunks they create from then on (every chunk they had
// keeps its sidecar: a chunk's form is found per chunk). An older target
// is upgraded when opened (version 1 has no log; its dirty flags are all in its
// sidecars) and keeps its layout: chunks never move. A release that knows
// only older versions refuses a newer target instead of missing the chunks
// its log names or looking for them in the wrong directories.
const (
	targetFormat = 4
	identityName = "strata-target"
	chunksDir    = "chunks"
)

// chunkLayout is how a target places its chunks in the fan-out tree: it
// maps an inode number to the number of its fan-out directory (dirOf),
// 0..fanOutDirs-1, where directory i is chunks/XX/YY with XX = i>>8 and
// YY = i&0xff (target.fanOutDir). Every chunk path is computed through it;
// the walks of the tree (listing, the inode ceiling scan) go over the
// directory numbers, which mean the same paths under every layout.
type chunkLayout uint8

const (
	// layoutLowBytes (1; every target of formats 1 and 2): XX = byte 0 of
	// the inode, YY = byte 1. Consecutive inodes land in different leaf
	// directories.
	layoutLowBytes chunkLayout = 1
	// layoutRuns (2; new targets): XX = byte 2, YY = byte 1: a run of 256
	// consecutive inodes shares a leaf and 65,536 share a top directory.
	layoutRuns chunkLayout = 2
	// newTargetLayout is the layout format gives new targets.
	newTargetLayout = layoutRuns
)

// layoutOf is the chunk layout an identity names; an error if this build
// does not know it.
func layoutOf(id identity) (chunkLayout, error) {
	if id.Format < 3 {
		if id.ChunkLayout == 0 {
			return layoutLowBytes, nil
		}
	} else if id.ChunkLayout == 0 {
		return 0, fmt.Errorf("format version %d names no chunk layout", id.Format)
	}
	switch l := chunkLayout(id.ChunkLayout); l {
	case layoutLowBytes, layoutRuns:
		return l, nil
	}
	return 0, fmt.Errorf("chunk layout %d, this build knows only layouts 1 and 2 (made by a newer Strata release?)", id.ChunkLayout)
}

// dirOf is the number of the fan-out directory that holds ino's chunk.
func (l chunkLayout) dirOf(ino uint64) uint32 {
	switch l {
	case layoutLowBytes:
		return uint32(ino&0xff)<<8 | uint32(ino>>8&0xff)
	case layoutRuns:
		return uint32(ino>>8) & 0xffff
	}
	panic(fmt.Sprintf("store: chunk layout %d", l)) // broken invariant: readOrFormat checks it
}

// identity is the content of the identity file.
type identity struct {
	Format  int       `json:"format"`
	UUID    string    `json:"uuid"`
	Created time.Time `json:"created"`
	// ID is the target id last assigned by the metadata service (0: none
	// yet). It lets a restarted server serve its data before it has
	// registered again.
	ID uint32 `json:"id,omitempty"`
	// InoCeiling: every chunk file here has an inode number below it (a
	// multiple of rpc.InoCeilingStep, or 1 while there are none; raised,
	// and synced, before a chunk at or above it is created). 0 or absent:
	// not recorded yet (a target formatted by an earlier release), found
	// by scanning the chunk directories at open.
	InoCeiling uint64 `json:"ino_ceiling,omitempty"`
	// ChunkLayout (format 3 on) is the chunkLayout of the chunk tree;
	// absent in formats 1 and 2, whose layout is 1.
	ChunkLayout int `json:"chunk_layout,omitempty"`
	// ChunkSums (format 4 on) is where small chunks keep their sums:
	// sumsSidecar or sumsInline (inlinesums.go); absent in formats 1 to
	// 3, whose chunks all have sidecars.
	ChunkSums int `json:"chunk_sums,omitempty"`
}

// ErrFormat marks a target directory this build cannot serve: another
// format version, a damaged identity file, or a non-empty unformatted
// directory.
var ErrFormat = errors.New("unusable target directory")

// target is one served target directory.
type target struct {
	path    string // as configured; used in messages and metrics
	uuid    string
	layout  chunkLayout // from the identity file's format version
	sums    int         // sumsSidecar or sumsInline, from the identity file
	lockFd  int         // the target directory, flock'ed while served
	reserve uint64      // free bytes a write must leave

	id atomic.Uint32 // id assigned by the metadata service (or 1..n standalone)

	// atimeDenied: an O_NOATIME open of a chunk file was refused (files
	// of another owner, openChunkFile); chunk files are opened without it
	// from then on.
	atimeDenied atomic.Bool

	// identMu serializes rewrites of the identity file.
	identMu sync.Mutex
	// inoCeiling is the identity file's InoCeiling; inoHigh is what the
	// metadata service is told: the ceiling found at open, then raised to
	// one past each chunk created since — exact for the chunks this
	// process made, so that it stays below the service's next inode
	// number in normal operation (the step-rounded ceiling would not).
	inoCeiling atomic.Uint64
	inoHigh    atomic.Uint64

	// Capacity, refreshed by statfs at most every statfsMaxAge, and on
	// every write while free space is close to the reserve.
	totalBytes atomic.Uint64
	freeBytes  atomic.Uint64
	statAt     atomic.Int64  // unix nanoseconds of the last statfs
	fsid       atomic.Uint64 // the file system's id (statfs f_fsid), 0 if none
	rawFree    atomic.Uint64 // free bytes including those reserved for root

	// ours holds the inodes of chunks this process marked dirty that were
	// then closed (evicted from the cache) before a sync: their sidecars
	// are consistent with their data (both written through the same page
	// cache), so reopening them needs no recomputation. Entries go away
	// when the chunk is synced or removed.
	ours struct {
		sync.Mutex
		m map[uint64]struct{}
	}

	// unsyncedDirs holds the directories of the chunk tree (chunks/,
	// chunks/XX, chunks/XX/YY) whose entries this process changed by
	// creating a chunk file or a fan-out directory in them since their
	// last fsync, each with a count of those changes (see syncDirsOf).
	unsyncedDirs struct {
		sync.Mutex
		m map[string]uint64
	}

	// unsynced holds the chunks this process made dirty (created, or
	// mutated after a sync) and has not synced since, open or evicted,
	// with when each became dirty and the bytes written to it since:
	// what the background round syncs and strata status reports
	// (bgsync.go). Entries go away with the ours entries.
	unsynced struct {
		sync.Mutex
		m map[uint64]unsyncedChunk
	}

	// gs groups concurrent chunk syncs into syncfs rounds of the target's
	// file system (groupsync.go); set at open.
	gs *groupSync

	// dlog is the target's intent log of the dirty flag (dirtylog.go);
	// set at open.
	dlog *dirtyLog
	// mlog is the target's record of what changed while its mirror
	// group was degraded (mirrorlog.go); set at open.
	mlog *mirrorLog
	// suspectPush: a copy of the suspects to the secondary runs
	// (consumeSuspects).
	suspectPush atomic.Bool
	// suspectsAsSecondary: this process found the target a mirror
	// group's secondary with suspects (consumeSuspects): promoted before
	// they were handed over, it says so loudly.
	suspectsAsSecondary atomic.Bool
	// suspectWarned: when a failed hand-over of the suspects was last
	// logged as a warning (unix ns; the retries at every heartbeat in
	// between are logged at debug level).
	suspectWarned atomic.Int64

	m *targetMetrics

	// noReserve turns the reserve check off, so that tests reach the
	// disk's own ENOSPC (the partial-write repair path).
	noReserve atomic.Bool
}

const statfsMaxAge = time.Second

// openTarget formats dir if it is new, checks its format version, locks it
// and measures it. reserve 0 means the default.
func openTarget(dir string, reserve uint64) (*target, error) {
	id, err := readOrFormat(dir)
	if err != nil {
		return nil, err
	}
	// The lock is on the directory, not the identity file, which is
	// replaced by rename when the id changes.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("target %s: open: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("target %s (uuid %s) is in use by another storage server", dir, id.UUID)
		}
		return nil, fmt.Errorf("target %s: lock: %w", dir, err)
	}
	lay, _ := layoutOf(id) // readOrFormat refuses the unknown
	sums, _ := sumsOf(id)  // likewise
	t := &target{path: dir, uuid: id.UUID, lockFd: fd, layout: lay, sums: sums}
	t.ours.m = map[uint64]struct{}{}
	t.unsyncedDirs.m = map[string]uint64{}
	t.unsynced.m = map[uint64]unsyncedChunk{}
	t.id.Store(id.ID)
	inline, err := inlineSupported(dir)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if t.sums == sumsInline && !inline {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: target %s keeps small chunks' checksums in extended attributes (%s), which its file system no longer stores",
			ErrFormat, dir, inlineXattr)
	}
	if id.Format < targetFormat {
		// The chunks stay where they are: the layout becomes explicit;
		// chunks made from now on may keep their sums inline.
		if id.Format < 4 && inline {
			t.sums = sumsInline
		}
		if err := t.updateIdentity(func(i *identity) { i.Format, i.ChunkLayout, i.ChunkSums = targetFormat, int(lay), t.sums }); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("target %s: upgrade to format version %d: %w", dir, targetFormat, err)
		}
	}
	if id.InoCeiling == 0 {
		if id.InoCeiling, err = t.scanCeiling(); err == nil {
			err = t.updateIdentity(func(i *identity) { i.InoCeiling = max(i.InoCeiling, id.InoCeiling) })
		}
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("target %s: record the inode ceiling: %w", dir, err)
		}
	}
	t.inoCeiling.Store(id.InoCeiling)
	t.inoHigh.Store(id.InoCeiling)
	if err := t.statfs(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	t.reserve = reserve
	if reserve == 0 {
		t.reserve = min(t.totalBytes.Load()/200, 64<<20)
	}
	if err := os.MkdirAll(filepath.Join(dir, chunksDir), 0o755); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("target %s: %w", dir, err)
	}
	if err := checkMaxFile(dir); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// The mirror log first: the intent log hands it the chunks it names
	// (openDirtyLog) before it forgets them.
	if t.mlog, err = openMirrorLog(dir); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if t.dlog, err = openDirtyLog(t, slog.Default().With("pkg", "store")); err != nil {
		t.mlog.close()
		unix.Close(fd)
		return nil, err
	}
	// A killed predecessor may have left chunk files and fan-out
	// directories whose entries are not durable yet, and its record of
	// them (unsyncedDirs) died with it: make them durable before a sync
	// of this process relies on them.
	if err := unix.Syncfs(fd); err != nil {
		t.dlog.close()
		t.mlog.close()
		unix.Close(fd)
		return nil, fmt.Errorf("target %s: syncfs: %w", dir, err)
	}
	if err := t.joinGroup(); err != nil {
		t.dlog.close()
		t.mlog.close()
		unix.Close(fd)
		return nil, fmt.Errorf("target %s: %w", dir, err)
	}
	return t, nil
}

// ErrSmallFiles marks a target whose file system cannot hold a chunk of
// layout.MaxChunkBytes (ext4 with blocks under 4 KiB, FAT, …): the file
// sizes clients allow would fail there only after being acknowledged.
var ErrSmallFiles = errors.New("file system cannot hold a chunk of the largest size")

// checkMaxFile makes sure that dir's file system holds a file of
// layout.MaxChunkBytes: it sets an empty probe file to that length (sparse:
// nothing is allocated; a file system that cannot hold it answers EFBIG
// before it allocates anything) and removes it, and what a crash left of
// earlier probes.
func checkMaxFile(dir string) error {
	const probe = ".maxfile-probe-"
	if old, _ := filepath.Glob(filepath.Join(dir, probe+"*")); len(old) > 0 {
		for _, p := range old {
			os.Remove(p)
		}
	}
	f, err := os.CreateTemp(dir, probe+"*")
	if err != nil {
		return fmt.Errorf("target %s: probe the largest file: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	err = f.Truncate(layout.MaxChunkBytes)
	if errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("target %s: %w (%d bytes; use ext4 with 4 KiB blocks, xfs or btrfs): %v",
			dir, ErrSmallFiles, int64(layout.MaxChunkBytes), err)
	}
	if err != nil {
		return fmt.Errorf("target %s: probe the largest file: %w", dir, err)
	}
	return nil
}

func (t *target) close() {
	if t.dlog != nil {
		if err := t.dlog.close(); err != nil {
			slog.Default().With("pkg", "store").Error("cannot empty the intent log after a clean stop; its chunks are recomputed at the next open",
				"target", t.path, "err", err)
		}
	}
	if t.mlog != nil {
		t.mlog.close()
	}
	t.leaveGroup()
	if t.lockFd >= 0 {
		unix.Close(t.lockFd)
		t.lockFd = -1
	}
}

// readOrFormat reads dir's identity file, or formats dir if it has none.
func readOrFormat(dir string) (identity, error) {
	var id identity
	b, err := os.ReadFile(filepath.Join(dir, identityName))
	if errors.Is(err, fs.ErrNotExist) {
		return format(dir)
	}
	if err != nil {
		return id, fmt.Errorf("target %s: read identity: %w", dir, err)
	}
	if err := json.Unmarshal(b, &id); err != nil {
		return id, fmt.Errorf("%w: target %s: identity file %s is damaged: %v", ErrFormat, dir, identityName, err)
	}
	if id.Format < 1 || id.Format > targetFormat {
		return id, fmt.Errorf("%w: target %s has format version %d, this build serves only versions 1 to %d (made by another Strata release?)",
			ErrFormat, dir, id.Format, targetFormat)
	}
	if _, err := layoutOf(id); err != nil {
		return id, fmt.Errorf("%w: target %s: %v", ErrFormat, dir, err)
	}
	if _, err := sumsOf(id); err != nil {
		return id, fmt.Errorf("%w: target %s: %v", ErrFormat, dir, err)
	}
	if id.UUID == "" {
		return id, fmt.Errorf("%w: target %s: identity file has no uuid", ErrFormat, dir)
	}
	return id, nil
}

// format writes a new identity into dir, which must be empty (a fresh
// file system's lost+found is allowed): a non-empty directory is more
// likely a typo than a new target, and formatting it would mix Strata's
// files with someone else's.
func format(dir string) (identity, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return identity{}, fmt.Errorf("target %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return identity{}, fmt.Errorf("%w: target %s is not empty and has no %s file; refusing to format it (found %q)",
				ErrFormat, dir, identityName, e.Name())
		}
	}
	sums := sumsSidecar
	if ok, err := inlineSupported(dir); err != nil {
		return identity{}, err
	} else if ok && inlineSumsForNewTargets.Load() {
		sums = sumsInline
	}
	id := identity{Format: targetFormat, UUID: newUUID(), Created: time.Now().UTC().Truncate(time.Second), InoCeiling: 1,
		ChunkLayout: int(newTargetLayout), ChunkSums: sums}
	if err := writeIdentity(dir, id); err != nil {
		return identity{}, err
	}
	return id, nil
}

// updateIdentity rewrites the identity file with change applied.
func (t *target) updateIdentity(change func(*identity)) error {
	t.identMu.Lock()
	defer t.identMu.Unlock()
	return t.updateIdentityLocked(change)
}

func (t *target) updateIdentityLocked(change func(*identity)) error {
	id, err := readOrFormat(t.path)
	if err != nil {
		return err
	}
	change(&id)
	return writeIdentity(t.path, id)
}

// ceilingFor is the inode ceiling that covers ino.
func ceilingFor(ino uint64) uint64 {
	return (ino/rpc.InoCeilingStep + 1) * rpc.InoCeilingStep
}

// coverIno makes the recorded inode ceiling cover ino before a chunk file
// for it is created.
func (t *target) coverIno(ino uint64) error {
	for {
		h := t.inoHigh.Load()
		if ino < h || t.inoHigh.CompareAndSwap(h, ino+1) {
			break
		}
	}
	if ino < t.inoCeiling.Load() {
		return nil
	}
	t.identMu.Lock()
	defer t.identMu.Unlock()
	if ino < t.inoCeiling.Load() {
		return nil // raised by a concurrent chunk meanwhile
	}
	c := ceilingFor(ino)
	if err := t.updateIdentityLocked(func(i *identity) { i.InoCeiling = max(i.InoCeiling, c) }); err != nil {
		return err
	}
	t.inoCeiling.Store(c)
	return nil
}

// scanCeiling finds the inode ceiling of a target whose identity file does
// not record one, from the names of its chunk files.
func (t *target) scanCeiling() (uint64, error) {
	var resp rpc.ListChunksResp
	var top uint64
	found := false
	walk := newFanOutWalk(t)
	for i := walk.next(0); i < fanOutDirs; i = walk.next(i + 1) {
		resp.Inos, resp.Bytes = resp.Inos[:0], resp.Bytes[:0]
		if err := t.listChunkDir(i, &resp); err != nil {
			return 0, fmt.Errorf("scan the chunks of %s: %w", t.path, err)
		}
		for _, ino := range resp.Inos {
			if !found || ino > top {
				top, found = ino, true
			}
		}
	}
	if !found {
		return 1, nil
	}
	return ceilingFor(top), nil
}

// writeIdentity replaces the identity file atomically and durably.
func writeIdentity(dir string, id identity) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	tmp := filepath.Join(dir, identityName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("target %s: write identity: %w", dir, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, identityName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("target %s: write identity: %w", dir, err)
	}
	return nil
}

func newUUID() string {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // broken invariant: no entropy
	}
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func syncDir(dir string) error {
	if h := testHookSyncDir.Load(); h != nil {
		(*h)(dir)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = unix.Fsync(fd)
	unix.Close(fd)
	return err
}

// testHookSyncDir, when set (tests), sees every directory syncDir fsyncs.
var testHookSyncDir atomic.Pointer[func(dir string)]

// statfs refreshes the capacity figures.
func (t *target) statfs() error {
	var st unix.Statfs_t
	if err := unix.Statfs(t.path, &st); err != nil {
		return fmt.Errorf("target %s: statfs: %w", t.path, err)
	}
	t.totalBytes.Store(st.Blocks * uint64(st.Bsize))
	t.freeBytes.Store(st.Bavail * uint64(st.Bsize))
	t.rawFree.Store(st.Bfree * uint64(st.Bsize))
	t.fsid.Store(uint64(uint32(st.Fsid.Val[0]))<<32 | uint64(uint32(st.Fsid.Val[1])))
	t.statAt.Store(time.Now().UnixNano())
	if t.m != nil {
		t.m.free.Set(float64(st.Bavail * uint64(st.Bsize)))
		t.m.total.Set(float64(st.Blocks * uint64(st.Bsize)))
	}
	return nil
}

// availBytes is the space writes may still use: the free space less the
// reserve, below which checkSpace answers ENOSPC. It is what the server
// reports to the metadata service as the target's free space, so that
// placement, statfs of a mount (df) and strata status agree with what a
// write meets.
func (t *target) availBytes() uint64 {
	free := t.freeBytes.Load()
	if t.noReserve.Load() {
		return free
	}
	if free < t.reserve {
		return 0
	}
	return free - t.reserve
}

// reserveCheckBytes: while the cached free space exceeds reserve plus this
// margin plus the write, the cached figure (at most statfsMaxAge old) is
// trusted; closer to the limit every write measures again.
const reserveCheckBytes = 1 << 30

// checkSpace answers ENOSPC if writing n more bytes would leave less than
// the reserve free.
func (t *target) checkSpace(n int, ino uint64) error {
	if t.noReserve.Load() {
		return nil
	}
	free := t.freeBytes.Load()
	stale := time.Now().UnixNano()-t.statAt.Load() > int64(statfsMaxAge)
	if stale || free < t.reserve+uint64(n)+reserveCheckBytes {
		if err := t.statfs(); err != nil {
			return rpc.Errorf(syscall.EIO, "%v", err)
		}
		free = t.freeBytes.Load()
	}
	if free < t.reserve+uint64(n) {
		return rpc.Errorf(syscall.ENOSPC, "target %s chunk %x: no space: %d bytes free, write of %d would go below the reserve of %d bytes",
			t.path, ino, free, n, t.reserve)
	}
	return nil
}

// chunkPath returns the directory of inode ino's chunk files and their base name.
func (t *target) chunkPath(ino uint64) (dir, base string) {
	return t.fanOutDir(t.layout.dirOf(ino)), fmt.Sprintf("%016x", ino)
}

// fanOutDir is the path of fan-out directory i: chunks/XX/YY with XX = i>>8,
// YY = i&0xff.
func (t *target) fanOutDir(i uint32) string {
	return filepath.Join(t.fanOutTop(i>>8), hex2(byte(i)))
}

// fanOutTop is the path of top directory xx (chunks/XX), the parent of
// fan-out directories xx<<8 to xx<<8|0xff.
func (t *target) fanOutTop(xx uint32) string {
	return filepath.Join(t.path, chunksDir, hex2(byte(xx)))
}

// fanOutWalk walks a target's fan-out directories in order, visiting only
// those that exist: it reads each top directory (chunks/XX) once instead of
// probing its 256 subdirectories one by one.
type fanOutWalk struct {
	t       *target
	top     int       // the XX whose subdirectories present describes; -1: none
	present [256]bool // chunks/XX/YY exists
}

func newFanOutWalk(t *target) *fanOutWalk { return &fanOutWalk{t: t, top: -1} }

// next returns the first existing fan-out directory from i on, or
// fanOutDirs.
func (w *fanOutWalk) next(i uint32) uint32 {
	for ; i < fanOutDirs; i++ {
		if xx := int(i >> 8); xx != w.top {
			w.top = xx
			w.present = [256]bool{}
			ents, err := os.ReadDir(w.t.fanOutTop(uint32(xx)))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				w.present = allPresent // unreadable: let the listing report it
			}
			for _, e := range ents {
				if v, err := strconv.ParseUint(e.Name(), 16, 8); err == nil && len(e.Name()) == 2 {
					w.present[v] = true
				}
			}
		}
		if w.present[i&0xff] {
			return i
		}
	}
	return i
}

var allPresent = func() (a [256]bool) {
	for i := range a {
		a[i] = true
	}
	return a
}()

// listChunkDir appends the chunks of fan-out directory i (fanOutDir) to
// resp: one entry per inode with a data or
// sidecar file (a sidecar alone is what a remove cut short leaves), with
// the data file's size.
func (t *target) listChunkDir(i uint32, resp *rpc.ListChunksResp) error {
	ents, err := os.ReadDir(t.fanOutDir(i))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	seen := map[uint64]int{} // ino → index in resp
	for _, e := range ents {
		base, isData := strings.CutSuffix(e.Name(), ".data")
		if !isData {
			var ok bool
			if base, ok = strings.CutSuffix(e.Name(), ".sum"); !ok {
				continue
			}
		}
		ino, err := strconv.ParseUint(base, 16, 64)
		if err != nil || len(base) != 16 {
			continue
		}
		k, ok := seen[ino]
		if !ok {
			k = len(resp.Inos)
			seen[ino] = k
			resp.Inos = append(resp.Inos, ino)
			resp.Bytes = append(resp.Bytes, 0)
		}
		if isData {
			if info, err := e.Info(); err == nil {
				resp.Bytes[k] = uint64(info.Size())
			}
		}
	}
	return nil
}

func hex2(b byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}

// makeChunkDir creates the fan-out directories of dir that are missing,
// without syncing anything: their entries become durable when a chunk
// below them is synced (syncDirsOf), so a create costs no fsync and a
// chunk that was never synced may vanish with its directories in a crash.
// The lock orders a creator's mkdir before any other's finding the
// directory there, so that whoever finds it also finds it recorded.
func (t *target) makeChunkDir(dir string) error {
	top := filepath.Dir(dir)
	t.unsyncedDirs.Lock()
	defer t.unsyncedDirs.Unlock()
	for _, d := range []string{top, dir} {
		err := unix.Mkdir(d, 0o755)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return err
		}
		t.unsyncedDirs.m[filepath.Dir(d)]++
	}
	return nil
}

// createdIn records that a chunk file was created in dir.
func (t *target) createdIn(dir string) {
	t.unsyncedDirs.Lock()
	t.unsyncedDirs.m[dir]++
	t.unsyncedDirs.Unlock()
}

// syncDirsOf makes durable the entries that lead to chunk directory dir:
// it fsyncs dir, its fan-out parent and chunks/ if this process changed
// them since their last fsync. A directory changed again while its fsync
// ran stays recorded (that change may have missed the fsync).
func (t *target) syncDirsOf(dir string) error {
	top := filepath.Dir(dir)
	for _, d := range []string{dir, top, filepath.Dir(top)} {
		t.unsyncedDirs.Lock()
		n, ok := t.unsyncedDirs.m[d]
		t.unsyncedDirs.Unlock()
		if !ok {
			continue
		}
		if err := syncDir(d); err != nil {
			return err
		}
		t.unsyncedDirs.Lock()
		if t.unsyncedDirs.m[d] == n {
			delete(t.unsyncedDirs.m, d)
		}
		t.unsyncedDirs.Unlock()
	}
	return nil
}

func (t *target) markOurs(ino uint64) {
	t.ours.Lock()
	t.ours.m[ino] = struct{}{}
	t.ours.Unlock()
}

// forgetOurs is called when the chunk is synced (and clean) or removed:
// it drops the chunk from ours and from the unsynced record.
func (t *target) forgetOurs(ino uint64) {
	t.ours.Lock()
	delete(t.ours.m, ino)
	t.ours.Unlock()
	t.noteSynced(ino)
}

func (t *target) isOurs(ino uint64) bool {
	t.ours.Lock()
	_, ok := t.ours.m[ino]
	t.ours.Unlock()
	return ok
}

func (t *target) oursList() []uint64 {
	t.ours.Lock()
	defer t.ours.Unlock()
	out := make([]uint64, 0, len(t.ours.m))
	for ino := range t.ours.m {
		out = append(out, ino)
	}
	return out
}
