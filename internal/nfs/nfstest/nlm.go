package nfstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// Programs and procedures of the lock manager (NLM v4) and the status
// monitor (NSM v1), Open Group XNFS 3W chapters 10 and 11.
const (
	NLM        = 100021
	NLMVersion = 4
	NSM        = 100024
	NSMVersion = 1

	NLMProcTest       uint32 = 1
	NLMProcLock       uint32 = 2
	NLMProcCancel     uint32 = 3
	NLMProcUnlock     uint32 = 4
	NLMProcGranted    uint32 = 5
	NLMProcTestMsg    uint32 = 6
	NLMProcLockMsg    uint32 = 7
	NLMProcCancelMsg  uint32 = 8
	NLMProcUnlockMsg  uint32 = 9
	NLMProcGrantedMsg uint32 = 10
	NLMProcTestRes    uint32 = 11
	NLMProcLockRes    uint32 = 12
	NLMProcCancelRes  uint32 = 13
	NLMProcUnlockRes  uint32 = 14
	NLMProcGrantedRes uint32 = 15
	NLMProcShare      uint32 = 20
	NLMProcNMLock     uint32 = 22
	NLMProcFreeAll    uint32 = 23
	NSMProcNotify     uint32 = 6

	pmapProg        = 100000
	pmapVers        = 2
	pmapProcGetport = 3
)

// LockHost is an NFS client host's lock manager as the gateway sees it: it
// calls the gateway's NLM service as Name (caller_name), and serves, on one
// loopback port, a port mapper (GETPORT only) that names that same port for
// NLM v4 and NSM v1 over TCP, NLM GRANTED, for the gateway's callbacks on
// blocked locks, and NSM SM_NOTIFY, for a restarted gateway's notifications. Give
// the gateway Port as its NLMPortmapPort.
type LockHost struct {
	Name string
	c    *Client
	srv  *oncrpc.Server
	ln   net.Listener
	port uint32
	// Granted receives the GRANTED callbacks (buffered; a full channel
	// answers the callback NLM4_DENIED).
	Granted chan xdr.Nlm4_testargs
	// Notified receives the SM_NOTIFY calls of the host's status monitor
	// (a server telling that it restarted).
	Notified chan xdr.Stat_chge
	// Results receives the _RES calls answering this host's _MSG calls.
	Results chan Result
	// Drop makes GRANTED callbacks fail (SYSTEM_ERR), as a callback a
	// firewall drops does.
	Drop atomic.Bool
	// Refuse makes GRANTED callbacks answer NLM4_DENIED (the client no
	// longer waits).
	Refuse atomic.Bool
	cookie atomic.Uint64
}

