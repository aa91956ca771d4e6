package transport

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// TestStream: a stream shares the rpc port; the hello and reply travel,
// then the raw connection carries bytes both ways; a refusal's reason and a
// wrong key reach the dialer.
func TestStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer([]byte("k"))
	addr := ln.Addr().String()
	sl := srv.ListenStream(StreamRaft, addr, ClientConfig{Key: []byte("k")}, func(peer string, hello []byte) ([]byte, error) {
		if string(hello) == "other" {
			return nil, errors.New("belongs to cluster other")
		}
		return []byte("reply:" + string(hello)), nil
	})
	sl.Hello = func() []byte { return []byte("mine") }
	var got []byte
	sl.Reply = func(_ string, r []byte) { got = r }
	go srv.Serve(ln)
	defer srv.Close()
	go func() {
		c, err := sl.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c) // echo
		c.Close()
	}()
	c, err := sl.DialStream(addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "reply:mine" {
		t.Fatalf("reply %q", got)
	}
	if sl.Addr().String() != addr {
		t.Fatalf("addr %v", sl.Addr())
	}
	msg := strings.Repeat("x", 100000)
	go c.Write([]byte(msg))
	buf := make([]byte, len(msg))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo: %v", err)
	}
	c.Close()

	_, _, err = DialStream(addr, StreamRaft, []byte("other"), ClientConfig{Key: []byte("k")}, time.Second)
	if !errors.Is(err, ErrStreamRefused) || !strings.Contains(err.Error(), "belongs to cluster other") {
		t.Fatalf("refusal: %v", err)
	}
	_, _, err = DialStream(addr, 9, nil, ClientConfig{Key: []byte("k")}, time.Second)
	if !errors.Is(err, ErrStreamRefused) {
		t.Fatalf("unknown purpose: %v", err)
	}
	_, _, err = DialStream(addr, StreamRaft, nil, ClientConfig{Key: []byte("wrong")}, time.Second)
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong key: %v", err)
	}
}

// TestStreamTLS: a stream over mutual TLS carries bytes; a dialer whose
// certificate the server does not trust fails with ErrAuth.
func TestStreamTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := testutil.NewTestCA(t, dir, "cluster"), testutil.NewTestCA(t, dir, "other")
	load := func(ca *testutil.TestCA, name string) *tls.Config {
		cert, key := ca.Issue(t, name)
		cfg, err := LoadTLS(cert, key, ca.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	srv := NewServer([]byte("k"))
	srv.TLS = load(ca, "server")
	sl := srv.ListenStream(StreamRaft, addr, ClientConfig{Key: []byte("k"), TLS: load(ca, "dialer")}, nil)
	go srv.Serve(ln)
	defer srv.Close()
	go func() {
		if c, err := sl.Accept(); err == nil {
			c.Write([]byte("over tls"))
			c.Close()
		}
	}()
	c, err := sl.DialStream(addr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(b) != "over tls" {
		t.Fatalf("read %q %v", b, err)
	}
	_, _, err = DialStream(addr, StreamRaft, nil, ClientConfig{Key: []byte("k"), TLS: load(other, "stranger")}, 3*time.Second)
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("untrusted certificate: %v", err)
	}
}
