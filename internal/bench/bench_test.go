package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseSweep(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "1,2,4", want: []int{1, 2, 4}},
		{in: "4,1,2,2", want: []int{1, 2, 4}},
		{in: "1-16", want: []int{1, 2, 4, 8, 16}},
		{in: "1-6", want: []int{1, 2, 4, 6}},
		{in: "3", want: []int{3}},
		{in: " 1, 8 ", want: []int{1, 8}},
		{in: "", bad: true},
		{in: "0", bad: true},
		{in: "-2", bad: true},
		{in: "8-2", bad: true},
		{in: "a", bad: true},
	} {
		got, err := ParseSweep(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseSweep(%q) = %v, want error", tc.in, got)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseSweep(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4G": 4 << 30, "512M": 512 << 20, "64k": 64 << 10, "1MiB": 1 << 20, "1048576": 1 << 20, "2GB": 2 << 30} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1M", "1.5G"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded", in)
		}
	}
}

func TestRateArithmetic(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if got := MiBps(3<<30, 2); !near(got, 1536) {
		t.Errorf("MiBps(3 GiB, 2 s) = %v, want 1536", got)
	}
	if got := MiBps(1<<20, 0); got != 0 {
		t.Errorf("MiBps over 0 s = %v, want 0", got)
	}
	if got := OpsPerSecond(50000, 2.5); !near(got, 20000) {
		t.Errorf("OpsPerSecond = %v, want 20000", got)
	}
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(tc.xs); !near(got, tc.want) {
			t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
	if got := Efficiency(686, 1372); !near(got, 0.5) {
		t.Errorf("Efficiency = %v, want 0.5", got)
	}
	if got := Efficiency(686, 0); got != 0 {
		t.Errorf("Efficiency without a limit = %v, want 0", got)
	}
	// The sample arithmetic the runner uses: the span from the earliest
	// start to the latest end.
	s := sample{bytes: 512 << 20, ops: 512, seconds: 0.5}
	if got := s.value(UnitMiBps); !near(got, 1024) {
		t.Errorf("sample MiB/s = %v, want 1024", got)
	}
	if got := s.value(UnitIOPS); !near(got, 1024) {
		t.Errorf("sample IOPS = %v, want 1024", got)
	}
	lim := &Limit{SeqWriteMiBps: 1000, SeqReadMiBps: 2000, RandWriteIOPS: 100, RandReadIOPS: 400}
	rep := &Report{Limit: lim, Results: []Result{
		{Workload: "seq", Phase: "write", Value: 500},
		{Workload: "shared", Phase: "read", Value: 1000},
		{Workload: "random", Phase: "read", Value: 100},
		{Workload: "meta", Phase: "create", Value: 100},
	}}
	rep.ApplyEfficiency()
	for i, want := range []float64{0.5, 0.5, 0.25, 0} {
		if !near(rep.Results[i].Efficiency, want) {
			t.Errorf("result %d efficiency %v, want %v", i, rep.Results[i].Efficiency, want)
		}
	}
}

func TestPattern(t *testing.T) {
	buf := make([]byte, 3*blockBytes+1000)
	fillPattern(buf, 9, 5, 12345)
	if err := checkPattern(buf, 9, 5, 12345, "f"); err != nil {
		t.Fatal(err)
	}
	// Pieces at odd offsets agree with the whole.
	part := make([]byte, 333)
	fillPattern(part, 9, 5, 12345+101)
	if !bytes.Equal(part, buf[101:434]) {
		t.Fatal("pattern depends on how the range is cut")
	}
	if err := checkPattern(buf, 10, 5, 12345, "f"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("other file's pattern accepted: %v", err)
	}
	if err := checkPattern(buf, 9, 6, 12345, "f"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an earlier run's data (other nonce) accepted: %v", err)
	}
	for _, shift := range []int64{8, 512, blockBytes} {
		if err := checkPattern(buf, 9, 5, 12345+shift, "f"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("pattern shifted by %d accepted: %v", shift, err)
		}
	}
	buf[4321] ^= 0x10
	err := checkPattern(buf, 9, 5, 12345, "f")
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "offset 16666") {
		t.Fatalf("flipped bit: %v, want corruption at offset 16666", err)
	}
}