// StartLockHost starts the callback service of a host named name; Dial
// then connects it to a gateway.
func StartLockHost(name string) (*LockHost, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &LockHost{Name: name, ln: ln, port: uint32(ln.Addr().(*net.TCPAddr).Port), Granted: make(chan xdr.Nlm4_testargs, 16),
		Notified: make(chan xdr.Stat_chge, 16), Results: make(chan Result, 16)}
	getport := func(_ context.Context, _ *oncrpc.Call, args []byte, res *bytes.Buffer) error {
		var m xdr.Mapping
		if _, err := xdr.Decode(args, &m); err != nil {
			return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
		}
		port := uint32(0)
		if (m.Prog == NLM && m.Vers == NLMVersion || m.Prog == NSM && m.Vers == NSMVersion) && m.Prot == xdr.IPPROTO_TCP {
			port = h.port
		}
		return xdr.Encode(res, xdr.XDR_uint32(&port))
	}
	granted := func(_ context.Context, _ *oncrpc.Call, args []byte, res *bytes.Buffer) error {
		var a xdr.Nlm4_testargs
		if _, err := xdr.Decode(args, &a); err != nil {
			return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
		}
		a.Alock.Fh = bytes.Clone(a.Alock.Fh)
		a.Alock.Oh = bytes.Clone(a.Alock.Oh)
		a.Cookie = bytes.Clone(a.Cookie)
		if h.Drop.Load() {
			return errors.New("nfstest: dropping a GRANTED callback") // SYSTEM_ERR
		}
		out := xdr.Nlm4_res{Cookie: a.Cookie, Stat: xdr.Nlm4_stat{Stat: xdr.NLM4_DENIED}}
		if !h.Refuse.Load() {
			select {
			case h.Granted <- a:
				out.Stat.Stat = xdr.NLM4_GRANTED
			default:
			}
		}
		return xdr.Encode(res, &out)
	}
	notify := func(_ context.Context, _ *oncrpc.Call, args []byte, res *bytes.Buffer) error {
		var a xdr.Stat_chge
		if _, err := xdr.Decode(args, &a); err != nil {
			return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
		}
		select {
		case h.Notified <- a:
		default:
		}
		return nil
	}
	result := func(_ context.Context, call *oncrpc.Call, args []byte, _ *bytes.Buffer) error {
		var r Result
		r.Proc = call.Proc
		if call.Proc == NLMProcTestRes {
			var res xdr.Nlm4_testres
			if _, err := xdr.Decode(args, &res); err != nil {
				return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
			}
			r.Cookie, r.Stat = bytes.Clone(res.Cookie), res.Stat.Stat
		} else {
			var res xdr.Nlm4_res
			if _, err := xdr.Decode(args, &res); err != nil {
				return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
			}
			r.Cookie, r.Stat = bytes.Clone(res.Cookie), res.Stat.Stat
		}
		select {
		case h.Results <- r:
		default:
		}
		return nil
	}
	cfg := oncrpc.DefaultConfig()
	h.srv = oncrpc.NewServer(cfg,
		&oncrpc.Program{Prog: pmapProg, Vers: pmapVers, Name: "portmap", Procs: []oncrpc.Proc{pmapProcGetport: getport}},
		&oncrpc.Program{Prog: NLM, Vers: NLMVersion, Name: "nlm-callback", Procs: []oncrpc.Proc{NLMProcGranted: granted,
			NLMProcTestRes: result, NLMProcLockRes: result, NLMProcCancelRes: result, NLMProcUnlockRes: result, NLMProcGrantedRes: result}},
		&oncrpc.Program{Prog: NSM, Vers: NSMVersion, Name: "nsm", Procs: []oncrpc.Proc{NSMProcNotify: notify}})
	go h.srv.Serve(ln)
	return h, nil
}

// Dial connects the host to the gateway's NLM service at addr (which may
// be its one NFS port), calling as root.
func (h *LockHost) Dial(addr string) error {
	c, err := Dial(addr, "")
	if err != nil {
		return err
	}
	c.As(0, 0)
	h.c = c
	return nil
}

// Result is an asynchronous answer: the _RES procedure, the cookie of
// the _MSG call it answers, the status.
type Result struct {
	Proc   uint32
	Cookie []byte
	Stat   xdr.Nlm4_stats
}

// Msg sends an asynchronous _MSG call (answered void; the result comes to
// Results) and returns its cookie.
func (h *LockHost) Msg(proc uint32, l Lock) ([]byte, error) {
	cookie := h.nextCookie()
	var args xdr.XdrType
	switch proc {
	case NLMProcTestMsg, NLMProcGrantedMsg:
		args = &xdr.Nlm4_testargs{Cookie: cookie, Exclusive: l.Exclusive, Alock: h.alock(l)}
	case NLMProcLockMsg:
		args = &xdr.Nlm4_lockargs{Cookie: cookie, Exclusive: l.Exclusive, Alock: h.alock(l), State: 1}
	case NLMProcCancelMsg:
		args = &xdr.Nlm4_cancargs{Cookie: cookie, Exclusive: l.Exclusive, Alock: h.alock(l)}
	case NLMProcUnlockMsg:
		args = &xdr.Nlm4_unlockargs{Cookie: cookie, Alock: h.alock(l)}
	default:
		return nil, fmt.Errorf("nlm: %d is no _MSG procedure", proc)
	}
	return cookie, h.Call(proc, args, nil)
}

// Port is the callback service's port (port mapper and NLM).
func (h *LockHost) Port() uint16 { return uint16(h.port) }

// Close stops the callback service and closes the connection.
func (h *LockHost) Close() error {
	h.srv.Close()
	if h.c != nil {
		return h.c.Close()
	}
	return nil
}

