package nfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rounds"
	"github.com/stratafs/strata/internal/rpc"
)

// Program numbers and versions served (RFC 1813; NLM and NSM: nlm.go).
const (
	nfsProgram   = 100003
	nfsVersion   = 3
	mountProgram = 100005
	mountVersion = 3
)

// maxIOBytes is rtmax and wtmax (FSINFO): the most one READ or WRITE moves.
const maxIOBytes = 1 << 20

// Config configures a Server.
type Config struct {
	// Exports are the exported directories; MNT names one by its Path.
	Exports []Export
	// ClusterKey is the cluster's key: handles carry an id derived from it.
	ClusterKey []byte
	// IdleFileTimeout: a file READ or WRITE has not touched for this long
	// is released (its writes flushed, its size committed).
	IdleFileTimeout time.Duration
	// MaxOpenFiles bounds the files kept open between calls.
	MaxOpenFiles int
	// NLMGrace is the lock manager's grace period after the gateway
	// starts: only reclaims of locks (a client's after its server
	// restarted or failed over) are granted until it ends.
	NLMGrace time.Duration
	// NLMPortmapPort is the port of a client host's port mapper, asked
	// where the client's lock manager (GRANTED callbacks) and status
	// monitor (SM_NOTIFY at a restart) listen.
	NLMPortmapPort uint16
	// NLMStateDir keeps the client hosts that took locks (as rpc.statd's
	// /var/lib/nfs/sm): at the next start each is told (SM_NOTIFY) so
	// that it reclaims its locks. Empty: no list, nobody told.
	NLMStateDir string
	// NLMName is the gateway's host name in SM_NOTIFY (the name clients
	// mount it by; default: the host name).
	NLMName string
	// AttrTimeout is how long READ, WRITE and COMMIT may check permissions
	// and bound reads with attributes the metadata service answered
	// earlier (attrcache.go); 0 asks it on every call. A change made
	// elsewhere shows in them within this time, as on a FUSE mount.
	AttrTimeout time.Duration
	// RPC configures the ONC RPC layer (record size, connections).
	RPC oncrpc.Config
	Log *slog.Logger
}

// DefaultConfig returns the defaults; Exports and ClusterKey must be set.
func DefaultConfig() Config {
	return Config{
		IdleFileTimeout: 5 * time.Second,
		MaxOpenFiles:    4096,
		NLMGrace:        45 * time.Second,
		NLMPortmapPort:  111,
		AttrTimeout:     time.Second,
		RPC:             oncrpc.DefaultConfig(),
		Log:             slog.Default(),
	}
}

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Exports) == 0 {
		errs = append(errs, errors.New("no export"))
	}
	seen := map[uint64]string{}
	for _, e := range c.Exports {
		if other, dup := seen[e.id()]; dup {
			errs = append(errs, fmt.Errorf("export %s given twice (or its id collides with %s)", e.Path, other))
		}
		seen[e.id()] = e.Path
	}
	if len(c.ClusterKey) == 0 {
		errs = append(errs, errors.New("no cluster key"))
	}
	if c.NLMGrace < 0 {
		errs = append(errs, errors.New("NLMGrace must not be negative"))
	}
	if c.NLMPortmapPort == 0 {
		errs = append(errs, errors.New("NLMPortmapPort must be set (111)"))
	}
	if c.AttrTimeout < 0 {
		errs = append(errs, errors.New("AttrTimeout must not be negative"))
	}
	if c.IdleFileTimeout <= 0 {
		errs = append(errs, errors.New("IdleFileTimeout must be positive"))
	}
	if c.RPC.MaxInFlight < 1 || c.RPC.MaxCalls < 1 || c.RPC.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("RPC.MaxInFlight %d, MaxCalls %d, MaxConns %d: each must be at least 1", c.RPC.MaxInFlight, c.RPC.MaxCalls, c.RPC.MaxConns))
	}
	if c.RPC.MaxRecordBytes < maxIOBytes+4096 {
		errs = append(errs, fmt.Errorf("RPC.MaxRecordBytes %d: must hold a WRITE of %d bytes and its headers", c.RPC.MaxRecordBytes, maxIOBytes))
	}
	return errors.Join(errs...)
}

