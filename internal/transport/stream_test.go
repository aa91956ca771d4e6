package transport

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
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
