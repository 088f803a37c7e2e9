package report

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"html/template"
	"strings"
	"time"
	"unicode/utf8"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// The HTML report is one file that needs nothing else: the stylesheet is inline, the
// rack diagram is inline SVG, and there is no script. Every string from the inventory or
// an agent goes through html/template, so a check message cannot inject markup.

// diagramStates are the lifecycle states the diagram colours and the legend lists, in
// lifecycle order (decommissioned machines are not in a report).
var diagramStates = []bootv1.MachineState{
	bootv1.MachineState_MACHINE_STATE_DISCOVERED,
	bootv1.MachineState_MACHINE_STATE_REGISTERED,
	bootv1.MachineState_MACHINE_STATE_APPROVED,
	bootv1.MachineState_MACHINE_STATE_JOINING,
	bootv1.MachineState_MACHINE_STATE_COMMISSIONING,
	bootv1.MachineState_MACHINE_STATE_READY,
	bootv1.MachineState_MACHINE_STATE_QUARANTINED,
	bootv1.MachineState_MACHINE_STATE_REJECTED,
	bootv1.MachineState_MACHINE_STATE_CONFLICT,
}

// reportStyle adds the diagram's colours to Style: class s-STATE fills an SVG slot and
// backs a legend swatch. Waiting states are blues and yellows, ready green, the states
// an operator must act on red, orange and violet.
const reportStyle = Style + `
.s-discovered{fill:#dbe6f7;background:#dbe6f7}.s-registered{fill:#b9cff2;background:#b9cff2}
.s-approved{fill:#fff1b8;background:#fff1b8}.s-joining{fill:#ffe08a;background:#ffe08a}
.s-commissioning{fill:#ffd05c;background:#ffd05c}.s-ready{fill:#a8e0b4;background:#a8e0b4}
.s-quarantined{fill:#f2a0a0;background:#f2a0a0}.s-rejected{fill:#d5c4e8;background:#d5c4e8}
.s-conflict{fill:#f5b97a;background:#f5b97a}.s-unspecified{fill:#dddddd;background:#dddddd}
svg.rack{display:block;margin:1em 0}svg.rack rect.frame{fill:#444}svg.rack text{font:12px system-ui,sans-serif;fill:#222}
svg.rack text.slot{font-weight:bold}.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:1em}
.sw{display:inline-block;width:1em;height:1em;border:1px solid #888;vertical-align:middle;margin-right:.3em}
.totals td{font-size:16px}.reason{color:#822}section.node{margin-top:1.5em}`

// HTMLContentSecurityPolicy is the policy to serve the HTML report with: nothing may
// load, and the only stylesheet allowed is the report's own inline one (by hash). The
// page carries the same policy (less frame-ancestors, which a meta element cannot set)
// so it holds when the file is opened from disk.
var HTMLContentSecurityPolicy = htmlCSP + "; frame-ancestors 'none'"

var htmlCSP = func() string {
	sum := sha256.Sum256([]byte(reportStyle))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; img-src 'none'; base-uri 'none'; form-action 'none'"
}()

// Diagram geometry, in SVG user units (px).
const (
	slotHeight = 24
	slotGap    = 4
	rackPad    = 8
	rackWidth  = 880
	reasonMax  = 90 // runes of the reason drawn in a slot; the full text is in <title> and below
)

type htmlPage struct {
	Rack, Generated                           string
	NodesReady, NodesQuarantined, Allocatable uint32
	Machines, GPUs                            int
	Simulated                                 string
	Legend                                    []legendEntry
	Height, InnerWidth, TextRight             int
	Slots                                     []svgSlot
	Quarantined, Waiting                      []reasonLine
	Alerts                                    []AlertLine
	DiskIntro                                 string
	Disks                                     []diskLine
	Rows                                      []row
	Nodes                                     []nodeSection
	Checks                                    []*bootv1.CheckTally
	Tenants                                   []tenantRow
	QuotaError                                string
}

// tenantRow is one tenant's share of the rack's GPUs as the renderings show it.
type tenantRow struct {
	Tenant, Namespaces, Quota string
	GPUs, Pods                uint32
}

