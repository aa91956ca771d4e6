package meta

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/stratafs/strata/internal/clock"
	"github.com/stratafs/strata/internal/kv"
)

// Config configures the metadata service. Zero fields take the defaults of
// DefaultConfig when passed to Open.
type Config struct {
	// DataDir holds everything the service keeps: meta.json (effective
	// config and format version), fsm/ (the namespace store) and raft/ (the
	// raft log and snapshots). Required.
	DataDir string
	// FS, when set, is the file system under the state machine's store
	// (DataDir/fsm): tests pass pebble's vfs/errorfs or its crash-simulating
	// memory file system (see package kv). The raft log and meta.json stay
	// on the operating system's. Default: the operating system's.
	FS kv.FS
	// ListenAddr is the rpc address (host:port; port 0 picks a free one).
	ListenAddr string
	// RaftAddr is the raft transport address. Default: 127.0.0.1:0 when
	// ListenAddr's host is loopback, else ListenAddr's host with port+1. On a
	// restart with a port-0 RaftAddr the previously bound port is tried first.
	RaftAddr string
	// NodeID is the raft server id; default: the id saved in DataDir, or a
	// new random one on first start. It cannot change for a data dir,
	// but once: a single node's data dir started with Peers becomes the
	// voter ListenAddr (join.go). With Peers it is ListenAddr.
	NodeID string
	// Peers, when set, makes this node one voter of a group: every voter's
	// ListenAddr as written (host:port), this one's included. The voters'
	// raft traffic then shares ListenAddr (RaftAddr is unused) and a voter's
	// raft id and address are its ListenAddr. The first start of a fresh
	// group bootstraps it with Peers; a voter whose other Peers already
	// have a group waits to be added (join.go); a restarted voter refuses
	// to start when Peers differ from the configuration it stored
	// (quorum.go).
	// Without Peers the node is a single voter with a raft port of its own.
	Peers []string
	// ClusterKey authenticates rpc peers, both directions (see package
	// rpc for what it does not protect).
	ClusterKey []byte
	// TLS, when set, is the mutual-TLS identity (transport.LoadTLS) of the rpc
	// service and of its calls to storage servers.
	TLS *tls.Config
	// ServerTimeout: a storage server without a heartbeat for this long is
	// considered dead (its targets get no new files). Default 10 s.
	ServerTimeout time.Duration
	// FailoverTimeout: the primary of an in-sync mirror group whose server
	// has not heartbeated for this long (measured from the last one
	// received, on Clock) is replaced by its secondary; a secondary's
	// silence that long degrades its group. Storage servers act as
	// primaries only for 2/3 of it after each heartbeat they send (the
	// lease of rpc.ServerHeartbeatResp), so a primary cut off from the
	// service has stopped before its secondary takes over. Default 2 s
	// (the stall a job feels when a primary dies is about this; servers
	// heartbeat every third of the lease, so a late heartbeat or two
	// costs no lease and no switch).
	FailoverTimeout time.Duration
	// SessionLease: a client session without a heartbeat for this long is
	// expired and its locks released. Default 15 s.
	SessionLease time.Duration
	// OrphanGrace: after becoming leader, wait this long before deleting
	// the data of unlinked files, so that clients that still hold them open
	// can report so. Default: SessionLease.
	OrphanGrace time.Duration
	// ReapDeferMax bounds how long orphan reaping yields to clients: while
	// they keep the service busy (over reapBusyRate requests a second) the
	// data of removed files is deleted at most this long after the last
	// pass, not during their burst; with under a tenth of the capacity
	// free it never waits. Default 10 s; negative: never defer.
	ReapDeferMax time.Duration
	// Clock is the time the leader's timers follow — session expiry,
	// storage server liveness (ServerTimeout), the lock grace period and
	// lock waits, the orphan grace and the reaper's ticks, the wait for
	// storage servers after taking office — and the time it stamps on
	// what it proposes (the Now of each command; Apply itself reads no
	// clock). Default (nil): the system clock. Tests pass a clock.Fake
	// and move it instead of sleeping. On a clock that stands still,
	// storage servers stay alive until it passes ServerTimeout (a test
	// sends their heartbeats as it moves it), and a create on a new
	// leader that knows no live target waits for one until every
	// registered server has heartbeated, the clock passes ServerTimeout
	// since it took office, or the request ends.
	Clock clock.Clock
	// MetricsAddr, if set, serves Prometheus metrics at http://ADDR/metrics.
	MetricsAddr string
	// StrictSync makes every mutation's answer wait until its raft entry is
	// on stable storage. Default (false): namespace changes (create, mkdir,
	// unlink, rename, link, setattr without size, xattrs) are answered once
	// applied, like a local file system's; they reach stable storage at
	// the client's next fsync or close barrier (MSync), with any later
	// durable answer, or within SyncDelay. Everything else always waits.
	StrictSync bool
	// SyncDelay bounds how long an applied namespace change may stay off
	// stable storage when nobody waits for it; default 5 ms.
	SyncDelay time.Duration
	// DiskReserve is the free space kept on the data directory's file
	// system: below it, operations that grow the namespace (create, mkdir,
	// link, rename, setxattr, a directory layout) fail with ENOSPC rather
	// than fill the disk until the store stalls. 0: DefaultDiskReserve;
	// negative: no reserve.
	DiskReserve int64

	// trailingLogs, when set (tests), is the raft log kept after a
	// snapshot (and the snapshot threshold), so that a voter that was away
	// must catch up from a snapshot.
	trailingLogs uint64
}

