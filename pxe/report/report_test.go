package report

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

func machines() []*bootv1.Machine {
	gpu := func(i int32) *int32 { return &i }
	gpus := []*machinev1.GPU{{Index: 0}, {Index: 1}, {Index: 2}, {Index: 3}}
	return []*bootv1.Machine{
		{Id: "m2", Rack: "r1", Slot: "U10", NodeName: "gpu-r1-u10", State: bootv1.MachineState_MACHINE_STATE_QUARANTINED,
			Identity: &machinev1.MachineIdentity{BootMac: "52:54:00:00:00:10", Serial: "SN|10"},
			Facts:    &machinev1.MachineFacts{Gpus: gpus},
			Checklist: &machinev1.Checklist{Results: []*machinev1.CheckResult{
				{Id: "gpu.pcie.link-width", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, GpuIndex: gpu(3)},
				{Id: "gpu.count", Status: machinev1.CheckStatus_CHECK_STATUS_PASS},
			}}},
		{Id: "m1", Rack: "r1", Slot: "U2", NodeName: "gpu-r1-u2", State: bootv1.MachineState_MACHINE_STATE_READY,
			Identity: &machinev1.MachineIdentity{BootMac: "52:54:00:00:00:02"}, Facts: &machinev1.MachineFacts{Gpus: gpus},
			Checklist: &machinev1.Checklist{Results: []*machinev1.CheckResult{{Id: "gpu.count", Status: machinev1.CheckStatus_CHECK_STATUS_PASS}}}},
		{Id: "m3", Rack: "r2", State: bootv1.MachineState_MACHINE_STATE_READY},
		{Id: "m4", Rack: "r1", State: bootv1.MachineState_MACHINE_STATE_DECOMMISSIONED},
		{Id: "m5", Rack: "r1", State: bootv1.MachineState_MACHINE_STATE_REGISTERED, Identity: &machinev1.MachineIdentity{BootMac: "52:54:00:00:00:05"}},
	}
}

func TestBuild(t *testing.T) {
	d := Build("r1", machines(), time.Unix(1764400000, 0))
	if len(d.Machines) != 3 {
		t.Fatalf("%d rows, want 3 (other rack and decommissioned excluded)", len(d.Machines))
	}
	if d.Machines[0].MachineId != "m1" || d.Machines[1].MachineId != "m2" || d.Machines[2].MachineId != "m5" {
		t.Fatalf("order %s %s %s, want m1 (U2) m2 (U10) m5 (no slot)", d.Machines[0].MachineId, d.Machines[1].MachineId, d.Machines[2].MachineId)
	}
	if d.GpuCount != 8 || d.HealthyGpuCount != 7 {
		t.Fatalf("gpus %d healthy %d, want 8 and 7", d.GpuCount, d.HealthyGpuCount)
	}
	if d.MachinesByState["ready"] != 1 || d.MachinesByState["quarantined"] != 1 {
		t.Fatalf("by state %v", d.MachinesByState)
	}
	if len(d.Checks) != 2 || d.Checks[0].Id != "gpu.count" || d.Checks[0].Pass != 2 || d.Checks[1].Fail != 1 {
		t.Fatalf("tallies %v", d.Checks)
	}
}