// Call calls an NLM v4 procedure of the gateway.
func (h *LockHost) Call(proc uint32, args, res xdr.XdrType) error {
	return h.c.Call(NLM, NLMVersion, proc, args, res)
}

// Conn is the connection to the gateway, for raw calls.
func (h *LockHost) Conn() *Client { return h.c }

// Lock is a lock of this host: a process (Svid) on a file (FH) over
// [Off, Off+Len) (Len 0: to the end of the file).
type Lock struct {
	FH        []byte
	Svid      int32
	Off, Len  uint64
	Exclusive bool
}

func (h *LockHost) alock(l Lock) xdr.Nlm4_lock {
	return xdr.Nlm4_lock{Caller_name: h.Name, Fh: l.FH, Oh: []byte(strconv.Itoa(int(l.Svid)) + "@" + h.Name),
		Svid: l.Svid, L_offset: l.Off, L_len: l.Len}
}

func (h *LockHost) nextCookie() []byte {
	return strconv.AppendUint(nil, h.cookie.Add(1), 10)
}

// checkCookie: every NLM answer carries the call's cookie back.
func checkCookie(sent, got []byte) error {
	if !bytes.Equal(sent, got) {
		return fmt.Errorf("nlm: answer's cookie %q, sent %q", got, sent)
	}
	return nil
}

// Test asks whether l could be taken; the holder when it could not.
func (h *LockHost) Test(l Lock) (xdr.Nlm4_stats, *xdr.Nlm4_holder, error) {
	args := xdr.Nlm4_testargs{Cookie: h.nextCookie(), Exclusive: l.Exclusive, Alock: h.alock(l)}
	var res xdr.Nlm4_testres
	if err := h.Call(NLMProcTest, &args, &res); err != nil {
		return 0, nil, err
	}
	if res.Stat.Stat == xdr.NLM4_DENIED {
		return res.Stat.Stat, res.Stat.Holder(), checkCookie(args.Cookie, res.Cookie)
	}
	return res.Stat.Stat, nil, checkCookie(args.Cookie, res.Cookie)
}

// Lock asks for l; block: wait (BLOCKED, then a GRANTED callback);
// reclaim: a lock held before the server restarted.
func (h *LockHost) Lock(l Lock, block, reclaim bool) (xdr.Nlm4_stats, error) {
	args := xdr.Nlm4_lockargs{Cookie: h.nextCookie(), Block: block, Exclusive: l.Exclusive, Alock: h.alock(l),
		Reclaim: reclaim, State: 1}
	return h.res(NLMProcLock, &args, args.Cookie)
}

// Cancel withdraws a blocked Lock(l, true, ...).
func (h *LockHost) Cancel(l Lock) (xdr.Nlm4_stats, error) {
	args := xdr.Nlm4_cancargs{Cookie: h.nextCookie(), Block: true, Exclusive: l.Exclusive, Alock: h.alock(l)}
	return h.res(NLMProcCancel, &args, args.Cookie)
}

// Unlock releases l's range.
func (h *LockHost) Unlock(l Lock) (xdr.Nlm4_stats, error) {
	args := xdr.Nlm4_unlockargs{Cookie: h.nextCookie(), Alock: h.alock(l)}
	return h.res(NLMProcUnlock, &args, args.Cookie)
}

func (h *LockHost) res(proc uint32, args xdr.XdrType, cookie []byte) (xdr.Nlm4_stats, error) {
	var res xdr.Nlm4_res
	if err := h.Call(proc, args, &res); err != nil {
		return 0, err
	}
	return res.Stat.Stat, checkCookie(cookie, res.Cookie)
}

// Notify sends the gateway's status monitor SM_NOTIFY: host restarted.
func (h *LockHost) Notify(host string, state int32) error {
	args := xdr.Stat_chge{Mon_name: host, State: state}
	return h.c.Call(NSM, NSMVersion, NSMProcNotify, &args, nil)
}

// FreeAll sends NLM FREE_ALL for host.
func (h *LockHost) FreeAll(host string, state int32) error {
	args := xdr.Nlm4_notify{Name: host, State: state}
	return h.Call(NLMProcFreeAll, &args, nil)
}
