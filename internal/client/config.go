package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Sync policies (Config.SyncPolicy).
const (
	// SyncPolicySync makes close put the file's data on stable storage of
	// every target written and commit its size durably, which also makes
	// every namespace change applied before that commit durable (the
	// metadata log is sequential): a closed file with data survives a
	// crash of any machine. A close that wrote nothing waits for nothing:
	// the file's entry (an empty file's create, a chmod) was written to the
	// metadata log before it was answered, so it survives a kill of the
	// daemons, and the log is on stable storage within its sync delay
	// (5 ms) — fsync (of the file or its directory) makes it so at once.
	// The default.
	SyncPolicySync = "sync"
	// SyncPolicyStrict makes every close an fsync: as sync, and a close
	// that wrote nothing also waits until the file's own namespace changes
	// (its create, mode changes) are on the metadata service's stable
	// storage.
	SyncPolicyStrict = "strict"
	// SyncPolicyAsync makes close only drain write-behind to the servers
	// (their memory) and commit the size without waiting for the metadata
	// log's sync: faster, scratch-grade.
	SyncPolicyAsync = "async"
)

// ValidSyncPolicy reports whether p names a sync policy.
func ValidSyncPolicy(p string) bool {
	return p == SyncPolicySync || p == SyncPolicyStrict || p == SyncPolicyAsync
}

// Config configures a Client. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// MetaAddrs are the metadata service's voters (host:port each), as
	// `--meta A,B,C` lists them: calls go to the leader among them
	// (transport.Multi). One address is a list of one.
	MetaAddrs []string
	// MetaAddr is the older form of MetaAddrs: one address, or a
	// comma-separated list. Used when MetaAddrs is empty; New sets it to
	// the list joined with commas (the mount's source shows it).
	MetaAddr string
	// ClusterKey authenticates this client and every server to each
	// other.
	ClusterKey []byte
	// TLS, when set, is the mutual-TLS identity (transport.LoadTLS) the client
	// presents to every server, whose certificates it verifies.
	TLS *tls.Config
	// IOTimeout bounds how long a call waits for an unreachable server
	// (metadata or storage) before it fails: EIO for storage, the
	// transport error (ErrUnavailable, EIO at the POSIX layer) for meta.
	IOTimeout time.Duration
	// SyncPolicy is SyncPolicySync, SyncPolicyStrict or SyncPolicyAsync
	// (see there).
	SyncPolicy string
	// WriteBehindBytes bounds the memory of data accepted by WriteAt but
	// not yet acknowledged by the stores, for the whole client. WriteAt
	// blocks when the budget is used up. Read-ahead buffers also draw on
	// it, but never wait for it.
	WriteBehindBytes int64
	// ReadAheadBytes is how far ahead of a sequential reader a handle
	// prefetches. 0 disables read-ahead.
	ReadAheadBytes int64
	// WriteThroughBytes: a buffered write at least this large, whose
	// stripes each take one contiguous piece of it, made while another
	// write is in progress, goes to the stores straight from the caller's
	// memory and returns when they have it, instead of being copied into
	// write-behind buffers. Concurrent writers keep the stores busy by
	// themselves, large writes gain nothing from coalescing, and the copy
	// is what a host whose memory bandwidth is the limit pays for most. A
	// lone writer keeps write-behind (it overlaps the writer with the
	// stores). 0 buffers every write.
	WriteThroughBytes int64
	// ConnsPerServer is the number of pooled TCP connections per storage
	// server.
	ConnsPerServer int
	// MetaConns is the number of pooled TCP connections to the metadata
	// service.
	MetaConns int
	// TargetRefreshInterval is how often the target map (MListTargets) is
	// refreshed in the background; it is also refreshed on errors.
	TargetRefreshInterval time.Duration
	// MetricsAddr, when not empty, serves Prometheus metrics at
	// http://MetricsAddr/metrics.
	MetricsAddr string
	// DirAttrTTL is how long a directory's attributes, as answered with
	// this client's own namespace change in it (create, unlink, rmdir,
	// rename, link, …), serve GetAttr without a metadata call. Keep it at most the mount's attribute timeout (the
	// kernel caches attributes that long anyway); 0 turns it off.
	DirAttrTTL time.Duration
	// CreateDelegation lets this client ask for a directory's create
	// delegation (docs/design/0016) after a run of its own creates there,
	// answer lookups of new names and creates there itself while it holds
	// it, and give it back on recall, when idle and at unmount. Not with
	// SyncPolicyStrict. (strata up and mount turn it on by default; the
	// zero Config leaves it off.)
	CreateDelegation bool
	// InlineBytes: a file this client creates under a create delegation
	// and closes at no more than this many bytes, all written before its
	// create was sent, keeps its data with its inode in the metadata
	// service instead of in a chunk (docs/design/0017); 0 never. At most
	// rpc.MaxInlineBytes. (strata up and mount set 4 KiB by default; the
	// zero Config leaves it off.)
	InlineBytes int
	// Host and MountPoint describe this client in its session (shown by
	// strata status). Host defaults to the hostname.
	Host       string
	MountPoint string
}