func TestRender(t *testing.T) {
	d := Build("r1", machines(), time.Unix(1764400000, 0))
	md, ct, name, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if err != nil || !strings.HasPrefix(ct, "text/markdown") || name != "rack-r1-report.md" {
		t.Fatal(ct, name, err)
	}
	for _, want := range []string{"# Rack r1", "gpu.pcie.link-width (GPU 3)", `SN\|10`, "| U2 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	js, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_JSON)
	if err != nil || !json.Valid(js) || !strings.Contains(string(js), `"healthyGpuCount": 7`) {
		t.Fatalf("json: %v\n%s", err, js)
	}
	h, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_HTML)
	if err != nil || !strings.Contains(string(h), `<td class="quarantined">`) {
		t.Fatalf("html: %v", err)
	}
	for _, banned := range []string{"<script src", "<link", "http://", "https://"} {
		if strings.Contains(string(h), banned) {
			t.Errorf("html report references external assets (%q)", banned)
		}
	}
	for in, want := range map[string]bootv1.ReportFormat{"md": 1, "json": 2, "html": 3} {
		if got, err := ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseFormat("pdf"); err == nil {
		t.Error("ParseFormat(pdf) succeeded")
	}
}

// TestSimulatedMachinesShown: a machine whose checklist is simulated is flagged as
// such in JSON, markdown and HTML, and a simulated machine gpuboot quarantined for it
// says why and how to allow it.
func TestSimulatedMachinesShown(t *testing.T) {
	ms := machines()
	ms[1].Checklist.Simulated = true // m1, ready
	ms = append(ms, &bootv1.Machine{Id: "m6", Rack: "r1", Slot: "U20", NodeName: "gpu-r1-u20", State: bootv1.MachineState_MACHINE_STATE_QUARANTINED,
		Checklist: &machinev1.Checklist{Simulated: true, Results: []*machinev1.CheckResult{{Id: "gpu.count", Status: machinev1.CheckStatus_CHECK_STATUS_PASS}}}})
	d := Build("r1", ms, time.Unix(1764400000, 0))
	sim := map[string]bool{}
	for _, m := range d.Machines {
		sim[m.MachineId] = m.Simulated
		if m.MachineId == "m6" && !strings.Contains(m.Reason, "simulated") || m.MachineId == "m6" && !strings.Contains(m.Reason, "enrollment.allowSimulated: true") {
			t.Errorf("m6 reason %q; want it to say simulated and how to allow it", m.Reason)
		}
	}
	if !sim["m1"] || !sim["m6"] || sim["m2"] || sim["m5"] {
		t.Fatalf("simulated flags %v; want m1 and m6 only", sim)
	}
	js, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_JSON)
	if err != nil || strings.Count(string(js), `"simulated": true`) < 4 { // two rows, two checklists
		t.Errorf("json: %v; want simulated on the two rows:\n%s", err, js)
	}
	md, _, _, _ := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if !strings.Contains(string(md), "| ready (simulated) |") || !strings.Contains(string(md), "| quarantined (simulated) |") || strings.Count(string(md), "(simulated)") != 2 {
		t.Errorf("markdown does not mark exactly the two simulated machines:\n%s", md)
	}
	h, _, _, _ := Render(d, bootv1.ReportFormat_REPORT_FORMAT_HTML)
	if !strings.Contains(string(h), `<td class="ready">ready <b class="simulated">(simulated)</b></td>`) || strings.Count(string(h), "simulated GPUs</b>") != 2 {
		t.Errorf("html does not mark the simulated machines:\n%s", h)
	}
	// The totals are split: simulated GPUs are never counted as hardware.
	if d.SimulatedGpuCount != 4 || d.SimulatedHealthyGpuCount != 4 || d.Totals.GetNodesReadySimulated() != 1 || d.Totals.GetGpusAllocatableSimulated() != 4 {
		t.Errorf("simulated totals: gpus %d healthy %d ready %d allocatable %d; want 4 4 1 4",
			d.SimulatedGpuCount, d.SimulatedHealthyGpuCount, d.Totals.GetNodesReadySimulated(), d.Totals.GetGpusAllocatableSimulated())
	}
	split := "Simulated, not hardware (GPU simulator): 4 of the 8 GPUs (4 of the 7 without a failing check), 1 of the 1 ready nodes, 4 of the 4 allocatable GPUs. Real GPUs: 4, 0 allocatable."
	if !strings.Contains(string(md), split) {
		t.Errorf("markdown lacks the split %q:\n%s", split, md)
	}
	if !strings.Contains(string(h), `<p class="simulated" id="simulated-split"><b>`+split) {
		t.Errorf("html lacks the split:\n%s", h)
	}
	if !strings.Contains(string(js), `"simulatedGpuCount": 4`) || !strings.Contains(string(js), `"gpusAllocatableSimulated": 4`) {
		t.Errorf("json lacks the simulated counts:\n%s", js)
	}
	real, _, _, _ := Render(Build("r1", machines(), time.Unix(1764400000, 0)), bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if strings.Contains(string(real), "Simulated, not hardware") {
		t.Errorf("a report with no simulated machine has the split line:\n%s", real)
	}
}

// TestTenantsInReport: the machines' GPU allocations sum per tenant (a GPU shared by
// time-slicing counts once per tenant; pods of no tenant last), in the data and in
// every rendering; machines of another rack do not count.
func TestTenantsInReport(t *testing.T) {
	ms := machines()
	holder := func(gpu, ns, pod, tenant string) *machinev1.GPUHolder {
		return &machinev1.GPUHolder{GpuUuid: gpu, Namespace: ns, Pod: pod, Container: "main", Tenant: tenant}
	}
	ms[1].GpuAllocation = &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{ // m1, r1
		holder("GPU-a", "vision", "train-0", "alpha"), holder("GPU-b", "vision", "train-0", "alpha"),
		holder("GPU-c", "vision-dev", "nb", "alpha"), holder("GPU-c", "speech", "infer", "beta"), // time-sliced GPU-c
		holder("GPU-d", "default", "stray", ""),
	}}
	ms[0].GpuAllocation = &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{holder("GPU-a", "speech", "infer-2", "beta")}} // m2, r1: quarantined, not counted
	ms[4].GpuAllocation = &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{holder("GPU-s", "x", "y", "stranger")}}        // m5, r1: registered, not counted
	ms[2].GpuAllocation = &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{holder("GPU-z", "vision", "x", "alpha")}}      // m3, r2
	d := Build("r1", ms, time.Unix(1764400000, 0))
	var got []string
	for _, tn := range d.Tenants {
		got = append(got, fmt.Sprintf("%s:%d gpus:%d pods:%v", tn.Tenant, tn.GpusAllocated, tn.Pods, tn.Namespaces))
	}
	want := []string{"alpha:3 gpus:2 pods:[vision vision-dev]", "beta:1 gpus:1 pods:[speech]", ":1 gpus:1 pods:[default]"}
	if !slices.Equal(got, want) {
		t.Fatalf("tenants\n got %q\nwant %q", got, want)
	}
	md, _, _, _ := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	js, _, _, _ := Render(d, bootv1.ReportFormat_REPORT_FORMAT_JSON)
	h, _, _, _ := Render(d, bootv1.ReportFormat_REPORT_FORMAT_HTML)
	for what, doc := range map[string]string{"markdown": string(md), "json": string(js), "html": string(h)} {
		for _, w := range map[string][]string{
			"markdown": {"## GPUs by tenant", "| alpha | 3 | 2 | vision, vision-dev | – |", "| (no tenant) | 1 | 1 | default | – |"},
			"json":     {`"tenants"`, `"gpusAllocated": 3`},
			"html":     {`<table id="tenants">`, "<td>alpha</td><td>3</td><td>2</td><td>vision, vision-dev</td>", "(no tenant)"},
		}[what] {
			if !strings.Contains(doc, w) {
				t.Errorf("%s lacks %q", what, w)
			}
		}
	}
	// Quotas (cluster-wide) join the tenants, and add one that holds no GPU here.
	AddQuotas(d, map[string]Quota{"alpha": {Hard: 8, Used: 5}, "gamma": {Hard: 4, Used: 0}})
	if len(d.Tenants) != 4 || d.Tenants[0].GetGpuQuota() != 8 || d.Tenants[0].GetGpuQuotaUsed() != 5 ||
		d.Tenants[1].GpuQuota != nil || d.Tenants[2].GetTenant() != "gamma" || d.Tenants[2].GetGpuQuota() != 4 || d.Tenants[3].GetTenant() != "" {
		t.Fatalf("tenants with quotas: %v", d.Tenants)
	}
	md, _, _, _ = Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	h, _, _, _ = Render(d, bootv1.ReportFormat_REPORT_FORMAT_HTML)
	for _, w := range []string{"| alpha | 3 | 2 | vision, vision-dev | 5 / 8 |", "| gamma | 0 | 0 | – | 0 / 4 |"} {
		if !strings.Contains(string(md), w) {
			t.Errorf("markdown lacks %q:\n%s", w, md)
		}
	}
	if !strings.Contains(string(h), "<td>5 / 8</td>") {
		t.Error("html lacks alpha's quota")
	}
	d.QuotaError = "list the tenants' ResourceQuotas: forbidden"
	md, _, _, _ = Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if !strings.Contains(string(md), "GPU quotas not shown: list the tenants' ResourceQuotas: forbidden") {
		t.Error("markdown does not say why quotas are missing")
	}

	// No allocation reported: no section.
	if md, _, _, _ := Render(Build("r1", machines(), time.Unix(1764400000, 0)), bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN); strings.Contains(string(md), "by tenant") {
		t.Error("a report without allocations shows a tenants section")
	}
}

