package store

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/transport"
)

// Config is the configuration of one storage server.
type Config struct {
	// MetaAddrs are the metadata service's voters (host:port each), as
	// `--meta A,B,C` lists them: registration and heartbeats go to the
	// leader among them (transport.Multi).
	MetaAddrs []string
	// MetaAddr is the older form of MetaAddrs: one address, or a
	// comma-separated list; used when MetaAddrs is empty (Open sets it to
	// the list joined with commas). Both empty means standalone: no
	// registration, target ids 1..n in Targets order (tests, benchmarks).
	MetaAddr string
	// ListenAddr is the data-path address to listen on; port 0 picks one.
	ListenAddr string
	// AdvertiseAddr is the address clients dial, as registered with the
	// metadata service. Default: the real listen address, with the host
	// name in place of an unspecified IP (0.0.0.0, ::).
	AdvertiseAddr string
	// Domain is the server's failure domain (a rack, a power feed), sent
	// with its registration: strata mirror create --domain pairs targets
	// across domains. "" for none.
	Domain string
	// Targets are the target directories, each on its own disk ideally.
	// Each is formatted on first use (it must then be empty, apart from
	// lost+found).
	Targets []string
	// ClusterKey authenticates peers (rpc handshake), both ways.
	ClusterKey []byte
	// TLS, when set, is the mutual-TLS identity (transport.LoadTLS) of the
	// data service and of its calls to the metadata service.
	TLS *tls.Config
	// HeartbeatInterval is the period of heartbeats to the metadata
	// service. Default 1 s.
	HeartbeatInterval time.Duration
	// ReserveBytes: a write that would leave less free space than this on
	// a target answers ENOSPC. 0 means the default, per target: 0.5 % of
	// the target's size or 64 MiB, whichever is smaller.
	ReserveBytes uint64
	// MetricsAddr, if set, serves Prometheus metrics at /metrics there.
	MetricsAddr string
	// MaxOpenChunks bounds the cache of open chunk files (two descriptors
	// each). Default 1024.
	MaxOpenChunks int
	// SyncInterval is the period of each target's background sync round,
	// which makes the chunks written and not synced since durable
	// (bgsync.go). 0 disables the rounds (a zero Config has none);
	// DefaultConfig sets DefaultSyncInterval.
	SyncInterval time.Duration
	// ResyncBytesPerSec throttles a mirror group's resync (resync.go):
	// bytes copied to the secondary a second. 0 means
	// DefaultResyncBytesPerSec; negative, no limit.
	ResyncBytesPerSec int64
}

// DefaultSyncInterval is the default Config.SyncInterval: ext4's journal
// commit interval.
const DefaultSyncInterval = 5 * time.Second

// DefaultConfig returns a configuration with every default filled in; the
// caller sets Targets and addresses.
func DefaultConfig() Config {
	return Config{
		ListenAddr:        "127.0.0.1:0",
		HeartbeatInterval: time.Second,
		MaxOpenChunks:     1024,
		SyncInterval:      DefaultSyncInterval,
	}
}

func (c *Config) applyDefaults() {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.MaxOpenChunks == 0 {
		c.MaxOpenChunks = 1024
	}
	if c.ResyncBytesPerSec == 0 {
		c.ResyncBytesPerSec = DefaultResyncBytesPerSec
	}
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Targets) == 0 {
		bad("no targets: give at least one target directory")
	}
	seen := map[string]string{}
	for _, t := range c.Targets {
		if t == "" {
			bad("empty target path")
			continue
		}
		key := canonicalPath(t)
		if prev, dup := seen[key]; dup {
			bad("target %q given twice (also as %q)", t, prev)
			continue
		}
		seen[key] = t
		fi, err := os.Stat(t)
		switch {
		case err != nil:
			bad("target %q: %v", t, err)
		case !fi.IsDir():
			bad("target %q is not a directory", t)
		default:
			if err := unix.Access(t, unix.W_OK|unix.X_OK); err != nil {
				bad("target %q is not writable: %v", t, err)
			}
		}
	}
	if err := checkAddr(c.ListenAddr, true); err != nil {
		bad("listen address: %v", err)
	}
	if c.AdvertiseAddr != "" {
		if err := checkAddr(c.AdvertiseAddr, false); err != nil {
			bad("advertise address: %v", err)
		}
	}
	if _, err := transport.AddrsOf(c.MetaAddrs, c.MetaAddr); err != nil {
		bad("metadata service addresses: %v", err)
	}
	if c.MetricsAddr != "" {
		if err := checkAddr(c.MetricsAddr, true); err != nil {
			bad("metrics address: %v", err)
		}
	}
	if c.HeartbeatInterval < 0 {
		bad("heartbeat interval %v is negative", c.HeartbeatInterval)
	}
	if c.MaxOpenChunks < 0 {
		bad("max open chunks %d is negative", c.MaxOpenChunks)
	}
	if c.SyncInterval < 0 {
		bad("sync interval %v is negative (0 disables the background sync)", c.SyncInterval)
	}
	return errors.Join(errs...)
}

// checkAddr checks a host:port; listen addresses may have an empty host and
// port 0, dial addresses need both.
func checkAddr(a string, listen bool) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q: %v", a, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("%q: port %q is not a number 0..65535", a, port)
	}
	if !listen && (host == "" || p == 0) {
		return fmt.Errorf("%q: need host and non-zero port", a)
	}
	return nil
}

// canonicalPath resolves t to an absolute path without symlinks, so that
// two spellings of one directory compare equal.
func canonicalPath(t string) string {
	p, err := filepath.Abs(t)
	if err != nil {
		p = filepath.Clean(t)
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return p
}
