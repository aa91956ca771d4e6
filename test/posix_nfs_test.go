package test

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/testutil"
)

// nfsSkips are the sub-tests of the POSIX suite that NFSv3 itself cannot
// pass, with the reason: what a user of knfsd and Linux's v3 client sees
// too. Every other sub-test must pass through NFS.
var nfsSkips = map[string]string{
	"rename_flags": "NFSv3 RENAME has no RENAME_NOREPLACE or RENAME_EXCHANGE (Linux's v3 client answers EINVAL)",
	"xattr":        "NFSv3 has no extended attributes (RFC 8276 adds them to v4.2 only)",
	"tmpfile":      "O_TMPFILE needs an open file with no name, which NFSv3 has no way to hold (Linux's v3 client: EOPNOTSUPP)",
	"seek_hole":    "NFSv3 has no SEEK (v4.2) nor hole punching (ALLOCATE/DEALLOCATE, v4.2): SEEK_DATA sees the whole file as data",
	"sparse_copy": "cp finds a sparse file's data with SEEK_DATA, which NFSv3 lacks; without it cp looks for zeros in pieces of " +
		"st_blksize (the 1 MiB wsize, as Linux's client reports) and writes a piece holding any data whole",
	"locks_across_mounts": "flock and fcntl locks across clients need NLM, which the gateway does not serve yet",
}

// TestPOSIXOnNFS runs the POSIX suite through NFS: a `strata nfs` gateway
// process on a process cluster, and two user-space NFSv3 clients
// (nfstest.MountFUSE, each its own process) whose mounts the suite's
// system calls use; the second is the other client of the cross-mount
// checks.
func TestPOSIXOnNFS(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2, Mounts: 1})
	addr := startNFSGateway(t, c)
	a := mountNFS(t, c, addr, "nfs0")
	b := mountNFS(t, c, addr, "nfs1")
	runPOSIXSuiteSkipping(t, a, b, c.Dir, nfsSkips)
	// Silly renames go at the last close: no .nfs file is left once the
	// suite closed everything (a release comes after close returns).
	if err := testutil.WaitFor(10*time.Second, func() error {
		var left []string
		err := filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), ".nfs") {
				left = append(left, p)
			}
			return err
		})
		if err == nil && len(left) > 0 {
			err = fmt.Errorf("silly-renamed files left: %v", left)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
}

