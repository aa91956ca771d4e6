package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Server is a running storage server: its targets, the data-path rpc
// server, and (with a metadata address) the registration loop.
type Server struct {
	cfg     Config
	log     *slog.Logger
	targets []*target // in Config.Targets order
	byID    atomic.Pointer[map[uint32]*target]
	cache   *chunkCache
	m       *metrics
	heal    *healer // self-healing of mirror group chunks (heal.go)

	rpc     *transport.Server
	ln      net.Listener
	addr    string // advertised
	metrics *http.Server
	metLn   net.Listener

	stop      chan struct{} // closed by Close
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// registered is closed after the first successful registration.
	registered chan struct{}
	regErr     atomic.Pointer[error] // the last registration's outcome
	regOnce    sync.Once
	serverID   atomic.Uint32

	// Mirror groups (mirror.go, forward.go, resync.go): the group map,
	// the metadata service's caller (registration, heartbeats, reports;
	// nil standalone), pooled clients of other stores, the primary's
	// per-chunk ordering locks and per-group gates, forwards and degrade and
	// primary-failed reports in flight, resyncs running, and the mirror
	// metrics.
	groups *groupMap
	meta   *transport.Multi
	peers  struct {
		sync.Mutex
		m map[string]*transport.Client
	}
	order    orderLocks
	forwards inflightForwards
	gates    struct {
		sync.Mutex
		m map[uint32]*sync.RWMutex
	}
	degrading struct {
		sync.Mutex
		m map[flightKey]*reportFlight
	}
	resyncs struct {
		sync.Mutex
		m map[uint32]*resyncRun
	}
	mm *mirrorMetrics
}

// Open formats (on first use) and opens the targets, starts serving on
// cfg.ListenAddr and, when cfg.MetaAddr is set, registers with the metadata
// service in the background. Open waits at most registerWait for the first
// registration; if the metadata service is down it returns anyway and
// keeps trying.
func Open(cfg Config) (*Server, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("store config: %w", err)
	}
	cfg.MetaAddrs, _ = transport.AddrsOf(cfg.MetaAddrs, cfg.MetaAddr) // checked by Validate
	cfg.MetaAddr = strings.Join(cfg.MetaAddrs, ",")
	s := &Server{
		cfg:        cfg,
		log:        slog.Default().With("pkg", "store"),
		m:          newMetrics(),
		stop:       make(chan struct{}),
		registered: make(chan struct{}),
		groups:     newGroupMap(),
	}
	s.peers.m = map[string]*transport.Client{}
	s.mm = newMirrorMetrics(s.m.reg)
	s.groups.changed = s.groupsChanged
	s.groups.log = s.log
	s.cache = newChunkCache(s, cfg.MaxOpenChunks)
	s.heal = newHealer(s)
	s.setPeerFinder(s.groups)
	ok := false
	defer func() {
		if !ok {
			s.closeTargets()
		}
	}()
	uuids := map[string]string{}
	for _, dir := range cfg.Targets {
		t, err := openTarget(dir, cfg.ReserveBytes)
		if err != nil {
			return nil, err
		}
		s.targets = append(s.targets, t)
		if prev, dup := uuids[t.uuid]; dup {
			return nil, fmt.Errorf("targets %s and %s are the same target (uuid %s)", prev, dir, t.uuid)
		}
		uuids[t.uuid] = dir
		t.m = s.m.forTarget(dir)
		_ = t.statfs() // publish the gauges
	}
	ids := map[uint32]*target{}
	for i, t := range s.targets {
		if cfg.MetaAddr == "" {
			t.id.Store(uint32(i + 1))
		}
		if id := t.id.Load(); id != 0 {
			ids[id] = t
		}
	}
	s.byID.Store(&ids)
	s.m.reg.MustRegister(newUnsyncedCollector(s))

	s.rpc = transport.NewServer(cfg.ClusterKey)
	s.rpc.TLS = cfg.TLS
	s.rpc.Observe = s.m.observe
	s.register()
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("store: listen on %s: %w", cfg.ListenAddr, err)
	}
	s.ln = ln
	s.addr = advertiseAddr(cfg.AdvertiseAddr, ln.Addr().String())
	if cfg.MetricsAddr != "" {
		hs, mln, err := s.m.serve(cfg.MetricsAddr, s.log)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("store: metrics listen on %s: %w", cfg.MetricsAddr, err)
		}
		s.metrics, s.metLn = hs, mln
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.rpc.Serve(ln); err != nil {
			s.log.Error("data path stopped serving", "addr", ln.Addr().String(), "err", err)
		}
	}()
	ok = true
	if cfg.SyncInterval > 0 {
		for _, t := range s.targets {
			s.wg.Add(1)
			go s.syncLoop(t)
		}
	}
	paths := make([]string, len(s.targets))
	for i, t := range s.targets {
		paths[i] = t.path
	}
	s.log.Info("storage server serving", "listen", ln.Addr().String(), "advertise", s.addr, "targets", paths, "meta", cfg.MetaAddr,
		"sync_interval", cfg.SyncInterval)
	if cfg.MetaAddr != "" {
		s.meta = transport.NewMulti(s.cfg.MetaAddrs, transport.MultiConfig{
			ClientConfig:   transport.ClientConfig{Key: s.cfg.ClusterKey, TLS: s.cfg.TLS, Conns: 1, CallTimeout: callTimeout},
			AttemptTimeout: attemptTimeout,
		})
		s.wg.Add(1)
		go s.registrationLoop()
		select {
		case <-s.registered:
		case <-time.After(registerWait):
			if err := s.Refused(); err != nil {
				s.log.Error("metadata service refuses a target", "meta", cfg.MetaAddr, "err", err)
			} else {
				s.log.Warn("metadata service not reachable yet; serving known targets and registering in the background", "meta", cfg.MetaAddr)
			}
		}
	}
	return s, nil
}

