// Package report builds a rack's commissioning report from inventory machines and
// renders it as Markdown, JSON (the protojson form of RackReportData) or a
// self-contained HTML page. It is pure: no I/O, no clock (the caller passes the time).
//
// It is not the rack view page (pxe/admin serves that, live, from the same data).
package report

import (
	"fmt"
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
	var ready, quarantined, allocatable, readySim, allocatableSim uint32
	tallies := map[string]*bootv1.CheckTally{}
	for _, m := range machines {
		if m.GetRack() != rack || m.GetState() == bootv1.MachineState_MACHINE_STATE_DECOMMISSIONED {
			continue
		}
		row := reportRow(m)
		d.Machines = append(d.Machines, row)
		d.MachinesByState[StateName(m.GetState())]++
		gpus := uint32(len(m.GetFacts().GetGpus()))
		healthy := tally(tallies, m.GetChecklist(), gpus)
		d.GpuCount += gpus
		d.HealthyGpuCount += healthy
		if row.Simulated {
			d.SimulatedGpuCount += gpus
			d.SimulatedHealthyGpuCount += healthy
		}
		row.Reason = Reason(m)
		switch m.GetState() {
		case bootv1.MachineState_MACHINE_STATE_READY:
			ready++
			row.AllocatableGpuCount = allocatableGPUs(m.GetHealth(), healthy)
		case bootv1.MachineState_MACHINE_STATE_QUARANTINED:
			quarantined++
		}
		allocatable += row.AllocatableGpuCount
		if row.Simulated {
			allocatableSim += row.AllocatableGpuCount
			if m.GetState() == bootv1.MachineState_MACHINE_STATE_READY {
				readySim++
			}
		}
	}
	d.Totals = &bootv1.RackReportTotals{NodesReady: &ready, NodesQuarantined: &quarantined, GpusAllocatable: &allocatable,
		NodesReadySimulated: &readySim, GpusAllocatableSimulated: &allocatableSim}
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
	d.Tenants = Tenants(d.Machines)
	return d
}

// reportRow is m's row, before its reason and GPU counts.
func reportRow(m *bootv1.Machine) *bootv1.RackReportMachine {
	row := &bootv1.RackReportMachine{
		MachineId: m.GetId(), NodeName: m.GetNodeName(), Slot: m.GetSlot(), Identity: m.GetIdentity(),
		State: m.GetState(), Checklist: m.GetChecklist(), Health: m.GetHealth(),
		ImageId: m.GetChecklist().GetImageId(), DriverVersion: m.GetChecklist().GetDriverVersion(),
		Simulated: m.GetChecklist().GetSimulated(), GpuAllocation: m.GetGpuAllocation(),
		DataDiskProblems: DiskProblems(m.GetDataDisks()),
	}
	if row.ImageId == "" {
		row.ImageId = m.GetImageId()
	}
	if row.DriverVersion == "" {
		row.DriverVersion = m.GetFacts().GetDriverVersion()
	}
	return row
}

// DiskProblems are the disks in d the agent refused or failed to prepare, in d's order
// (RackReportMachine.data_disk_problems).
func DiskProblems(d *machinev1.DataDisks) []*machinev1.DataDisk {
	var out []*machinev1.DataDisk
	for _, x := range d.GetDisks() {
		switch x.GetState() {
		case machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, machinev1.DataDiskState_DATA_DISK_STATE_FAILED:
			out = append(out, x)
		}
	}
	return out
}

// DiskStateName is the text form of a data disk's state ("refused", "not-selected").
func DiskStateName(s machinev1.DataDiskState) string {
	if s == machinev1.DataDiskState_DATA_DISK_STATE_UNSPECIFIED {
		return "unknown"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "DATA_DISK_STATE_")), "_", "-")
}

// diskProblemsIntro heads the renderings' list of refused and failed data disks.
const diskProblemsIntro = "Disks a storage.dataDisks rule selects that the agent refused (they hold something gpurack did not make; nothing was written) or failed to prepare. Only `gpuboot machines wipe-disk` makes a refused disk usable (docs/storage.md)."