// TestNFSCrossProtocol: a file written over NFS (the Go client, UNSTABLE
// and COMMIT) reads byte-exact on a FUSE mount of the same cluster, one
// written on the FUSE mount reads byte-exact over NFS, and a file written
// by both at different offsets — in one stripe unit and in different
// ones — reads the same, and as expected, through both.
func TestNFSCrossProtocol(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2, Mounts: 1})
	addr := startNFSGateway(t, c)
	nc, err := nfstest.Dial(addr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.As(0, 0)
	root, err := nc.MountRoot("/")
	if err != nil {
		t.Fatal(err)
	}
	mnt := c.Mount(0)
	rng := rand.New(rand.NewPCG(22, 6))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	writeNFS := func(h []byte, off int, data []byte) {
		t.Helper()
		for o := 0; o < len(data); o += 1 << 20 {
			end := min(o+1<<20, len(data))
			if _, err := nc.Write(h, uint64(off+o), data[o:end], xdr.UNSTABLE); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := nc.Commit(h); err != nil {
			t.Fatal(err)
		}
	}
	readNFS := func(name string) []byte {
		t.Helper()
		h, err := lookupNFS(nc, root, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := readAllNFS(nc, h)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	t.Run("nfs_to_fuse", func(t *testing.T) {
		data := random(5<<20 + 4321) // several stripe units, a ragged end
		h, err := nc.Create(root, "from-nfs", 0o644)
		if err != nil {
			t.Fatal(err)
		}
		writeNFS(h, 0, data)
		got, err := os.ReadFile(filepath.Join(mnt, "from-nfs"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("FUSE mount reads %d bytes (%v) of the %d written over NFS; equal: %v", len(got), err, len(data), bytes.Equal(got, data))
		}
	})
	t.Run("fuse_to_nfs", func(t *testing.T) {
		data := random(3<<20 + 999)
		if err := os.WriteFile(filepath.Join(mnt, "from-fuse"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := readNFS("from-fuse"); !bytes.Equal(got, data) {
			t.Fatalf("NFS reads %d bytes of the %d written on the FUSE mount, equal: %v", len(got), len(data), bytes.Equal(got, data))
		}
	})
	t.Run("both", func(t *testing.T) {
		// FUSE writes [0, 100000) and [2 MiB, 2 MiB+70000); NFS writes
		// [100000, 300000) — the same stripe unit — and [3 MiB+5, 4 MiB+77)
		// after a hole; then the FUSE mount writes into the NFS range's
		// middle.
		const M = 1 << 20
		want := make([]byte, 4*M+77)
		p := filepath.Join(mnt, "both")
		fuseWrite := func(off int, data []byte) {
			t.Helper()
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(data, int64(off)); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			copy(want[off:], data)
		}
		fuseWrite(0, random(100000))
		fuseWrite(2*M, random(70000))
		h, err := lookupNFS(nc, root, "both")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range [][2]int{{100000, 200000}, {3*M + 5, M + 72}} {
			d := random(w[1])
			writeNFS(h, w[0], d)
			copy(want[w[0]:], d)
		}
		fuseWrite(150000, random(10000))
		if got := readNFS("both"); !bytes.Equal(got, want) {
			t.Errorf("over NFS: %d bytes, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("on the FUSE mount: %d bytes (%v), want %d; first difference at %d", len(got), err, len(want), firstDiff(got, want))
		}
	})
}

// TestNFSFUSEGatewayRestart: writes through the NFS client mount are
// UNSTABLE; the gateway is killed (-9) and restarted before the close, so
// it lost what it held in memory. The close's COMMIT gets another
// verifier, the client sends the writes again and commits them (RFC 1813
// 3.3.7), and the file reads complete on a FUSE mount of the cluster. The
// writer is a process of its own: a process holding a file open on the
// mount must not fork (the child's copy of the descriptor is closed at
// its exec, a FLUSH — a COMMIT to the dead gateway, retried).
func TestNFSFUSEGatewayRestart(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2, Mounts: 1})
	g := newNFSGateway(t, c)
	m := mountNFS(t, c, g.addr, "nfs0")
	w := exec.Command(os.Args[0])
	w.Env = append(os.Environ(), "STRATA_TEST_WORKER=nfswrite", "NFSWRITE_FILE="+filepath.Join(m, "f"))
	stdin, err := w.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.Stderr = os.Stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Process.Kill()
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); line != "written\n" {
		t.Fatalf("writer: %q %v", line, err)
	}
	g.p.Kill()
	g.start()
	fmt.Fprintln(stdin, "close")
	if line, err := out.ReadString('\n'); line != "closed\n" {
		t.Fatalf("writer's close (its COMMIT after the gateway's restart): %q %v", line, err)
	}
	_ = w.Wait()
	data := nfsWriteData()
	got, err := os.ReadFile(filepath.Join(c.Mount(0), "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("FUSE mount reads %d bytes (%v), want the %d written; first difference at %d", len(got), err, len(data), firstDiff(got, data))
	}
}

// nfsWriteData is what the nfswrite worker writes.
func nfsWriteData() []byte {
	data := make([]byte, 3<<20+7)
	rng := rand.New(rand.NewPCG(3, 7))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	return data
}

// nfsWriteWorker writes nfsWriteData to NFSWRITE_FILE in 1 MiB writes,
// says "written", and closes the file when a line comes on stdin, then
// says "closed" (or the error).
func nfsWriteWorker() int {
	data := nfsWriteData()
	f, err := os.OpenFile(os.Getenv("NFSWRITE_FILE"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := f.WriteAt(data[off:min(off+1<<20, len(data))], int64(off)); err != nil {
			fmt.Println(err)
			return 1
		}
	}
	fmt.Println("written")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := f.Close(); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("closed")
	return 0
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func lookupNFS(c *nfstest.Client, dir []byte, name string) ([]byte, error) {
	var res xdr.LOOKUP3res
	err := c.NFS(nfstest.ProcLookup, &xdr.LOOKUP3args{What: xdr.Diropargs3{Dir: xdr.Nfs_fh3{Data: dir}, Name: name}}, &res)
	if err != nil || res.Status != xdr.NFS3_OK {
		return nil, fmt.Errorf("LOOKUP %s: %v %v", name, res.Status, err)
	}
	return bytes.Clone(res.Resok().Object.Data), nil
}

// readAllNFS reads a file whole over NFS, 1 MiB a READ.
func readAllNFS(c *nfstest.Client, h []byte) ([]byte, error) {
	var out []byte
	for calls := 0; calls < 1<<12; calls++ {
		var res xdr.READ3res
		err := c.NFS(nfstest.ProcRead, &xdr.READ3args{File: xdr.Nfs_fh3{Data: h}, Offset: uint64(len(out)), Count: 1 << 20}, &res)
		if err != nil || res.Status != xdr.NFS3_OK {
			return nil, fmt.Errorf("READ at %d: %v %v", len(out), res.Status, err)
		}
		out = append(out, res.Resok().Data...)
		if res.Resok().Eof {
			return out, nil
		}
	}
	return nil, fmt.Errorf("READ: no end after %d bytes", len(out))
}

// nfsGateway is a `strata nfs` process on a ProcCluster, exporting / to
// 127.0.0.1 (rw, sync, no_root_squash).
type nfsGateway struct {
	t    *testing.T
	c    *testutil.ProcCluster
	addr string
	p    *testutil.Proc
}

// startNFSGateway starts the gateway on a free port and returns its
// address once it answers MNT.
func startNFSGateway(t *testing.T, c *testutil.ProcCluster) string {
	return newNFSGateway(t, c).addr
}

func newNFSGateway(t *testing.T, c *testutil.ProcCluster) *nfsGateway {
	t.Helper()
	g := &nfsGateway{t: t, c: c, addr: testutil.FreePort(t)}
	g.start()
	t.Cleanup(func() {
		_ = g.p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("nfs log:\n%s", g.p.Tail(40))
		}
	})
	return g
}

// start (re)starts the gateway on its address.
func (g *nfsGateway) start() {
	g.t.Helper()
	g.p = testutil.StartProc(g.t, g.c.Dir, "nfs", nil, g.c.Bin, "nfs", "--meta", g.c.MetaAddr, "--key-file", g.c.KeyFile,
		"--listen", g.addr, "--rpcbind=false", "--export", "/=rw,sync,no_root_squash,clients=127.0.0.1")
	if err := testutil.WaitFor(20*time.Second, func() error {
		if g.p.Exited() {
			return fmt.Errorf("strata nfs exited:\n%s", g.p.Tail(20))
		}
		nc, err := nfstest.Dial(g.addr, "")
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = nc.MountRoot("/")
		return err
	}); err != nil {
		g.t.Fatalf("gateway: %v", err)
	}
}

// mountNFS mounts the gateway's / with nfstest.MountFUSE in a process of
// its own (the test binary as the nfsfuse worker: a FUSE server must not
// share a process with callers of its mount — a page fault on a mapped
// file would wait for a goroutine the garbage collector stopped).
func mountNFS(t *testing.T, c *testutil.ProcCluster, addr, name string) string {
	t.Helper()
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := testutil.StartProc(t, c.Dir, name, []string{"env", "STRATA_TEST_WORKER=nfsfuse", "NFSFUSE_ADDR=" + addr,
		"NFSFUSE_DIR=" + dir}, os.Args[0])
	t.Cleanup(func() {
		if err := p.Stop(15 * time.Second); err != nil {
			t.Logf("%s: %v", name, err)
		}
		testutil.ForceUnmount(dir)
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.Tail(40))
		}
	})
	if err := testutil.WaitFor(20*time.Second, func() error {
		if p.Exited() {
			return fmt.Errorf("%s exited:\n%s", name, p.Tail(20))
		}
		if !testutil.IsMounted(dir) {
			return fmt.Errorf("%s not mounted yet", dir)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// nfsFUSEWorker serves nfstest.MountFUSE of NFSFUSE_ADDR at NFSFUSE_DIR
// until SIGTERM or SIGINT (then unmounts) or an unmount from outside.
func nfsFUSEWorker() int {
	m, err := nfstest.MountFUSE(os.Getenv("NFSFUSE_DIR"), nfstest.FUSEOptions{Addr: os.Getenv("NFSFUSE_ADDR"), Export: "/",
		Debug: os.Getenv("NFSFUSE_DEBUG") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() { m.Wait(); close(done) }()
	select {
	case <-sig:
		if err := m.Unmount(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case <-done:
	}
	return 0
}
