package report

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/testreq"
)

const (
	xidReason     = "XID 79: the GPU has fallen off the bus"
	scriptPayload = `</title></svg><script>alert("rack")</script>`
)

// rack20 is a 20-slot rack of 8-GPU machines: U07 quarantined by a fatal XID on GPU 3,
// U12 ready with GPU 5 withdrawn by its latest heartbeat (7 allocatable), the rest
// ready, so 19 nodes are ready and 19×8−1 = 151 GPUs are allocatable. U15 carries a
// warning whose message is markup, as a hostile agent could send.
func rack20() []*bootv1.Machine {
	idx := func(i int32) *int32 { return &i }
	var ms []*bootv1.Machine
	for u := 1; u <= 20; u++ {
		gpus := make([]*machinev1.GPU, 8)
		for i := range gpus {
			gpus[i] = &machinev1.GPU{Index: int32(i)}
		}
		results := []*machinev1.CheckResult{
			{Id: string(checkid.Count), Status: machinev1.CheckStatus_CHECK_STATUS_PASS, Observed: "8", Expected: "8"},
			{Id: string(checkid.DriverLoaded), Status: machinev1.CheckStatus_CHECK_STATUS_PASS},
		}
		for i := int32(0); i < 8; i++ {
			results = append(results, &machinev1.CheckResult{Id: string(checkid.XIDFatal), Status: machinev1.CheckStatus_CHECK_STATUS_PASS, GpuIndex: idx(i)})
		}
		m := &bootv1.Machine{
			Id: fmt.Sprintf("m%02d", u), Rack: "r1", Slot: fmt.Sprintf("U%02d", u), NodeName: fmt.Sprintf("gpu-r1-u%02d", u),
			State:    bootv1.MachineState_MACHINE_STATE_READY,
			Identity: &machinev1.MachineIdentity{BootMac: fmt.Sprintf("3c:ec:ef:00:00:%02x", u), Serial: fmt.Sprintf("7CE1234X%02d", u)},
			Facts:    &machinev1.MachineFacts{Gpus: gpus},
			Health:   &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY, GpuHealthy: true, GpuCount: 8, HealthyGpuCount: 8},
		}
		switch u {
		case 7:
			m.State = bootv1.MachineState_MACHINE_STATE_QUARANTINED
			results[2+3] = &machinev1.CheckResult{Id: string(checkid.XIDFatal), Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, GpuIndex: idx(3),
				Observed: "XID 79", Expected: "none", Message: xidReason, Remedy: "Reseat or replace GPU 3."}
			m.Health = &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_UNHEALTHY, GpuCount: 8, HealthyGpuCount: 7, UnhealthyGpuIndexes: []int32{3}}
		case 12:
			// Withdrawn alone (decision 0630): degraded, GPUHealthy stays True.
			m.Health = &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_DEGRADED, GpuHealthy: true, GpuCount: 8, HealthyGpuCount: 7,
				UnhealthyGpuIndexes: []int32{5}, GpuHealthyReason: "GPUsWithdrawn", GpuHealthyMessage: "gpu.ecc.uncorrected failing on GPU 5"}
		case 15:
			results = append(results, &machinev1.CheckResult{Id: string(checkid.Temperature), Status: machinev1.CheckStatus_CHECK_STATUS_WARN, GpuIndex: idx(0), Message: scriptPayload})
		}
		m.Checklist = &machinev1.Checklist{Phase: machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, Results: results}
		ms = append(ms, m)
	}
	return ms
}