// registerWait bounds how long Open waits for the first registration.
const registerWait = 2 * time.Second

// advertiseAddr picks the address clients dial.
func advertiseAddr(configured, listened string) string {
	if configured != "" {
		return configured
	}
	host, port, err := net.SplitHostPort(listened)
	if err != nil {
		return listened
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			return net.JoinHostPort(h, port)
		}
	}
	return listened
}

// Addr is the address clients dial (the advertised address).
func (s *Server) Addr() string { return s.addr }

// MetricsAddr is the address of the /metrics endpoint ("" without one).
func (s *Server) MetricsAddr() string {
	if s.metLn == nil {
		return ""
	}
	return s.metLn.Addr().String()
}

// TargetIDs returns the ids of the targets this server serves, in
// configuration order: 1..n standalone; with a metadata service the ids it
// assigned (from the last registration, or remembered from the previous
// run until then). Targets without an id yet are left out.
func (s *Server) TargetIDs() []uint32 {
	var out []uint32
	for _, t := range s.targets {
		if id := t.id.Load(); id != 0 {
			out = append(out, id)
		}
	}
	return out
}

// TargetUUIDs returns the targets' identities, in configuration order.
func (s *Server) TargetUUIDs() []string {
	out := make([]string, len(s.targets))
	for i, t := range s.targets {
		out[i] = t.uuid
	}
	return out
}

// Refused is the error of the last registration attempt when the
// metadata service refused a target as another file system's (EXDEV), a
// refusal that retrying does not change; nil otherwise.
func (s *Server) Refused() error {
	if p := s.regErr.Load(); p != nil && errors.Is(*p, syscall.EXDEV) {
		return *p
	}
	return nil
}

// WaitRegistered waits until the server has registered with the metadata
// service at least once.
func (s *Server) WaitRegistered(ctx context.Context) error {
	select {
	case <-s.registered:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return errors.New("store: server closed")
	}
}

// Close stops serving and the background sync rounds, makes every chunk
// written since its last sync durable and marks it clean, logs one line
// saying how many chunks and bytes that took, and releases the targets.
// Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close(true) })
	return s.closeErr
}

