// Package graphs tests gpuboot's graphs page end to end: real simulated gpuagents
// scraped by the real Prometheus, gpuboot's operator handler drawing from it, and the
// page rendered by headless Chromium.
package graphs

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/testreq"
)

// charts are the charts each page draws (pxe/graphs.Charts).
var (
	nodeCharts   = []string{"utilization", "memory", "temperature", "power"}
	tenantCharts = []string{"utilization", "memory", "temperature", "power", "held"}
)

// TestGraphsPageInChromium runs two simulated 8-GPU nodes' gpuagents (the GPU
// simulator, simulated="true" on every series), a stand-in kubelet per node that has
// given three GPUs to tenant vision's namespace, and the real Prometheus scraping them
// every second with the shipped tenant recording rules; gpuboot's operator handler
// serves /graphs from it. Headless Chromium opens the node page and the tenant page:
// every chart must have a line of at least two points, the simulated GPUs must be
// marked, and the screenshots must show drawn lines.
func TestGraphsPageInChromium(t *testing.T) {
	chromium := testreq.Tool(t, "chromium", "run make deps (hack/deps.sh installs Debian's chromium)")
	prometheus := pinned(t, "prometheus")
	out := artifactDir(t)
	dir := t.TempDir()
	agent := buildAgent(t)

	nodes := []*simNode{startNode(t, agent, dir, "gpu-0001"), startNode(t, agent, dir, "gpu-0002")}
	a, b := nodes[0].uuids(t), nodes[1].uuids(t)
	nodes[0].kubelet.allocate("vision-train", "trainer-0", a["0"], a["1"])
	nodes[1].kubelet.allocate("vision-train", "trainer-1", b["3"])
	nodes[1].kubelet.allocate("audio", "other", b["4"]) // not vision's: never in its graphs
	tenantsAddr := tenantsTarget(t, []tenants.Usage{{Tenant: "vision", Namespaces: []string{"vision-train", "vision-eval"}}, {Tenant: "audio", Namespaces: []string{"audio"}}})
	prom := startPrometheus(t, prometheus, dir, nodes, tenantsAddr)

	// Twenty samples of each (twenty seconds of lines: at a 5-minute range a line of
	// eight seconds spans about 16 px, too short to tell from a legend's swatch in the
	// screenshot once it slopes): both nodes' GPUs, what vision holds on the second
	// node, the namespace join and the recording rule.
	for _, q := range []string{
		`gpurack_gpu_power_usage_watts{node="gpu-0001",gpu="0",simulated="true"}`,
		`gpurack_gpu_power_usage_watts{node="gpu-0002",gpu="7",simulated="true"}`,
		`gpurack_gpu_allocated{namespace="vision-train",node="gpu-0002"}`,
		`gpurack_tenant_namespace{tenant="vision",namespace="vision-train"}`,
		`gpurack:tenant_gpus_allocated:count{tenant="vision"}`,
	} {
		eventually(t, 60*time.Second, "Prometheus has 20 samples of "+q, func() error {
			n, err := samples(prom, "count_over_time("+q+"[1m])")
			if err == nil && n < 20 {
				err = fmt.Errorf("%d samples", n)
			}
			return err
		})
	}

	g := startGpuboot(t, prom, "gpu-0001", "gpu-0002")
	checkAuth(t, g)
	front := g.tokenProxy(t)
	for _, page := range []struct {
		name, query string
		charts      []string
		lines       int // lines of the per-GPU charts
	}{
		{"node-gpu-0001", "node=gpu-0001&range=5m", nodeCharts, 8},
		{"tenant-vision", "tenant=vision&range=5m", tenantCharts, 3},
	} {
		dom := render(t, chromium, out, page.name, front+"/graphs?"+page.query)
		checkDOM(t, page.name, dom, page.charts, page.lines)
	}
}

// checkAuth: the page and its data answer only an operator: none is 401, a viewer's
// certificate or token is let in.
func checkAuth(t *testing.T, g *gpuboot) {
	t.Helper()
	for _, path := range []string{"/graphs?node=gpu-0001", "/api/v1/graphs?node=gpu-0001"} {
		for _, tc := range []struct {
			who   string
			certs []tls.Certificate
			token string
			code  int
		}{{"no credential", nil, "", 401}, {"a viewer certificate", []tls.Certificate{g.viewer}, "", 200}, {"a viewer token", nil, g.token, 200}} {
			c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(g.ca), Certificates: tc.certs}}}
			req, _ := http.NewRequest("GET", g.url+path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Errorf("GET %s with %s: HTTP %d; want %d", path, tc.who, resp.StatusCode, tc.code)
			}
		}
	}
}

