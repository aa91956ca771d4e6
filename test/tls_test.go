package test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

// TestMutualTLSCluster runs meta, stores and a mount as real processes over
// mutual TLS (and the cluster key), and checks that a certificate of
// another authority, or none, is refused.
func TestMutualTLSCluster(t *testing.T) {
	dir := t.TempDir()
	ca, other := testutil.NewTestCA(t, dir, "cluster"), testutil.NewTestCA(t, dir, "other")
	cert, key := ca.Issue(t, "node")
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1,
		AuthArgs: []string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca.CAFile}})
	p := filepath.Join(c.Mount(0), "f")
	data := bytes.Repeat([]byte("tls "), 300_000) // more than one 1 MiB write
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back over TLS: %v (%d of %d bytes equal)", err, len(got), len(data))
	}

	status := func(extra ...string) (string, error) {
		args := append([]string{"status", "--meta", c.MetaAddr, "--key-file", c.KeyFile}, extra...)
		return runBounded(30*time.Second, c.Bin, args...)
	}
	if out, err := status("--tls-cert", cert, "--tls-key", key, "--tls-ca", ca.CAFile); err != nil {
		t.Fatalf("status with the cluster's certificate: %v\n%s", err, out)
	}
	scert, skey := other.Issue(t, "stranger")
	out, err := status("--tls-cert", scert, "--tls-key", skey, "--tls-ca", ca.CAFile)
	if err == nil || !strings.Contains(out, "authentication failed") {
		t.Fatalf("status with another authority's certificate: want an authentication failure, got %v\n%s", err, out)
	}
	if out, err := status(); err == nil || !strings.Contains(out, "TLS") {
		t.Fatalf("status without TLS, to a TLS service: want an error suggesting TLS, got %v\n%s", err, out)
	}
}