func TestBuildTotals(t *testing.T) {
	d := Build("r1", rack20(), time.Unix(1764400000, 0))
	tot := d.GetTotals()
	if tot.GetNodesReady() != 19 || tot.GetNodesQuarantined() != 1 || tot.GetGpusAllocatable() != 151 {
		t.Fatalf("totals ready %d quarantined %d allocatable %d, want 19, 1, 151", tot.GetNodesReady(), tot.GetNodesQuarantined(), tot.GetGpusAllocatable())
	}
	for _, m := range d.Machines {
		want := map[string]string{"U07": "failed gpu.xid.fatal on GPU 3: " + xidReason, "U12": "GPU 5 withdrawn: gpu.ecc.uncorrected failing on GPU 5"}[m.Slot]
		if m.Reason != want {
			t.Errorf("%s reason %q, want %q", m.Slot, m.Reason, want)
		}
	}
	js, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_JSON)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Totals   map[string]int `json:"totals"`
		GpuCount int            `json:"gpuCount"`
	}
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	if got.Totals["nodesReady"] != 19 || got.Totals["nodesQuarantined"] != 1 || got.Totals["gpusAllocatable"] != 151 || got.GpuCount != 160 {
		t.Fatalf("JSON totals %v gpuCount %d", got.Totals, got.GpuCount)
	}

	// The markdown (the demo's terminal checklist) names the withdrawn GPU and why.
	md, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if err != nil || !strings.Contains(string(md), "- ready U12 gpu-r1-u12, 7 GPUs allocatable: GPU 5 withdrawn: gpu.ecc.uncorrected failing on GPU 5") {
		t.Errorf("markdown lacks the withdrawn GPU line (%v):\n%s", err, md)
	}

	// A ready node whose GPUHealthy is False is tainted: none of its GPUs count.
	ms := rack20()
	ms[14].Health = &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_UNHEALTHY, GpuCount: 8, HealthyGpuCount: 7,
		UnhealthyGpuIndexes: []int32{2}, GpuHealthyReason: "NvlinkState"}
	if got := Build("r1", ms, time.Unix(1764400000, 0)).GetTotals().GetGpusAllocatable(); got != 151-8 {
		t.Errorf("with slot 15 tainted: %d GPUs allocatable, want %d", got, 151-8)
	}

	// A rack with nothing quarantined still says so: the totals have presence.
	empty, _, _, err := Render(Build("r9", nil, time.Unix(1764400000, 0)), bootv1.ReportFormat_REPORT_FORMAT_JSON)
	if err != nil || !strings.Contains(string(empty), `"nodesQuarantined": 0`) || !strings.Contains(string(empty), `"gpusAllocatable": 0`) {
		t.Fatalf("empty rack JSON lacks zero totals: %v\n%s", err, empty)
	}
}

func TestReasonByState(t *testing.T) {
	for st, want := range map[bootv1.MachineState]string{
		bootv1.MachineState_MACHINE_STATE_REGISTERED:  "waiting for approval",
		bootv1.MachineState_MACHINE_STATE_CONFLICT:    "two keys claim",
		bootv1.MachineState_MACHINE_STATE_QUARANTINED: "names no failing check",
		bootv1.MachineState_MACHINE_STATE_READY:       "",
	} {
		got := Reason(&bootv1.Machine{State: st})
		if want == "" && got != "" || !strings.Contains(got, want) {
			t.Errorf("Reason(%v) = %q, want it to contain %q", st, got, want)
		}
	}
}

func renderRack20(t *testing.T, ms []*bootv1.Machine) []byte {
	t.Helper()
	h, ct, name, err := Render(Build("r1", ms, time.Unix(1764400000, 0)), bootv1.ReportFormat_REPORT_FORMAT_HTML)
	if err != nil || ct != "text/html; charset=utf-8" || name != "rack-r1-report.html" {
		t.Fatalf("render: %v %q %q", err, ct, name)
	}
	return h
}

