package test

import (
	"bytes"
	"context"
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

// TestMultiHost runs the metadata service, two storage servers and a client
// in four network namespaces joined by a bridge (in a fifth), so every byte
// crosses a (virtual) network with its own addresses. It also cuts one
// storage server's link (a partition): I/O to it fails with EIO after the
// bounded wait, and works again once the link is back.
func TestMultiHost(t *testing.T) {
	testutil.RequireFUSE(t)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter (util-linux) not installed")
	}
	bin := testutil.Binary(t)
	n := testutil.NewNet(t, "meta", "s1", "s2", "cli")
	hosts := map[string]*testutil.Host{}
	for _, h := range n.Hosts {
		hosts[h.Name] = h
	}
	in := func(h *testutil.Host) []string { return h.Prefix() }

	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	os.WriteFile(key, []byte("multi-host-key"), 0o600)
	metaAddr := hosts["meta"].Addr + ":7400"
	procs := []*testutil.Proc{
		testutil.StartProc(t, dir, "meta", in(hosts["meta"]), bin, "meta", "--listen", metaAddr, "--data", filepath.Join(dir, "meta"), "--key-file", key),
	}
	mnt := filepath.Join(dir, "mnt")
	os.MkdirAll(mnt, 0o755)
	testutil.StopAtCleanup(t, &procs, mnt)
	for _, s := range []string{"s1", "s2"} {
		tdir := filepath.Join(dir, s)
		os.MkdirAll(tdir, 0o755)
		procs = append(procs, testutil.StartProc(t, dir, s, in(hosts[s]), bin, "store", "--meta", metaAddr,
			"--listen", hosts[s].Addr+":7500", "--target", tdir, "--key-file", key))
	}
	status := func() string {
		out, _ := hosts["cli"].Command(context.Background(), bin, "status", "--meta", metaAddr, "--key-file", key).CombinedOutput()
		return string(out)
	}
	if err := testutil.WaitFor(30*time.Second, func() error {
		s := status()
		if strings.Count(s, hosts["s1"].Addr) == 0 || strings.Count(s, hosts["s2"].Addr) == 0 {
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
	hosts["s2"].LinkDown()
	dropCaches()
	start := time.Now()
	if _, err := os.ReadFile(p); !errors.Is(err, syscall.EIO) {
		t.Errorf("read during partition: want EIO, got %v", err)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Errorf("partition EIO took %v", d)
	}
	hosts["s2"].LinkUp()
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
