package report

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/alerts"
)

// AddAlerts puts into d the active alerts that concern its rack (RackReportData.alerts):
// each alert names its node by its Hostname label, else its node label (the node
// name, which is the machine's hostname); an alert naming a machine of d's rack is
// that machine's, one naming a machine of another rack is left out, and one naming no
// machine gpuboot manages (none, or one decommissioned) is cluster-wide and in every
// rack's report. machines are every rack's.
func AddAlerts(d *bootv1.RackReportData, machines []*bootv1.Machine, active []alerts.Alert) {
	byNode := map[string]*bootv1.Machine{}
	for _, m := range machines {
		if m.GetState() == bootv1.MachineState_MACHINE_STATE_DECOMMISSIONED {
			continue
		}
		if h := m.GetFacts().GetHostname(); h != "" && byNode[h] == nil {
			byNode[h] = m
		}
	}
	for _, m := range machines { // a node name wins over a reported hostname
		if m.GetState() != bootv1.MachineState_MACHINE_STATE_DECOMMISSIONED && m.GetNodeName() != "" {
			byNode[m.GetNodeName()] = m
		}
	}
	for _, a := range active {
		ra := alertRow(a)
		m := byNode[ra.NodeName]
		switch {
		case ra.NodeName == "" || m == nil:
			ra.ClusterWide = true
		case m.GetRack() != d.GetRack():
			continue
		default:
			ra.MachineId = m.GetId()
		}
		d.Alerts = append(d.Alerts, ra)
	}
	sort.SliceStable(d.Alerts, func(i, j int) bool {
		a, b := d.Alerts[i], d.Alerts[j]
		if sa, sb := severityRank(a.GetSeverity()), severityRank(b.GetSeverity()); sa != sb {
			return sa < sb
		}
		if !a.GetSince().AsTime().Equal(b.GetSince().AsTime()) {
			return a.GetSince().AsTime().Before(b.GetSince().AsTime())
		}
		if a.GetName() != b.GetName() {
			return a.GetName() < b.GetName()
		}
		return a.GetFingerprint() < b.GetFingerprint()
	})
}

// alertRow is a's row, before it is placed on a machine.
func alertRow(a alerts.Alert) *bootv1.RackReportAlert {
	l := a.Labels
	r := &bootv1.RackReportAlert{
		Name: a.Name(), Severity: l["severity"], NodeName: first(l["Hostname"], l["node"]),
		Gpu: first(l["gpu"], l["gpu_index"]), GpuUuid: l["UUID"], Summary: a.Annotations["summary"],
		RunbookUrl: a.Annotations["runbook_url"], Fingerprint: a.Fingerprint, Labels: l,
	}
	if !a.StartsAt.IsZero() {
		r.Since = timestamppb.New(a.StartsAt)
	}
	return r
}

func first(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// severityRank orders severities: critical, warning, info, then any other.
func severityRank(s string) int {
	switch s {
	case "critical":
		return 0
	case "warning":
		return 1
	case "info":
		return 2
	}
	return 3
}

// AlertLine is one alert as the renderings and the rack view show it.
type AlertLine struct {
	Severity, Name, Where, GPU, Summary, Since, Runbook string
	// RunbookLink is Runbook when it is an http or https URL (the HTML renderings link
	// it), else "".
	RunbookLink string
}

// AlertLines is d's alerts for the renderings: where is the node (with its machine's
// slot when the rack report has it), or "cluster-wide".
func AlertLines(d *bootv1.RackReportData) []AlertLine {
	slots := map[string]string{}
	for _, m := range d.GetMachines() {
		slots[m.GetMachineId()] = m.GetSlot()
	}
	var out []AlertLine
	for _, a := range d.GetAlerts() {
		l := AlertLine{Severity: first(a.GetSeverity(), "–"), Name: a.GetName(), Summary: a.GetSummary(), Runbook: a.GetRunbookUrl()}
		switch {
		case a.GetClusterWide() && a.GetNodeName() != "":
			l.Where = a.GetNodeName() + " (cluster-wide: no machine of gpuboot's)"
		case a.GetClusterWide():
			l.Where = "cluster-wide"
		case slots[a.GetMachineId()] != "":
			l.Where = slots[a.GetMachineId()] + " " + a.GetNodeName()
		default:
			l.Where = a.GetNodeName()
		}
		l.GPU = a.GetGpu()
		if u := a.GetGpuUuid(); u != "" {
			l.GPU = strings.TrimSpace(l.GPU + " " + u)
		}
		if a.GetSince() != nil {
			l.Since = a.GetSince().AsTime().UTC().Format(time.RFC3339)
		}
		if u, err := url.Parse(l.Runbook); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
			l.RunbookLink = l.Runbook
		}
		out = append(out, l)
	}
	return out
}

// mdAlerts writes the active alerts' section, all text escaped (alert labels and
// annotations come from the metrics server's rules and targets).
func mdAlerts(b *strings.Builder, d *bootv1.RackReportData) {
	lines := AlertLines(d)
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "## Active alerts (%d)\n\n| severity | alert | node | GPU | summary | since | runbook |\n|---|---|---|---|---|---|---|\n", len(lines))
	for _, l := range lines {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", mdEscape(l.Severity), mdEscape(l.Name), mdEscape(l.Where),
			mdEscape(l.GPU), mdEscape(l.Summary), mdEscape(l.Since), mdEscape(l.Runbook))
	}
	b.WriteString("\n")
}
