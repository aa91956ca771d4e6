package oncrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// Cred is a call's credential as the program sees it: AUTH_SYS's uid, gid
// and supplementary groups, or, for AUTH_NONE, Flavor AUTH_NONE and the
// ids left to the program (the NFS gateway maps it to the anonymous user).
type Cred struct {
	Flavor  xdr.Auth_flavor
	UID     uint32
	GID     uint32
	GIDs    []uint32
	Machine string
}

// Call is one decoded call header.
type Call struct {
	Xid              uint32
	Prog, Vers, Proc uint32
	Cred             Cred
	// Remote is the caller's address (port included: `secure` exports
	// want a privileged one).
	Remote netip.AddrPort
	// Local is the address the call came in on (a callback to the caller
	// comes from it: the address the caller knows the server by).
	Local netip.AddrPort
	// tail is what SetTail added to the reply; tailDone gives its memory
	// back once the reply is written (or dropped).
	tail     [][]byte
	tailDone func()
}

// SetTail makes bufs the end of the reply, after the results the procedure
// wrote to res, sent from their own memory (one writev with the rest)
// rather than copied into the reply buffer: a READ's data. done, if not
// nil, is called once the reply is written or dropped; the procedure must
// not change bufs until then. A procedure that fails after SetTail drops
// the tail.
func (c *Call) SetTail(done func(), bufs ...[]byte) {
	c.endTail()
	c.tail, c.tailDone = bufs, done
}

// tailBytes is the length of the tail.
func (c *Call) tailBytes() int {
	n := 0
	for _, b := range c.tail {
		n += len(b)
	}
	return n
}

// endTail forgets the tail and gives its memory back.
func (c *Call) endTail() {
	done := c.tailDone
	c.tail, c.tailDone = nil, nil
	if done != nil {
		done()
	}
}

// ErrGarbageArgs: a procedure could not decode its arguments; the caller
// gets GARBAGE_ARGS.
var ErrGarbageArgs = errors.New("oncrpc: garbage arguments")

// Proc serves one procedure: it decodes its arguments from args (returning
// an error wrapping ErrGarbageArgs when they do not decode) and appends its
// results to res. Any other error is answered SYSTEM_ERR and logged. Procs
// run concurrently, on a goroutine per call.
type Proc func(ctx context.Context, call *Call, args []byte, res *bytes.Buffer) error

// Program is one version of an RPC program: Procs indexed by procedure
// number, nil for a procedure it does not serve (PROC_UNAVAIL).
type Program struct {
	Prog, Vers uint32
	Name       string
	Procs      []Proc
	// Cached are the procedures whose replies the duplicate request
	// cache keeps (drc.go): the non-idempotent ones.
	Cached []uint32
}

// cached reports whether proc's replies are kept.
func (p *Program) cached(proc uint32) bool {
	for _, c := range p.Cached {
		if c == proc {
			return true
		}
	}
	return false
}

// Config configures a Server.
type Config struct {
	// MaxRecordBytes bounds a call's record (arguments and header); a
	// larger one closes the connection. The NFS gateway allows 1 MiB of
	// WRITE data plus headers.
	MaxRecordBytes int
	// MaxInFlight bounds the calls of one connection served at once; the
	// connection's reader waits for a free slot before reading the next
	// record, so a connection holds at most this many records in memory.
	MaxInFlight int
	// MaxCalls bounds the calls of all connections served at once (each
	// holds a record and builds a reply, up to about a megabyte each for
	// the NFS gateway), so that memory is bounded whatever the number of
	// connections.
	MaxCalls int
	// MaxConns bounds the open connections; more are closed at accept.
	MaxConns int
	// IdleTimeout closes a connection that sent nothing for this long.
	IdleTimeout time.Duration
	// DRCEntries bounds the duplicate request cache (drc.go); 0: none.
	DRCEntries int
	Log        *slog.Logger
}

