package main

import (
	"crypto/tls"
	"os"

	"github.com/spf13/pflag"

	"github.com/stratafs/strata/internal/transport"
)

// tlsFlags are the mutual-TLS options of every command that talks rpc:
// all three or none. Without them, peers prove the cluster key to each
// other but the traffic is neither encrypted nor integrity-protected
// (README, "Security").
type tlsFlags struct{ cert, key, ca string }

func (t *tlsFlags) register(f *pflag.FlagSet) {
	f.StringVar(&t.cert, "tls-cert", "", "PEM certificate (chain) of this node, for mutual TLS with --tls-key and --tls-ca (default $STRATA_TLS_CERT)")
	f.StringVar(&t.key, "tls-key", "", "PEM private key of --tls-cert (default $STRATA_TLS_KEY)")
	f.StringVar(&t.ca, "tls-ca", "", "PEM certificates of the authorities that sign the cluster's certificates (default $STRATA_TLS_CA)")
}

// load returns the TLS identity the flags name (nil: no TLS), and records
// it as the one of this process's admin clients (adminClient).
func (t *tlsFlags) load() (*tls.Config, error) {
	cert, key, ca := envDefault(t.cert, "STRATA_TLS_CERT"), envDefault(t.key, "STRATA_TLS_KEY"), envDefault(t.ca, "STRATA_TLS_CA")
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, usagef("mutual TLS needs --tls-cert, --tls-key and --tls-ca together")
	}
	c, err := transport.LoadTLS(cert, key, ca)
	if err != nil {
		return nil, usagef("%v", err)
	}
	adminTLS = c
	return c, nil
}

// adminTLS is the TLS identity of the admin commands' clients, set by
// tlsFlags.load.
var adminTLS *tls.Config

func envDefault(v, env string) string {
	if v == "" {
		return os.Getenv(env)
	}
	return v
}
