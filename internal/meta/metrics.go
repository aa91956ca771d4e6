package meta

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stratafs/strata/internal/rpc"
)

// metrics are the service's Prometheus collectors, in a registry of their
// own so that several services can run in one process (tests, strata up).
type metrics struct {
	reg     *prometheus.Registry
	ops     *prometheus.CounterVec
	latency *prometheus.HistogramVec
	batch   prometheus.Histogram
	reaped  prometheus.Counter
	spills  prometheus.Counter
	mirror  *mirrorMetrics
	// known holds each named method's "ok" counter and latency observer,
	// resolved once: a label lookup per request (hashing the label values)
	// cost more than the rest of a lookup's bookkeeping. Read-only after
	// newMetrics.
	known map[rpc.Method]methodMetrics
}

type methodMetrics struct {
	ok  prometheus.Counter
	lat prometheus.Observer
}

var methodNames = map[rpc.Method]string{
	rpc.MSessionOpen: "session_open", rpc.MSessionHeartbeat: "session_heartbeat", rpc.MSessionClose: "session_close",
	rpc.MLookup: "lookup", rpc.MGetAttr: "getattr", rpc.MSetAttr: "setattr", rpc.MCreate: "create",
	rpc.MUnlink: "unlink", rpc.MRmdir: "rmdir", rpc.MRename: "rename", rpc.MLink: "link",
	rpc.MReadlink: "readlink", rpc.MReadDir: "readdir", rpc.MStatFS: "statfs", rpc.MGetXattr: "getxattr",
	rpc.MSetXattr: "setxattr", rpc.MListXattr: "listxattr", rpc.MRemoveXattr: "removexattr",
	rpc.MCommitSize: "commit_size", rpc.MGetLk: "getlk", rpc.MSetLk: "setlk", rpc.MSetDirLayout: "set_dir_layout",
	rpc.MRegisterServer: "register_server", rpc.MServerHeartbeat: "server_heartbeat",
	rpc.MClusterStatus: "cluster_status", rpc.MListTargets: "list_targets", rpc.MSync: "sync", rpc.MTmpfile: "tmpfile",
	rpc.MSetAtimes: "set_atimes", rpc.MMetaInfo: "meta_info", rpc.MAddVoter: "add_voter", rpc.MRemoveVoter: "remove_voter",
	rpc.MTransferLeader: "transfer_leader", rpc.MListGroups: "list_groups", rpc.MMirrorCreate: "mirror_create",
	rpc.MMirrorFailOver: "mirror_fail_over", rpc.MMirrorReport: "mirror_report", rpc.MMirrorReplace: "mirror_replace",
	rpc.MHALease: "ha_lease", rpc.MDirLayout: "dir_layout",
	rpc.MReserveInos: "reserve_inos", rpc.MCreateBatch: "create_batch", rpc.MDelegate: "delegate",
	rpc.MReturnDelegation: "return_delegation", rpc.MWaitRecall: "wait_recall",
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_meta_ops_total", Help: "Metadata rpc requests by method and result (ok or errno name).",
		}, []string{"method", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "strata_meta_op_seconds", Help: "Metadata rpc latency by method.",
			Buckets: prometheus.ExponentialBuckets(20e-6, 2, 18),
		}, []string{"method"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "strata_meta_apply_batch_entries", Help: "Commands per raft apply batch (group commit size).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_meta_orphans_reaped_total", Help: "Unlinked files whose data was removed.",
		}),
		spills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_meta_inline_spills_total", Help: "Files whose inline data was moved to their targets (an open for writing).",
		}),
	}
	m.known = make(map[rpc.Method]methodMetrics, len(methodNames))
	for meth, name := range methodNames {
		m.known[meth] = methodMetrics{ok: m.ops.WithLabelValues(name, "ok"), lat: m.latency.WithLabelValues(name)}
	}
	m.reg.MustRegister(m.ops, m.latency, m.batch, m.reaped, m.spills,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	m.mirror = newMirrorMetrics(m.reg)
	return m
}

func methodName(m rpc.Method) string {
	if n, ok := methodNames[m]; ok {
		return n
	}
	return strconv.Itoa(int(m))
}

// observe is the rpc server's hook.
func (m *metrics) observe(method rpc.Method, d time.Duration, err error) {
	if k, ok := m.known[method]; ok && err == nil {
		k.ok.Inc()
		k.lat.Observe(d.Seconds())
		return
	}
	name := methodName(method)
	result := "ok"
	if err != nil {
		result = rpc.ErrnoOf(err).Error()
	}
	m.ops.WithLabelValues(name, result).Inc()
	m.latency.WithLabelValues(name).Observe(d.Seconds())
}

// MetricsAddr is the address of the /metrics endpoint ("" without one).
func (s *Service) MetricsAddr() string { return s.webAddr }

func (s *Service) serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen on %s: %w", addr, err)
	}
	s.webAddr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	s.web = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.web.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("metrics server stopped", "err", err)
		}
	}()
	return nil
}
