package bench

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
)

// Document is what a report shows: one or more runs, optionally the seed
// figures, optionally ratios against baseline systems (peers).
type Document struct {
	Title string
	Runs  []NamedReport
	Seeds *Seeds
	// Baselines are system labels that ratio columns divide by
	// (peers: "passthrough", "local").
	Baselines []string
}

// NamedReport is one run; Name is its file stem or label.
type NamedReport struct {
	Name   string
	Report *Report
}

// Results merges the runs' results. When two runs use the same system
// label, the later ones are prefixed with their run name so that every
// series stays distinct.
func (d *Document) Results() []Result {
	seen := map[string]string{} // system -> run that owns it
	var out []Result
	for _, run := range d.Runs {
		for _, r := range run.Report.Results {
			if owner, ok := seen[r.System]; ok && owner != run.Name {
				r.System = run.Name + ": " + r.System
			} else {
				seen[r.System] = run.Name
			}
			out = append(out, r)
		}
	}
	return out
}

// Systems lists the system labels in first-seen order.
func Systems(rs []Result) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range rs {
		if !seen[r.System] {
			seen[r.System] = true
			out = append(out, r.System)
		}
	}
	return out
}

func phaseOrder(workload, phase string) int {
	i := 0
	for k, w := range Workloads {
		if w == workload {
			i = k * 10
		}
	}
	switch phase {
	case "write", "create":
		return i
	case "read", "stat":
		return i + 1
	}
	return i + 2
}

// sortResults orders by workload, phase, clients, threads, then system.
func sortResults(rs []Result, systems []string) {
	sysIdx := map[string]int{}
	for i, s := range systems {
		sysIdx[s] = i
	}
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if pa, pb := phaseOrder(a.Workload, a.Phase), phaseOrder(b.Workload, b.Phase); pa != pb {
			return pa < pb
		}
		if a.Clients != b.Clients {
			return a.Clients < b.Clients
		}
		if a.Threads != b.Threads {
			return a.Threads < b.Threads
		}
		return sysIdx[a.System] < sysIdx[b.System]
	})
}

