package peers

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// nfsSystem is a system benchmarked over NFS by driveNFS instead of
// through a mounted path (no kernel NFS client here).
type nfsSystem interface {
	system
	target() nfsTarget
}

// Ports of the NFS systems on 127.0.0.1 (neither the standard 2049 nor
// Strata's fallback 20490, so that a running gateway or kernel nfsd does
// not meet them).
const (
	strataNFSPort = 20611 // strata-nfs-async: 20613
	ganeshaPort   = 20621 // NFS; MOUNT, NLM and RQUOTA on the next three
)

// ---- Strata over NFS: strata up --nfs ----

// strataNFS is `strata up --nfs` on its port: the cluster and its gateway
// exporting / rw,sync,no_root_squash to 127.0.0.1 (strata-nfs-async:
// rw,async, on the next port but one, since the bench sets every system
// up before it drives them).
type strataNFS struct {
	strataFS
	port int
}

func newStrataNFS(e *env) *strataNFS {
	return &strataNFS{strataFS{env: e, sys: "strata-nfs", flags: []string{"--nfs", "--nfs-port", strconv.Itoa(strataNFSPort)}}, strataNFSPort}
}

// newStrataNFSAsync is strata-nfs with the export async: UNSTABLE writes
// answered from the gateway's memory, namespace changes before the
// metadata log's sync (COMMIT still flushes).
func newStrataNFSAsync(e *env) *strataNFS {
	port := strataNFSPort + 2
	return &strataNFS{strataFS{env: e, sys: "strata-nfs-async", flags: []string{"--nfs", "--nfs-port", strconv.Itoa(port),
		"--nfs-export", "/=rw,async,no_root_squash,clients=127.0.0.1"}}, port}
}

func (s *strataNFS) setup(ctx context.Context) (string, error) {
	if _, err := s.strataFS.setup(ctx); err != nil {
		return "", err
	}
	addr := s.target().nfsAddr
	return "nfs://" + addr + "/", waitPort(ctx, addr, s.d, 30*time.Second)
}

func (s *strataNFS) target() nfsTarget {
	a := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	return nfsTarget{mountAddr: a, nfsAddr: a, export: "/"}
}

// ---- NFS-Ganesha 4.3 (Debian) with its VFS FSAL on a local directory ----

var ganeshaPackages = []string{"nfs-ganesha", "nfs-ganesha-vfs"}

// ganeshaNFS exports a directory of the work directory (the same disk)
// with the options of strata-nfs: rw, no root squash, 127.0.0.1 only,
// NFSv3 over TCP; rpcbind runs (started by us when none answers), as
// Ganesha registers with it.
type ganeshaNFS struct {
	env     *env
	d, rpcb *daemon
	dir     string
}

func (s *ganeshaNFS) name() string { return "ganesha" }

// ganeshaConfig is the configuration file for exporting dir on port (NFS)
// and the next three (MOUNT, NLM, RQUOTA).
func ganeshaConfig(dir string, port int) string {
	return fmt.Sprintf(`# Written by strata bench peers.
NFS_CORE_PARAM {
	Protocols = 3;
	Bind_addr = 127.0.0.1;
	NFS_Port = %d;
	MNT_Port = %d;
	NLM_Port = %d;
	Rquota_Port = %d;
	Enable_NLM = false;
	Enable_RQUOTA = false;
}
NFSV4 {
	Graceless = true;
}
EXPORT {
	Export_Id = 1;
	Path = %s;
	Pseudo = /bench;
	Protocols = 3;
	Transports = TCP;
	Access_Type = None;
	Squash = No_Root_Squash;
	SecType = sys;
	CLIENT {
		Clients = 127.0.0.1;
		Access_Type = RW;
	}
	FSAL {
		Name = VFS;
	}
}
`, port, port+1, port+2, port+3, dir)
}

func (s *ganeshaNFS) setup(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("ganesha.nfsd"); err != nil {
		if err := s.env.pkgs.ensure(ctx, ganeshaPackages...); err != nil {
			return "", errSkip{fmt.Sprintf("nfs-ganesha not installed (apt-get install %s): %v", "nfs-ganesha nfs-ganesha-vfs", err)}
		}
	}
	base := filepath.Join(s.env.dir, "ganesha")
	s.dir = filepath.Join(base, "export")
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return "", err
	}
	if c, err := net.DialTimeout("unix", "/run/rpcbind.sock", time.Second); err == nil {
		c.Close()
	} else {
		bin, lerr := exec.LookPath("rpcbind")
		if lerr != nil {
			bin = "/usr/sbin/rpcbind"
		}
		if s.rpcb, err = start("rpcbind", s.env.logPath("rpcbind"), bin, "-f", "-w"); err != nil {
			return "", err
		}
	}
	conf := filepath.Join(base, "ganesha.conf")
	if err := os.WriteFile(conf, []byte(ganeshaConfig(s.dir, ganeshaPort)), 0o644); err != nil {
		return "", err
	}
	var err error
	if s.d, err = start("ganesha.nfsd", s.env.logPath("ganesha-out"), "ganesha.nfsd", "-F", "-f", conf,
		"-L", s.env.logPath("ganesha"), "-p", filepath.Join(base, "ganesha.pid")); err != nil {
		return "", err
	}
	t := s.target()
	for _, a := range []string{t.nfsAddr, t.mountAddr} {
		if err := waitPort(ctx, a, s.d, 60*time.Second); err != nil {
			return "", err
		}
	}
	return "nfs://" + t.nfsAddr + t.export, nil
}

func (s *ganeshaNFS) target() nfsTarget {
	return nfsTarget{mountAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ganeshaPort+1)),
		nfsAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ganeshaPort)), export: s.dir}
}

func (s *ganeshaNFS) teardown() error {
	var err error
	if s.d.stop(20 * time.Second) {
		err = fmt.Errorf("ganesha.nfsd did not stop within 20 s of SIGTERM and was killed")
	}
	s.rpcb.stop(5 * time.Second)
	s.d, s.rpcb = nil, nil
	return err
}

// waitPort waits, bounded, until addr accepts TCP connections, failing
// early when d exited.
func waitPort(ctx context.Context, addr string, d *daemon, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if d != nil && d.exited() {
			return fmt.Errorf("%s exited before %s answered: %s", d.name, addr, d.logTail())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer within %v: %v", addr, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
