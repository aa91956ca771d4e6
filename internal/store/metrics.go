package store

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stratafs/strata/internal/rpc"
)

// metrics are the server's Prometheus collectors, in a registry of its own
// so that several servers can live in one process (tests, strata up).
type metrics struct {
	reg        *prometheus.Registry
	readBytes  *prometheus.CounterVec
	writeBytes *prometheus.CounterVec
	readOps    *prometheus.CounterVec
	writeOps   *prometheus.CounterVec
	csumErrors *prometheus.CounterVec
	freeBytes  *prometheus.GaugeVec
	totalBytes *prometheus.GaugeVec
	latency    *prometheus.HistogramVec
	errors     *prometheus.CounterVec
	observers  map[rpc.Method]prometheus.Observer // latency by method, resolved once
}

// targetMetrics are one target's collectors, resolved once so that the
// data path does no label lookups.
type targetMetrics struct {
	readBytes, writeBytes, readOps, writeOps, csumErrors prometheus.Counter
	free, total                                          prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	ns := "strata_store"
	cv := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, []string{"target"})
		m.reg.MustRegister(v)
		return v
	}
	gv := func(name, help string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help}, []string{"target"})
		m.reg.MustRegister(v)
		return v
	}
	m.readBytes = cv("read_bytes_total", "Bytes read from chunks.")
	m.writeBytes = cv("write_bytes_total", "Bytes written to chunks.")
	m.readOps = cv("read_ops_total", "Chunk read requests served.")
	m.writeOps = cv("write_ops_total", "Chunk write requests served.")
	m.csumErrors = cv("checksum_errors_total", "Blocks whose checksum did not match their data (answered EIO).")
	m.freeBytes = gv("free_bytes", "Free bytes of the target's file system, as last measured.")
	m.totalBytes = gv("total_bytes", "Size of the target's file system.")
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "request_seconds", Help: "Time to serve a request, by method.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10), // 10 µs .. 2.6 s
	}, []string{"method"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "request_errors_total",
		Help: "Requests answered with an error, by method and errno."}, []string{"method", "errno"})
	m.reg.MustRegister(m.latency, m.errors)
	m.observers = map[rpc.Method]prometheus.Observer{}
	for meth, name := range methodNames {
		m.observers[meth] = m.latency.WithLabelValues(name)
	}
	return m
}

func (m *metrics) forTarget(path string) *targetMetrics {
	return &targetMetrics{
		readBytes: m.readBytes.WithLabelValues(path), writeBytes: m.writeBytes.WithLabelValues(path),
		readOps: m.readOps.WithLabelValues(path), writeOps: m.writeOps.WithLabelValues(path),
		csumErrors: m.csumErrors.WithLabelValues(path),
		free:       m.freeBytes.WithLabelValues(path), total: m.totalBytes.WithLabelValues(path),
	}
}

var methodNames = map[rpc.Method]string{
	rpc.SWrite: "write", rpc.SRead: "read", rpc.STruncate: "truncate", rpc.SPunch: "punch",
	rpc.SSync: "sync", rpc.SRemove: "remove", rpc.SChunkStat: "chunk_stat",
	rpc.SSyncStat: "sync_stat", rpc.SSeek: "seek", rpc.SScrub: "scrub", rpc.SChunkSums: "chunk_sums",
	rpc.SMirrorSuspects: "mirror_suspects",
}

// observe is the rpc server's per-request hook.
func (m *metrics) observe(meth rpc.Method, d time.Duration, err error) {
	name, ok := methodNames[meth]
	if !ok {
		name = strconv.Itoa(int(meth))
	}
	if o, ok := m.observers[meth]; ok {
		o.Observe(d.Seconds())
	} else {
		m.latency.WithLabelValues(name).Observe(d.Seconds())
	}
	if err != nil {
		m.errors.WithLabelValues(name, rpc.ErrnoOf(err).Error()).Inc()
	}
}

// serveMetrics starts the /metrics endpoint; the returned server is shut
// down by Close.
func (m *metrics) serve(addr string, log *slog.Logger) (*http.Server, net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "addr", addr, "err", err)
		}
	}()
	return hs, ln, nil
}

// mirrorMetrics are the mirror groups' collectors (forward.go, resync.go),
// by group.
type mirrorMetrics struct {
	forwardedBytes  *prometheus.CounterVec
	resyncBytes     *prometheus.CounterVec
	resyncRemaining *prometheus.GaugeVec
}

func newMirrorMetrics(reg *prometheus.Registry) *mirrorMetrics {
	mm := &mirrorMetrics{
		forwardedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "strata", Subsystem: "mirror", Name: "forwarded_bytes_total",
			Help: "Data bytes a mirror group's primary forwarded to its secondary."}, []string{"group"}),
		resyncBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "strata", Subsystem: "mirror", Name: "resync_bytes_total",
			Help: "Bytes a mirror group's primary copied to its secondary in resyncs."}, []string{"group"}),
		resyncRemaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "strata", Subsystem: "mirror", Name: "resync_remaining_bytes",
			Help: "Bytes the running resync of a mirror group still has to copy (0: none running)."}, []string{"group"}),
	}
	reg.MustRegister(mm.forwardedBytes, mm.resyncBytes, mm.resyncRemaining)
	return mm
}

func groupLabel(g uint32) string { return strconv.FormatUint(uint64(g), 10) }

func (mm *mirrorMetrics) forwarded(g uint32, n int) {
	if n > 0 {
		mm.forwardedBytes.WithLabelValues(groupLabel(g)).Add(float64(n))
	}
}