// WriteTable prints every result as an aligned table.
func WriteTable(w io.Writer, rs []Result) {
	rs = append([]Result(nil), rs...)
	sortResults(rs, Systems(rs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tworkload\tphase\tthreads\tclients\tvalue\tunit\tverified\tefficiency\tnotes\t")
	for _, r := range rs {
		eff := "-"
		if r.Efficiency > 0 {
			eff = fmt.Sprintf("%.0f%%", r.Efficiency*100)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%v\t%s\t%s\t\n", r.System, r.Workload, r.Phase, r.Threads, r.Clients,
			formatValue(r.Value), r.Unit, r.Verified, eff, strings.Join(r.Notes, "; "))
	}
	tw.Flush()
}

func formatValue(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// comparisonRow is one (workload, phase, threads, clients) across systems.
type comparisonRow struct {
	Workload, Phase  string
	Threads, Clients int
	Unit             string
	Values           map[string]float64
}

func comparisonRows(rs []Result) []comparisonRow {
	idx := map[string]int{}
	var rows []comparisonRow
	sorted := append([]Result(nil), rs...)
	sortResults(sorted, Systems(rs))
	for _, r := range sorted {
		k := fmt.Sprintf("%s/%s/%d/%d", r.Workload, r.Phase, r.Threads, r.Clients)
		i, ok := idx[k]
		if !ok {
			i = len(rows)
			idx[k] = i
			rows = append(rows, comparisonRow{Workload: r.Workload, Phase: r.Phase, Threads: r.Threads, Clients: r.Clients, Unit: r.Unit, Values: map[string]float64{}})
		}
		rows[i].Values[r.System] = r.Value
	}
	return rows
}

// WriteComparison prints one row per point with a column per system and,
// for each baseline present, each system's ratio against it.
func (d *Document) WriteComparison(w io.Writer) {
	rs := d.Results()
	systems := Systems(rs)
	if len(systems) < 2 {
		return
	}
	var bases []string
	for _, b := range d.Baselines {
		for _, s := range systems {
			if s == b {
				bases = append(bases, b)
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "workload\tphase\tthreads\tclients\tunit\t")
	for _, s := range systems {
		fmt.Fprintf(tw, "%s\t", s)
	}
	for _, b := range bases {
		for _, s := range systems {
			if s != b {
				fmt.Fprintf(tw, "%s/%s\t", s, b)
			}
		}
	}
	fmt.Fprintln(tw)
	for _, row := range comparisonRows(rs) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t", row.Workload, row.Phase, row.Threads, row.Clients, row.Unit)
		for _, s := range systems {
			if v, ok := row.Values[s]; ok {
				fmt.Fprintf(tw, "%s\t", formatValue(v))
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		for _, b := range bases {
			for _, s := range systems {
				if s != b {
					fmt.Fprintf(tw, "%s\t", ratioText(row.Values, s, b))
				}
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func ratioText(vals map[string]float64, s, base string) string {
	v, ok1 := vals[s]
	b, ok2 := vals[base]
	if !ok1 || !ok2 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v/b)
}

// peak is a run's best value for one workload/phase.
type peak struct {
	System          string
	Workload, Phase string
	Value           float64
	Unit            string
	Threads         int
	Limit           float64
	Efficiency      float64
}

// peaks returns, per system and workload/phase, the best value over the
// sweep and its efficiency against the run's own fio limit.
func (d *Document) peaks() []peak {
	var out []peak
	idx := map[string]int{}
	rs := d.Results()
	// Map each merged result back to its run's limit.
	limits := map[string]*Limit{}
	k := 0
	for _, run := range d.Runs {
		for range run.Report.Results {
			limits[rs[k].System] = run.Report.Limit
			k++
		}
	}
	for _, r := range rs {
		key := r.System + "/" + r.Workload + "/" + r.Phase
		i, ok := idx[key]
		if !ok {
			i = len(out)
			idx[key] = i
			out = append(out, peak{System: r.System, Workload: r.Workload, Phase: r.Phase, Unit: r.Unit})
		}
		if r.Value > out[i].Value {
			out[i].Value, out[i].Threads = r.Value, r.Threads
		}
	}
	for i := range out {
		out[i].Limit = limits[out[i].System].limitFor(out[i].Workload, out[i].Phase)
		out[i].Efficiency = Efficiency(out[i].Value, out[i].Limit)
	}
	sort.SliceStable(out, func(i, j int) bool {
		return phaseOrder(out[i].Workload, out[i].Phase) < phaseOrder(out[j].Workload, out[j].Phase)
	})
	return out
}

// WritePeaks prints each system's peak per workload/phase with its
// efficiency, and the seed figures for the same column when present.
func (d *Document) WritePeaks(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload/phase\tsystem\tpeak\tunit\t@threads\tfio limit\tefficiency\t")
	for _, p := range d.peaks() {
		lim, eff := "-", "-"
		if p.Limit > 0 {
			lim = formatValue(p.Limit)
			eff = fmt.Sprintf("%.0f%%", p.Efficiency*100)
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", p.Workload, p.Phase, p.System, formatValue(p.Value), p.Unit, p.Threads, lim, eff)
	}
	tw.Flush()
	if d.Seeds == nil {
		return
	}
	fmt.Fprintln(w, "\nSeed studies (published; compare shapes and efficiency, not raw numbers):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "system\t")
	for _, c := range SeedColumns {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw)
	for _, row := range d.Seeds.Rows {
		fmt.Fprintf(tw, "%s\t", row.System)
		for _, c := range SeedColumns {
			if f, ok := row.Figures[c]; ok {
				fmt.Fprintf(tw, "%s\t", f.Text)
			} else {
				fmt.Fprint(tw, "\t")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// WriteFiles writes the plots (PNG and SVG per workload) and report.html
// into dir and returns the paths written.
func (d *Document) WriteFiles(dir string) ([]string, error) {
	rs := d.Results()
	svgs, paths, err := writePlots(dir, rs, d.Title)
	if err != nil {
		return paths, err
	}
	html := filepath.Join(dir, "report.html")
	if err := d.writeHTML(html, svgs); err != nil {
		return paths, err
	}
	return append(paths, html), nil
}