// tally counts cl's results into tallies (by check id) and returns how many of the
// machine's gpus are healthy: none when a node-wide check fails, else those no
// failing check names.
func tally(tallies map[string]*bootv1.CheckTally, cl *machinev1.Checklist, gpus uint32) uint32 {
	failing := map[int32]bool{}
	nodeFail := false
	for _, r := range cl.GetResults() {
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
	if nodeFail || uint32(len(failing)) > gpus {
		return 0
	}
	return gpus - uint32(len(failing))
}

// allocatableGPUs is how many GPUs of a ready machine pods may get: its healthy ones,
// or what its agent last reported allocatable.
func allocatableGPUs(h *machinev1.HealthSummary, healthy uint32) uint32 {
	n := healthy
	if h.GetGpuCount() > 0 {
		n = min(h.GetHealthyGpuCount(), h.GetGpuCount())
	}
	// A node with GPUHealthy False carries gpurack.io/gpu-unhealthy: no pod that
	// does not tolerate it gets any of its GPUs. Withdrawn GPUs (GPUHealthy
	// stays True, decision 0630) cost only themselves.
	if h.GetState() == machinev1.HealthState_HEALTH_STATE_UNHEALTHY && !h.GetGpuHealthy() {
		n = 0
	}
	return n
}

// SimulatedLine says how much of a report's totals is simulated (CONTRACTS §11), or ""
// when nothing is: the markdown and HTML reports and the rack view print it beside the
// totals, so simulated GPUs are never read as hardware.
func SimulatedLine(d *bootv1.RackReportData) string {
	if d.GetSimulatedGpuCount() == 0 {
		return ""
	}
	t := d.GetTotals()
	return fmt.Sprintf("Simulated, not hardware (GPU simulator): %d of the %d GPUs (%d of the %d without a failing check), %d of the %d ready nodes, %d of the %d allocatable GPUs. Real GPUs: %d, %d allocatable.",
		d.GetSimulatedGpuCount(), d.GetGpuCount(), d.GetSimulatedHealthyGpuCount(), d.GetHealthyGpuCount(),
		t.GetNodesReadySimulated(), t.GetNodesReady(), t.GetGpusAllocatableSimulated(), t.GetGpusAllocatable(),
		d.GetGpuCount()-d.GetSimulatedGpuCount(), t.GetGpusAllocatable()-t.GetGpusAllocatableSimulated())
}

// Quota is a tenant's GPU quota across the cluster: hard limit and used.
type Quota struct{ Hard, Used int64 }

// AddQuotas puts each tenant's GPU quota into d's tenants, adding the tenants that
// hold no GPU on the rack.
func AddQuotas(d *bootv1.RackReportData, quotas map[string]Quota) {
	have := map[string]*bootv1.RackReportTenant{}
	for _, t := range d.Tenants {
		have[t.GetTenant()] = t
	}
	for name, q := range quotas {
		t := have[name]
		if t == nil {
			t = &bootv1.RackReportTenant{Tenant: name}
			d.Tenants = append(d.Tenants, t)
		}
		t.GpuQuota, t.GpuQuotaUsed = &q.Hard, &q.Used
	}
	sortTenants(d.Tenants)
}

// allocationStates are the states whose machines' GPU allocations count: bound
// machines that joined or are joining. gpuboot stores no other machine's, and the
// report does not count one it finds (a record from before that rule, or a machine
// since quarantined, rejected or decommissioned).
var allocationStates = map[bootv1.MachineState]bool{
	bootv1.MachineState_MACHINE_STATE_JOINING:       true,
	bootv1.MachineState_MACHINE_STATE_COMMISSIONING: true,
	bootv1.MachineState_MACHINE_STATE_READY:         true,
}

// Tenants sums the machines' GPU allocations per tenant: distinct GPUs (a GPU shared
// by time-slicing counts once per tenant holding it), pods and namespaces, over the
// machines in allocationStates only. Tenants come sorted by name, pods of no tenant
// ("") last.
func Tenants(machines []*bootv1.RackReportMachine) []*bootv1.RackReportTenant {
	type acc struct {
		gpus, pods, namespaces map[string]bool
	}
	by := map[string]*acc{}
	for _, m := range machines {
		if !allocationStates[m.GetState()] {
			continue
		}
		for _, h := range m.GetGpuAllocation().GetHolders() {
			a := by[h.GetTenant()]
			if a == nil {
				a = &acc{gpus: map[string]bool{}, pods: map[string]bool{}, namespaces: map[string]bool{}}
				by[h.GetTenant()] = a
			}
			a.gpus[m.GetMachineId()+"/"+h.GetGpuUuid()] = true
			a.pods[h.GetNamespace()+"/"+h.GetPod()] = true
			a.namespaces[h.GetNamespace()] = true
		}
	}
	var out []*bootv1.RackReportTenant
	for name, a := range by {
		t := &bootv1.RackReportTenant{Tenant: name, GpusAllocated: uint32(len(a.gpus)), Pods: uint32(len(a.pods))}
		for ns := range a.namespaces {
			t.Namespaces = append(t.Namespaces, ns)
		}
		sort.Strings(t.Namespaces)
		out = append(out, t)
	}
	sortTenants(out)
	return out
}

// sortTenants orders tenants by name, the namespaces of no tenant ("") last.
func sortTenants(ts []*bootv1.RackReportTenant) {
	sort.Slice(ts, func(i, j int) bool {
		a, b := ts[i].GetTenant(), ts[j].GetTenant()
		if (a == "") != (b == "") {
			return b == ""
		}
		return a < b
	})
}

// Reason says in one line why m is in its state, or "" for a ready machine with every
// GPU healthy (RackReportMachine.reason). Agent-reported text is kept as is.
func Reason(m *bootv1.Machine) string {
	switch m.GetState() {
	case bootv1.MachineState_MACHINE_STATE_QUARANTINED:
		var fails []string
		for _, r := range sortedResults(m.GetChecklist()) {
			if r.GetStatus() == machinev1.CheckStatus_CHECK_STATUS_FAIL {
				fails = append(fails, checkName(r)+": "+CheckDetail(r))
			}
		}
		if len(fails) == 0 && m.GetChecklist().GetSimulated() {
			return "simulated: its agent runs the simulator GPU backend, not real GPUs (enrollment.allowSimulated: true in gpuboot's config lets it be ready)"
		}
		if len(fails) == 0 {
			return "commissioning failed; its latest checklist names no failing check"
		}
		return "failed " + strings.Join(fails, "; ")
	case bootv1.MachineState_MACHINE_STATE_READY:
		h := m.GetHealth()
		if len(h.GetUnhealthyGpuIndexes()) == 0 && h.GetState() != machinev1.HealthState_HEALTH_STATE_UNHEALTHY {
			return ""
		}
		var gpus []string
		for _, i := range h.GetUnhealthyGpuIndexes() {
			gpus = append(gpus, fmt.Sprint(i))
		}
		what := "unhealthy"
		if len(gpus) > 0 {
			what = "GPU " + strings.Join(gpus, ", ") + " withdrawn"
		}
		if msg := h.GetGpuHealthyMessage(); msg != "" {
			if strings.HasPrefix(msg, what) { // the agent's message already says so
				return msg
			}
			return what + ": " + msg
		}
		if ids := h.GetFailingCheckIds(); len(ids) > 0 {
			return what + ": failing " + strings.Join(ids, ", ")
		}
		return what
	}
	return waiting[m.GetState()]
}

// waiting says what a machine that is neither ready nor quarantined waits for.
var waiting = map[bootv1.MachineState]string{
	bootv1.MachineState_MACHINE_STATE_DISCOVERED:    "waiting for its agent to register",
	bootv1.MachineState_MACHINE_STATE_REGISTERED:    "waiting for approval (gpuboot machines approve)",
	bootv1.MachineState_MACHINE_STATE_APPROVED:      "approved; waiting for its agent to fetch the JoinBundle",
	bootv1.MachineState_MACHINE_STATE_JOINING:       "waiting for its Node to register",
	bootv1.MachineState_MACHINE_STATE_COMMISSIONING: "waiting for the commissioning report",
	bootv1.MachineState_MACHINE_STATE_REJECTED:      "rejected by an operator (gpuboot machines history)",
	bootv1.MachineState_MACHINE_STATE_CONFLICT:      "two keys claim this identity (gpuboot machines resolve-conflict)",
}

// CheckDetail is a result's explanation: its message, else what was observed against
// what was expected, else its status.
func CheckDetail(r *machinev1.CheckResult) string {
	switch {
	case r.GetMessage() != "":
		return r.GetMessage()
	case r.GetObserved() != "" && r.GetExpected() != "":
		return r.GetObserved() + " (expected " + r.GetExpected() + ")"
	case r.GetObserved() != "":
		return r.GetObserved()
	}
	return StatusName(r.GetStatus())
}

// checkName is "id" or "id on GPU n".
func checkName(r *machinev1.CheckResult) string {
	if r.GpuIndex != nil && r.GetGpuIndex() >= 0 {
		return fmt.Sprintf("%s on GPU %d", r.GetId(), r.GetGpuIndex())
	}
	return r.GetId()
}

// sortedResults returns cl's results ordered by check id, node-level before GPU-level,
// then by GPU index, so renderings do not depend on the agent's order.
func sortedResults(cl *machinev1.Checklist) []*machinev1.CheckResult {
	rs := append([]*machinev1.CheckResult(nil), cl.GetResults()...)
	gpu := func(r *machinev1.CheckResult) int64 {
		if r.GpuIndex == nil || r.GetGpuIndex() < 0 {
			return -1
		}
		return int64(r.GetGpuIndex())
	}
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].GetId() != rs[j].GetId() {
			return rs[i].GetId() < rs[j].GetId()
		}
		return gpu(rs[i]) < gpu(rs[j])
	})
	return rs
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
		b, err := renderHTML(d)
		return b, "text/html; charset=utf-8", base + ".html", err
	}
	return nil, "", "", fmt.Errorf("unknown report format %v", f)
}

