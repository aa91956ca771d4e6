package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// netHost is one test host: a network namespace joined to a bridge.
type netHost struct {
	ns   string
	addr string
}

// TestMultiHost runs the metadata service, two storage servers and a client
// in four network namespaces joined by a bridge (in a fifth), so every byte
// crosses a (virtual) network with its own addresses. It also cuts one
// storage server's link (a partition): I/O to it fails with EIO after the
// bounded wait, and works again once the link is back.
func TestMultiHost(t *testing.T) {
	testutil.RequireFUSE(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) not installed")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter (util-linux) not installed")
	}
	bin := testutil.Binary(t)
	prefix := fmt.Sprintf("strt%d", os.Getpid()%100000)
	br := prefix + "-br"
	hosts := map[string]*netHost{
		"meta": {ns: prefix + "-meta", addr: "10.213.7.1"},
		"s1":   {ns: prefix + "-s1", addr: "10.213.7.2"},
		"s2":   {ns: prefix + "-s2", addr: "10.213.7.3"},
		"cli":  {ns: prefix + "-cli", addr: "10.213.7.4"},
	}
	ipc := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	all := []string{br}
	for _, h := range hosts {
		all = append(all, h.ns)
	}
	t.Cleanup(func() {
		for _, ns := range all {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range all {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Skipf("cannot create network namespaces: %v %s", err, out)
		}
	}
	ipc("-n", br, "link", "add", "br0", "type", "bridge")
	ipc("-n", br, "link", "set", "br0", "up")
	i := 0
	for _, h := range hosts {
		i++
		peer := fmt.Sprintf("vb%d", i)
		ipc("-n", h.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", br)
		ipc("-n", h.ns, "addr", "add", h.addr+"/24", "dev", "eth0")
		ipc("-n", h.ns, "link", "set", "eth0", "up")
		ipc("-n", h.ns, "link", "set", "lo", "up")
		ipc("-n", br, "link", "set", peer, "master", "br0", "up")
	}
	in := func(h *netHost) []string { return []string{"nsenter", "--net=/run/netns/" + h.ns, "--"} }

	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	os.WriteFile(key, []byte("multi-host-key"), 0o600)
	metaAddr := hosts["meta"].addr + ":7400"
	procs := []*testutil.Proc{
		testutil.StartProc(t, dir, "meta", in(hosts["meta"]), bin, "meta", "--listen", metaAddr, "--data", filepath.Join(dir, "meta"), "--key-file", key),
	}
	mnt := filepath.Join(dir, "mnt")
	os.MkdirAll(mnt, 0o755)
	t.Cleanup(func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Stop(10 * time.Second)
		}
		testutil.ForceUnmount(mnt)
		if t.Failed() {
			for _, p := range procs {
				t.Logf("---- %s ----\n%s", p.Name, p.Tail(30))
			}
		}
	})
	for _, s := range []string{"s1", "s2"} {
		tdir := filepath.Join(dir, s)
		os.MkdirAll(tdir, 0o755)
		procs = append(procs, testutil.StartProc(t, dir, s, in(hosts[s]), bin, "store", "--meta", metaAddr,
			"--listen", hosts[s].addr+":7500", "--target", tdir, "--key-file", key))
	}
	status := func() string {
		out, _ := exec.Command("nsenter", "--net=/run/netns/"+hosts["cli"].ns, "--", bin, "status", "--meta", metaAddr, "--key-file", key).CombinedOutput()
		return string(out)
	}
	if err := testutil.WaitFor(30*time.Second, func() error {
		s := status()
		if strings.Count(s, hosts["s1"].addr) == 0 || strings.Count(s, hosts["s2"].addr) == 0 {
			return fmt.Errorf("servers not registered yet:\n%s", s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mp := testutil.StartProc(t, dir, "mount", in(hosts["cli"]), bin, "mount", "--meta", metaAddr, "--key-file", key, "--io-timeout", "3s", mnt)
	procs = append(procs, mp)
	if err := testutil.WaitFor(30*time.Second, func() error {
		if mp.Exited() {
			return errors.New("mount exited")
		}
		if !testutil.IsMounted(mnt) {
			return errors.New("not mounted")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("across the wire "), 1<<18) // 4 MiB over both servers
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dropCaches()
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back across hosts: %v", err)
	}
	// Both servers hold part of the file.
	for _, s := range []string{"s1", "s2"} {
		if largestFile(t, filepath.Join(dir, s)) < 1<<20 {
			t.Errorf("server %s holds less than 1 MiB of a 4 MiB file striped over 2 targets", s)
		}
	}
	// Partition s2: bounded EIO, then recovery.
	ipc("-n", hosts["s2"].ns, "link", "set", "eth0", "down")
	dropCaches()
	start := time.Now()
	if _, err := os.ReadFile(p); !errors.Is(err, syscall.EIO) {
		t.Errorf("read during partition: want EIO, got %v", err)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Errorf("partition EIO took %v", d)
	}
	ipc("-n", hosts["s2"].ns, "link", "set", "eth0", "up")
	if err := testutil.WaitFor(30*time.Second, func() error {
		got, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, data) {
			return errors.New("content differs")
		}
		return nil
	}); err != nil {
		t.Errorf("after the partition heals: %v", err)
	}
}