// DefaultConfig returns the defaults; DataDir must still be set.
func DefaultConfig() Config {
	return Config{
		ListenAddr:      "127.0.0.1:7700",
		ServerTimeout:   10 * time.Second,
		FailoverTimeout: 2 * time.Second,
		SessionLease:    15 * time.Second,
		OrphanGrace:     15 * time.Second,
		ReapDeferMax:    10 * time.Second,
	}
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ListenAddr == "" {
		c.ListenAddr = d.ListenAddr
	}
	if c.ServerTimeout == 0 {
		c.ServerTimeout = d.ServerTimeout
	}
	if c.SessionLease == 0 {
		c.SessionLease = d.SessionLease
	}
	if c.FailoverTimeout == 0 {
		c.FailoverTimeout = d.FailoverTimeout
	}
	if c.OrphanGrace == 0 {
		c.OrphanGrace = c.SessionLease
	}
	if c.ReapDeferMax == 0 {
		c.ReapDeferMax = d.ReapDeferMax
	}
	if c.RaftAddr == "" {
		c.RaftAddr = defaultRaftAddr(c.ListenAddr)
	}
	c.Clock = clock.OrReal(c.Clock)
	return c
}

func defaultRaftAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return net.JoinHostPort(host, "0")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return net.JoinHostPort(host, "0")
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1))
}

// Validate reports every problem of the (defaulted) config at once.
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir is not set"))
	}
	check := func(name, addr string, optional bool) {
		if addr == "" {
			if !optional {
				errs = append(errs, fmt.Errorf("%s is not set", name))
			}
			return
		}
		if _, port, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %v", name, addr, err))
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("%s %q: bad port", name, addr))
		}
	}
	check("listen address", c.ListenAddr, false)
	errs = append(errs, c.validatePeers()...)
	check("raft address", c.RaftAddr, true)
	check("metrics address", c.MetricsAddr, true)
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"server timeout", c.ServerTimeout}, {"failover timeout", c.FailoverTimeout}, {"session lease", c.SessionLease}, {"orphan grace", c.OrphanGrace}, {"sync delay", c.SyncDelay}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.FailoverTimeout > 0 && c.FailoverTimeout < 30*time.Millisecond {
		errs = append(errs, fmt.Errorf("failover timeout %v is shorter than 30ms", c.FailoverTimeout))
	}
	if c.SessionLease > 0 && c.SessionLease < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("session lease %v is shorter than 100ms", c.SessionLease))
	}
	return errors.Join(errs...)
}

// FormatVersion is the on-disk format of a metadata data dir (meta.json,
// the layout of the fsm store and the raft log). It changes only when a
// build can no longer read an older data dir: the stored values and the
// raft commands carry versions of their own (schema's doc.go, command's
// doc comment), which newer builds keep reading.
//
// Version history: 1 — initial (still 1 with schema's Result version 2).
const FormatVersion = 1

const stateFileName = "meta.json"

// savedState is meta.json: the format version and the effective config.
type savedState struct {
	FormatVersion int    `json:"format_version"`
	NodeID        string `json:"node_id"`
	ListenAddr    string `json:"listen_addr"`
	RaftAddr      string `json:"raft_addr"` // as bound
	// Peers: the voters this node was last started with (informational:
	// the raft configuration in raft/ is what counts).
	Peers []string `json:"peers,omitempty"`
	// ClusterID names the group this data dir belongs to, once known.
	ClusterID     string `json:"cluster_id,omitempty"`
	ServerTimeout string `json:"server_timeout"`
	SessionLease  string `json:"session_lease"`
	OrphanGrace   string `json:"orphan_grace"`
	MetricsAddr   string `json:"metrics_addr,omitempty"`
	Saved         string `json:"saved"`
}

// loadState reads meta.json; (nil, nil) for a new data dir.
func loadState(dir string) (*savedState, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, "fsm")); err == nil {
			return nil, fmt.Errorf("data dir %s has a metadata store but no %s: refusing to guess its format", dir, stateFileName)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", stateFileName, err)
	}
	var s savedState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("data dir %s: %s is corrupt: %w", dir, stateFileName, err)
	}
	if s.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("data dir %s has metadata format version %d, but this strata reads version %d only", dir, s.FormatVersion, FormatVersion)
	}
	return &s, nil
}

func saveState(dir string, c Config, raftAddr, clusterID string) error {
	s := savedState{
		FormatVersion: FormatVersion, NodeID: c.NodeID, ListenAddr: c.ListenAddr, RaftAddr: raftAddr,
		Peers: c.Peers, ClusterID: clusterID,
		ServerTimeout: c.ServerTimeout.String(), SessionLease: c.SessionLease.String(),
		OrphanGrace: c.OrphanGrace.String(), MetricsAddr: c.MetricsAddr,
		Saved: time.Now().UTC().Format(time.RFC3339),
	}
	b, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFileName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("save %s: %w", stateFileName, err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, stateFileName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("save %s: %w", stateFileName, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func newNodeID() string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return "meta-" + hex.EncodeToString(b)
}