// render opens url in headless Chromium twice: the DOM after the page's script ran
// (kept as NAME.html) and a screenshot (NAME.png), which must decode, not be one
// colour, and show pixels of the first line's colour.
func render(t *testing.T, chromium, out, name, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	run := func(args ...string) []byte {
		t.Helper()
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
			"--user-data-dir=" + filepath.Join(t.TempDir(), "profile"), "--virtual-time-budget=10000", "--window-size=1400,1900"}, args...)
		cmd := exec.CommandContext(ctx, chromium, append(args, url)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.Bytes()
	}
	dom := string(run("--dump-dom"))
	if err := os.WriteFile(filepath.Join(out, name+".html"), []byte(dom), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(out, name+".png")
	run("--screenshot=" + shot)
	t.Logf("%s: screenshot %s, DOM %s", name, shot, filepath.Join(out, name+".html"))
	checkScreenshot(t, shot)
	return dom
}

// lineColours are the page's line colours (pxe/graphs/page.js COLOURS).
var lineColours = [][3]uint8{{0x1f, 0x77, 0xb4}, {0xff, 0x7f, 0x0e}, {0x2c, 0xa0, 0x2c}, {0xd6, 0x27, 0x28}, {0x94, 0x67, 0xbd},
	{0x8c, 0x56, 0x4b}, {0xe3, 0x77, 0xc2}, {0x7f, 0x7f, 0x7f}, {0xbc, 0xbd, 0x22}, {0x17, 0xbe, 0xcf}}

// checkScreenshot: the PNG decodes, is not one colour, and shows a drawn line: a
// horizontal run of at least minRun pixels of one line colour, longer than a legend's
// swatch (12 px).
func checkScreenshot(t *testing.T, shot string) {
	t.Helper()
	const minRun = 16
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	colours := map[uint32]bool{}
	runs, longest := 0, 0
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		run, last := 0, -1
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[(r>>8)<<16|(g>>8)<<8|b>>8] = true
			c := lineColour(r, g, b)
			if c >= 0 && c == last {
				run++
			} else {
				run = 1
			}
			last = c
			if c >= 0 && run == minRun {
				runs++
			}
			longest = max(longest, run)
		}
	}
	t.Logf("screenshot %dx%d: %d colours, %d line runs of ≥ %d px (longest %d)", bounds.Dx(), bounds.Dy(), len(colours), runs, minRun, longest)
	if len(colours) < 10 || runs == 0 {
		t.Errorf("screenshot %s: %d colours, no run of %d px of a line colour; want a page with drawn lines", shot, len(colours), minRun)
	}
}

// lineColour is the index of the line colour r, g, b (16-bit) is, or -1.
func lineColour(r, g, b uint32) int {
	near := func(a uint32, b uint8) bool { d := int(a>>8) - int(b); return d >= -4 && d <= 4 }
	for i, c := range lineColours {
		if near(r, c[0]) && near(g, c[1]) && near(b, c[2]) {
			return i
		}
	}
	return -1
}

var (
	sectionRE = regexp.MustCompile(`<section class="chart" id="chart-([a-z]+)">`)
	pointsRE  = regexp.MustCompile(`<path [^>]*data-points="(\d+)"`)
)

// checkDOM reads the charts Chromium built: each of want must be there with at least
// one line of two or more points, the per-GPU charts with lines lines, and the
// simulated GPUs marked in the legend.
func checkDOM(t *testing.T, page, dom string, want []string, lines int) {
	t.Helper()
	if strings.Contains(dom, `class="error"`) {
		t.Errorf("%s: the page shows an error: %s", page, regexp.MustCompile(`(?s)<p id="status" class="error">.*?</p>`).FindString(dom))
	}
	locs := sectionRE.FindAllStringSubmatchIndex(dom, -1)
	var got []string
	for i, loc := range locs {
		id := dom[loc[2]:loc[3]]
		got = append(got, id)
		end := len(dom)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		section := dom[loc[0]:end]
		var drawn, long int
		for _, m := range pointsRE.FindAllStringSubmatch(section, -1) {
			drawn++
			if n, _ := strconv.Atoi(m[1]); n >= 2 {
				long++
			}
		}
		if long == 0 {
			t.Errorf("%s: chart %s has no line of at least 2 points (%d lines)", page, id, drawn)
		}
		if id != "held" && drawn != lines {
			t.Errorf("%s: chart %s draws %d lines; want %d", page, id, drawn, lines)
		}
		if id != "held" && !strings.Contains(section, `<span class="sim"> · simulated</span>`) {
			t.Errorf("%s: chart %s's legend does not mark the simulated GPUs", page, id)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s: charts %v; want %v", page, got, want)
	}
}
