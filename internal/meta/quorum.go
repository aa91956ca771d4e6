package meta

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/consensus"
	"github.com/stratafs/strata/internal/transport"
)

// A metadata group of several voters (Config.Peers): each voter's raft id
// and raft address are its rpc --listen address, and raft's traffic runs
// over that port as transport streams (transport.ListenStream), so "the
// leader's raft address" that raft reports is the rpc address clients are
// redirected to (rpc.NotLeader). docs/design/0012-metadata-quorum.md has
// the design: durability of followers' acknowledgements, the leader's read
// lease, the configuration checks.

// readVerifyTimeout bounds the leadership check of a request that finds
// the read lease expired.
const readVerifyTimeout = 2 * time.Second

// validatePeers checks the peer list: well-formed, no duplicates, this
// node's ListenAddr among them.
func (c Config) validatePeers() []error {
	if len(c.Peers) == 0 {
		return nil
	}
	var errs []error
	seen := map[string]bool{}
	self := false
	for _, p := range c.Peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %q: %v", p, err))
			continue
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 || host == "" {
			errs = append(errs, fmt.Errorf("peer %q: needs a host and a fixed port", p))
		}
		if seen[p] {
			errs = append(errs, fmt.Errorf("peers list %s twice: two voters cannot share one address", p))
		}
		seen[p] = true
		if p == c.ListenAddr {
			self = true
		}
	}
	if !self {
		errs = append(errs, fmt.Errorf("peers %v do not include this voter's listen address %s (list every voter's --listen address exactly as written, this one's included)", c.Peers, c.ListenAddr))
	}
	return errs
}

// checkVoterID refuses a data dir that belongs to another node: a voter's
// id is its listen address.
func checkVoterID(c Config, saved *savedState) error {
	if c.NodeID != "" && c.NodeID != c.ListenAddr {
		return fmt.Errorf("a voter's node id is its listen address %s, not %q (drop --node-id)", c.ListenAddr, c.NodeID)
	}
	if saved == nil || saved.NodeID == c.ListenAddr {
		return nil
	}
	if len(saved.Peers) == 0 {
		return fmt.Errorf("data dir %s belongs to the single metadata node %q (started without --peers); a voter of a group needs a data dir of its own, or the group grows from this node with strata meta add-voter", c.DataDir, saved.NodeID)
	}
	return fmt.Errorf("data dir %s belongs to the voter %s, not to %s: start that voter with it, or give this one its own data dir", c.DataDir, saved.NodeID, c.ListenAddr)
}

// quorumConfig makes rc a voter of the group in s.cfg.Peers with raft over
// the rpc port.
func (s *Service) quorumConfig(rc *consensus.Config) {
	streams := s.srv.ListenStream(transport.StreamRaft, s.cfg.ListenAddr,
		transport.ClientConfig{Key: s.cfg.ClusterKey, TLS: s.cfg.TLS}, s.checkRaftStream)
	streams.Hello = func() []byte { return []byte(s.fsm.clusterID()) }
	streams.Reply = s.checkRaftReply
	rc.Streams = &loggedStreams{StreamListener: streams, s: s, last: map[string]time.Time{}}
	rc.CheckPeers = true
	rc.Peers = nil
	for _, p := range s.cfg.Peers {
		rc.Peers = append(rc.Peers, consensus.Peer{ID: p, Addr: p})
	}
}

// clusterID is the namespace's cluster id, "" before the first command
// (or for a namespace created before cluster ids existed).
func (f *fsm) clusterID() string {
	if p := f.cid.Load(); p != nil {
		return *p
	}
	return ""
}

// clusterIDOf derives the cluster id from the namespace's first command.
func clusterIDOf(now int64, index, term uint64) string {
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], uint64(now))
	binary.BigEndian.PutUint64(b[8:], index)
	binary.BigEndian.PutUint64(b[16:], term)
	h := sha256.Sum256(b[:])
	return hex.EncodeToString(h[:8])
}

// errOtherCluster: a voter met a voter of another group.
var errOtherCluster = errors.New("voter of another cluster")

