package oncrpc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// AcceptError is an accepted reply whose status is not SUCCESS.
type AcceptError struct{ Stat xdr.Accept_stat }

func (e *AcceptError) Error() string { return "rpc: call not successful: " + e.Stat.String() }

// DeniedError is a MSG_DENIED reply.
type DeniedError struct{ Reply xdr.Rejected_reply }

func (e *DeniedError) Error() string { return "rpc: call denied: " + e.Reply.Stat.String() }

// clientMaxRecord bounds a reply's record.
const clientMaxRecord = 4 << 20

// Client calls procedures over one stream connection (TCP or a Unix
// socket), one call at a time, without retransmission: the gateway's
// rpcbind registration and the tests' NFS client.
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	xid  uint32
	// Cred is the AUTH_SYS credential sent; nil sends AUTH_NONE.
	Cred *xdr.Authsys_parms
	// Timeout bounds each call (send and reply).
	Timeout time.Duration
}

// NewClient calls over conn, which the client then owns.
func NewClient(conn net.Conn, cred *xdr.Authsys_parms) *Client {
	return &Client{conn: conn, r: bufio.NewReader(conn), xid: uint32(time.Now().UnixNano()),
		Cred: cred, Timeout: 30 * time.Second}
}

// SetCred sets the AUTH_SYS credential of the next calls (nil: AUTH_NONE).
func (c *Client) SetCred(cred *xdr.Authsys_parms) {
	c.mu.Lock()
	c.Cred = cred
	c.mu.Unlock()
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the connection, for tests that write raw bytes.
func (c *Client) Conn() net.Conn { return c.conn }

// LastXid is the xid of the last call sent.
func (c *Client) LastXid() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.xid
}

// Retransmit sends a call with xid, as a client resends an unanswered one
// (tests of the duplicate request cache), and decodes its reply as Call.
func (c *Client) Retransmit(xid, prog, vers, proc uint32, args, res xdr.XdrType) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.xid = xid
	return c.call(prog, vers, proc, args, res)
}

// Call sends a call of (prog, vers, proc) with args and decodes the
// results into res (either may be nil for void).
func (c *Client) Call(prog, vers, proc uint32, args, res xdr.XdrType) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.xid++
	return c.call(prog, vers, proc, args, res)
}

// call sends a call with xid c.xid (mu held).
func (c *Client) call(prog, vers, proc uint32, args, res xdr.XdrType) error {
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
	out := bytes.NewBuffer(AppendRecordHeader(nil))
	if err := xdr.Encode(out, &m); err != nil {
		return err
	}
	if args != nil {
		if err := xdr.Encode(out, args); err != nil {
			return err
		}
	}
	b := out.Bytes()
	FinishRecord(b)
	if err := c.conn.SetDeadline(time.Now().Add(c.Timeout)); err != nil {
		return fmt.Errorf("rpc: deadline: %w", err)
	}
	if _, err := c.conn.Write(b); err != nil {
		return fmt.Errorf("rpc: send: %w", err)
	}
	rec, err := ReadRecord(c.r, nil, clientMaxRecord)
	if err != nil {
		return fmt.Errorf("rpc: reply: %w", err)
	}
	var reply xdr.Rpc_msg
	rest, err := xdr.Decode(rec, &reply)
	if err != nil {
		return err
	}
	if reply.Xid != c.xid || reply.Body.Mtype != xdr.REPLY {
		return fmt.Errorf("rpc: reply xid %d type %v to call %d", reply.Xid, reply.Body.Mtype, c.xid)
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
		return errors.New("rpc: bytes after the results")
	}
	return nil
}