// TestDataDiskProblems: a machine's refused and failed data disks, and only those, are
// its data_disk_problems; the Markdown and HTML reports list them one line per disk
// (path, serial, state, the agent's detail) with the agent's text escaped.
func TestDataDiskProblems(t *testing.T) {
	ms := machines()
	ms[1].DataDisks = &machinev1.DataDisks{Disks: []*machinev1.DataDisk{
		{Path: "/dev/nvme0n1", Serial: "S-N0", State: machinev1.DataDiskState_DATA_DISK_STATE_READY, MountPoint: "/var/lib/gpurack/data/nvme0n1"},
		{Path: "/dev/sda", Serial: "S-A", State: machinev1.DataDiskState_DATA_DISK_STATE_NOT_SELECTED},
		{Path: "/dev/sdb", Serial: "S-B", State: machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, Detail: `ext4 filesystem (label "<b>scratch</b>")`},
		{Path: "/dev/sdc", Serial: "S|C", State: machinev1.DataDiskState_DATA_DISK_STATE_FAILED, Detail: "mkfs.xfs: exit status 1"},
	}}
	d := Build("r1", ms, time.Unix(1764400000, 0))
	var paths []string
	for _, m := range d.Machines {
		for _, x := range m.DataDiskProblems {
			paths = append(paths, m.MachineId+" "+x.Path)
		}
	}
	if strings.Join(paths, ",") != "m1 /dev/sdb,m1 /dev/sdc" {
		t.Fatalf("data disk problems %v, want m1's /dev/sdb and /dev/sdc", paths)
	}
	md, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Data disks refused or failed",
		`- U2 gpu-r1-u2: /dev/sdb serial S-B, refused: ext4 filesystem (label "\<b\>scratch\</b\>")`,
		`- U2 gpu-r1-u2: /dev/sdc serial S\|C, failed: mkfs.xfs: exit status 1`,
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "/dev/sda") || strings.Contains(string(md), "/dev/nvme0n1") {
		t.Errorf("markdown lists a disk that is neither refused nor failed:\n%s", md)
	}
	h, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_HTML)
	if err != nil {
		t.Fatal(err)
	}
	want := `<li><b>U2</b> gpu-r1-u2: <code>/dev/sdb</code> serial <code>S-B</code>, refused: <span class="reason">ext4 filesystem (label &#34;&lt;b&gt;scratch&lt;/b&gt;&#34;)</span></li>`
	if !strings.Contains(string(h), want) || strings.Contains(string(h), "<b>scratch") {
		t.Errorf("HTML lacks %q or carries the agent's markup:\n%s", want, h)
	}
	if clean := Build("r1", machines(), time.Unix(1764400000, 0)); strings.Contains(string(markdown(clean)), "Data disks") {
		t.Error("a rack without disk problems gets a data-disk section")
	}
}