// Server is the NFS gateway: NFS v3 and MOUNT v3 on one port, every
// operation through a client.Client as the caller's (squashed) identity.
type Server struct {
	cfg       Config
	c         *client.Client
	log       *slog.Logger
	clusterID uint64
	exports   map[uint64]*Export // by Export.id
	byPath    map[string]*Export
	// verifier is the write verifier (WRITE, COMMIT) and the readdir
	// cookie verifier: new at every start, so that a client resends the
	// UNSTABLE writes a restarted gateway may have lost (RFC 1813 3.3.7).
	verifier [8]byte
	files    *openFiles
	// metaSyncs is the group commit of sync exports' namespace changes
	// (durable).
	metaSyncs rounds.Rounds[struct{}]
	attrs     *attrCache
	cookies   *cookieTable
	rpc       *oncrpc.Server
	nlm       *nlm
	// notify: the hosts to tell of the restart, once serving.
	notify     map[string]monitored
	notifyOnce sync.Once
	metrics    *metrics
	reporter   reporter
	addr       atomic.Pointer[string] // where Serve listens (the heartbeat's report)
	mu         struct {
		sync.Mutex
		mounts map[mountKey]struct{} // MNT'ed (host, path) pairs: DUMP
		roots  map[uint64]uint64     // export id -> its root inode, once MNT'ed
	}
}

type mountKey struct{ host, path string }

// New returns a gateway serving cfg.Exports through c (which the caller
// keeps and closes after Close).
func New(c *client.Client, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("nfs: %w", err)
	}
	s := &Server{cfg: cfg, c: c, log: cfg.Log, clusterID: clusterIDOf(cfg.ClusterKey),
		exports: map[uint64]*Export{}, byPath: map[string]*Export{}}
	for i := range cfg.Exports {
		e := &cfg.Exports[i]
		s.exports[e.id()] = e
		s.byPath[e.Path] = e
	}
	binary.BigEndian.PutUint64(s.verifier[:], uint64(time.Now().UnixNano()))
	if _, err := rand.Read(s.verifier[4:]); err != nil {
		return nil, fmt.Errorf("nfs: write verifier: %w", err)
	}
	s.mu.mounts = map[mountKey]struct{}{}
	s.mu.roots = map[uint64]uint64{}
	s.files = newOpenFiles(c, s.log, cfg.IdleFileTimeout, cfg.MaxOpenFiles)
	s.attrs = newAttrCache(cfg.AttrTimeout)
	s.cookies = newCookieTable(cookieBatches)
	rpcCfg := cfg.RPC
	rpcCfg.Log = s.log
	m, err := newMetrics(c.Registry())
	if err != nil {
		return nil, err
	}
	s.metrics = m
	var notify map[string]monitored
	if s.nlm, notify, err = newNLM(s, &cfg); err != nil {
		m.close()
		s.files.close()
		return nil, err
	}
	s.notify = notify
	s.rpc = oncrpc.NewServer(rpcCfg, m.count(s.nfsProgram(), "", nfsProcNames[:]), m.count(s.mountProgram(), "mount_", mountProcNames[:]),
		m.count(s.nlm.program(), "nlm_", nlmProcNames[:]), m.count(s.nlm.nsmProgram(), "nsm_", nsmProcNames[:]))
	// The session's heartbeats carry the gateway's exports, clients and
	// calls to the metadata service, for strata status.
	c.SetGatewayReport(func() *rpc.GatewayReport { return s.report(time.Now()) })
	return s, nil
}

// Serve answers calls on ln until Close: NFS, MOUNT, NLM and NSM alike.
// The first call tells the client hosts that held locks before the
// restart (when NLMStateDir keeps them) to reclaim them.
func (s *Server) Serve(ln net.Listener) error {
	a := ln.Addr().String()
	s.addr.Store(&a)
	return s.ServeNLM(ln)
}

// ServeNLM is Serve on another listener (--nlm-port's own): the same
// programs, but not the address the gateway reports.
func (s *Server) ServeNLM(ln net.Listener) error {
	s.notifyOnce.Do(func() { s.nlm.notifyAll(s.notify) })
	return s.rpc.Serve(ln)
}