// DefaultConfig returns a Config for the NFS gateway.
func DefaultConfig() Config {
	return Config{
		MaxRecordBytes: 1<<20 + 64<<10,
		MaxInFlight:    32,
		MaxCalls:       256,
		MaxConns:       1024,
		IdleTimeout:    15 * time.Minute,
		DRCEntries:     16384,
		Log:            slog.Default(),
	}
}

// Server serves RPC programs on a TCP listener.
//
// Goroutines: Serve's accept loop; per connection a reader (conn.read:
// reads a record, decodes its call header, hands the reading of the next
// record to a worker and serves the call itself, bounded by MaxInFlight);
// workers (workers.go: goroutines kept between calls, at most MaxCalls
// serving) read and serve calls and write their replies under the
// connection's write lock.
type Server struct {
	cfg   Config
	progs map[uint32][]*Program // by program number, each version
	conns chan struct{}         // semaphore of MaxConns
	calls chan struct{}         // semaphore of MaxCalls
	done  chan struct{}         // closed by Close
	drc   *drc                  // nil: no duplicate request cache
	work  *workers              // the goroutines calls run on
	mu    struct {
		sync.Mutex
		lns    []net.Listener
		open   map[net.Conn]struct{}
		closed bool
	}
	wg sync.WaitGroup
}

// NewServer returns a server of progs.
func NewServer(cfg Config, progs ...*Program) *Server {
	s := &Server{cfg: cfg, progs: map[uint32][]*Program{}, conns: make(chan struct{}, cfg.MaxConns),
		calls: make(chan struct{}, cfg.MaxCalls), done: make(chan struct{})}
	s.work = newWorkers(s.done)
	for _, p := range progs {
		s.progs[p.Prog] = append(s.progs[p.Prog], p)
	}
	if cfg.DRCEntries > 0 {
		s.drc = newDRC(cfg.DRCEntries)
	}
	s.mu.open = map[net.Conn]struct{}{}
	return s
}

// cacheable reports whether call's reply goes through the duplicate
// request cache.
func (s *Server) cacheable(call *Call) bool {
	if s.drc == nil {
		return false
	}
	for _, p := range s.progs[call.Prog] {
		if p.Vers == call.Vers {
			return p.cached(call.Proc)
		}
	}
	return false
}

// DRCStats answers how many retransmitted calls got their kept reply and
// how many were dropped while their first transmission ran.
func (s *Server) DRCStats() (replayed, dropped uint64) {
	if s.drc == nil {
		return 0, 0
	}
	return s.drc.stats()
}

