// Package nfstest is a small NFSv3 and MOUNT v3 client over TCP, built on
// the generated XDR types, for tests of the gateway: one call at a time,
// AUTH_SYS or AUTH_NONE, no retransmission.
package nfstest

import (
	"net"
	"time"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// Program numbers.
const (
	NFS     = 100003
	Mount   = 100005
	Version = 3
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
type AcceptError = oncrpc.AcceptError

// DeniedError is a MSG_DENIED reply.
type DeniedError = oncrpc.DeniedError

// Client is a connection to a gateway (oncrpc.Client's Call, Cred, Close
// and Conn).
type Client struct {
	*oncrpc.Client
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
	return &Client{oncrpc.NewClient(c, &xdr.Authsys_parms{Machinename: "nfstest"})}, nil
}

// As sets the AUTH_SYS identity of the next calls.
func (c *Client) As(uid, gid uint32, gids ...uint32) {
	c.SetCred(&xdr.Authsys_parms{Machinename: "nfstest", Uid: uid, Gid: gid, Gids: gids})
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
