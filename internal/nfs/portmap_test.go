package nfs

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rpcbindRunning starts `rpcbind -f -w` unless one already answers on its
// socket; the test is skipped when rpcbind is not installed.
func rpcbindRunning(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("rpcinfo"); err != nil {
		t.Skip("rpcbind is not installed (apt-get install rpcbind): rpcinfo not found")
	}
	if c, err := net.DialTimeout("unix", RpcbindSocket, time.Second); err == nil {
		c.Close()
		return
	}
	bin, err := exec.LookPath("rpcbind")
	if err != nil {
		for _, p := range []string{"/usr/sbin/rpcbind", "/sbin/rpcbind"} {
			if _, err := os.Stat(p); err == nil {
				bin = p
			}
		}
	}
	if bin == "" {
		t.Skip("rpcbind is not installed (apt-get install rpcbind)")
	}
	if os.Geteuid() != 0 {
		t.Skip("starting rpcbind needs root (port 111 and " + RpcbindSocket + ")")
	}
	cmd := exec.Command(bin, "-f", "-w")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rpcbind: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for i := 0; i < 100; i++ {
		if c, err := net.DialTimeout("unix", RpcbindSocket, time.Second); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("rpcbind did not open its socket within 5 s")
}

// mappings is what `rpcinfo -p` lists for prog over tcp: the ports (of
// version 3, or for NLM 4 and NSM 1, the versions the gateway serves).
func mappings(t *testing.T, prog int) []string {
	t.Helper()
	out, err := exec.Command("rpcinfo", "-p", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("rpcinfo -p: %v: %s", err, out)
	}
	var ports []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		vers := map[int]string{nlmProgram: "4", nsmProgram: "1"}[prog]
		if vers == "" {
			vers = "3"
		}
		if len(f) >= 4 && f[0] == strconv.Itoa(prog) && f[1] == vers && f[2] == "tcp" {
			ports = append(ports, f[3])
		}
	}
	return ports
}

func TestRegisterWithRpcbind(t *testing.T) {
	rpcbindRunning(t)
	// rpcbind v4 on its socket, then port mapper v2 over TCP (the socket
	// path made unreachable).
	for _, sock := range []string{"", filepath.Join(t.TempDir(), "none.sock")} {
		registerOnce(t, sock)
	}
}

func registerOnce(t *testing.T, sock string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	r, err := Register(ln.Addr(), sock, "")
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	t.Logf("registered via %s", r.Method)
	for _, prog := range []int{nfsProgram, mountProgram, nlmProgram, nsmProgram} {
		if got := mappings(t, prog); len(got) != 1 || got[0] != port {
			t.Errorf("rpcinfo -p: program %d tcp on %v, want [%s]", prog, got, port)
		}
	}
	// A second registration (a restarted gateway on another port)
	// replaces the first.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	port2 := strconv.Itoa(ln2.Addr().(*net.TCPAddr).Port)
	r2, err := Register(ln2.Addr(), sock, "")
	if err != nil {
		t.Fatalf("register again: %v", err)
	}
	if got := mappings(t, nfsProgram); len(got) != 1 || got[0] != port2 {
		t.Errorf("after re-registering: NFS on %v, want [%s]", got, port2)
	}
	// NLM and NSM on a port of their own (--nlm-port).
	r3, err := RegisterPorts(ln2.Addr(), 4045, sock, "")
	if err != nil {
		t.Fatalf("register with an NLM port: %v", err)
	}
	if got := mappings(t, nlmProgram); len(got) != 1 || got[0] != "4045" {
		t.Errorf("NLM on %v, want [4045]", got)
	}
	if got := mappings(t, mountProgram); len(got) != 1 || got[0] != port2 {
		t.Errorf("with an NLM port: MOUNT on %v, want [%s]", got, port2)
	}
	_ = r2
	if err := r3.Unregister(); err != nil {
		t.Fatalf("unregister: %v", err)
	}
	for _, prog := range []int{nfsProgram, mountProgram, nlmProgram, nsmProgram} {
		if got := mappings(t, prog); len(got) != 0 {
			t.Errorf("after unregister: program %d still mapped on %v", prog, got)
		}
	}
}

func TestRegisterNoPortmapper(t *testing.T) {
	// A socket path that does not exist and a loopback port nobody
	// listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, err = Register(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2049}, filepath.Join(t.TempDir(), "none.sock"), closed)
	if !errors.Is(err, ErrNoPortmapper) {
		t.Fatalf("register without a portmapper: %v, want ErrNoPortmapper", err)
	}
}