// DefaultConfig returns the defaults; MetaAddrs (or MetaAddr) and ClusterKey must still be set.
func DefaultConfig() Config {
	return Config{
		IOTimeout:             30 * time.Second,
		SyncPolicy:            SyncPolicySync,
		WriteBehindBytes:      64 << 20,
		ReadAheadBytes:        8 << 20,
		WriteThroughBytes:     1 << 20,
		ConnsPerServer:        4,
		MetaConns:             4,
		TargetRefreshInterval: 10 * time.Second,
		DirAttrTTL:            time.Second,
	}
}

// Validate reports every problem of the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if _, err := c.MetaList(); err != nil {
		errs = append(errs, err)
	}
	if len(c.ClusterKey) == 0 {
		errs = append(errs, errors.New("cluster key is empty"))
	}
	if c.IOTimeout <= 0 {
		errs = append(errs, fmt.Errorf("io timeout %v must be positive", c.IOTimeout))
	}
	if !ValidSyncPolicy(c.SyncPolicy) {
		errs = append(errs, fmt.Errorf("sync policy %q: want %q, %q or %q", c.SyncPolicy, SyncPolicySync, SyncPolicyStrict, SyncPolicyAsync))
	}
	if c.CreateDelegation && c.SyncPolicy == SyncPolicyStrict {
		errs = append(errs, fmt.Errorf("create delegation is not for sync policy %q (every create must be durable before it is answered)", SyncPolicyStrict))
	}
	if c.WriteBehindBytes < 4<<20 {
		errs = append(errs, fmt.Errorf("write-behind bytes %d must be at least 4 MiB", c.WriteBehindBytes))
	}
	if c.ReadAheadBytes < 0 {
		errs = append(errs, fmt.Errorf("read-ahead bytes %d must not be negative", c.ReadAheadBytes))
	}
	if c.InlineBytes < 0 || c.InlineBytes > rpc.MaxInlineBytes {
		errs = append(errs, fmt.Errorf("inline bytes %d must be 0..%d", c.InlineBytes, rpc.MaxInlineBytes))
	}
	if c.WriteThroughBytes < 0 {
		errs = append(errs, fmt.Errorf("write-through bytes %d must not be negative", c.WriteThroughBytes))
	}
	if c.ConnsPerServer <= 0 || c.ConnsPerServer > 64 {
		errs = append(errs, fmt.Errorf("connections per server %d must be 1..64", c.ConnsPerServer))
	}
	if c.MetaConns <= 0 || c.MetaConns > 64 {
		errs = append(errs, fmt.Errorf("meta connections %d must be 1..64", c.MetaConns))
	}
	if c.TargetRefreshInterval <= 0 {
		errs = append(errs, fmt.Errorf("target refresh interval %v must be positive", c.TargetRefreshInterval))
	}
	if c.DirAttrTTL < 0 {
		errs = append(errs, fmt.Errorf("directory attribute ttl %v must not be negative", c.DirAttrTTL))
	}
	return errors.Join(errs...)
}

// MetaList returns the metadata service's addresses, checked: MetaAddrs,
// else MetaAddr parsed as a list.
func (c *Config) MetaList() ([]string, error) {
	l, err := transport.AddrsOf(c.MetaAddrs, c.MetaAddr)
	if err != nil {
		return nil, fmt.Errorf("meta addresses: %w", err)
	}
	if len(l) == 0 {
		return nil, errors.New("meta address is empty")
	}
	return l, nil
}