// TestPatternStamp checks the writers' fast path: a primed buffer whose
// headers are re-stamped is the full pattern at every aligned offset, and
// every byte of a block (header or body) is checked.
func TestPatternStamp(t *testing.T) {
	p := newPattern(3, 77)
	const rec = 16 * blockBytes
	buf := alignedBuf(rec)
	p.prime(buf)
	want := make([]byte, rec)
	for _, off := range []int64{0, rec, 5 * rec, 1 << 40} {
		p.stamp(buf, off)
		p.fill(want, off)
		if !bytes.Equal(buf, want) {
			t.Fatalf("stamp at %d differs from fill", off)
		}
		if err := p.check(buf, off, "f"); err != nil {
			t.Fatal(err)
		}
	}
	// A short last record falls back to a full fill.
	short := buf[:blockBytes+100]
	p.stamp(short, 7*rec)
	if err := p.check(short, 7*rec, "f"); err != nil {
		t.Fatal(err)
	}
	// Every position of a block is covered by the check.
	p.fill(buf, 0)
	for _, i := range []int{0, 7, 8, 15, 16, 100, blockBytes - 1, 9*blockBytes + 3} {
		buf[i] ^= 0x80
		err := p.check(buf, 0, "f")
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d:", i)) {
			t.Errorf("flip at %d: %v", i, err)
		}
		buf[i] ^= 0x80
	}
	// A zeroed block fails.
	clear(buf[2*blockBytes : 3*blockBytes])
	if err := p.check(buf, 0, "f"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("zeroed block accepted: %v", err)
	}
}

