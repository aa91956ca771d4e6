package nfstest

import (
	"fmt"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// StatusError is an NFS reply whose status is not NFS3_OK.
type StatusError struct {
	Op   string
	Stat xdr.Nfsstat3
}

func (e *StatusError) Error() string { return fmt.Sprintf("nfs %s: %v", e.Op, e.Stat) }

func statusErr(op string, st xdr.Nfsstat3, err error) error {
	if err != nil {
		return fmt.Errorf("nfs %s: %w", op, err)
	}
	if st != xdr.NFS3_OK {
		return &StatusError{op, st}
	}
	return nil
}

// fhOf wraps a handle's bytes.
func fhOf(h []byte) xdr.Nfs_fh3 { return xdr.Nfs_fh3{Data: h} }

// MountRoot mounts path and fails on any status but MNT3_OK.
func (c *Client) MountRoot(path string) ([]byte, error) {
	h, st, err := c.Mnt(path)
	if err == nil && st != xdr.MNT3_OK {
		err = fmt.Errorf("MNT %s: %v", path, st)
	}
	return h, err
}

// Create makes (or truncates: UNCHECKED) the file name in dir with mode.
func (c *Client) Create(dir []byte, name string, mode uint32) ([]byte, error) {
	args := xdr.CREATE3args{Where: xdr.Diropargs3{Dir: fhOf(dir), Name: xdr.Filename3(name)}}
	args.How.Mode = xdr.UNCHECKED
	sa := args.How.Obj_attributes()
	sa.Mode.Set_it = true
	*sa.Mode.Mode() = mode
	var res xdr.CREATE3res
	err := c.NFS(ProcCreate, &args, &res)
	if err := statusErr("CREATE "+name, res.Status, err); err != nil {
		return nil, err
	}
	return res.Resok().Obj.Handle().Data, nil
}

// Mkdir makes the directory name in dir.
func (c *Client) Mkdir(dir []byte, name string, mode uint32) ([]byte, error) {
	args := xdr.MKDIR3args{Where: xdr.Diropargs3{Dir: fhOf(dir), Name: xdr.Filename3(name)}}
	args.Attributes.Mode.Set_it = true
	*args.Attributes.Mode.Mode() = mode
	var res xdr.MKDIR3res
	err := c.NFS(ProcMkdir, &args, &res)
	if err := statusErr("MKDIR "+name, res.Status, err); err != nil {
		return nil, err
	}
	return res.Resok().Obj.Handle().Data, nil
}

// Write writes data at off with the stability asked and returns the
// verifier.
func (c *Client) Write(h []byte, off uint64, data []byte, stable xdr.Stable_how) (xdr.Writeverf3, error) {
	var res xdr.WRITE3res
	err := c.NFS(ProcWrite, &xdr.WRITE3args{File: fhOf(h), Offset: off, Count: uint32(len(data)), Stable: stable, Data: data}, &res)
	if err := statusErr("WRITE", res.Status, err); err != nil {
		return xdr.Writeverf3{}, err
	}
	if int(res.Resok().Count) != len(data) {
		return xdr.Writeverf3{}, fmt.Errorf("nfs WRITE: %d of %d bytes written", res.Resok().Count, len(data))
	}
	return res.Resok().Verf, nil
}

// Commit commits the whole file and returns the verifier.
func (c *Client) Commit(h []byte) (xdr.Writeverf3, error) {
	var res xdr.COMMIT3res
	err := c.NFS(ProcCommit, &xdr.COMMIT3args{File: fhOf(h)}, &res)
	if err := statusErr("COMMIT", res.Status, err); err != nil {
		return xdr.Writeverf3{}, err
	}
	return res.Resok().Verf, nil
}

// Read reads up to n bytes at off.
func (c *Client) Read(h []byte, off uint64, n uint32) ([]byte, error) {
	var res xdr.READ3res
	err := c.NFS(ProcRead, &xdr.READ3args{File: fhOf(h), Offset: off, Count: n}, &res)
	if err := statusErr("READ", res.Status, err); err != nil {
		return nil, err
	}
	return res.Resok().Data, nil
}

// Getattr returns the attributes of h.
func (c *Client) Getattr(h []byte) (*xdr.Fattr3, error) {
	var res xdr.GETATTR3res
	err := c.NFS(ProcGetattr, &xdr.GETATTR3args{Object: fhOf(h)}, &res)
	if err := statusErr("GETATTR", res.Status, err); err != nil {
		return nil, err
	}
	return &res.Resok().Obj_attributes, nil
}

// Remove removes the file name from dir.
func (c *Client) Remove(dir []byte, name string) error {
	var res xdr.REMOVE3res
	err := c.NFS(ProcRemove, &xdr.REMOVE3args{Object: xdr.Diropargs3{Dir: fhOf(dir), Name: xdr.Filename3(name)}}, &res)
	return statusErr("REMOVE "+name, res.Status, err)
}
