package client

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stratafs/strata/internal/rpc"
)

// metrics are the client's Prometheus counters. Each Client has its own
// registry so that several clients can live in one process (tests, bench).
type metrics struct {
	reg        *prometheus.Registry
	metaOps    prometheus.Counter
	metaErrors prometheus.Counter
	ops        *prometheus.CounterVec // by kind: read, write, fsync, ...
	bytes      *prometheus.CounterVec // by kind: read, write, readahead
	storeErrs  *prometheus.CounterVec // by target
	// groupRetries counts requests to mirror groups sent again, by why:
	// stale (ESTALE), again (EAGAIN), unreachable (also a call given up
	// on a hung server once the group switched), copy (EIO from one
	// in-sync copy, read from the other).
	groupRetries *prometheus.CounterVec
	opRead       prometheus.Counter
	opWrite      prometheus.Counter
	bytesRead    prometheus.Counter
	bytesWrite   prometheus.Counter
	bytesRA      prometheus.Counter
	raHits       prometheus.Counter
	// calls counts metadata and storage calls by rpc method number
	// (round trips per file operation, for performance work).
	calls *prometheus.CounterVec

	// The counters of ops and calls once looked up: a label lookup
	// (hashing, a lock, the method's number formatted) per call was ~1 %
	// of a small-file read's CPU.
	cache struct {
		sync.RWMutex
		ops   map[string]prometheus.Counter
		calls [2]map[rpc.Method]prometheus.Counter // meta, store
	}
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.metaOps = prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_client_meta_calls_total", Help: "Calls to the metadata service."})
	m.metaErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_client_meta_errors_total", Help: "Calls to the metadata service that failed."})
	m.ops = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_client_ops_total", Help: "File operations by kind."}, []string{"kind"})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_client_bytes_total", Help: "Bytes moved by kind."}, []string{"kind"})
	m.storeErrs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_client_store_errors_total", Help: "Failed storage calls by target."}, []string{"target"})
	m.groupRetries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_client_group_retries_total", Help: "Requests to mirror groups sent again, by reason (stale, again, unreachable, copy)."}, []string{"reason"})
	m.raHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_client_readahead_hits_total", Help: "Reads served from read-ahead buffers."})
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "strata_client_calls_total", Help: "Metadata and storage calls by service (meta, store) and rpc method number."}, []string{"service", "method"})
	m.reg.MustRegister(m.metaOps, m.metaErrors, m.ops, m.bytes, m.storeErrs, m.groupRetries, m.raHits, m.calls)
	m.opRead = m.ops.WithLabelValues("read")
	m.opWrite = m.ops.WithLabelValues("write")
	m.bytesRead = m.bytes.WithLabelValues("read")
	m.bytesWrite = m.bytes.WithLabelValues("write")
	m.bytesRA = m.bytes.WithLabelValues("readahead")
	return m
}

func (m *metrics) op(kind string) {
	m.cache.RLock()
	c := m.cache.ops[kind]
	m.cache.RUnlock()
	if c == nil {
		c = m.ops.WithLabelValues(kind)
		m.cache.Lock()
		if m.cache.ops == nil {
			m.cache.ops = map[string]prometheus.Counter{}
		}
		m.cache.ops[kind] = c
		m.cache.Unlock()
	}
	c.Inc()
}

// call counts one call of method meth to service ("meta" or "store").
func (m *metrics) call(service string, meth rpc.Method) {
	i := 0
	if service != "meta" {
		i = 1
	}
	m.cache.RLock()
	c := m.cache.calls[i][meth]
	m.cache.RUnlock()
	if c == nil {
		c = m.calls.WithLabelValues(service, strconv.Itoa(int(meth)))
		m.cache.Lock()
		if m.cache.calls[i] == nil {
			m.cache.calls[i] = map[rpc.Method]prometheus.Counter{}
		}
		m.cache.calls[i][meth] = c
		m.cache.Unlock()
	}
	c.Inc()
}

// Calls returns how many calls of method meth this client made to the
// metadata service (service "meta") or the storage servers ("store").
func (c *Client) Calls(service string, meth rpc.Method) uint64 {
	var out dto.Metric
	if err := c.m.calls.WithLabelValues(service, strconv.Itoa(int(meth))).Write(&out); err != nil {
		return 0
	}
	return uint64(out.GetCounter().GetValue())
}

// Ops is how many operations of kind this client made (the
// strata_client_ops_total counter; tests).
func (c *Client) Ops(kind string) uint64 {
	var out dto.Metric
	if err := c.m.ops.WithLabelValues(kind).Write(&out); err != nil {
		return 0
	}
	return uint64(out.GetCounter().GetValue())
}

// Registry exposes the client's metrics (for embedding in another server).
func (c *Client) Registry() *prometheus.Registry { return c.m.reg }
