package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"

	"github.com/stratafs/strata/internal/rpc"
)

// fakeServer accepts one connection, sends hello, reads what the client
// answers, and then sends answer(clientBytes). It knows no cluster key.
func fakeServer(t *testing.T, hello []byte, answer func(fromClient []byte) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := c.Write(hello); err != nil {
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		var buf [256]byte
		n, err := io.ReadAtLeast(c, buf[:], len(magic)+proofLenForTest)
		if err != nil {
			return
		}
		_, _ = c.Write(answer(buf[:n]))
		_, _ = io.Copy(io.Discard, c) // until the client hangs up
	}()
	return ln.Addr().String()
}

// proofLenForTest is the shortest client answer after the magic: a proof.
const proofLenForTest = 32

func TestClientRefusesServerWithoutKey(t *testing.T) {
	addr := fakeServer(t, append(magic[:], newNonce()...), func([]byte) []byte {
		// "Accepted", and a proof made up without the key.
		return append([]byte{0}, make([]byte, 32)...)
	})
	c := NewClient(addr, ClientConfig{Key: []byte("k"), NoLocal: true, DialTimeout: 3 * time.Second})
	defer c.Close()
	err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{})
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "server did not prove") {
		t.Fatalf("a server without the key: want ErrAuth saying the server did not prove the key, got %v", err)
	}
}

func TestReflectedProofRefused(t *testing.T) {
	// The impostor answers with the client's own proof (the last 32
	// bytes it sent).
	addr := fakeServer(t, append(magic[:], newNonce()...), func(from []byte) []byte {
		return append([]byte{0}, from[len(from)-32:]...)
	})
	c := NewClient(addr, ClientConfig{Key: []byte("k"), NoLocal: true, DialTimeout: 3 * time.Second})
	defer c.Close()
	err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("a server reflecting the client's proof: want ErrAuth, got %v", err)
	}
	ns, nc := newNonce(), newNonce()
	if string(authProof([]byte("k"), clientLabel, ns, nc)) == string(authProof([]byte("k"), serverLabel, ns, nc)) {
		t.Fatal("client and server proofs of the same nonces are equal")
	}
}

func TestVersion1PeerNamed(t *testing.T) {
	v1 := [8]byte{'S', 'T', 'R', 'A', 'T', 'A', 0, 1}
	addr := fakeServer(t, append(v1[:], newNonce()...), func([]byte) []byte { return []byte{0} })
	c := NewClient(addr, ClientConfig{Key: []byte("k"), NoLocal: true, DialTimeout: 3 * time.Second})
	defer c.Close()
	err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 1}, &rpc.AttrResp{})
	if err == nil || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("a version 1 server: want an error naming handshake version 1, got %v", err)
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := testutil.NewTestCA(t, dir, "cluster"), testutil.NewTestCA(t, dir, "other")
	load := func(ca *testutil.TestCA, name, trust string) *tls.Config {
		cert, key := ca.Issue(t, name)
		cfg, err := LoadTLS(cert, key, trust)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	_, addr := startTunedServer(t, []byte("k"), func(s *Server) { s.TLS = load(ca, "server", ca.CAFile) })
	call := func(cfg *tls.Config, key string) error {
		c := NewClient(addr, ClientConfig{Key: []byte(key), TLS: cfg, NoLocal: true, DialTimeout: 3 * time.Second})
		defer c.Close()
		var r rpc.AttrResp
		err := c.Call(context.Background(), rpc.MGetAttr, &rpc.GetAttrReq{Ino: 5}, &r)
		if err == nil && r.Attr.Ino != 5 {
			err = errors.New("wrong answer")
		}
		return err
	}
	if err := call(load(ca, "client", ca.CAFile), "k"); err != nil {
		t.Fatalf("certificate of the cluster's CA: %v", err)
	}
	if err := call(load(other, "stranger", ca.CAFile), "k"); !errors.Is(err, ErrAuth) {
		t.Fatalf("client certificate of another CA: want ErrAuth, got %v", err)
	}
	if err := call(load(ca, "client2", other.CAFile), "k"); !errors.Is(err, ErrAuth) {
		t.Fatalf("server certificate not trusted by the client: want ErrAuth, got %v", err)
	}
	if err := call(load(ca, "client3", ca.CAFile), "wrong"); !errors.Is(err, ErrAuth) {
		t.Fatalf("good certificate, wrong cluster key: want ErrAuth, got %v", err)
	}
	if err := call(nil, "k"); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("a client without TLS, to a TLS server: want an error suggesting TLS, got %v", err)
	}
}