// The check must stay far cheaper than the copy a read costs.
func BenchmarkPatternCheck(b *testing.B) {
	p := newPattern(1, 1)
	buf := alignedBuf(1 << 20)
	p.fill(buf, 0)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if err := p.check(buf, 0, "f"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPatternStamp(b *testing.B) {
	p := newPattern(1, 1)
	buf := alignedBuf(1 << 20)
	p.prime(buf)
	b.SetBytes(int64(len(buf)))
	for i := 0; b.Loop(); i++ {
		p.stamp(buf, int64(i)<<20)
	}
}

func TestQuickRunWritesEverything(t *testing.T) {
	dir := t.TempDir()
	c := testConfig(t, dir)
	rep, err := Run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, w := range []string{"seq/write", "seq/read", "random/write", "random/read", "shared/write", "shared/read", "meta/create", "meta/stat", "meta/remove",
		"smallfile/create", "smallfile/read", "smallfile/remove"} {
		for _, th := range []string{"1", "2"} {
			want[w+"/"+th] = true
		}
	}
	for _, r := range rep.Results {
		k := r.Workload + "/" + r.Phase + "/" + map[int]string{1: "1", 2: "2"}[r.Threads]
		delete(want, k)
		if !(r.Value > 0) || !r.Verified || r.Seconds <= 0 || r.Clients != 1 || r.System != "tmp" {
			t.Errorf("insane result %+v", r)
		}
		if r.Workload != "meta" && r.Phase != "remove" && r.Bytes <= 0 {
			t.Errorf("no bytes in %+v", r)
		}
		if r.Workload == "seq" && r.Bytes != c.SeqBytes {
			t.Errorf("seq moved %d bytes, want %d", r.Bytes, c.SeqBytes)
		}
		if r.Workload == "meta" && r.Ops != int64(r.Threads*c.FilesPerDir*c.DirsPerThread) {
			t.Errorf("meta did %d ops at %d threads", r.Ops, r.Threads)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing results: %v", want)
	}
	if rep.Machine.Cores < 1 || rep.Machine.Kernel == "" || rep.Machine.FSType == "" || rep.Machine.GoVersion == "" || rep.Machine.MemoryBytes <= 0 {
		t.Errorf("machine facts incomplete: %+v", rep.Machine)
	}
	// The work directory is gone.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}

	out := t.TempDir()
	jsonPath := filepath.Join(out, "out.json")
	if err := rep.WriteJSON(jsonPath); err != nil {
		t.Fatal(err)
	}
	doc := &Document{Title: "test", Runs: []NamedReport{{Name: "tmp", Report: rep}}}
	if _, err := doc.WriteFiles(out); err != nil {
		t.Fatal(err)
	}
	// The JSON contract, read the way another tool would.
	var generic map[string]any
	b, _ := os.ReadFile(jsonPath)
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	if _, ok := generic["machine"].(map[string]any); !ok {
		t.Fatal("no machine object")
	}
	results, _ := generic["results"].([]any)
	if len(results) == 0 {
		t.Fatal("no results array")
	}
	for _, x := range results {
		m := x.(map[string]any)
		for _, f := range []string{"workload", "phase", "threads", "clients", "value", "unit", "verified"} {
			if _, ok := m[f]; !ok {
				t.Fatalf("result without %q: %v", f, m)
			}
		}
	}
	for _, w := range Workloads {
		png, err := os.ReadFile(filepath.Join(out, w+".png"))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
			t.Errorf("%s.png: %v", w, err)
		}
		svg, err := os.ReadFile(filepath.Join(out, w+".svg"))
		if err != nil || !bytes.Contains(svg, []byte("<svg")) {
			t.Errorf("%s.svg: %v", w, err)
		}
	}
	html, err := os.ReadFile(filepath.Join(out, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(html, []byte("<svg")); n != len(Workloads) {
		t.Errorf("report.html inlines %d SVGs, want %d", n, len(Workloads))
	}
	if !bytes.Contains(html, []byte("<table")) || bytes.Contains(html, []byte(`src="`)) {
		t.Error("report.html is not a self-contained page with tables")
	}
}

func TestCompareMergesRuns(t *testing.T) {
	a := &Report{Limit: &Limit{SeqWriteMiBps: 1000}, Results: []Result{
		{System: "local", Workload: "seq", Phase: "write", Threads: 1, Clients: 1, Value: 400, Unit: UnitMiBps, Verified: true},
		{System: "local", Workload: "seq", Phase: "write", Threads: 2, Clients: 1, Value: 800, Unit: UnitMiBps, Verified: true},
	}}
	b := &Report{Results: []Result{
		{System: "local", Workload: "seq", Phase: "write", Threads: 1, Clients: 1, Value: 200, Unit: UnitMiBps, Verified: true},
		{System: "passthrough", Workload: "seq", Phase: "write", Threads: 1, Clients: 1, Value: 100, Unit: UnitMiBps, Verified: true},
	}}
	seeds, err := LoadSeeds()
	if err != nil {
		t.Fatal(err)
	}
	doc := &Document{Runs: []NamedReport{{"run-a", a}, {"run-b", b}}, Seeds: seeds, Baselines: []string{"passthrough"}}
	rs := doc.Results()
	if got := Systems(rs); !reflect.DeepEqual(got, []string{"local", "run-b: local", "passthrough"}) {
		t.Fatalf("systems %v", got)
	}
	var cmp, peaks bytes.Buffer
	doc.WriteComparison(&cmp)
	if !strings.Contains(cmp.String(), "4.00") { // local ÷ passthrough at 1 thread
		t.Errorf("comparison lacks the local/passthrough ratio:\n%s", cmp.String())
	}
	doc.WritePeaks(&peaks)
	if !strings.Contains(peaks.String(), "80%") { // 800 ÷ run-a's limit 1000
		t.Errorf("peaks lack run-a's efficiency:\n%s", peaks.String())
	}
	if !strings.Contains(peaks.String(), "NSS7.3-HA") {
		t.Errorf("peaks lack the seed rows:\n%s", peaks.String())
	}
	out := t.TempDir()
	if _, err := doc.WriteFiles(out); err != nil {
		t.Fatal(err)
	}
	html, _ := os.ReadFile(filepath.Join(out, "report.html"))
	for _, s := range []string{"run-b: local", "passthrough", "Lustre HSS4.5", "54,795"} {
		if !bytes.Contains(html, []byte(s)) {
			t.Errorf("report.html lacks %q", s)
		}
	}
}

func TestSeedsParse(t *testing.T) {
	s, err := LoadSeeds()
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]SeedRow{}
	for _, r := range s.Rows {
		rows[r.System] = r
	}
	if len(s.Rows) != 15 {
		t.Errorf("%d seed rows, want the 15 published ones", len(s.Rows))
	}
	check := func(system, key string, want float64) {
		t.Helper()
		r, ok := rows[system]
		if !ok {
			t.Fatalf("no seed row %q", system)
		}
		if f := r.Figures[key]; f.Value != want {
			t.Errorf("%s %s = %v, want %v", system, key, f.Value, want)
		}
	}
	check("NSS2-HA NFS+HA (2011)", "seq/write", 1275)
	check("NSS7.3-HA (2018)", "meta/stat", 808317)
	check("NSS7.4-HA (2019)", "random/read", 16607)
	check("Lustre HSS4.5, 1 OSS pair, 24 OSTs (2013)", "seq/read", 6780)
	check("Lustre HSS4.5, IOR N-to-1", "shared/read", 6400)
	check("NFS baseline, 1 RAID card (DFC study)", "meta/create", 45000)
	check("plain NFS, async export (2013)", "random/write", 111000)
	for _, r := range s.Rows {
		for k := range r.Figures {
			ok := false
			for _, c := range SeedColumns {
				ok = ok || c == k
			}
			if !ok {
				t.Errorf("%s: unknown column %q", r.System, k)
			}
		}
	}
}

func TestValidateReportsAll(t *testing.T) {
	c := DefaultConfig()
	c.Workloads = []string{"seq", "bogus"}
	c.Threads = nil
	c.Repeat = 0
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, s := range []string{"no path", "bogus", "thread sweep", "repeat", "worker command"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestStriperCommands(t *testing.T) {
	if got := stripeSetArgs(4, 4<<20, "/m/d"); !reflect.DeepEqual(got, []string{"stripe", "set", "--count", "4", "--size", "4194304", "/m/d"}) {
		t.Errorf("stripe set: %q", got)
	}
	if got := statusArgs("/w/strata-data"); !reflect.DeepEqual(got, []string{"status", "--json", "--data", "/w/strata-data"}) {
		t.Errorf("status: %q", got)
	}
	n, err := liveTargets([]byte(`{"meta":{"leader":"127.0.0.1:1"},"targets":[{"id":1,"alive":true},{"id":2,"alive":true},{"id":3,"alive":false},{"id":4,"alive":true}]}`))
	if err != nil || n != 3 {
		t.Errorf("liveTargets = %d, %v; want 3", n, err)
	}
	for _, bad := range []string{`{"targets":[]}`, `not json`, `{"targets":[{"id":1,"alive":false}]}`} {
		if _, err := liveTargets([]byte(bad)); err == nil {
			t.Errorf("liveTargets(%s) succeeded", bad)
		}
	}
	// Off Strata the striper does nothing.
	if note, err := (DefaultStriper{Binary: "/nonexistent"}).StripeAll(context.Background(), t.TempDir(), 4<<20); note != "" || err != nil {
		t.Errorf("striping a local dir: %q, %v", note, err)
	}
}

func TestGoLine(t *testing.T) {
	for line, want := range map[string]int64{"go\n": 0, "go 123456789\n": 123456789} {
		if got, err := parseGo(line); err != nil || got != want {
			t.Errorf("parseGo(%q) = %d, %v", line, got, err)
		}
	}
	for _, bad := range []string{"", "stop\n", "go x\n", "go 1 2\n"} {
		if _, err := parseGo(bad); err == nil {
			t.Errorf("parseGo(%q) accepted", bad)
		}
	}
	// sleepUntil waits for the instant and returns at once for a past one.
	at := monotonicNow() + 20e6
	sleepUntil(at)
	if now := monotonicNow(); now < at {
		t.Errorf("woke %d ns early", at-now)
	}
	sleepUntil(1)
}

// A run at one thread count is drawn as bars grouped by phase (in workload
// order), not as a column of single points.
func TestBarPlotForOneThreadCount(t *testing.T) {
	var rs []Result
	for _, sys := range []string{"local", "strata"} {
		for i, ph := range []string{"remove", "create", "stat"} {
			rs = append(rs, Result{System: sys, Workload: "meta", Phase: ph, Threads: 4, Clients: 1, Value: float64(100 * (i + 1)), Unit: "ops/s"})
		}
	}
	p, err := workloadPlot("meta", rs, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.X.Label.Text != "4 threads" {
		t.Fatalf("x label %q", p.X.Label.Text)
	}
	var labels []string
	for _, tk := range p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if strings.Join(labels, ",") != "create,stat,remove" {
		t.Fatalf("groups %v, want create,stat,remove", labels)
	}
	// Several thread counts keep the line plot.
	rs = append(rs, Result{System: "local", Workload: "meta", Phase: "create", Threads: 8, Clients: 1, Value: 5, Unit: "ops/s"})
	p, err = workloadPlot("meta", rs, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.X.Label.Text != "threads" {
		t.Fatalf("x label %q for a sweep", p.X.Label.Text)
	}
}

func TestMergeRepeats(t *testing.T) {
	res := func(phase string, v, secs float64, verified bool) Result {
		return Result{System: "s", Workload: "meta", Phase: phase, Threads: 4, Clients: 1,
			Value: v, Unit: UnitOpsps, Samples: []float64{v}, Seconds: secs, Ops: 100, Verified: verified}
	}
	in := []Result{
		res("create", 10, 1, true), res("stat", 50, 0.5, true),
		res("create", 30, 3, true), res("stat", 70, 0.7, false),
		res("create", 20, 2, true),
	}
	out := MergeRepeats(in)
	if len(out) != 2 || out[0].Phase != "create" || out[1].Phase != "stat" {
		t.Fatalf("merged %+v, want create then stat", out)
	}
	c := out[0]
	if c.Value != 20 || c.Seconds != 2 || !slices.Equal(c.Samples, []float64{10, 30, 20}) || !c.Verified {
		t.Errorf("create merged to %+v, want median 20 from the 2 s sample, all three samples, verified", c)
	}
	s := out[1]
	if s.Value != 60 || len(s.Samples) != 2 || s.Verified {
		t.Errorf("stat merged to %+v, want median 60 of 2 samples, not verified (one turn was not)", s)
	}
	if one := MergeRepeats(in[:1]); len(one) != 1 || one[0].Value != 10 {
		t.Errorf("a single result changed: %+v", one)
	}
}

// Peers runs each workload once per turn: with KeepRandomFiles the random
// files are written by the first call only and removed on request.
func TestRandomFilesKeptAcrossCalls(t *testing.T) {
	dir := t.TempDir()
	c := testConfig(t, dir)
	c.Threads = []int{2}
	c.KeepRandomFiles = true
	r, err := NewRunner(c)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		rs, err := r.Workload(ctx, "random")
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 2 || !(rs[0].Value > 0) || !(rs[1].Value > 0) {
			t.Fatalf("call %d: %+v", i, rs)
		}
		for th := 0; th < 2; th++ {
			if st, err := os.Stat(randomName(r.work, th)); err != nil || st.Size() != c.RandomFileBytes {
				t.Fatalf("call %d: random file %d not kept: %v", i, th, err)
			}
		}
	}
	if r.calls["random"] != 3 {
		t.Errorf("calls counted %d, want 3", r.calls["random"])
	}
	r.RemoveRandomFiles()
	if _, err := os.Stat(randomName(r.work, 0)); !os.IsNotExist(err) {
		t.Errorf("random file after RemoveRandomFiles: %v", err)
	}
	// Without the option a call cleans up after itself.
	c.KeepRandomFiles = false
	r2, err := NewRunner(c)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r2.Workload(ctx, "random"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(randomName(r2.work, 0)); !os.IsNotExist(err) {
		t.Errorf("random file left by a call without KeepRandomFiles: %v", err)
	}
}

// smallfile does one operation per file in every phase, moves the files'
// bytes in create and read, and leaves nothing behind, in one shared
// directory and in private ones, with and without an fsync per file.
func TestSmallFileCounts(t *testing.T) {
	for _, tc := range []struct {
		name          string
		shared, fsync bool
		size          int64
	}{
		{"shared", true, false, 3901},
		{"private+fsync", false, true, 3901},
		{"empty", true, false, 0},
		{"two blocks and a bit", false, false, 2*blockBytes + 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := testConfig(t, dir)
			c.Workloads = []string{"smallfile"}
			c.Threads = []int{1, 3}
			c.Clients = []int{1, 2}
			c.SmallFilesPerThread = 25
			c.SmallFileShared, c.SmallFileFsync, c.SmallFileBytes = tc.shared, tc.fsync, tc.size
			c.Fio = false
			rep, err := Run(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			// Points (threads, clients): (1,1), (3,1), (3,2).
			if len(rep.Results) != 9 {
				t.Fatalf("%d results, want 3 phases at 3 points: %+v", len(rep.Results), rep.Results)
			}
			for _, r := range rep.Results {
				ops := int64(r.Threads * c.SmallFilesPerThread)
				bytes := ops * tc.size
				if r.Phase == "remove" {
					bytes = 0
				}
				if r.Ops != ops || r.Bytes != bytes || r.Unit != UnitOpsps || !(r.Value > 0) || !r.Verified || r.RecordBytes != tc.size {
					t.Errorf("%s t=%d c=%d: ops %d bytes %d unit %s value %v record %d; want ops %d bytes %d",
						r.Phase, r.Threads, r.Clients, r.Ops, r.Bytes, r.Unit, r.Value, r.RecordBytes, ops, bytes)
				}
				notes := strings.Join(r.Notes, "; ")
				where := map[bool]string{true: "one shared directory", false: "a directory per thread"}[tc.shared]
				if !strings.Contains(notes, where) || !strings.Contains(notes, fmt.Sprintf("%d bytes", tc.size)) {
					t.Errorf("%s notes %q do not say how it ran", r.Phase, notes)
				}
				if got := strings.Contains(notes, "fsync before each close"); got != (tc.fsync && r.Phase == "create") {
					t.Errorf("%s notes %q: fsync note %v, want %v", r.Phase, notes, got, tc.fsync && r.Phase == "create")
				}
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("left behind: %v", ents)
			}
		})
	}
}

// smallTask is one smallfile phase of threads 0..n-1 run in this process.
func smallTask(dir, phase string, n int, nonce uint64) *task {
	return &task{Workload: "smallfile", Phase: phase, Dir: dir, TotalThreads: n, FileBytes: 3901,
		FilesPerThread: 4, SharedDir: true, Nonce: nonce}
}

func runSmall(t *testing.T, tk *task) error {
	t.Helper()
	for th := 0; th < tk.TotalThreads; th++ {
		fn, _, err := prepareSmall(tk, th)
		if err != nil {
			t.Fatal(err)
		}
		if err := fn(&threadResult{}, &counters{}); err != nil {
			return err
		}
	}
	return nil
}

// The read phase checks every file: a flipped byte, a file of the wrong
// size, another file's data, another thread's data and an earlier pass's
// data all fail it with ErrCorrupt naming the file (and the offset in it).
func TestSmallFileVerification(t *testing.T) {
	const nonce = 42
	for _, tc := range []struct {
		name    string
		damage  func(t *testing.T, dir string)
		wantMsg string
	}{
		{"intact", func(*testing.T, string) {}, ""},
		{"flipped byte", func(t *testing.T, dir string) { flipByte(t, smallName(dir, true, 1, 2), 3000) }, "t1.f2 offset 3000"},
		{"flipped header byte", func(t *testing.T, dir string) { flipByte(t, smallName(dir, true, 0, 0), 9) }, "t0.f0 offset 9"},
		{"truncated", func(t *testing.T, dir string) {
			os.Truncate(smallName(dir, true, 0, 3), 3900)
		}, "t0.f3 offset 0: stat says mode 100644 size 3900"},
		{"files of one thread swapped", func(t *testing.T, dir string) {
			a, b := smallName(dir, true, 1, 0), smallName(dir, true, 1, 1)
			os.Rename(a, a+".x")
			os.Rename(b, a)
			os.Rename(a+".x", b)
		}, "t1.f0 offset 1:"},
		{"another thread's file", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(smallName(dir, true, 0, 1))
			os.WriteFile(smallName(dir, true, 1, 1), b, 0o644)
		}, "t1.f1 offset 8:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := runSmall(t, smallTask(dir, "create", 2, nonce)); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, dir)
			err := runSmall(t, smallTask(dir, "read", 2, nonce))
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("intact files failed: %v", err)
				}
				// Data of an earlier pass (another nonce) fails.
				err = runSmall(t, smallTask(dir, "read", 2, nonce+1))
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("an earlier pass's data accepted: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("read of damaged files: %v; want a verification failure naming %q", err, tc.wantMsg)
			}
		})
	}
}

// flipByte flips one bit of byte i of file name.
func flipByte(t *testing.T, name string, i int) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	b[i] ^= 0x04
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A file system that corrupts a small file fails the whole run.
func TestSmallFileRunFailsOnCorruption(t *testing.T) {
	dir := t.TempDir()
	c := testConfig(t, dir)
	c.Workloads = []string{"smallfile"}
	c.Threads = []int{2}
	c.SmallFilesPerThread = 10
	c.Fio = false
	r, err := NewRunner(c)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Between create and read, zero a page of one file: the runner's
	// cache dropper is the hook that runs between phases.
	r.cfg.Caches = damageOnce(func() error {
		return os.WriteFile(smallName(r.work, true, 1, 7), make([]byte, 3901), 0o644)
	})
	_, err = r.Workload(context.Background(), "smallfile")
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "t1.f7 offset 1:") {
		t.Fatalf("run over a zeroed file: %v; want a verification failure naming t1.f7", err)
	}
}

// damageOnce is a CacheDropper that runs f (every call; the test makes one).
type damageOnce func() error

func (d damageOnce) DropCaches(context.Context) error {
	if d == nil {
		return nil
	}
	return d()
}