func TestHTMLReport(t *testing.T) {
	ms := rack20()
	ms[6].Checklist.Results = append(ms[6].Checklist.Results, &machinev1.CheckResult{Id: "gpu.nvlink.state", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, Message: scriptPayload})
	h := string(renderRack20(t, ms))

	if n := strings.Count(h, `<g class="slot"`); n != 20 {
		t.Errorf("%d diagram slots, want 20", n)
	}
	if n := strings.Count(h, "<section class=\"node\""); n != 20 {
		t.Errorf("%d node sections, want 20", n)
	}
	for _, want := range []string{
		`<td id="gpus-allocatable">151</td>`, `<td id="nodes-ready">19</td>`, `<td id="nodes-quarantined">1</td>`,
		`<g class="slot" data-slot="U07" data-state="quarantined"><title>U07 gpu-r1-u07: quarantined: failed gpu.nvlink.state: &lt;/title&gt;`,
		`<rect class="s-quarantined"`, `<span class="sw s-ready"></span>ready 19`, `<span class="sw s-quarantined"></span>quarantined 1`,
		xidReason, "GPU 5 withdrawn", `<td class="quarantined">quarantined</td>`,
	} {
		if !strings.Contains(h, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	// The machine-reported markup is text everywhere it appears: the slot's <title>,
	// the quarantined list, the node's reason and its check table.
	if strings.Contains(h, "<script") || strings.Contains(h, `alert("rack")`) {
		t.Errorf("HTML carries the agent's markup unescaped")
	}
	if n := strings.Count(h, "&lt;script&gt;alert(&#34;rack&#34;)"); n < 4 {
		t.Errorf("escaped payload appears %d times, want at least 4 (title, list, reason, table)", n)
	}
	for _, banned := range []string{"<script", "<link", "<img", "<iframe", "http://", "https://", "url("} {
		if strings.Contains(h, banned) {
			t.Errorf("HTML report is not self-contained (%q)", banned)
		}
	}

	// The CSP allows exactly the page's own stylesheet.
	style := regexp.MustCompile(`(?s)<style>(.*)</style>`).FindStringSubmatch(h)
	if style == nil {
		t.Fatal("no <style> element")
	}
	sum := sha256.Sum256([]byte(style[1]))
	hash := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	if !strings.Contains(h, `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src `+hash) ||
		!strings.Contains(HTMLContentSecurityPolicy, "style-src "+hash) || !strings.Contains(HTMLContentSecurityPolicy, "frame-ancestors 'none'") {
		t.Errorf("CSP does not pin the stylesheet %s:\n%s", hash, HTMLContentSecurityPolicy)
	}

	// Deterministic: the inventory's order does not matter.
	shuffled := rack20()
	shuffled[6].Checklist.Results = append(shuffled[6].Checklist.Results, &machinev1.CheckResult{Id: "gpu.nvlink.state", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, Message: scriptPayload})
	rng := rand.New(rand.NewSource(1))
	rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, m := range shuffled {
		rs := m.Checklist.Results
		rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	}
	if again := string(renderRack20(t, shuffled)); again != h {
		t.Error("rendering the same rack in another order gave different HTML")
	}
}

// artifactDir is where a test keeps files worth looking at afterwards:
// $GPURACK_TEST_ARTIFACTS/<test> when set, else the test's temporary directory.
func artifactDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("GPURACK_TEST_ARTIFACTS")
	if root == "" {
		return t.TempDir()
	}
	dir := filepath.Join(root, "pxe-report", t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestHTMLReportInChromium opens the 20-slot rack's report in headless Chromium and
// reads back what the browser built: the DOM (20 slots, the quarantined node's reason,
// 151 allocatable GPUs, no script element) and a screenshot whose pixels show the
// stylesheet's state colours, so the page's Content-Security-Policy let its own
// stylesheet through.
func TestHTMLReportInChromium(t *testing.T) {
	chromium := testreq.Tool(t, "chromium", "run make deps (hack/deps.sh installs Debian's chromium)")
	dir := artifactDir(t)
	page := filepath.Join(dir, "rack-r1-report.html")
	if err := os.WriteFile(page, renderRack20(t, rack20()), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "rack-r1-report.png")

	// Chromium is slow to start on a small shared host: a generous bound, not a target.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	run := func(args ...string) []byte {
		t.Helper()
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
			"--user-data-dir=" + filepath.Join(t.TempDir(), "profile"), "--window-size=1280,1600"}, args...)
		cmd := exec.CommandContext(ctx, chromium, append(args, "file://"+page)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.Bytes()
	}

	dom := string(run("--dump-dom"))
	if err := os.WriteFile(filepath.Join(dir, "dom.html"), []byte(dom), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(dom, `<g class="slot"`); n != 20 {
		t.Errorf("browser DOM has %d rack slots, want 20", n)
	}
	for _, want := range []string{`id="gpus-allocatable">151<`, `id="nodes-quarantined">1<`, `data-slot="U07" data-state="quarantined"`, xidReason} {
		if !strings.Contains(dom, want) {
			t.Errorf("browser DOM lacks %q", want)
		}
	}
	if strings.Contains(dom, "<script") || !strings.Contains(dom, "&lt;script&gt;") {
		t.Error("the agent's markup became a script element in the browser, or vanished")
	}

	run("--screenshot=" + shot)
	t.Logf("screenshot: %s", shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	// Count pixels of the ready and quarantined fills (#a8e0b4, #f2a0a0), with a little
	// slack for colour conversion. A slot is 864×24 px; unstyled SVG would be black.
	near := func(a uint32, b uint8) bool { d := int(a>>8) - int(b); return d >= -3 && d <= 3 }
	var ready, quarantined int
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			switch {
			case near(r, 0xa8) && near(g, 0xe0) && near(b, 0xb4):
				ready++
			case near(r, 0xf2) && near(g, 0xa0) && near(b, 0xa0):
				quarantined++
			}
		}
	}
	t.Logf("screenshot %dx%d: %d ready-green and %d quarantined-red pixels", bounds.Dx(), bounds.Dy(), ready, quarantined)
	if quarantined < 10000 || ready < 10*quarantined {
		t.Errorf("screenshot shows %d ready and %d quarantined pixels: want one quarantined slot (≥ 10000) and ≥ 10× as many ready; is the stylesheet blocked? see %s", ready, quarantined, shot)
	}
}