// tenantRows is d's tenants for the renderings; pods of no tenant show as "(no tenant)".
func tenantRows(d *bootv1.RackReportData) []tenantRow {
	var out []tenantRow
	for _, t := range d.GetTenants() {
		name := t.GetTenant()
		if name == "" {
			name = "(no tenant)"
		}
		quota := ""
		if t.GpuQuota != nil {
			quota = fmt.Sprintf("%d / %d", t.GetGpuQuotaUsed(), t.GetGpuQuota())
		}
		out = append(out, tenantRow{Tenant: name, Namespaces: strings.Join(t.GetNamespaces(), ", "), Quota: quota, GPUs: t.GetGpusAllocated(), Pods: t.GetPods()})
	}
	return out
}

type legendEntry struct {
	State string
	Count uint32
}

type svgSlot struct {
	Y, TextY                               int
	Slot, Node, State, Reason, Short, GPUs string
}

type reasonLine struct{ Slot, Node, State, Reason string }

// diskLine is one refused or failed data disk.
type diskLine struct{ Slot, Node, Path, Serial, State, Detail string }

type nodeSection struct {
	Anchor, Slot, Node, ID, State, Reason, Phase, Overall string
	Checks                                                []checkRow
	HasChecklist, Simulated                               bool
}

type checkRow struct{ ID, GPU, Status, Observed, Expected, Detail, Remedy string }

func renderHTML(d *bootv1.RackReportData) ([]byte, error) {
	var buf bytes.Buffer
	if err := htmlTemplate.Execute(&buf, htmlView(d)); err != nil {
		return nil, fmt.Errorf("render rack %s report as HTML: %w", d.GetRack(), err)
	}
	return buf.Bytes(), nil
}

func htmlView(d *bootv1.RackReportData) htmlPage {
	t := d.GetTotals()
	p := htmlPage{
		Rack: d.GetRack(), Generated: d.GetGeneratedAt().AsTime().UTC().Format(time.RFC3339),
		NodesReady: t.GetNodesReady(), NodesQuarantined: t.GetNodesQuarantined(), Allocatable: t.GetGpusAllocatable(),
		Machines: len(d.GetMachines()), GPUs: int(d.GetGpuCount()), Simulated: SimulatedLine(d),
		Rows: view(d).Rows, Alerts: AlertLines(d), Checks: d.GetChecks(), Tenants: tenantRows(d), QuotaError: d.GetQuotaError(), InnerWidth: rackWidth - 2*rackPad, TextRight: rackWidth - 2*rackPad - 8,
	}
	for _, st := range diagramStates {
		p.Legend = append(p.Legend, legendEntry{State: StateName(st), Count: d.GetMachinesByState()[StateName(st)]})
	}
	y := rackPad
	for _, m := range d.GetMachines() {
		s := svgSlot{Y: y, TextY: y + slotHeight/2 + 4, Slot: dashIfEmpty(m.GetSlot()), Node: nodeOrID(m),
			State: StateName(m.GetState()), Reason: m.GetReason(), Short: truncate(m.GetReason(), reasonMax)}
		if m.GetState() == bootv1.MachineState_MACHINE_STATE_READY {
			s.GPUs = fmt.Sprintf("%d GPUs", m.GetAllocatableGpuCount())
		}
		p.Slots = append(p.Slots, s)
		y += slotHeight + slotGap
		if m.GetReason() != "" {
			line := reasonLine{Slot: s.Slot, Node: s.Node, State: s.State, Reason: m.GetReason()}
			if m.GetState() == bootv1.MachineState_MACHINE_STATE_QUARANTINED {
				p.Quarantined = append(p.Quarantined, line)
			} else {
				p.Waiting = append(p.Waiting, line)
			}
		}
		p.Nodes = append(p.Nodes, nodeView(m))
		for _, x := range m.GetDataDiskProblems() {
			p.Disks = append(p.Disks, diskLine{Slot: s.Slot, Node: s.Node, Path: x.GetPath(), Serial: dashIfEmpty(x.GetSerial()),
				State: DiskStateName(x.GetState()), Detail: x.GetDetail()})
		}
	}
	if len(p.Disks) > 0 {
		p.DiskIntro = diskProblemsIntro
	}
	p.Height = y - slotGap + rackPad
	if len(p.Slots) == 0 {
		p.Height = slotHeight + 2*rackPad
	}
	return p
}

