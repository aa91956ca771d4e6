package nfs

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/rpc"
)

// Procedure names, as the metrics label them (RFC 1813's, lower case).
var (
	nfsProcNames = [...]string{"null", "getattr", "setattr", "lookup", "access", "readlink", "read", "write",
		"create", "mkdir", "symlink", "mknod", "remove", "rmdir", "rename", "link", "readdir", "readdirplus",
		"fsstat", "fsinfo", "pathconf", "commit"}
	mountProcNames = [...]string{"null", "mnt", "dump", "umnt", "umntall", "export"}
)

// clientWindow is how recently a client must have called to count in
// strata_nfs_clients.
const clientWindow = 5 * time.Minute

// maxTrackedClients bounds the map of clients seen (a scan of the
// address space must not grow it without end): beyond it, the oldest
// half is dropped.
const maxTrackedClients = 16384

// metrics counts the gateway's calls per procedure and the clients seen.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector
	ops        *prometheus.CounterVec
	readAhead  prometheus.Counter // READs answered from a read-ahead piece
	total      atomic.Uint64      // calls counted, all procedures
	mu         struct {
		sync.Mutex
		seen map[netip.Addr]time.Time
	}
}

// newMetrics registers the gateway's metrics in reg (the client
// library's registry, which --metrics-addr serves) until close.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{reg: reg, ops: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_nfs_ops_total", Help: "NFS v3 and MOUNT v3 calls answered, by procedure (mount_ prefix: MOUNT).",
	}, []string{"proc"}), readAhead: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "strata_nfs_read_ahead_hits_total", Help: "NFS READs answered from the piece the previous sequential READ of the file read ahead.",
	})}
	m.mu.seen = map[netip.Addr]time.Time{}
	clients := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "strata_nfs_clients", Help: "NFS client addresses that called in the last 5 minutes.",
	}, func() float64 { return float64(m.clients(time.Now())) })
	for _, c := range []prometheus.Collector{m.ops, m.readAhead, clients} {
		if err := reg.Register(c); err != nil {
			m.close()
			return nil, fmt.Errorf("nfs: metrics (another gateway on this client?): %w", err)
		}
		m.collectors = append(m.collectors, c)
	}
	return m, nil
}

// close unregisters the metrics (a gateway started again on the same
// client registers its own).
func (m *metrics) close() {
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
	m.collectors = nil
}

// clients counts (and forgets beyond the window) the clients seen.
func (m *metrics) clients(now time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for a, t := range m.mu.seen {
		if now.Sub(t) > clientWindow {
			delete(m.mu.seen, a)
		}
	}
	return len(m.mu.seen)
}

func (m *metrics) saw(a netip.Addr, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mu.seen[a]; !ok && len(m.mu.seen) >= maxTrackedClients {
		cut := now.Add(-clientWindow / 2)
		for k, t := range m.mu.seen {
			if t.Before(cut) || len(m.mu.seen) >= maxTrackedClients {
				delete(m.mu.seen, k)
			}
		}
	}
	m.mu.seen[a] = now
}

// count wraps the procedures of p so that each call is counted.
func (m *metrics) count(p *oncrpc.Program, prefix string, names []string) *oncrpc.Program {
	for i, fn := range p.Procs {
		if fn == nil || i >= len(names) {
			continue
		}
		c := m.ops.WithLabelValues(prefix + names[i])
		p.Procs[i] = func(ctx context.Context, call *oncrpc.Call, args []byte, res *bytes.Buffer) error {
			c.Inc()
			m.total.Add(1)
			m.saw(call.Remote.Addr(), time.Now())
			return fn(ctx, call, args, res)
		}
	}
	return p
}

// reporter makes the gateway's heartbeat reports (client.SetGatewayReport):
// the calls a second are counted between two reports.
type reporter struct {
	mu       sync.Mutex
	lastOps  uint64
	lastTime time.Time
}

// report answers the gateway's report at now.
func (s *Server) report(now time.Time) *rpc.GatewayReport {
	r := &rpc.GatewayReport{Clients: uint32(s.metrics.clients(now)), Ops: s.metrics.total.Load()}
	if a := s.addr.Load(); a != nil {
		r.Address = *a
	}
	for i := range s.cfg.Exports {
		r.Exports = append(r.Exports, s.cfg.Exports[i].String())
	}
	s.reporter.mu.Lock()
	defer s.reporter.mu.Unlock()
	if !s.reporter.lastTime.IsZero() && now.After(s.reporter.lastTime) && r.Ops >= s.reporter.lastOps {
		per := float64(r.Ops-s.reporter.lastOps) / now.Sub(s.reporter.lastTime).Seconds()
		r.OpsPerSec = uint32(min(per+0.5, math.MaxUint32))
	}
	s.reporter.lastOps, s.reporter.lastTime = r.Ops, now
	return r
}
