package bench

import (
	"bytes"
	"fmt"
	"html/template"
	"os"
	"strings"
)

// writeHTML writes one self-contained page: machine, limit, tables and the
// SVG plots inlined.
func (d *Document) writeHTML(path string, svgs map[string][]byte) error {
	rs := d.Results()
	var table, cmp, peaks strings.Builder
	WriteTable(&table, rs)
	d.WriteComparison(&cmp)
	d.WritePeaks(&peaks)
	type figure struct {
		Title string
		SVG   template.HTML
	}
	var figs []figure
	for _, w := range Workloads {
		if b, ok := svgs[w]; ok {
			// Drop the XML prolog so the SVG can sit inside HTML.
			if i := bytes.Index(b, []byte("<svg")); i > 0 {
				b = b[i:]
			}
			figs = append(figs, figure{Title: workloadTitles[w], SVG: template.HTML(b)})
		}
	}
	data := struct {
		Title       string
		Runs        []NamedReport
		Rows        []Result
		Cmp, Peaks  string
		Table       string
		Figures     []figure
		Seeds       *Seeds
		SeedColumns []string
	}{d.Title, d.Runs, rs, cmp.String(), peaks.String(), table.String(), figs, d.Seeds, SeedColumns}
	var buf bytes.Buffer
	if err := htmlTemplate.Execute(&buf, data); err != nil {
		return fmt.Errorf("render report: %w", err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

var htmlTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct": func(f float64) string {
		if f <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", f*100)
	},
	"num": formatValue,
	"gib": func(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) },
	"fig": func(r SeedRow, c string) string { return r.Figures[c].Text },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f0f0f0}td.l,th.l{text-align:left}
pre{background:#f8f8f8;padding:1em;overflow-x:auto;font-size:.85em}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}
.bad{color:#b00;font-weight:bold}
</style></head><body>
<h1>{{.Title}}</h1>
{{range .Runs}}<h2>Run: {{.Name}}</h2>
{{with .Report}}<table>
<tr><th class="l">machine</th><td class="l">{{.Machine.Hostname}}: {{.Machine.Cores}} cores, {{gib .Machine.MemoryBytes}}, Linux {{.Machine.Kernel}}, {{.Machine.GoVersion}}</td></tr>
<tr><th class="l">date</th><td class="l">{{.Machine.Date}}</td></tr>
<tr><th class="l">path</th><td class="l">{{.Machine.Path}} ({{.Machine.FSType}})</td></tr>
<tr><th class="l">caches dropped</th><td class="l">{{.Machine.CachesDropped}}</td></tr>
{{with .Limit}}<tr><th class="l">raw limit ({{.Tool}}, {{.Directory}}{{with .Measured}}: {{.}}{{end}})</th><td class="l">seq write {{num .SeqWriteMiBps}} MiB/s, seq read {{num .SeqReadMiBps}} MiB/s, random write {{num .RandWriteIOPS}} IOPS, random read {{num .RandReadIOPS}} IOPS — {{.Pattern}}</td></tr>{{end}}
{{range .Notes}}<tr><th class="l">note</th><td class="l">{{.}}</td></tr>{{end}}
</table>{{end}}{{end}}
<h2>Figures</h2>
{{range .Figures}}<figure>{{.SVG}}<figcaption>{{.Title}}</figcaption></figure>{{end}}
{{if .Cmp}}<h2>Side by side (ratios: system ÷ baseline)</h2><pre>{{.Cmp}}</pre>{{end}}
<h2>Peaks and efficiency (delivered ÷ the run's own fio limit)</h2><pre>{{.Peaks}}</pre>
<h2>All results</h2>
<table><tr><th class="l">system</th><th class="l">workload</th><th class="l">phase</th><th>threads</th><th>clients</th><th>value</th><th class="l">unit</th><th>verified</th><th>efficiency</th><th class="l">notes</th></tr>
{{range .Rows}}<tr><td class="l">{{.System}}</td><td class="l">{{.Workload}}</td><td class="l">{{.Phase}}</td><td>{{.Threads}}</td><td>{{.Clients}}</td><td>{{num .Value}}</td><td class="l">{{.Unit}}</td><td{{if not .Verified}} class="bad"{{end}}>{{.Verified}}</td><td>{{pct .Efficiency}}</td><td class="l">{{range .Notes}}{{.}}; {{end}}</td></tr>
{{end}}</table>
{{with .Seeds}}<h2>Seed studies (published)</h2><p>{{.Source}}</p>
<table><tr><th class="l">system</th>{{range $.SeedColumns}}<th>{{.}}</th>{{end}}</tr>
{{range $r := .Rows}}<tr><td class="l">{{$r.System}}</td>{{range $.SeedColumns}}<td>{{fig $r .}}</td>{{end}}</tr>
{{end}}</table>{{end}}
</body></html>
`))