func nodeView(m *bootv1.RackReportMachine) nodeSection {
	n := nodeSection{Anchor: "machine-" + m.GetMachineId(), Slot: dashIfEmpty(m.GetSlot()), Node: nodeOrID(m), ID: m.GetMachineId(),
		State: StateName(m.GetState()), Reason: m.GetReason(), Simulated: m.GetSimulated()}
	cl := m.GetChecklist()
	if cl == nil {
		return n
	}
	n.HasChecklist = true
	n.Overall = StatusName(overall(cl))
	n.Phase = phaseName(cl.GetPhase())
	for _, r := range sortedResults(cl) {
		c := checkRow{ID: r.GetId(), GPU: "node", Status: StatusName(r.GetStatus()), Observed: r.GetObserved(),
			Expected: r.GetExpected(), Detail: r.GetMessage(), Remedy: r.GetRemedy()}
		if r.GpuIndex != nil && r.GetGpuIndex() >= 0 {
			c.GPU = fmt.Sprint(r.GetGpuIndex())
		}
		n.Checks = append(n.Checks, c)
	}
	return n
}

func phaseName(p machinev1.CheckPhase) string {
	if p == machinev1.CheckPhase_CHECK_PHASE_UNSPECIFIED {
		return "continuous"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(p.String(), "CHECK_PHASE_")), "_", "-")
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// truncate shortens s to at most n runes, ending in "…" when it cut.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

