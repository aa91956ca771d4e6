// Package nfstest is a small NFSv3 and MOUNT v3 client over TCP, built on
// the generated XDR types, for tests of the gateway: one call at a time,
// AUTH_SYS or AUTH_NONE, no retransmission.
package nfstest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// Program numbers.
const (
	NFS       = 100003
	Mount     = 100005
	Version   = 3
	maxRecord = 4 << 20
)

// Procedure numbers of NFS v3 (RFC 1813) and MOUNT v3.
const (
	ProcNull uint32 = iota
	ProcGetattr
	ProcSetattr
	ProcLookup
	ProcAccess
	ProcReadlink
	ProcRead
	ProcWrite
	ProcCreate
	ProcMkdir
	ProcSymlink
	ProcMknod
	ProcRemove
	ProcRmdir
	ProcRename
	ProcLink
	ProcReaddir
	ProcReaddirplus
	ProcFsstat
	ProcFsinfo
	ProcPathconf
	ProcCommit
)

const (
	MountProcMnt     uint32 = 1
	MountProcDump    uint32 = 2
	MountProcUmnt    uint32 = 3
	MountProcUmntall uint32 = 4
	MountProcExport  uint32 = 5
)

// AcceptError is an accepted reply whose status is not SUCCESS.
type AcceptError struct{ Stat xdr.Accept_stat }

func (e *AcceptError) Error() string { return "rpc: call not successful: " + e.Stat.String() }

// DeniedError is a MSG_DENIED reply.
type DeniedError struct{ Reply xdr.Rejected_reply }

func (e *DeniedError) Error() string { return "rpc: call denied: " + e.Reply.Stat.String() }

// Client is a connection to a gateway.
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	xid  uint32
	// Cred is the AUTH_SYS credential sent; nil sends AUTH_NONE.
	Cred *xdr.Authsys_parms
}

// Dial connects to addr; a non-empty local is the source address (e.g.
// "127.0.0.2:0" to come from another loopback address).
func Dial(addr, local string) (*Client, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		la, err := net.ResolveTCPAddr("tcp", local)
		if err != nil {
			return nil, err
		}
		d.LocalAddr = la
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Client{conn: c, r: bufio.NewReader(c), xid: uint32(time.Now().UnixNano()),
		Cred: &xdr.Authsys_parms{Machinename: "nfstest"}}, nil
}

// As sets the AUTH_SYS identity of the next calls.
func (c *Client) As(uid, gid uint32, gids ...uint32) {
	c.mu.Lock()
	c.Cred = &xdr.Authsys_parms{Machinename: "nfstest", Uid: uid, Gid: gid, Gids: gids}
	c.mu.Unlock()
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the connection, for tests that write raw bytes.
func (c *Client) Conn() net.Conn { return c.conn }

// Call sends a call of (prog, vers, proc) with args and decodes the
// results into res (either may be nil for void).
func (c *Client) Call(prog, vers, proc uint32, args, res xdr.XdrType) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.xid++
	var m xdr.Rpc_msg
	m.Xid = c.xid
	m.Body.Mtype = xdr.CALL
	cb := m.Body.Cbody()
	cb.Rpcvers, cb.Prog, cb.Vers, cb.Proc = 2, prog, vers, proc
	if c.Cred != nil {
		var body bytes.Buffer
		if err := xdr.Encode(&body, c.Cred); err != nil {
			return err
		}
		cb.Cred = xdr.Opaque_auth{Flavor: uint32(xdr.AUTH_SYS), Body: body.Bytes()}
	}
	var out bytes.Buffer
	out.Write([]byte{0, 0, 0, 0})
	if err := xdr.Encode(&out, &m); err != nil {
		return err
	}
	if args != nil {
		if err := xdr.Encode(&out, args); err != nil {
			return err
		}
	}
	b := out.Bytes()
	oncrpc.FinishRecord(b)
	c.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.conn.Write(b); err != nil {
		return fmt.Errorf("nfstest: send: %w", err)
	}
	rec, err := oncrpc.ReadRecord(c.r, nil, maxRecord)
	if err != nil {
		return fmt.Errorf("nfstest: reply: %w", err)
	}
	var reply xdr.Rpc_msg
	rest, err := xdr.Decode(rec, &reply)
	if err != nil {
		return err
	}
	if reply.Xid != c.xid || reply.Body.Mtype != xdr.REPLY {
		return fmt.Errorf("nfstest: reply xid %d type %v to call %d", reply.Xid, reply.Body.Mtype, c.xid)
	}
	rb := reply.Body.Rbody()
	if rb.Stat == xdr.MSG_DENIED {
		return &DeniedError{Reply: *rb.Rreply()}
	}
	if st := rb.Areply().Reply_data.Stat; st != xdr.SUCCESS {
		return &AcceptError{Stat: st}
	}
	if res != nil {
		if rest, err = xdr.Decode(rest, res); err != nil {
			return err
		}
	}
	if len(rest) != 0 {
		return errors.New("nfstest: bytes after the results")
	}
	return nil
}

// NFS calls an NFS v3 procedure.
func (c *Client) NFS(proc uint32, args, res xdr.XdrType) error {
	return c.Call(NFS, Version, proc, args, res)
}

// Mnt mounts path and returns the root handle (or the status).
func (c *Client) Mnt(path string) ([]byte, xdr.Mountstat3, error) {
	var res xdr.Mountres3
	p := xdr.Dirpath(path)
	if err := c.Call(Mount, Version, MountProcMnt, xdr.XDR_Dirpath(&p), &res); err != nil {
		return nil, 0, err
	}
	if res.Fhs_status != xdr.MNT3_OK {
		return nil, res.Fhs_status, nil
	}
	return res.Mountinfo().Fhandle, xdr.MNT3_OK, nil
}
