// Package report builds a rack's commissioning report from inventory machines and
// renders it as Markdown, JSON (the protojson form of RackReportData) or a
// self-contained HTML page. It is pure: no I/O, no clock (the caller passes the time).
//
// It is not the rack view page (pxe/admin serves that, live, from the same data).
package report

import (
	"bytes"
	"fmt"
	"html/template"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pbjson"
)

// Build returns the report data for rack from machines (any rack; others and
// decommissioned machines are skipped).
func Build(rack string, machines []*bootv1.Machine, now time.Time) *bootv1.RackReportData {
	d := &bootv1.RackReportData{Rack: rack, GeneratedAt: timestamppb.New(now), MachinesByState: map[string]uint32{}}
	tallies := map[string]*bootv1.CheckTally{}
	for _, m := range machines {
		if m.GetRack() != rack || m.GetState() == bootv1.MachineState_MACHINE_STATE_DECOMMISSIONED {
			continue
		}
		row := &bootv1.RackReportMachine{
			MachineId: m.GetId(), NodeName: m.GetNodeName(), Slot: m.GetSlot(), Identity: m.GetIdentity(),
			State: m.GetState(), Checklist: m.GetChecklist(), Health: m.GetHealth(),
			ImageId: m.GetChecklist().GetImageId(), DriverVersion: m.GetChecklist().GetDriverVersion(),
		}
		if row.ImageId == "" {
			row.ImageId = m.GetImageId()
		}
		if row.DriverVersion == "" {
			row.DriverVersion = m.GetFacts().GetDriverVersion()
		}
		d.Machines = append(d.Machines, row)
		d.MachinesByState[StateName(m.GetState())]++
		gpus := uint32(len(m.GetFacts().GetGpus()))
		failing := map[int32]bool{}
		nodeFail := false
		for _, r := range m.GetChecklist().GetResults() {
			t := tallies[r.GetId()]
			if t == nil {
				t = &bootv1.CheckTally{Id: r.GetId()}
				tallies[r.GetId()] = t
			}
			switch r.GetStatus() {
			case machinev1.CheckStatus_CHECK_STATUS_PASS:
				t.Pass++
			case machinev1.CheckStatus_CHECK_STATUS_WARN:
				t.Warn++
			case machinev1.CheckStatus_CHECK_STATUS_FAIL:
				t.Fail++
				if r.GpuIndex != nil && r.GetGpuIndex() >= 0 {
					failing[r.GetGpuIndex()] = true
				} else {
					nodeFail = true
				}
			case machinev1.CheckStatus_CHECK_STATUS_NOT_APPLICABLE:
				t.NotApplicable++
			default:
				t.Unknown++
			}
		}
		d.GpuCount += gpus
		if !nodeFail && uint32(len(failing)) <= gpus {
			d.HealthyGpuCount += gpus - uint32(len(failing))
		}
	}
	sort.Slice(d.Machines, func(i, j int) bool {
		a, b := d.Machines[i], d.Machines[j]
		if a.Slot != b.Slot {
			return slotLess(a.Slot, b.Slot)
		}
		if a.NodeName != b.NodeName {
			return a.NodeName < b.NodeName
		}
		return a.MachineId < b.MachineId
	})
	for _, t := range tallies {
		d.Checks = append(d.Checks, t)
	}
	sort.Slice(d.Checks, func(i, j int) bool { return d.Checks[i].Id < d.Checks[j].Id })
	return d
}

// slotLess orders slots naturally: "U2" before "U10"; empty slots last.
func slotLess(a, b string) bool {
	if a == "" || b == "" {
		return b == "" && a != ""
	}
	na, pa := splitNum(a)
	nb, pb := splitNum(b)
	if pa != pb {
		return pa < pb
	}
	return na < nb
}

func splitNum(s string) (int, string) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	n := 0
	for _, c := range s[i:] {
		n = n*10 + int(c-'0')
	}
	return n, s[:i]
}

// StateName is the text form of a state ("ready").
func StateName(s bootv1.MachineState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "MACHINE_STATE_"))
}