var htmlTemplate = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="` + htmlCSP + `">
<title>Rack {{.Rack}} commissioning report</title>
<style>` + reportStyle + `</style></head><body>
<h1>Rack {{.Rack}} commissioning checklist</h1>
<p>Generated {{.Generated}}. {{.Machines}} machines, {{.GPUs}} GPUs.</p>
<table class="totals"><tr><th>nodes ready</th><th>nodes quarantined</th><th>GPUs allocatable</th></tr>
<tr><td id="nodes-ready">{{.NodesReady}}</td><td id="nodes-quarantined">{{.NodesQuarantined}}</td><td id="gpus-allocatable">{{.Allocatable}}</td></tr></table>
{{if .Simulated}}<p class="simulated" id="simulated-split"><b>{{.Simulated}}</b></p>
{{end}}{{if .Quarantined}}<h2>Quarantined</h2>
<ul id="quarantined">{{range .Quarantined}}
<li><b>{{.Slot}}</b> {{.Node}}: <span class="reason">{{.Reason}}</span></li>{{end}}
</ul>{{end}}
{{if .Waiting}}<h2>Other machines needing attention</h2>
<ul id="attention">{{range .Waiting}}
<li><b>{{.Slot}}</b> {{.Node}} ({{.State}}): {{.Reason}}</li>{{end}}
</ul>{{end}}
{{if .Alerts}}<h2>Active alerts ({{len .Alerts}})</h2>
<table id="alerts"><tr><th>severity</th><th>alert</th><th>node</th><th>GPU</th><th>summary</th><th>since</th><th>runbook</th></tr>
{{range .Alerts}}<tr><td class="sev-{{.Severity}}">{{.Severity}}</td><td><code>{{.Name}}</code></td><td>{{.Where}}</td><td>{{.GPU}}</td><td>{{.Summary}}</td><td>{{.Since}}</td><td>{{if .RunbookLink}}<a href="{{.RunbookLink}}">runbook</a>{{else}}{{.Runbook}}{{end}}</td></tr>
{{end}}</table>{{end}}
{{if .Disks}}<h2>Data disks refused or failed</h2>
<p>{{.DiskIntro}}</p>
<ul id="data-disks">{{range .Disks}}
<li><b>{{.Slot}}</b> {{.Node}}: <code>{{.Path}}</code> serial <code>{{.Serial}}</code>, {{.State}}: <span class="reason">{{.Detail}}</span></li>{{end}}
</ul>{{end}}
<h2>Rack</h2>
<ul class="legend">{{range .Legend}}<li><span class="sw s-{{.State}}"></span>{{.State}} {{.Count}}</li>{{end}}</ul>
<svg class="rack" width="` + fmt.Sprint(rackWidth) + `" height="{{.Height}}" viewBox="0 0 ` + fmt.Sprint(rackWidth) + ` {{.Height}}" role="img" aria-label="rack {{.Rack}}: one slot per machine, coloured by state">
<rect class="frame" x="0" y="0" width="` + fmt.Sprint(rackWidth) + `" height="{{.Height}}" rx="4"/>
{{$w := .InnerWidth}}{{$r := .TextRight}}{{range .Slots}}<g class="slot" data-slot="{{.Slot}}" data-state="{{.State}}"><title>{{.Slot}} {{.Node}}: {{.State}}{{if .Reason}}: {{.Reason}}{{end}}</title>
<rect class="s-{{.State}}" x="` + fmt.Sprint(rackPad) + `" y="{{.Y}}" width="{{$w}}" height="` + fmt.Sprint(slotHeight) + `" rx="2"/>
<text class="slot" x="16" y="{{.TextY}}">{{.Slot}}</text><text x="70" y="{{.TextY}}">{{.Node}}</text><text x="220" y="{{.TextY}}">{{.State}}</text><text x="320" y="{{.TextY}}">{{.Short}}</text><text x="{{$r}}" y="{{.TextY}}" text-anchor="end">{{.GPUs}}</text></g>
{{end}}</svg>
<h2>Machines</h2>
<table><tr><th>slot</th><th>node</th><th>machine</th><th>MAC</th><th>serial</th><th>state</th><th>checks</th><th>failing</th><th>warning</th><th>health</th><th>image</th><th>driver</th></tr>
{{range .Rows}}<tr><td>{{.Slot}}</td><td>{{.Node}}</td><td><code>{{.ID}}</code></td><td><code>{{.MAC}}</code></td><td>{{.Serial}}</td><td class="{{.State}}">{{.State}}{{if .Simulated}} <b class="simulated">(simulated)</b>{{end}}</td><td class="{{.Overall}}">{{.Overall}}</td><td>{{.Failing}}</td><td>{{.Warning}}</td><td>{{.Health}}</td><td><code>{{.Image}}</code></td><td>{{.Driver}}</td></tr>
{{end}}</table>
{{if .Tenants}}<h2>GPUs by tenant</h2><table id="tenants"><tr><th>tenant</th><th>GPUs allocated here</th><th>pods</th><th>namespaces</th><th>GPU quota used / hard (cluster)</th></tr>
{{range .Tenants}}<tr><td>{{.Tenant}}</td><td>{{.GPUs}}</td><td>{{.Pods}}</td><td>{{.Namespaces}}</td><td>{{.Quota}}</td></tr>
{{end}}</table>{{end}}{{if .QuotaError}}<p class="reason">Tenants' GPU quotas not shown: {{.QuotaError}}</p>{{end}}
{{if .Checks}}<h2>Checks across the rack</h2><table><tr><th>check</th><th>pass</th><th>warn</th><th>fail</th><th>unknown</th><th>n/a</th></tr>
{{range .Checks}}<tr><td><code>{{.Id}}</code></td><td>{{.Pass}}</td><td>{{.Warn}}</td><td{{if .Fail}} class="fail"{{end}}>{{.Fail}}</td><td>{{.Unknown}}</td><td>{{.NotApplicable}}</td></tr>
{{end}}</table>{{end}}
<h2>Checklist per node</h2>
{{range .Nodes}}<section class="node" id="{{.Anchor}}"><h3>{{.Slot}} · {{.Node}} · <span class="{{.State}}">{{.State}}</span>{{if .Simulated}} · <b class="simulated">simulated GPUs</b>{{end}}</h3>
{{if .Reason}}<p class="reason">{{.Reason}}</p>{{end}}
{{if .HasChecklist}}<p>{{.Phase}} checklist, overall <span class="{{.Overall}}">{{.Overall}}</span>.</p>
<table><tr><th>check</th><th>GPU</th><th>status</th><th>observed</th><th>expected</th><th>detail</th><th>remedy</th></tr>
{{range .Checks}}<tr><td><code>{{.ID}}</code></td><td>{{.GPU}}</td><td class="{{.Status}}">{{.Status}}</td><td>{{.Observed}}</td><td>{{.Expected}}</td><td>{{.Detail}}</td><td>{{.Remedy}}</td></tr>
{{end}}</table>{{else}}<p>No checklist reported yet.</p>{{end}}</section>
{{end}}</body></html>
`))
