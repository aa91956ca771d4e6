package bench

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writePlots draws one figure per workload, shaped like the seed studies'
// figures: aggregate rate against thread count (evenly spaced powers of
// two), one line per system and phase. It writes WORKLOAD.png and
// WORKLOAD.svg into dir and returns the SVG bytes for inlining.
func writePlots(dir string, rs []Result, title string) (map[string][]byte, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	svgs := map[string][]byte{}
	var paths []string
	for _, w := range Workloads {
		var sub []Result
		for _, r := range rs {
			if r.Workload == w {
				sub = append(sub, r)
			}
		}
		if len(sub) == 0 {
			continue
		}
		p, err := workloadPlot(w, sub, title)
		if err != nil {
			return nil, paths, err
		}
		const width, height = 7 * vg.Inch, 4.5 * vg.Inch
		for _, ext := range []string{"png", "svg"} {
			wt, err := p.WriterTo(width, height, ext)
			if err != nil {
				return nil, paths, err
			}
			var buf bytes.Buffer
			if _, err := wt.WriteTo(&buf); err != nil {
				return nil, paths, err
			}
			path := filepath.Join(dir, w+"."+ext)
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				return nil, paths, err
			}
			paths = append(paths, path)
			if ext == "svg" {
				svgs[w] = buf.Bytes()
			}
		}
	}
	return svgs, paths, nil
}

var workloadTitles = map[string]string{
	"seq":       "Sequential N-to-N, 1 MiB records",
	"random":    "Random 4 KiB",
	"shared":    "N-to-1 shared file (IOR-style)",
	"meta":      "Metadata (mdtest-style)",
	"smallfile": "Small files (IO500 mdtest-hard-style)",
}

func workloadPlot(workload string, rs []Result, title string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = workloadTitles[workload]
	if title != "" {
		p.Title.Text += " — " + title
	}
	p.X.Label.Text = "threads"
	p.Y.Label.Text = rs[0].Unit
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())

	multiClients := false
	for _, r := range rs {
		if r.Clients != rs[0].Clients {
			multiClients = true
		}
	}
	threadSet := map[int]bool{}
	for _, r := range rs {
		threadSet[r.Threads] = true
	}
	if len(threadSet) == 1 && !multiClients {
		return barPlot(p, rs)
	}
	type series struct {
		name string
		pts  plotter.XYs
		dash int
	}
	var order []string
	byName := map[string]*series{}
	threads := map[int]bool{}
	maxY := 0.0
	for _, r := range rs {
		name := r.System + " " + r.Phase
		if multiClients {
			name += fmt.Sprintf(" (%d clients)", r.Clients)
		}
		s, ok := byName[name]
		if !ok {
			s = &series{name: name, dash: phaseOrder(r.Workload, r.Phase) % 10}
			byName[name] = s
			order = append(order, name)
		}
		s.pts = append(s.pts, plotter.XY{X: math.Log2(float64(r.Threads)), Y: r.Value})
		threads[r.Threads] = true
		maxY = math.Max(maxY, r.Value)
	}
	for i, name := range order {
		s := byName[name]
		sort.Slice(s.pts, func(a, b int) bool { return s.pts[a].X < s.pts[b].X })
		l, pts, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return nil, err
		}
		c := plotutil.Color(i)
		l.Color, pts.Color = c, c
		l.Width = vg.Points(1.5)
		l.Dashes = plotutil.Dashes(s.dash)
		pts.Shape = draw.CircleGlyph{}
		p.Add(l, pts)
		p.Legend.Add(name, l, pts)
	}
	var ticks plot.ConstantTicks
	var ts []int
	for t := range threads {
		ts = append(ts, t)
	}
	sort.Ints(ts)
	for _, t := range ts {
		ticks = append(ticks, plot.Tick{Value: math.Log2(float64(t)), Label: strconv.Itoa(t)})
	}
	p.X.Tick.Marker = ticks
	p.X.Min = math.Log2(float64(ts[0])) - 0.25
	p.X.Max = math.Log2(float64(ts[len(ts)-1])) + 0.25
	p.Y.Min = 0
	p.Y.Max = maxY * 1.35 // room for the legend
	if p.Y.Max == 0 {
		p.Y.Max = 1
	}
	return p, nil
}

// barPlot draws a run at a single thread count as grouped bars: one group
// per phase, one bar per system (a line plot of one point per series
// would be a column of dots).
func barPlot(p *plot.Plot, rs []Result) (*plot.Plot, error) {
	var phases, systems []string
	val := map[[2]string]float64{}
	for _, r := range rs {
		k := [2]string{r.System, r.Phase}
		if _, ok := val[k]; !ok {
			if !slices.Contains(systems, r.System) {
				systems = append(systems, r.System)
			}
			if !slices.Contains(phases, r.Phase) {
				phases = append(phases, r.Phase)
			}
		}
		val[k] = math.Max(val[k], r.Value)
	}
	sort.SliceStable(phases, func(a, b int) bool {
		return phaseOrder(rs[0].Workload, phases[a]) < phaseOrder(rs[0].Workload, phases[b])
	})
	hi := 0.0
	for _, v := range val {
		hi = math.Max(hi, v)
	}
	p.X.Label.Text = fmt.Sprintf("%d threads", rs[0].Threads)
	w := vg.Points(max(6, 60/float64(len(systems))))
	for i, sys := range systems {
		vs := make(plotter.Values, len(phases))
		for j, ph := range phases {
			vs[j] = val[[2]string{sys, ph}]
		}
		b, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(len(systems)-1)/2)
		p.Add(b)
		p.Legend.Add(sys, b)
	}
	p.NominalX(phases...)
	p.X.Min, p.X.Max = -0.5, float64(len(phases))-0.5
	p.Legend.Left = false
	p.Y.Min, p.Y.Max = 0, math.Max(hi*1.45, 1) // room for the legend
	return p, nil
}