// row is one machine as the renderings show it.
type row struct {
	Slot, Node, ID, MAC, Serial, State, Overall, Failing, Warning, Health, Image, Driver string
	// Simulated: the machine's GPUs are the simulator's; shown after the state.
	Simulated bool
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
			Serial: m.GetIdentity().GetSerial(), State: StateName(m.GetState()), Image: shortImage(m.GetImageId()), Driver: m.GetDriverVersion(),
			Simulated: m.GetSimulated()}
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

// nodeOrID names a row: its node name, else its machine id.
func nodeOrID(m *bootv1.RackReportMachine) string {
	if m.GetNodeName() != "" {
		return m.GetNodeName()
	}
	return m.GetMachineId()
}

// mdEscape makes s, which may come from an agent or a manifest, plain text in a
// GitHub-flavoured Markdown table cell or list item: "" becomes "–"; control characters
// (line breaks end a table row) become spaces; each character that starts markup, a
// link or an HTML tag or entity is backslash-escaped (CommonMark §2.4), and so is the ':'
// of "://" and the '.' of "www." (GFM's extended autolinks); an '@' is followed by
// a zero-width space, since GFM links an e-mail address even through escapes. The
// rendered text reads as s (TestMarkdownEscapesUntrustedText renders it with cmark-gfm).
func mdEscape(s string) string {
	if s == "" {
		return "–"
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r < 0x20 || r == 0x7f:
			b.WriteByte(' ')
		case strings.ContainsRune("\\`*_~[]<>|&!", r), r == ':' && strings.HasPrefix(s[i+1:], "//"):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '.' && i >= 3 && strings.EqualFold(s[i-3:i], "www"):
			b.WriteString(`\.`)
		case r == '@':
			b.WriteString("@\u200b")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func markdown(d *bootv1.RackReportData) []byte {
	p := view(d)
	var b strings.Builder
	fmt.Fprintf(&b, "# Rack %s commissioning report\n\nGenerated %s. %d machines (%s). GPUs: %d, %d without a failing check.\n\n",
		mdEscape(p.Rack), p.Generated, len(p.Rows), strings.Join(p.States, ", "), p.GPUs, p.Healthy)
	t := d.GetTotals()
	fmt.Fprintf(&b, "Nodes ready: %d. Nodes quarantined: %d. GPUs allocatable: %d.\n\n", t.GetNodesReady(), t.GetNodesQuarantined(), t.GetGpusAllocatable())
	if line := SimulatedLine(d); line != "" {
		b.WriteString(line + "\n\n")
	}
	for _, m := range d.GetMachines() {
		if m.GetState() == bootv1.MachineState_MACHINE_STATE_QUARANTINED {
			fmt.Fprintf(&b, "- quarantined %s %s: %s\n", mdEscape(m.GetSlot()), mdEscape(nodeOrID(m)), mdEscape(m.GetReason()))
		}
	}
	if t.GetNodesQuarantined() > 0 {
		b.WriteString("\n")
	}
	attention := false
	for _, m := range d.GetMachines() {
		if m.GetState() == bootv1.MachineState_MACHINE_STATE_READY && m.GetReason() != "" {
			fmt.Fprintf(&b, "- ready %s %s, %d GPUs allocatable: %s\n", mdEscape(m.GetSlot()), mdEscape(nodeOrID(m)), m.GetAllocatableGpuCount(), mdEscape(m.GetReason()))
			attention = true
		}
	}
	if attention {
		b.WriteString("\n")
	}
	mdAlerts(&b, d)
	mdDiskProblems(&b, d)
	b.WriteString("| slot | node | machine | MAC | serial | state | checks | failing | warning | health | image | driver |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range p.Rows {
		state := r.State
		if r.Simulated {
			state += " (simulated)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			mdEscape(r.Slot), mdEscape(r.Node), mdEscape(r.ID), mdEscape(r.MAC), mdEscape(r.Serial), state,
			mdEscape(r.Overall), mdEscape(r.Failing), mdEscape(r.Warning), mdEscape(r.Health), mdEscape(r.Image), mdEscape(r.Driver))
	}
	if ts := tenantRows(d); len(ts) > 0 {
		b.WriteString("\n## GPUs by tenant\n\n| tenant | GPUs allocated here | pods | namespaces | GPU quota used / hard (cluster) |\n|---|---|---|---|---|\n")
		for _, t := range ts {
			fmt.Fprintf(&b, "| %s | %d | %d | %s | %s |\n", mdEscape(t.Tenant), t.GPUs, t.Pods, mdEscape(t.Namespaces), mdEscape(t.Quota))
		}
	}
	if e := d.GetQuotaError(); e != "" {
		fmt.Fprintf(&b, "\nTenants' GPU quotas not shown: %s\n", mdEscape(e))
	}
	if len(p.Checks) > 0 {
		b.WriteString("\n## Checks\n\n| check | pass | warn | fail | unknown | n/a |\n|---|---|---|---|---|---|\n")
		for _, c := range p.Checks {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d |\n", mdEscape(c.GetId()), c.GetPass(), c.GetWarn(), c.GetFail(), c.GetUnknown(), c.GetNotApplicable())
		}
	}
	return []byte(b.String())
}

// mdDiskProblems writes the refused and failed data disks, one line per disk: where,
// path, serial, state and the agent's detail, all escaped (agent text).
func mdDiskProblems(b *strings.Builder, d *bootv1.RackReportData) {
	heading := false
	for _, m := range d.GetMachines() {
		for _, x := range m.GetDataDiskProblems() {
			if !heading {
				fmt.Fprintf(b, "## Data disks refused or failed\n\n%s\n\n", mdEscape(diskProblemsIntro))
				heading = true
			}
			fmt.Fprintf(b, "- %s %s: %s serial %s, %s: %s\n", mdEscape(m.GetSlot()), mdEscape(nodeOrID(m)), mdEscape(x.GetPath()),
				mdEscape(x.GetSerial()), DiskStateName(x.GetState()), mdEscape(x.GetDetail()))
		}
	}
	if heading {
		b.WriteString("\n")
	}
}

// Style is the inline stylesheet of the HTML report and the rack view (no external
// assets).
const Style = `body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.ready,.pass{background:#dff5df}.quarantined,.fail,.conflict,.rejected{background:#f9d6d6}
.warn,.commissioning,.joining,.approved{background:#fdf3cf}.discovered,.registered{background:#e4ecf9}
.decommissioned,.no-report{color:#888}code{font-size:12px}.sev-critical{background:#f9d6d6}.sev-warning{background:#fdf3cf}`