// checkRaftStream accepts a raft stream from another voter unless it
// belongs to another cluster; it replies with this voter's cluster id.
func (s *Service) checkRaftStream(peer string, hello []byte) ([]byte, error) {
	mine, theirs := s.fsm.clusterID(), string(hello)
	if mine != "" && theirs != "" && mine != theirs {
		s.log.Error("refusing raft traffic from a voter of another cluster: its data dir belongs to another metadata group (check its --data and --peers)",
			"peer", peer, "peer_cluster", theirs, "cluster", mine)
		return nil, fmt.Errorf("%w: this voter (%s) belongs to cluster %s, the dialer's data dir to cluster %s", errOtherCluster, s.cfg.ListenAddr, mine, theirs)
	}
	return []byte(mine), nil
}

// checkRaftReply checks the cluster id a dialled voter replied with.
func (s *Service) checkRaftReply(addr string, reply []byte) {
	mine, theirs := s.fsm.clusterID(), string(reply)
	if mine != "" && theirs != "" && mine != theirs {
		s.log.Error("voter belongs to another cluster", "peer", addr, "peer_cluster", theirs, "cluster", mine)
	}
}

// loggedStreams logs why a dial to another voter was refused, at most
// every dialLogEvery per peer, in words an operator acts on (a wrong key,
// another cluster); raft redials at every heartbeat.
type loggedStreams struct {
	*transport.StreamListener
	s    *Service
	mu   sync.Mutex
	last map[string]time.Time
}

const dialLogEvery = 10 * time.Second

func (l *loggedStreams) DialStream(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := l.StreamListener.DialStream(addr, timeout)
	if err == nil || !(errors.Is(err, transport.ErrAuth) || errors.Is(err, transport.ErrStreamRefused)) {
		return c, err
	}
	l.mu.Lock()
	quiet := time.Since(l.last[addr]) < dialLogEvery
	if !quiet {
		l.last[addr] = time.Now()
	}
	l.mu.Unlock()
	if !quiet {
		l.s.log.Error("raft stream to another voter refused", "peer", addr, "why", refusalText(err))
	}
	return c, err
}

// refusalText says what an operator should check for a refused stream.
func refusalText(err error) string {
	if errors.Is(err, transport.ErrAuth) {
		return fmt.Sprintf("wrong cluster key: the voters' --key-file differ (%v)", err)
	}
	return err.Error()
}

// preflightTimeout bounds each dial of the check at start.
const preflightTimeout = time.Second

// preflight contacts every other voter once before raft starts and
// refuses to start when a majority of them refuse this voter: its cluster
// key is not theirs, or its data dir belongs to another cluster. Voters
// that cannot be reached (not started yet) do not count: a voter started
// before the others learns of a wrong key from its log only.
func (s *Service) preflight() error {
	var others []string
	for _, p := range s.cfg.Peers {
		if p != s.cfg.ListenAddr {
			others = append(others, p)
		}
	}
	if len(others) == 0 {
		return nil
	}
	type answer struct {
		peer string
		err  error
	}
	ch := make(chan answer, len(others))
	for _, p := range others {
		go func() {
			c, _, err := transport.DialStream(p, transport.StreamRaft, []byte(s.fsm.clusterID()),
				transport.ClientConfig{Key: s.cfg.ClusterKey, TLS: s.cfg.TLS}, preflightTimeout)
			if c != nil {
				c.Close()
			}
			ch <- answer{p, err}
		}()
	}
	var refused []error
	for range others {
		a := <-ch
		if a.err != nil && (errors.Is(a.err, transport.ErrAuth) || errors.Is(a.err, transport.ErrStreamRefused)) {
			refused = append(refused, fmt.Errorf("%s: %s", a.peer, refusalText(a.err)))
		}
	}
	if len(refused) > len(others)/2 {
		return fmt.Errorf("metadata voter %s refused by %d of the %d other voters, not starting: %w", s.cfg.ListenAddr, len(refused), len(others), errors.Join(refused...))
	}
	for _, err := range refused {
		s.log.Error("another voter refuses this one", "why", err)
	}
	return nil
}

// ClusterID is the metadata group's cluster id ("" until the namespace
// exists, or for one created before cluster ids).
func (s *Service) ClusterID() string { return s.fsm.clusterID() }

// Node is the service's raft node (membership commands, status).
func (s *Service) Node() *consensus.Node { return s.node }

// Serving reports whether this node serves requests now: it leads and has
// caught up.
func (s *Service) Serving() bool { return s.ready.Load() }