// StatusName is the text form of a check status ("not-applicable").
func StatusName(s machinev1.CheckStatus) string {
	if s == machinev1.CheckStatus_CHECK_STATUS_UNSPECIFIED {
		return "unknown"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "CHECK_STATUS_")), "_", "-")
}

// ParseFormat maps the CLI words md, json and html (and the enum names) to a format.
func ParseFormat(s string) (bootv1.ReportFormat, error) {
	switch strings.ToLower(s) {
	case "", "md", "markdown":
		return bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN, nil
	case "json":
		return bootv1.ReportFormat_REPORT_FORMAT_JSON, nil
	case "html":
		return bootv1.ReportFormat_REPORT_FORMAT_HTML, nil
	}
	return 0, fmt.Errorf("report format %q: use md, json or html", s)
}

// Render renders d and returns the content, its MIME type and a file name.
func Render(d *bootv1.RackReportData, f bootv1.ReportFormat) (content []byte, contentType, filename string, err error) {
	base := "rack-" + d.GetRack() + "-report"
	switch f {
	case bootv1.ReportFormat_REPORT_FORMAT_UNSPECIFIED, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN:
		return markdown(d), "text/markdown; charset=utf-8", base + ".md", nil
	case bootv1.ReportFormat_REPORT_FORMAT_JSON:
		b, err := pbjson.Marshal(d)
		return b, "application/json", base + ".json", err
	case bootv1.ReportFormat_REPORT_FORMAT_HTML:
		var buf bytes.Buffer
		err := htmlTemplate.Execute(&buf, view(d))
		return buf.Bytes(), "text/html; charset=utf-8", base + ".html", err
	}
	return nil, "", "", fmt.Errorf("unknown report format %v", f)
}

// row is one machine as the renderings show it.
type row struct {
	Slot, Node, ID, MAC, Serial, State, Overall, Failing, Warning, Health, Image, Driver string
}

type page struct {
	Rack, Generated string
	Rows            []row
	States          []string
	Checks          []*bootv1.CheckTally
	GPUs, Healthy   uint32
}

func view(d *bootv1.RackReportData) page {
	p := page{Rack: d.GetRack(), Generated: d.GetGeneratedAt().AsTime().UTC().Format(time.RFC3339), Checks: d.GetChecks(),
		GPUs: d.GetGpuCount(), Healthy: d.GetHealthyGpuCount()}
	var states []string
	for s, n := range d.GetMachinesByState() {
		states = append(states, fmt.Sprintf("%s %d", s, n))
	}
	sort.Strings(states)
	p.States = states
	for _, m := range d.GetMachines() {
		r := row{Slot: m.GetSlot(), Node: m.GetNodeName(), ID: m.GetMachineId(), MAC: m.GetIdentity().GetBootMac(),
			Serial: m.GetIdentity().GetSerial(), State: StateName(m.GetState()), Image: shortImage(m.GetImageId()), Driver: m.GetDriverVersion()}
		if cl := m.GetChecklist(); cl != nil {
			r.Overall = StatusName(overall(cl))
			var fail, warn []string
			for _, c := range cl.GetResults() {
				name := c.GetId()
				if c.GpuIndex != nil && c.GetGpuIndex() >= 0 {
					name = fmt.Sprintf("%s (GPU %d)", c.GetId(), c.GetGpuIndex())
				}
				switch c.GetStatus() {
				case machinev1.CheckStatus_CHECK_STATUS_FAIL:
					fail = append(fail, name)
				case machinev1.CheckStatus_CHECK_STATUS_WARN:
					warn = append(warn, name)
				}
			}
			r.Failing, r.Warning = strings.Join(fail, ", "), strings.Join(warn, ", ")
		} else {
			r.Overall = "no report"
		}
		if h := m.GetHealth(); h != nil {
			r.Health = strings.ToLower(strings.TrimPrefix(h.GetState().String(), "HEALTH_STATE_"))
		}
		p.Rows = append(p.Rows, r)
	}
	return p
}

