package meta

import (
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// TestMetricsByMethodAndResult: requests are counted by method and result
// and timed by method, for named methods (resolved once) and others alike.
func TestMetricsByMethodAndResult(t *testing.T) {
	m := newMetrics()
	m.observe(rpc.MLookup, time.Millisecond, nil)
	m.observe(rpc.MLookup, time.Millisecond, nil)
	m.observe(rpc.MLookup, time.Millisecond, errNoEntry)
	m.observe(rpc.MCreate, time.Millisecond, rpc.Errorf(syscall.ENOSPC, "full"))
	m.observe(rpc.Method(999), time.Millisecond, nil)
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]float64{}   // method/result → count
	counts := map[string]uint64{} // method → latency samples
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetName() {
			case "strata_meta_ops_total":
				ops[labels["method"]+"/"+labels["result"]] = s.GetCounter().GetValue()
			case "strata_meta_op_seconds":
				counts[labels["method"]] = s.GetHistogram().GetSampleCount()
			}
		}
	}
	for _, c := range []struct {
		method, result string
		want           float64
	}{
		{"lookup", "ok", 2}, {"lookup", syscall.ENOENT.Error(), 1}, {"create", syscall.ENOSPC.Error(), 1},
		{"create", "ok", 0}, {"999", "ok", 1},
	} {
		if got := ops[c.method+"/"+c.result]; got != c.want {
			t.Errorf("ops{method=%s,result=%s} = %v, want %v", c.method, c.result, got, c.want)
		}
	}
	if counts["lookup"] != 3 || counts["create"] != 1 || counts["999"] != 1 {
		t.Fatalf("latency sample counts %v, want lookup 3, create 1, 999 1", counts)
	}
}
