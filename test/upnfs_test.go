package test

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/testutil"
)

// TestUpNFS: strata up --nfs serves the mount's namespace over NFS on the
// port asked for, records it in cluster.json, and strata status lists the
// gateway; a file written on the FUSE mount reads the same over NFS, and
// a lock taken over NLM excludes one on the FUSE mount.
func TestUpNFS(t *testing.T) {
	testutil.RequireFUSE(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	u := &upRun{bin: testutil.Binary(t), dir: t.TempDir()}
	u.data, u.mnt = filepath.Join(u.dir, "data"), filepath.Join(u.dir, "mnt")
	u.P = startUp(t, u.bin, u.dir, u.data, u.mnt, "--nfs", "--nfs-port", strconv.Itoa(port))
	t.Cleanup(func() { u.P.Kill(); testutil.ForceUnmount(u.mnt) })
	addr := "127.0.0.1:" + strconv.Itoa(port)

	var info struct{ NFS string }
	if err := testutil.WaitFor(10*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(u.data, "cluster.json"))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &info); err != nil || info.NFS == "" {
			return errors.New("no nfs address in cluster.json: " + string(b))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if info.NFS != addr {
		t.Fatalf("cluster.json nfs %q, want %q", info.NFS, addr)
	}
	const body = "written on the FUSE mount\n"
	if err := os.WriteFile(filepath.Join(u.mnt, "f"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := nfstest.Dial(addr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	root, st, err := c.Mnt("/")
	if err != nil || st != xdr.MNT3_OK {
		t.Fatalf("MNT /: %v %v", st, err)
	}
	var lk xdr.LOOKUP3res
	if err := c.NFS(nfstest.ProcLookup, &xdr.LOOKUP3args{What: xdr.Diropargs3{Dir: xdr.Nfs_fh3{Data: root}, Name: "f"}}, &lk); err != nil || lk.Status != xdr.NFS3_OK {
		t.Fatalf("LOOKUP f: %v %v", lk.Status, err)
	}
	var rd xdr.READ3res
	if err := c.NFS(nfstest.ProcRead, &xdr.READ3args{File: lk.Resok().Object, Count: 4096}, &rd); err != nil || rd.Status != xdr.NFS3_OK {
		t.Fatalf("READ f: %v %v", rd.Status, err)
	}
	if got := string(rd.Resok().Data); got != body {
		t.Fatalf("READ over NFS %q, want %q", got, body)
	}
	// A lock over NLM (on the same port) excludes an fcntl lock on the
	// FUSE mount, until it is released.
	h, err := nfstest.StartLockHost("upnfs-client")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Dial(addr); err != nil {
		t.Fatal(err)
	}
	nl := nfstest.Lock{FH: lk.Resok().Object.Data, Svid: 1, Exclusive: true}
	if st, err := h.Lock(nl, false, false); err != nil || st != xdr.NLM4_GRANTED {
		t.Fatalf("NLM LOCK: %v %v", st, err)
	}
	f, err := os.OpenFile(filepath.Join(u.mnt, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flk := syscall.Flock_t{Type: syscall.F_WRLCK, Len: 1}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &flk); !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EACCES) {
		t.Fatalf("F_SETLK on the FUSE mount under an NLM lock: %v, want EAGAIN", err)
	}
	if st, err := h.Unlock(nl); err != nil || st != xdr.NLM4_GRANTED {
		t.Fatalf("NLM UNLOCK: %v %v", st, err)
	}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &flk); err != nil {
		t.Fatalf("F_SETLK on the FUSE mount after the NLM unlock: %v", err)
	}
	out, code := run(t, u.bin, u.dir, "status", "--data", u.data)
	if code != 0 || !strings.Contains(out, "nfs gateways: "+addr) {
		t.Fatalf("strata status: exit %d, no gateway %s:\n%s", code, addr, out)
	}
	// The gateway's heartbeats carry its exports and calls: status shows
	// them (within a heartbeat period or two).
	var gw struct {
		Address    string   `json:"address"`
		Exports    []string `json:"exports"`
		NFSClients uint32   `json:"nfs_clients"`
		Ops        uint64   `json:"ops"`
	}
	if err := testutil.WaitFor(30*time.Second, func() error {
		out, code := run(t, u.bin, u.dir, "status", "--json", "--data", u.data)
		var doc struct {
			Gateways []json.RawMessage `json:"nfs_gateways"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
			return errors.New("strata status --json: " + out)
		}
		if len(doc.Gateways) != 1 {
			return errors.New("nfs_gateways: " + out)
		}
		if err := json.Unmarshal(doc.Gateways[0], &gw); err != nil {
			return err
		}
		if gw.Ops < 3 { // MNT, LOOKUP, READ at least
			return errors.New("no calls reported yet: " + string(doc.Gateways[0]))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if gw.Address != addr || gw.NFSClients != 1 || len(gw.Exports) != 1 || !strings.HasPrefix(gw.Exports[0], "/=rw,sync,no_root_squash,") {
		t.Fatalf("status's gateway: %+v (want %s, 1 NFS client, the export /=rw,sync,no_root_squash,…)", gw, addr)
	}
}