func overall(cl *machinev1.Checklist) machinev1.CheckStatus {
	if cl.GetOverall() != machinev1.CheckStatus_CHECK_STATUS_UNSPECIFIED {
		return cl.GetOverall()
	}
	worst := machinev1.CheckStatus_CHECK_STATUS_NOT_APPLICABLE
	rank := map[machinev1.CheckStatus]int{machinev1.CheckStatus_CHECK_STATUS_FAIL: 4, machinev1.CheckStatus_CHECK_STATUS_WARN: 3, machinev1.CheckStatus_CHECK_STATUS_UNKNOWN: 2, machinev1.CheckStatus_CHECK_STATUS_PASS: 1}
	for _, r := range cl.GetResults() {
		if rank[r.GetStatus()] > rank[worst] {
			worst = r.GetStatus()
		}
	}
	return worst
}

func shortImage(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func mdEscape(s string) string {
	if s == "" {
		return "–"
	}
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

func markdown(d *bootv1.RackReportData) []byte {
	p := view(d)
	var b strings.Builder
	fmt.Fprintf(&b, "# Rack %s commissioning report\n\nGenerated %s. %d machines (%s). GPUs: %d, %d without a failing check.\n\n",
		p.Rack, p.Generated, len(p.Rows), strings.Join(p.States, ", "), p.GPUs, p.Healthy)
	b.WriteString("| slot | node | machine | MAC | serial | state | checks | failing | warning | health | image | driver |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range p.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			mdEscape(r.Slot), mdEscape(r.Node), mdEscape(r.ID), mdEscape(r.MAC), mdEscape(r.Serial), r.State,
			mdEscape(r.Overall), mdEscape(r.Failing), mdEscape(r.Warning), mdEscape(r.Health), mdEscape(r.Image), mdEscape(r.Driver))
	}
	if len(p.Checks) > 0 {
		b.WriteString("\n## Checks\n\n| check | pass | warn | fail | unknown | n/a |\n|---|---|---|---|---|---|\n")
		for _, c := range p.Checks {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d |\n", mdEscape(c.GetId()), c.GetPass(), c.GetWarn(), c.GetFail(), c.GetUnknown(), c.GetNotApplicable())
		}
	}
	return []byte(b.String())
}

// Style is the inline stylesheet of the HTML report and the rack view (no external
// assets).
const Style = `body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.ready,.pass{background:#dff5df}.quarantined,.fail,.conflict,.rejected{background:#f9d6d6}
.warn,.commissioning,.joining,.approved{background:#fdf3cf}.discovered,.registered{background:#e4ecf9}
.decommissioned,.no-report{color:#888}code{font-size:12px}`

var htmlTemplate = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Rack {{.Rack}} commissioning report</title>
<style>` + Style + `</style></head><body>
<h1>Rack {{.Rack}} commissioning report</h1>
<p>Generated {{.Generated}}. {{len .Rows}} machines ({{range $i, $s := .States}}{{if $i}}, {{end}}{{$s}}{{end}}). GPUs: {{.GPUs}}, {{.Healthy}} without a failing check.</p>
<table><tr><th>slot</th><th>node</th><th>machine</th><th>MAC</th><th>serial</th><th>state</th><th>checks</th><th>failing</th><th>warning</th><th>health</th><th>image</th><th>driver</th></tr>
{{range .Rows}}<tr><td>{{.Slot}}</td><td>{{.Node}}</td><td><code>{{.ID}}</code></td><td><code>{{.MAC}}</code></td><td>{{.Serial}}</td><td class="{{.State}}">{{.State}}</td><td class="{{.Overall}}">{{.Overall}}</td><td>{{.Failing}}</td><td>{{.Warning}}</td><td>{{.Health}}</td><td><code>{{.Image}}</code></td><td>{{.Driver}}</td></tr>
{{end}}</table>
{{if .Checks}}<h2>Checks</h2><table><tr><th>check</th><th>pass</th><th>warn</th><th>fail</th><th>unknown</th><th>n/a</th></tr>
{{range .Checks}}<tr><td><code>{{.Id}}</code></td><td>{{.Pass}}</td><td>{{.Warn}}</td><td{{if .Fail}} class="fail"{{end}}>{{.Fail}}</td><td>{{.Unknown}}</td><td>{{.NotApplicable}}</td></tr>
{{end}}</table>{{end}}
</body></html>
`))