// Serve accepts connections on ln until Close. It returns nil after Close.
// It may serve several listeners at once (a call each), all closed by Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.mu.lns = append(s.mu.lns, ln)
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return nil // Close
		}
		if err != nil {
			return fmt.Errorf("oncrpc: accept: %w", err)
		}
		select {
		case s.conns <- struct{}{}:
		default:
			s.cfg.Log.Warn("oncrpc: too many connections, closing a new one", "remote", c.RemoteAddr(), "max", s.cfg.MaxConns)
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.mu.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.mu.open[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// Close stops accepting, closes every connection and waits for their
// calls to end.
func (s *Server) Close() error {
	s.mu.Lock()
	if !s.mu.closed {
		close(s.done)
	}
	s.mu.closed = true
	for _, ln := range s.mu.lns {
		ln.Close()
	}
	for c := range s.mu.open {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// conn is one client connection.
type conn struct {
	s      *Server
	c      net.Conn
	r      *bufio.Reader // read by one goroutine at a time (read)
	ctx    context.Context
	cancel context.CancelFunc
	remote netip.AddrPort
	local  netip.AddrPort
	wmu    sync.Mutex // serialises replies
	slots  chan struct{}
	calls  sync.WaitGroup
}

func (s *Server) serveConn(c net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	cn := &conn{s: s, c: c, slots: make(chan struct{}, s.cfg.MaxInFlight), ctx: ctx, cancel: cancel,
		r: bufio.NewReaderSize(c, 64<<10)}
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		cn.remote = ta.AddrPort()
	}
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		cn.local = ta.AddrPort()
	}
	cn.read()
}

// read is the connection's reader: it reads the next call and serves it
// on its own goroutine, having handed the reading of the calls after it to
// a worker first (the goroutine that read a call serves it: no hand-over
// between the call's arrival and its procedure, which a client waiting for
// each answer would wait for). At the end of the stream it closes the
// connection once its calls are answered.
func (cn *conn) read() {
	s := cn.s
	release := func() { <-s.calls; <-cn.slots }
	// Bounded: at most MaxInFlight records held by this connection,
	// MaxCalls by all.
	cn.slots <- struct{}{}
	select {
	case s.calls <- struct{}{}:
	case <-s.done:
		<-cn.slots
		cn.end()
		return
	}
	if s.cfg.IdleTimeout > 0 {
		cn.c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
	}
	rec, err := ReadRecord(cn.r, nil, s.cfg.MaxRecordBytes)
	if err != nil {
		release()
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		case errors.Is(err, syscall.ECONNRESET), errors.Is(err, os.ErrDeadlineExceeded):
			s.cfg.Log.Debug("oncrpc: connection ended", "remote", cn.remote, "err", err)
		default:
			s.cfg.Log.Warn("oncrpc: closing connection", "remote", cn.remote, "err", err)
		}
		cn.end()
		return
	}
	call, args, err := decodeCall(rec)
	if err != nil {
		release()
		s.cfg.Log.Warn("oncrpc: undecodable call header, closing connection", "remote", cn.remote, "bytes", len(rec), "err", err)
		cn.end()
		return
	}
	cn.calls.Add(1)
	s.work.run(cn.read)
	defer func() { release(); cn.calls.Done() }()
	cn.serveCall(cn.ctx, call, args)
}

// end closes the connection once its calls are answered.
func (cn *conn) end() {
	s := cn.s
	cn.cancel()
	cn.calls.Wait()
	cn.c.Close()
	s.mu.Lock()
	delete(s.mu.open, cn.c)
	s.mu.Unlock()
	<-s.conns
	s.wg.Done()
}

// header is a decoded call: the message and the arguments after it.
type header struct {
	msg  xdr.Rpc_msg
	args []byte
}

// decodeCall decodes a record's call header. A REPLY or an undecodable
// header is an error (there is nobody to answer).
func decodeCall(rec []byte) (*header, []byte, error) {
	h := &header{}
	var err error
	if h.args, err = xdr.Decode(rec, &h.msg); err != nil {
		return nil, nil, err
	}
	if h.msg.Body.Mtype != xdr.CALL {
		return nil, nil, fmt.Errorf("oncrpc: a %v message where a call was expected", h.msg.Body.Mtype)
	}
	return h, h.args, nil
}

// serveCall answers one call: version, program, procedure and credential
// checks, then the procedure.
func (cn *conn) serveCall(ctx context.Context, h *header, args []byte) {
	cb := h.msg.Body.Cbody()
	call := &Call{Xid: h.msg.Xid, Prog: cb.Prog, Vers: cb.Vers, Proc: cb.Proc, Remote: cn.remote, Local: cn.local}
	out := replyBufs.Get().(*bytes.Buffer)
	defer putReplyBuf(out)
	defer call.endTail()
	out.Reset()
	out.Write([]byte{0, 0, 0, 0}) // the record mark, FinishRecord fills it
	switch {
	case cb.Rpcvers != 2:
		writeDenied(out, call.Xid, xdr.RPC_MISMATCH, 0)
	default:
		cred, stat := parseCred(&cb.Cred)
		if stat != xdr.AUTH_OK {
			cn.s.cfg.Log.Warn("oncrpc: credential refused", "remote", cn.remote, "flavor", cb.Cred.Flavor, "stat", stat)
			writeDenied(out, call.Xid, xdr.AUTH_ERROR, stat)
			break
		}
		call.Cred = cred
		if !cn.s.cacheable(call) {
			cn.s.dispatch(ctx, call, args, out)
			break
		}
		k := drcKeyOf(call, args)
		switch v, kept := cn.s.drc.begin(k, time.Now()); v {
		case drcDrop:
			cn.s.cfg.Log.Debug("oncrpc: retransmission dropped while its first call runs", "remote", cn.remote, "xid", call.Xid, "proc", call.Proc)
			return
		case drcReplay:
			cn.s.cfg.Log.Debug("oncrpc: retransmission answered from the reply cache", "remote", cn.remote, "xid", call.Xid, "proc", call.Proc)
			cn.write(kept)
			return
		}
		ok := cn.s.dispatch(ctx, call, args, out)
		for _, t := range call.tail {
			out.Write(t) // the cache keeps the whole reply
		}
		call.endTail()
		b := out.Bytes()
		FinishRecord(b)
		if !ok {
			cn.s.drc.finish(k, nil) // a failure of ours, not the procedure's answer: run again
		} else {
			cn.s.drc.finish(k, b)
		}
		cn.write(b)
		return
	}
	b := out.Bytes()
	if len(call.tail) == 0 {
		FinishRecord(b)
		cn.write(b)
		return
	}
	binary.BigEndian.PutUint32(b[:4], uint32(len(b)-4+call.tailBytes())|lastFragment)
	cn.write(append(net.Buffers{b}, call.tail...)...)
}

// write sends one reply record, whose pieces go out in one writev.
func (cn *conn) write(b ...[]byte) {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	cn.c.SetWriteDeadline(time.Now().Add(time.Minute))
	var err error
	if len(b) == 1 {
		_, err = cn.c.Write(b[0])
	} else {
		bufs := net.Buffers(b)
		_, err = bufs.WriteTo(cn.c)
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		cn.s.cfg.Log.Debug("oncrpc: writing a reply", "remote", cn.remote, "err", err)
	}
}

// replyBufs are reply buffers, each given back once its reply is written
// (a READ's is a megabyte); one grown beyond 2 MiB is left to the
// collector.
var replyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putReplyBuf(b *bytes.Buffer) {
	if b.Cap() <= 2<<20 {
		replyBufs.Put(b)
	}
}

// dispatch finds the procedure and runs it, writing the accepted reply;
// false when the procedure failed (SYSTEM_ERR).
func (s *Server) dispatch(ctx context.Context, call *Call, args []byte, out *bytes.Buffer) bool {
	versions := s.progs[call.Prog]
	if len(versions) == 0 {
		writeAccepted(out, call.Xid, xdr.PROG_UNAVAIL, nil)
		return true
	}
	var prog *Program
	lo, hi := ^uint32(0), uint32(0)
	for _, p := range versions {
		lo, hi = min(lo, p.Vers), max(hi, p.Vers)
		if p.Vers == call.Vers {
			prog = p
		}
	}
	if prog == nil {
		writeAccepted(out, call.Xid, xdr.PROG_MISMATCH, &xdr.Mismatch_info{Low: lo, High: hi})
		return true
	}
	if int64(call.Proc) >= int64(len(prog.Procs)) || prog.Procs[call.Proc] == nil {
		writeAccepted(out, call.Xid, xdr.PROC_UNAVAIL, nil)
		return true
	}
	mark := out.Len()
	writeAccepted(out, call.Xid, xdr.SUCCESS, nil)
	err := prog.Procs[call.Proc](ctx, call, args, out)
	if err == nil {
		if s.cfg.Log.Enabled(ctx, slog.LevelDebug) {
			s.cfg.Log.Debug("oncrpc: call", "remote", call.Remote, "prog", prog.Name, "proc", call.Proc, "xid", call.Xid, "uid", call.Cred.UID, "reply_bytes", out.Len()-mark)
		}
		return true
	}
	out.Truncate(mark)
	call.endTail()
	if errors.Is(err, ErrGarbageArgs) {
		s.cfg.Log.Warn("oncrpc: garbage arguments", "remote", call.Remote, "prog", prog.Name, "proc", call.Proc, "err", err)
		writeAccepted(out, call.Xid, xdr.GARBAGE_ARGS, nil)
		return true
	}
	s.cfg.Log.Error("oncrpc: procedure failed", "remote", call.Remote, "prog", prog.Name, "proc", call.Proc, "err", err)
	writeAccepted(out, call.Xid, xdr.SYSTEM_ERR, nil)
	return false
}

// parseCred reads an AUTH_NONE or AUTH_SYS credential.
func parseCred(a *xdr.Opaque_auth) (Cred, xdr.Auth_stat) {
	switch xdr.Auth_flavor(a.Flavor) {
	case xdr.AUTH_NONE:
		return Cred{Flavor: xdr.AUTH_NONE}, xdr.AUTH_OK
	case xdr.AUTH_SYS:
		var p xdr.Authsys_parms
		if rest, err := xdr.Decode(a.Body, &p); err != nil || len(rest) != 0 {
			return Cred{}, xdr.AUTH_BADCRED
		}
		return Cred{Flavor: xdr.AUTH_SYS, UID: p.Uid, GID: p.Gid, GIDs: p.Gids, Machine: p.Machinename}, xdr.AUTH_OK
	default:
		return Cred{}, xdr.AUTH_REJECTEDCRED
	}
}

// reply is a reply header of xid with status stat.
func reply(xid uint32, stat xdr.Reply_stat) (*xdr.Rpc_msg, *xdr.Reply_body) {
	m := &xdr.Rpc_msg{Xid: xid}
	m.Body.Mtype = xdr.REPLY
	rb := m.Body.Rbody()
	rb.Stat = stat
	return m, rb
}

// acceptedOK is an accepted SUCCESS reply header of xid 0 as the
// generated encoder writes it, made once: writeAccepted copies it and sets
// the xid (its first word) rather than running the generated traversal for
// every reply (a seventh of a GETATTR's CPU).
var acceptedOK = func() []byte {
	var b bytes.Buffer
	writeAcceptedXDR(&b, 0, xdr.SUCCESS, nil)
	return b.Bytes()
}()

func writeAccepted(out *bytes.Buffer, xid uint32, stat xdr.Accept_stat, mismatch *xdr.Mismatch_info) {
	if stat != xdr.SUCCESS {
		writeAcceptedXDR(out, xid, stat, mismatch)
		return
	}
	at := out.Len()
	out.Write(acceptedOK)
	binary.BigEndian.PutUint32(out.Bytes()[at:], xid)
}

func writeAcceptedXDR(out *bytes.Buffer, xid uint32, stat xdr.Accept_stat, mismatch *xdr.Mismatch_info) {
	m, rb := reply(xid, xdr.MSG_ACCEPTED)
	ar := rb.Areply()
	ar.Verf.Flavor = uint32(xdr.AUTH_NONE)
	ar.Reply_data.Stat = stat
	if stat == xdr.PROG_MISMATCH {
		*ar.Reply_data.Mismatch() = *mismatch
	}
	mustEncode(out, m)
}

func writeDenied(out *bytes.Buffer, xid uint32, stat xdr.Reject_stat, auth xdr.Auth_stat) {
	m, rb := reply(xid, xdr.MSG_DENIED)
	rr := rb.Rreply()
	rr.Stat = stat
	if stat == xdr.RPC_MISMATCH {
		*rr.Mismatch() = xdr.Mismatch_info{Low: 2, High: 2}
	} else {
		*rr.Auth() = auth
	}
	mustEncode(out, m)
}

// mustEncode encodes a value this package built: within its bounds by
// construction, so a failure is a broken invariant.
func mustEncode(out *bytes.Buffer, v xdr.XdrType) {
	if err := xdr.Encode(out, v); err != nil {
		panic(err)
	}
}
