package transport

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Handshake proofs (transport.go has the exchange). The label binds a proof
// to the side that makes it: a client's proof is never a valid server proof
// for the same nonces, so a peer without the key cannot reflect one back.
const (
	clientLabel = "strata rpc client"
	serverLabel = "strata rpc server"
	nonceBytes  = 16
	proofBytes  = sha256.Size
)

func authProof(key []byte, label string, serverNonce, clientNonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(serverNonce)
	m.Write(clientNonce)
	return m.Sum(nil)
}

// readHello reads the peer's magic, checks it, and then reads the rest of
// its message into rest.
func readHello(c net.Conn, rest []byte) error {
	var m [len(magic)]byte
	if _, err := io.ReadFull(c, m[:]); err != nil {
		return err
	}
	if err := checkMagic(m[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(c, rest)
	return err
}

// checkMagic explains a peer whose first bytes are not this version's.
func checkMagic(got []byte) error {
	switch {
	case bytes.Equal(got, magic[:]):
		return nil
	case bytes.Equal(got, magicV1[:]):
		return fmt.Errorf("%w: the peer speaks rpc handshake version 1, which authenticates only the client; this Strata needs version 2: run the same Strata version on every node", rpc.ErrMalformed)
	}
	return fmt.Errorf("%w: bad magic %q (not a Strata peer, or another protocol version)", rpc.ErrMalformed, got)
}

// serverHandshake runs the server's side of the handshake on c (inside TLS
// when the server has a TLS config): it returns once both sides proved the
// cluster key, ErrAuth when the client did not.
func serverHandshake(c net.Conn, key []byte, deadline time.Time) error {
	_ = c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	ns := newNonce()
	if _, err := c.Write(append(magic[:], ns...)); err != nil {
		return err
	}
	var in [nonceBytes + proofBytes]byte
	if err := readHello(c, in[:]); err != nil {
		return err
	}
	nc, proof := in[:nonceBytes], in[nonceBytes:]
	if !hmac.Equal(proof, authProof(key, clientLabel, ns, nc)) {
		return fmt.Errorf("%w: the client did not prove the cluster key", ErrAuth)
	}
	_, err := c.Write(append([]byte{0}, authProof(key, serverLabel, ns, nc)...))
	return err
}

// clientHandshake runs the client's side of the handshake on nc: it returns
// once both sides proved the cluster key, ErrAuth when the server did not
// or refused the client's proof.
func clientHandshake(nc net.Conn, key []byte, deadline time.Time) error {
	_ = nc.SetDeadline(deadline)
	defer nc.SetDeadline(time.Time{})
	var ns [nonceBytes]byte
	if err := readHello(nc, ns[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("no greeting from the server (a server using TLS waits for the client to start TLS: is it configured for TLS and this side not?): %w", err)
		}
		return err
	}
	cn := newNonce()
	out := append(append(magic[:], cn...), authProof(key, clientLabel, ns[:], cn)...)
	if _, err := nc.Write(out); err != nil {
		return err
	}
	var ans [1 + proofBytes]byte
	if _, err := io.ReadFull(nc, ans[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return fmt.Errorf("%w: the server refused this client's proof of the cluster key", ErrAuth)
		}
		return err
	}
	if ans[0] != 0 || !hmac.Equal(ans[1:], authProof(key, serverLabel, ns[:], cn)) {
		return fmt.Errorf("%w: the server did not prove the cluster key (not a member of this cluster, or another cluster's)", ErrAuth)
	}
	return nil
}

// LoadTLS reads a node's mutual-TLS identity from PEM files: its
// certificate chain (certFile) and private key (keyFile), and the
// certificate authorities it trusts for its peers (caFile). The config
// serves both roles: as a server it demands and verifies the client's
// certificate, as a client (Client sets ServerName to the host it dials)
// it verifies the server's certificate and its name.
func LoadTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read TLS CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", caFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// clientTLS wraps nc in a TLS client session for addr and completes the
// TLS handshake by deadline.
func clientTLS(nc net.Conn, cfg *tls.Config, addr string, deadline time.Time) (net.Conn, error) {
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	return tlsHandshake(tls.Client(nc, cfg), deadline)
}

// serverTLS wraps c in a TLS server session and completes the handshake by
// deadline.
func serverTLS(c net.Conn, cfg *tls.Config, deadline time.Time) (net.Conn, error) {
	return tlsHandshake(tls.Server(c, cfg), deadline)
}

func tlsHandshake(tc *tls.Conn, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, tlsError(err)
	}
	return tc, nil
}

// tlsError marks a refused certificate (the peer's, or ours: the peer's
// alert) as ErrAuth.
func tlsError(err error) error {
	var ve *tls.CertificateVerificationError
	var ae tls.AlertError
	if errors.Is(err, ErrAuth) {
		return err
	}
	var oe *net.OpError // an alert from the peer is a "remote error"
	if errors.As(err, &ve) || errors.As(err, &ae) || errors.As(err, &oe) && oe.Op == "remote error" {
		return fmt.Errorf("%w: TLS: %v", ErrAuth, err)
	}
	return fmt.Errorf("TLS handshake: %w", err)
}
