package report

import (
	"strings"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/alerts"
)

func firingAlert(fp, name string, since time.Time, kv ...string) alerts.Alert {
	a := alerts.Alert{Status: alerts.StatusFiring, Fingerprint: fp, StartsAt: since, Labels: map[string]string{"alertname": name}}
	for i := 0; i+1 < len(kv); i += 2 {
		a.Labels[kv[i]] = kv[i+1]
	}
	return a
}

// TestAddAlerts: an alert goes to the rack of the machine its Hostname (else node)
// label names, by node name or the hostname its agent reported; one naming a machine
// of another rack is left out; one naming no machine gpuboot manages is cluster-wide.
// Critical comes first, then by start.
func TestAddAlerts(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ms := []*bootv1.Machine{
		{Id: "m1", Rack: "r1", Slot: "U01", NodeName: "gpu-0001", State: bootv1.MachineState_MACHINE_STATE_READY},
		{Id: "m2", Rack: "r1", Slot: "U02", State: bootv1.MachineState_MACHINE_STATE_REGISTERED, Facts: &machinev1.MachineFacts{Hostname: "localhost-2"}},
		{Id: "m3", Rack: "r2", NodeName: "gpu-0003", State: bootv1.MachineState_MACHINE_STATE_READY},
		{Id: "m4", Rack: "r1", NodeName: "gpu-old", State: bootv1.MachineState_MACHINE_STATE_DECOMMISSIONED},
	}
	xid := firingAlert("f1", "GpurackXIDFatal", now.Add(-time.Hour), "Hostname", "gpu-0001", "severity", "critical", "gpu_index", "3")
	xid.Annotations = map[string]string{"summary": "Fatal XID on gpu-0001 GPU 3", "runbook_url": "https://docs.example/ops#xid"}
	active := []alerts.Alert{
		firingAlert("f0", "GpurackKubeletDown", now.Add(-2*time.Hour), "node", "gpu-0001", "severity", "warning"),
		xid,
		firingAlert("f2", "GpurackECCUncorrected", now, "Hostname", "localhost-2", "severity", "warning", "gpu", "1", "UUID", "GPU-1"),
		firingAlert("f3", "GpurackXIDFatal", now, "Hostname", "gpu-0003", "severity", "critical"),
		firingAlert("f4", "GpurackAPIServerErrors", now, "severity", "critical"),
		firingAlert("f5", "GpurackNodeNotReady", now, "Hostname", "gpu-old", "severity", "critical"),
	}
	d := Build("r1", ms, now)
	AddAlerts(d, ms, active)
	var got []string
	for _, a := range d.GetAlerts() {
		got = append(got, a.GetFingerprint()+":"+a.GetMachineId())
	}
	want := "f1:m1 f4: f5: f0:m1 f2:m2"
	if strings.Join(got, " ") != want {
		t.Fatalf("rack r1's alerts %q, want %q", strings.Join(got, " "), want)
	}
	first := d.GetAlerts()[0]
	if first.GetName() != "GpurackXIDFatal" || first.GetSeverity() != "critical" || first.GetNodeName() != "gpu-0001" || first.GetGpu() != "3" ||
		first.GetSummary() == "" || first.GetRunbookUrl() == "" || !first.GetSince().AsTime().Equal(now.Add(-time.Hour)) || first.GetClusterWide() {
		t.Errorf("first alert %v", first)
	}
	if a := d.GetAlerts()[1]; !a.GetClusterWide() || a.GetNodeName() != "" {
		t.Errorf("an alert naming no node: %v, want cluster-wide", a)
	}
	if a := d.GetAlerts()[2]; !a.GetClusterWide() || a.GetNodeName() != "gpu-old" {
		t.Errorf("an alert naming a decommissioned machine's node: %v, want cluster-wide", a)
	}
	if a := d.GetAlerts()[4]; a.GetGpu() != "1" || a.GetGpuUuid() != "GPU-1" {
		t.Errorf("GPU labels: %v", a)
	}
	d2 := Build("r2", ms, now)
	AddAlerts(d2, ms, active)
	if len(d2.GetAlerts()) != 3 || d2.GetAlerts()[2].GetMachineId() != "m3" {
		t.Errorf("rack r2's alerts %v, want m3's and the two cluster-wide", d2.GetAlerts())
	}
}

// TestAlertsRendered: the Markdown and HTML reports list the alerts with name,
// severity, node and GPU, summary, since and runbook; hostile label text is escaped,
// and a runbook_url that is not http(s) is not made a link.
func TestAlertsRendered(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ms := []*bootv1.Machine{{Id: "m1", Rack: "r1", Slot: "U01", NodeName: "gpu-0001", State: bootv1.MachineState_MACHINE_STATE_READY}}
	xid := firingAlert("f1", "GpurackXIDFatal", now, "Hostname", "gpu-0001", "severity", "critical", "gpu", "3", "UUID", "GPU-abc")
	xid.Annotations = map[string]string{"summary": "Fatal XID " + scriptPayload, "runbook_url": "https://docs.example/operations.md#xid"}
	evil := firingAlert("f2", "Evil", now, "severity", "warning")
	evil.Annotations = map[string]string{"runbook_url": "javascript:alert(1)"}
	d := Build("r1", ms, now)
	AddAlerts(d, ms, []alerts.Alert{xid, evil})
	md, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Active alerts (2)", "| critical | GpurackXIDFatal | U01 gpu-0001 | 3 GPU-abc | Fatal XID \\</title\\>", "2026-12-04T12:00:00Z", "https\\://docs.example/operations.md#xid", "| warning | Evil | cluster-wide |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	html, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_HTML)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<table id="alerts">`, `<a href="https://docs.example/operations.md#xid">runbook</a>`, "<td>U01 gpu-0001</td>", "<td>3 GPU-abc</td>"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if strings.Contains(string(html), "<script>") || strings.Contains(string(html), `href="javascript:`) {
		t.Errorf("HTML carries the alert's markup or a javascript: link")
	}
}
