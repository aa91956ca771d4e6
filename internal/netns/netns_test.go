package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func newTestNet(t *testing.T, shaped bool, names ...string) *Net {
	t.Helper()
	n, err := New(Config{Prefix: OwnedPrefix("strata-nstest-", os.Getpid()) + fmt.Sprint(time.Now().UnixNano()%100000) + "-", Subnet: "10.213.9", Shaped: shaped}, names...)
	if errors.Is(err, ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// acceptOn accepts (and closes) TCP connections on h:port until the test ends.
func acceptOn(t *testing.T, h *Host, port int) {
	t.Helper()
	ln, err := h.Listen("tcp", fmt.Sprintf("%s:%d", h.Addr, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

func exists(ns string) bool {
	_, err := os.Stat("/run/netns/" + ns)
	return err == nil
}

// TestCloseRemovesEverything: New makes the bridge's and the hosts'
// namespaces with the addresses in order; the hosts reach each other;
// Close deletes every namespace, also after a packet fault.
func TestCloseRemovesEverything(t *testing.T) {
	n := newTestNet(t, false, "a", "b")
	if got := n.Namespaces(); len(got) != 3 || !exists(got[0]) || !exists(got[2]) {
		t.Fatalf("namespaces %v", got)
	}
	a, b := n.Host("a"), n.Host("b")
	if a.Addr != "10.213.9.1" || b.Addr != "10.213.9.2" || n.Host("c") != nil {
		t.Fatalf("addresses %s %s", a.Addr, b.Addr)
	}
	acceptOn(t, b, 9000)
	if c, err := a.Dial("tcp", b.Addr+":9000", 2*time.Second); err != nil {
		t.Fatalf("a cannot reach b: %v", err)
	} else {
		c.Close()
	}
	if CheckNft() == nil {
		if err := n.DropFrom(a, b); err != nil {
			t.Fatal(err)
		}
		if c, err := a.Dial("tcp", b.Addr+":9000", time.Second); err == nil {
			c.Close()
			t.Error("a reached b through DropFrom(a, b)")
		}
		if err := n.Heal(); err != nil {
			t.Fatal(err)
		}
		if err := n.Heal(); err != nil { // nothing left to heal: no error
			t.Fatalf("second Heal: %v", err)
		}
	}
	all := n.Namespaces()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range all {
		if exists(ns) {
			t.Errorf("namespace %s left after Close", ns)
		}
	}
}

// TestLeftovers: the namespaces of an owner that no longer runs are found
// and removed with the process running in them; those of a live owner
// (this process) are left alone.
func TestLeftovers(t *testing.T) {
	if err := Check(false); err != nil {
		t.Skip(err)
	}
	const base = "strata-nstest-left-"
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadNS := OwnedPrefix(base, dead.Process.Pid) + "x"
	liveNS := OwnedPrefix(base, os.Getpid()) + "x"
	for _, ns := range []string{deadNS, liveNS} {
		if err := ip("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ip("netns", "del", ns) })
	}
	// A process left running in the dead owner's namespace.
	sleeper := exec.Command("nsenter", "--net=/run/netns/"+deadNS, "--", "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { sleeper.Wait(); close(exited) }()
	t.Cleanup(func() { sleeper.Process.Kill() })
	if got := Leftovers(base); !slices.Equal(got, []string{deadNS}) {
		t.Fatalf("Leftovers = %v, want [%s]", got, deadNS)
	}
	deadline := time.Now().Add(10 * time.Second) // until nsenter has entered
	for len(PIDs(deadNS)) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := PIDs(deadNS); !slices.Equal(got, []int{sleeper.Process.Pid}) {
		t.Fatalf("PIDs(%s) = %v, want [%d]", deadNS, got, sleeper.Process.Pid)
	}
	var seen []int
	removed, err := RemoveLeftovers(base, 5*time.Second, func(pid int) { seen = append(seen, pid) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{deadNS}) || !slices.Equal(seen, []int{sleeper.Process.Pid}) {
		t.Fatalf("removed %v (saw pids %v)", removed, seen)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the leftover namespace still runs")
	}
	if exists(deadNS) || !exists(liveNS) {
		t.Fatalf("after RemoveLeftovers: %s exists %v, %s exists %v", deadNS, exists(deadNS), liveNS, exists(liveNS))
	}
}

// TestShapedDelay: a shaped link delays what its host sends; Heal ends it.
func TestShapedDelay(t *testing.T) {
	n := newTestNet(t, true, "a", "b")
	a, b := n.Host("a"), n.Host("b")
	acceptOn(t, b, 9000)
	connect := func() time.Duration {
		start := time.Now()
		c, err := a.Dial("tcp", b.Addr+":9000", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return time.Since(start)
	}
	connect()
	const d = 150 * time.Millisecond
	if err := a.Delay(d); err != nil {
		t.Fatal(err)
	}
	if got := connect(); got < d {
		t.Errorf("connect took %v with %v delay", got, d)
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if got := connect(); got >= d {
		t.Errorf("connect took %v after Heal", got)
	}
}