func (s *Server) close(syncAll bool) error {
	close(s.stop)
	s.rpc.Close() // waits for handlers in flight
	s.heal.close()
	if s.metrics != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.metrics.Shutdown(ctx)
		cancel()
	}
	s.wg.Wait()
	s.closePeers()
	if s.meta != nil {
		s.meta.Close()
	}
	var left rpc.TargetUnsynced
	for _, t := range s.targets {
		f := t.unsyncedFigures(time.Now())
		left.Chunks += f.Chunks
		left.Bytes += f.Bytes
		left.OldestMs = max(left.OldestMs, f.OldestMs)
	}
	var errs []error
	open := s.cache.drain()
	if syncAll {
		// Open chunks, then those closed dirty earlier (reopened): the
		// same concurrent syncs as a background round.
		if _, err := syncChunks(open); err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range open {
		c.closeFiles()
	}
	if syncAll {
		for _, t := range s.targets {
			if _, _, err := s.syncInos(t, t.oursList(), nil, true); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.closeTargets()
	if err := errors.Join(errs...); err != nil {
		s.log.Error("storage server closed with errors", "err", err)
		return err
	}
	if syncAll {
		s.log.Info("storage server closed: synced the chunks written since their last sync", "addr", s.addr,
			"chunks", left.Chunks, "bytes", left.Bytes, "oldest_seconds", float64(left.OldestMs)/1000)
	} else {
		s.log.Info("storage server closed", "addr", s.addr)
	}
	return nil
}

func (s *Server) closeTargets() {
	for _, t := range s.targets {
		t.close()
	}
}

// register installs the rpc handlers.
func (s *Server) register() {
	transport.Handle(s.rpc, rpc.SWrite, s.handleWrite)
	transport.Handle(s.rpc, rpc.SRead, s.handleRead)
	transport.Handle(s.rpc, rpc.STruncate, s.handleTruncate)
	transport.Handle(s.rpc, rpc.SPunch, s.handlePunch)
	transport.Handle(s.rpc, rpc.SSync, s.handleSync)
	transport.Handle(s.rpc, rpc.SRemove, s.handleRemove)
	transport.Handle(s.rpc, rpc.SRemoveMany, s.handleRemoveMany)
	transport.Handle(s.rpc, rpc.SChunkStat, s.handleChunkStat)
	transport.Handle(s.rpc, rpc.SListChunks, s.handleListChunks)
	transport.Handle(s.rpc, rpc.SSeek, s.handleSeek)
	transport.Handle(s.rpc, rpc.SSyncStat, s.handleSyncStat)
	transport.Handle(s.rpc, rpc.SScrub, s.handleScrub)
	transport.Handle(s.rpc, rpc.SChunkSums, s.handleChunkSums)
	transport.Handle(s.rpc, rpc.SMirrorSuspects, s.handleMirrorSuspects)
}

// target resolves a target id.
func (s *Server) target(id uint32, ino uint64) (*target, error) {
	if t := (*s.byID.Load())[id]; t != nil {
		return t, nil
	}
	return nil, rpc.Errorf(syscall.ENOENT, "target %d chunk %x: target %d is not served by storage server %s (known: %v)",
		id, ino, id, s.addr, s.TargetIDs())
}

// checkRange rejects offsets and lengths outside [0, maxChunkBytes].
func checkRange(t *target, ino uint64, off, n uint64, what string) error {
	if off > maxChunkBytes || n > maxChunkBytes || off+n > maxChunkBytes {
		return rpc.Errorf(syscall.EINVAL, "target %s chunk %x: %s at offset %d length %d beyond the chunk limit of %d bytes",
			t.path, ino, what, off, n, uint64(maxChunkBytes))
	}
	return nil
}

// checkGrowth rejects a write or truncate that would make a chunk longer
// than layout.MaxChunkBytes (EFBIG), before anything is written: every
// target's file system holds a chunk that long (checkMaxFile), and clients
// never ask for more (layout.MaxFileSize). Chunks already longer (made on
// a larger file system before the limit) stay readable.
func checkGrowth(t *target, ino uint64, end uint64, what string) error {
	if end > layout.MaxChunkBytes {
		return rpc.Errorf(syscall.EFBIG, "target %s chunk %x: %s to %d bytes past the chunk limit of %d bytes",
			t.path, ino, what, end, uint64(layout.MaxChunkBytes))
	}
	return nil
}

// maxRetries bounds the lookups of a chunk that is removed concurrently.
const maxRetries = 3

// handleWrite writes and answers the chunk's space after the write (an
// fstat of its open data file, as SChunkStat answers it), so that the
// writer's size commit need not ask for it.
func (s *Server) handleWrite(ctx context.Context, r *rpc.WriteReq) (*rpc.WriteResp, error) {
	if rpc.IsGroup(r.Chunk.Target) {
		return s.groupWrite(ctx, r)
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	if err := checkRange(t, r.Chunk.Ino, r.Off, uint64(len(r.Data)), "write"); err != nil {
		return nil, err
	}
	if err := checkGrowth(t, r.Chunk.Ino, r.Off+uint64(len(r.Data)), "write"); err != nil {
		return nil, err
	}
	if len(r.Data) > 0 {
		if err := t.checkSpace(len(r.Data), r.Chunk.Ino); err != nil {
			return nil, err
		}
	}
	for i := 0; ; i++ {
		c, err := s.cache.get(t, r.Chunk.Ino, true)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			// The caller gave up (an in-process caller's lent bytes may
			// already serve another request): write nothing.
			s.cache.release(c)
			return nil, rpc.Errorf(syscall.EIO, "target %s chunk %x: write abandoned by its caller: %v", t.path, r.Chunk.Ino, err)
		}
		err = c.write(ctx, s, int64(r.Off), r.Data)
		if err == nil && r.Sync {
			err = c.sync()
		}
		var resp rpc.WriteResp
		if err == nil {
			// The write is done: a failed fstat only leaves the space
			// unknown (the writer then asks with SChunkStat).
			a, serr := c.alloc()
			resp.Alloc, resp.HasAlloc = a, serr == nil
		}
		s.cache.release(c)
		if errors.Is(err, errRemoved) && i < maxRetries {
			continue
		}
		if err != nil {
			return nil, s.failed(err)
		}
		t.m.writeOps.Inc()
		t.m.writeBytes.Add(float64(len(r.Data)))
		return &resp, nil
	}
}

func (s *Server) handleRead(ctx context.Context, r *rpc.ReadReq) (*readResp, error) {
	group := r.Chunk.Target // kept for healRead: admission names the local target instead
	if err := s.groupRead(ctx, &r.Chunk); err != nil {
		return nil, err
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	if r.Len > maxIOBytes {
		return nil, rpc.Errorf(syscall.EINVAL, "target %s chunk %x: read of %d bytes exceeds the limit of %d", t.path, r.Chunk.Ino, r.Len, maxIOBytes)
	}
	if err := checkRange(t, r.Chunk.Ino, r.Off, uint64(r.Len), "read"); err != nil {
		return nil, err
	}
	c, err := s.cache.get(t, r.Chunk.Ino, false)
	if errors.Is(err, errNotExist) {
		t.m.readOps.Inc()
		return &readResp{}, nil // an absent chunk has length 0
	}
	if err != nil {
		return nil, s.failed(err)
	}
	failpoint.Hit("store/before-read") // a stalled disk, for the callers' bounds
	dest := transport.LocalReadDest(ctx)
	resp, err := c.read(s, int64(r.Off), int(r.Len), dest)
	if err != nil && rpc.IsGroup(group) {
		resp, err = s.healRead(ctx, c, group, r, dest, err)
	}
	s.cache.release(c)
	if err != nil {
		return nil, s.failed(err)
	}
	t.m.readOps.Inc()
	t.m.readBytes.Add(float64(len(resp.Data)))
	return resp, nil
}

func (s *Server) handleTruncate(ctx context.Context, r *rpc.TruncateReq) (*rpc.Empty, error) {
	if rpc.IsGroup(r.Chunk.Target) {
		return s.groupTruncate(ctx, r)
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	if err := checkRange(t, r.Chunk.Ino, r.Size, 0, "truncate"); err != nil {
		return nil, err
	}
	if err := checkGrowth(t, r.Chunk.Ino, r.Size, "truncate"); err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		c, err := s.cache.get(t, r.Chunk.Ino, r.Size > 0)
		if errors.Is(err, errNotExist) {
			return &rpc.Empty{}, nil // size 0 of an absent chunk: nothing to do
		}
		if err != nil {
			return nil, s.failed(err)
		}
		err = c.truncate(s, int64(r.Size))
		s.cache.release(c)
		if errors.Is(err, errRemoved) && i < maxRetries {
			continue
		}
		if err != nil {
			return nil, s.failed(err)
		}
		return &rpc.Empty{}, nil
	}
}

func (s *Server) handlePunch(ctx context.Context, r *rpc.PunchReq) (*rpc.Empty, error) {
	if rpc.IsGroup(r.Chunk.Target) {
		return s.groupPunch(ctx, r)
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	if err := checkRange(t, r.Chunk.Ino, r.Off, r.Len, "punch"); err != nil {
		return nil, err
	}
	if r.Len == 0 {
		return &rpc.Empty{}, nil
	}
	c, err := s.cache.get(t, r.Chunk.Ino, false)
	if errors.Is(err, errNotExist) {
		return &rpc.Empty{}, nil // reads as zeros already
	}
	if err != nil {
		return nil, s.failed(err)
	}
	err = c.punch(s, int64(r.Off), int64(r.Len))
	s.cache.release(c)
	if err != nil && !errors.Is(err, errRemoved) {
		return nil, s.failed(err)
	}
	return &rpc.Empty{}, nil
}

func (s *Server) handleSync(ctx context.Context, r *rpc.ChunkReq) (*rpc.Empty, error) {
	if rpc.IsGroup(r.Chunk.Target) {
		if _, err := s.groupSyncStat(ctx, r, false); err != nil {
			return nil, err
		}
		return &rpc.Empty{}, nil
	}
	if _, err := s.syncStat(r, true, false); err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}

// handleSyncStat syncs a chunk and answers its stat, as handleSync and
// then handleChunkStat would.
func (s *Server) handleSyncStat(ctx context.Context, r *rpc.ChunkReq) (*rpc.ChunkStatResp, error) {
	if rpc.IsGroup(r.Chunk.Target) {
		return s.groupSyncStat(ctx, r, true)
	}
	return s.syncStat(r, true, true)
}

// syncStat puts a chunk's data on stable storage when sync is set and
// answers its length and space when stat is (an absent chunk: none).
func (s *Server) syncStat(r *rpc.ChunkReq, sync, stat bool) (*rpc.ChunkStatResp, error) {
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	// A chunk that is not open may still be dirty: closed by eviction, or
	// left by a process that was killed (whose writes may sit unsynced in
	// the page cache). Opening it recovers it (which syncs) or finds it
	// clean; a clean chunk on disk is durable by the flag's invariant.
	c, err := s.cache.get(t, r.Chunk.Ino, false)
	if errors.Is(err, errNotExist) {
		return &rpc.ChunkStatResp{HasAlloc: true}, nil
	}
	if err != nil {
		return nil, s.failed(err)
	}
	defer s.cache.release(c)
	if sync {
		if err := c.sync(); err != nil {
			return nil, s.failed(err)
		}
	}
	if !stat {
		return nil, nil
	}
	return s.chunkStat(c)
}

func (s *Server) handleRemove(ctx context.Context, r *rpc.ChunkReq) (*rpc.Empty, error) {
	if rpc.IsGroup(r.Chunk.Target) {
		return s.groupRemove(ctx, r)
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	if c := s.cache.lookup(t, r.Chunk.Ino); c != nil {
		s.cache.forget(c)
		err = c.remove()
		s.cache.release(c)
	} else {
		err = removeChunkFiles(t, r.Chunk.Ino)
	}
	if err != nil {
		return nil, s.failed(err)
	}
	return &rpc.Empty{}, nil
}

func (s *Server) handleChunkStat(ctx context.Context, r *rpc.ChunkReq) (*rpc.ChunkStatResp, error) {
	if err := s.groupRead(ctx, &r.Chunk); err != nil {
		return nil, err
	}
	return s.syncStat(r, false, true)
}

// chunkStat answers an open chunk's length and the space its data takes.
func (s *Server) chunkStat(c *chunk) (*rpc.ChunkStatResp, error) {
	size := c.size.Load()
	alloc, err := c.alloc()
	if err != nil {
		return nil, s.failed(err)
	}
	return &rpc.ChunkStatResp{Size: uint64(size), Exists: true, Alloc: alloc, HasAlloc: true}, nil
}

// alloc is the space (bytes) an open chunk's data file takes on disk: one
// fstat, no sync.
func (c *chunk) alloc() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(c.dataFd, &st); err != nil {
		return 0, c.ioErr("stat data file", 0, err)
	}
	return uint64(st.Blocks) * 512, nil
}

// handleSeek answers lseek's SEEK_DATA or SEEK_HOLE on a chunk file. A
// chunk that does not exist is all hole; so is everything past its end,
// which counts from the end of its last block (the bytes after the last
// write in that block are there, as zeros, as in a local file's last
// block).
func (s *Server) handleSeek(ctx context.Context, r *rpc.SeekReq) (*rpc.SeekResp, error) {
	if err := s.groupRead(ctx, &r.Chunk); err != nil {
		return nil, err
	}
	t, err := s.target(r.Chunk.Target, r.Chunk.Ino)
	if err != nil {
		return nil, err
	}
	if err := checkRange(t, r.Chunk.Ino, r.Off, 0, "seek"); err != nil {
		return nil, err
	}
	hole := &rpc.SeekResp{Off: r.Off, Found: !r.Data} // what a missing chunk or its end answers
	c, err := s.cache.get(t, r.Chunk.Ino, false)
	if errors.Is(err, errNotExist) {
		return hole, nil
	}
	if err != nil {
		return nil, s.failed(err)
	}
	defer s.cache.release(c)
	size := c.size.Load()
	end := blocks(size) << blockShift
	off := int64(r.Off)
	switch {
	case off >= end:
		return hole, nil
	case off >= size: // in the last block, after the last byte written
		if r.Data {
			return &rpc.SeekResp{Off: r.Off, Found: true}, nil
		}
		return &rpc.SeekResp{Off: uint64(end), Found: true}, nil
	}
	whence := unix.SEEK_HOLE
	if r.Data {
		whence = unix.SEEK_DATA
	}
	n, err := unix.Seek(c.dataFd, off, whence)
	switch {
	case errors.Is(err, unix.ENXIO): // no data after off (a hole runs to the end)
		return hole, nil
	case err != nil:
		return nil, s.failed(c.ioErr("seek", off, err))
	case r.Data && n >= size:
		return hole, nil
	case !r.Data && n >= size:
		n = end
	}
	return &rpc.SeekResp{Off: uint64(n), Found: true}, nil
}

// fanOutDirs is the number of chunk directories of a target
// (chunks/XX/YY).
const fanOutDirs = 1 << 16

func (s *Server) handleListChunks(ctx context.Context, r *rpc.ListChunksReq) (*rpc.ListChunksResp, error) {
	t, err := s.target(r.Target, 0)
	if err != nil {
		return nil, err
	}
	resp := &rpc.ListChunksResp{Next: r.From}
	walk := newFanOutWalk(t)
	for resp.Next = walk.next(resp.Next); resp.Next < fanOutDirs && len(resp.Inos) < int(max(r.Max, 1)); resp.Next = walk.next(resp.Next + 1) {
		if err := ctx.Err(); err != nil {
			return nil, rpc.Errorf(syscall.ETIMEDOUT, "list chunks of target %s: %v", t.path, err)
		}
		if err := t.listChunkDir(resp.Next, resp); err != nil {
			return nil, s.failed(rpc.Errorf(syscall.EIO, "list chunks of target %s: %v", t.path, err))
		}
	}
	resp.Done = resp.Next >= fanOutDirs
	return resp, nil
}

// failed logs disk-level failures (not the routine ENOSPC) before they are
// answered, so an operator sees which target misbehaves.
func (s *Server) failed(err error) error {
	switch rpc.ErrnoOf(err) {
	case syscall.ENOSPC, syscall.EINVAL, syscall.ENOENT:
	default:
		var re *rpc.Error
		if !errors.As(err, &re) || re.Errno != syscall.EIO || !isChecksumErr(re) {
			s.log.Error("storage request failed", "err", err)
		}
	}
	if errors.Is(err, errRemoved) {
		return rpc.Errorf(syscall.EAGAIN, "chunk removed concurrently: %v", err)
	}
	return err
}

// isChecksumErr tells checksum mismatches (already logged in detail) from
// other EIO.
func isChecksumErr(e *rpc.Error) bool { return strings.Contains(e.Msg, "checksum mismatch") }