// BeginGrace starts the lock manager's grace period again (Config.NLMGrace):
// the gateway of an HA pair calls it when it becomes the active one, so
// that the clients that locked through the other gateway reclaim their
// locks before anybody else gets them.
func (s *Server) BeginGrace() { s.nlm.beginGrace() }

// Close stops serving, then releases the open files (flushing their
// writes, fsyncing those with UNSTABLE writes). Locks taken over NLM stay
// with the gateway's client session (its Close releases them).
func (s *Server) Close() error {
	s.c.SetGatewayReport(nil)
	s.rpc.Close()
	s.nlm.close()
	s.files.close()
	s.metrics.close()
	return nil
}

// Verifier is the current write verifier.
func (s *Server) Verifier() [8]byte { return s.verifier }

// serve adapts a typed procedure to oncrpc: decode the arguments (garbage
// is GARBAGE_ARGS), run fn, encode its results.
func serve[A, R any, PA, PR xdr.XdrType](argx func(*A) PA, resx func(*R) PR, fn func(context.Context, *oncrpc.Call, *A) *R) oncrpc.Proc {
	return serveRelease(argx, resx, func(ctx context.Context, call *oncrpc.Call, a *A) (*R, func()) {
		return fn(ctx, call, a), nil
	})
}

// serveRelease is serve for a procedure whose results use memory it gives
// back (release, when not nil) once they are sent. Results whose last
// field is bulk data (READ's: SplitData) are encoded without it, and the
// data is sent after them from its own memory (oncrpc's Call.SetTail),
// not copied into the reply.
func serveRelease[A, R any, PA, PR xdr.XdrType](argx func(*A) PA, resx func(*R) PR, fn func(context.Context, *oncrpc.Call, *A) (*R, func())) oncrpc.Proc {
	return func(ctx context.Context, call *oncrpc.Call, args []byte, res *bytes.Buffer) error {
		var a A
		if _, err := xdr.Decode(args, argx(&a)); err != nil {
			return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
		}
		r, release := fn(ctx, call, &a)
		var data []byte
		if sp, ok := any(r).(interface{ SplitData() []byte }); ok {
			data = sp.SplitData()
		}
		if data == nil {
			if release != nil {
				defer release()
			}
			return xdr.Encode(res, resx(r))
		}
		if err := xdr.Encode(res, resx(r)); err != nil {
			if release != nil {
				release()
			}
			return err
		}
		call.SetTail(release, data, xdr.EndData(res.Bytes(), data))
		return nil
	}
}

// serveVoid adapts a procedure without results.
func serveVoid[A any, PA xdr.XdrType](argx func(*A) PA, fn func(context.Context, *oncrpc.Call, *A)) oncrpc.Proc {
	return func(ctx context.Context, call *oncrpc.Call, args []byte, res *bytes.Buffer) error {
		var a A
		if _, err := xdr.Decode(args, argx(&a)); err != nil {
			return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
		}
		fn(ctx, call, &a)
		return nil
	}
}

// nullProc answers a NULL procedure (no arguments, no results).
func nullProc(context.Context, *oncrpc.Call, []byte, *bytes.Buffer) error { return nil }

// target is what a handle names, checked for the caller.
type target struct {
	ino  uint64
	exp  *Export
	cred cred
}

// resolve checks a handle and the caller's right to use its export, and
// returns the inode and the caller's identity for it.
func (s *Server) resolve(call *oncrpc.Call, fh *xdr.Nfs_fh3) (target, error) {
	h, ok := decodeHandle(fh.Data)
	if !ok {
		return target{}, errStatus(xdr.NFS3ERR_BADHANDLE)
	}
	if h.cluster != s.clusterID {
		return target{}, errStatus(xdr.NFS3ERR_STALE)
	}
	e := s.exports[h.export]
	if e == nil {
		return target{}, errStatus(xdr.NFS3ERR_STALE)
	}
	if !e.allows(call.Remote) {
		return target{}, errStatus(xdr.NFS3ERR_ACCES)
	}
	return target{ino: h.ino, exp: e, cred: e.credOf(&call.Cred)}, nil
}

func (s *Server) handleOf(e *Export, ino uint64) []byte {
	return handle{cluster: s.clusterID, export: e.id(), ino: ino}.encode()
}
