package graphs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

// fakeSource answers every query with series (or err) and records the queries.
type fakeSource struct {
	series  []Series
	err     error
	queries []string
}

func (f *fakeSource) QueryRange(_ context.Context, q string, start, end time.Time, step time.Duration) ([]Series, bool, error) {
	f.queries = append(f.queries, q)
	return f.series, false, f.err
}
func (f *fakeSource) String() string { return "http://prom.test:9090" }

func gpuSeriesAt(node, gpu, sim string, n int) Series {
	s := Series{Labels: map[string]string{"node": node, "gpu": gpu, "UUID": "GPU-" + node + gpu, "simulated": sim}}
	for i := range n {
		s.Points = append(s.Points, [2]float64{float64(1000 + i), float64(10 * i)})
	}
	return s
}

func newTestGraphs(t *testing.T, src Source) *Graphs {
	t.Helper()
	g, err := New(Config{Source: src, KnownNode: func(_ context.Context, n string) (bool, error) {
		if n == "broken" {
			return false, errors.New("inventory closed")
		}
		return n == "gpu-0001", nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func get(h http.HandlerFunc, target string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h(rec, httptest.NewRequest("GET", target, nil))
	return rec
}

// message is a response's text: the "error" of a JSON answer, else the body.
func message(rec *httptest.ResponseRecorder) string {
	var e errorAnswer
	if json.Unmarshal(rec.Body.Bytes(), &e) == nil && e.Error != "" {
		return e.Error
	}
	return rec.Body.String()
}

func TestPageAndDataRefuseBadRequests(t *testing.T) {
	src := &fakeSource{}
	g := newTestGraphs(t, src)
	for _, tc := range []struct {
		query string
		code  int
		want  string
	}{
		{"node=gpu-0002", 400, `unknown node "gpu-0002"`},
		{"node=GPU", 400, "is not a node name"},
		{"node=gpu-0001&range=1y", 400, `range "1y"`},
		{"tenant=audio", 400, `unknown tenant "audio"`}, // the fake knows no tenant
		{"node=broken", 500, "inventory closed"},
	} {
		for _, h := range []http.HandlerFunc{g.Page, g.Data} {
			rec := get(h, "/graphs?"+tc.query)
			if rec.Code != tc.code || !strings.Contains(message(rec), tc.want) {
				t.Errorf("%s: %d %q; want %d containing %q", tc.query, rec.Code, rec.Body, tc.code, tc.want)
			}
		}
	}
	for _, q := range src.queries {
		if !strings.Contains(q, `gpurack_tenant_namespace{tenant="audio"}`) {
			t.Errorf("a refused request reached the metrics server with %q", q)
		}
	}
}

func TestNotConfigured(t *testing.T) {
	g, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := get(g.Page, "/graphs?node=gpu-0001")
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "The metrics server is not configured: set metrics.prometheusURL") || strings.Contains(rec.Body.String(), `data-api="`) {
		t.Errorf("page without a metrics server: %d\n%s", rec.Code, rec.Body)
	}
	if rec := get(g.Data, DataPath+"?node=gpu-0001"); rec.Code != 503 || !strings.Contains(rec.Body.String(), "not configured") {
		t.Errorf("data without a metrics server: %d %s", rec.Code, rec.Body)
	}
	if _, err := New(Config{PrometheusURL: "ftp://x"}); err == nil {
		t.Error("New took an ftp:// metrics server")
	}
}

// The page carries its script and stylesheet inline, allowed by hash and by nothing
// else, and fetches its data from the same origin with its own parameters.
func TestPageIsSelfContained(t *testing.T) {
	g := newTestGraphs(t, &fakeSource{series: []Series{{Labels: map[string]string{}, Points: [][2]float64{{1, 1}}}}})
	rec := get(g.Page, "/graphs?tenant=vision&range=15m")
	body := rec.Body.String()
	if rec.Code != 200 {
		t.Fatalf("page: %d %s", rec.Code, body)
	}
	csp := rec.Header().Get("Content-Security-Policy")
	script := regexp.MustCompile(`(?s)<script>(.*)</script>`).FindStringSubmatch(body)
	style := regexp.MustCompile(`(?s)<style>(.*)</style>`).FindStringSubmatch(body)
	if script == nil || style == nil || !strings.Contains(csp, "script-src '"+hash(script[1])+"'") || !strings.Contains(csp, "style-src '"+hash(style[1])+"'") {
		t.Fatalf("the page's inline script or style is not the one its policy %q allows", csp)
	}
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("policy %q", csp)
	}
	// The SVG namespace and the metrics server's name (text) are the only URLs in it.
	rest := strings.NewReplacer("http://www.w3.org/2000/svg", "", "from the metrics server http://prom.test:9090", "").Replace(body)
	for _, bad := range []string{"http://", "https://", "src=", "@import", "url(", "<link", "<img", "<iframe"} {
		if strings.Contains(rest, bad) {
			t.Errorf("page refers to something outside itself: %q", bad)
		}
	}
	if !strings.Contains(body, `data-api="/api/v1/graphs?range=15m&amp;tenant=vision"`) || !strings.Contains(body, `<a href="/graphs?range=1h&amp;tenant=vision">1h</a>`) {
		t.Errorf("page lacks its data URL or range links:\n%s", body)
	}
}

func TestDataAnswer(t *testing.T) {
	src := &fakeSource{series: []Series{gpuSeriesAt("gpu-0001", "1", "true", 3), gpuSeriesAt("gpu-0001", "0", "true", 5)}}
	g := newTestGraphs(t, src)
	g.now = func() time.Time { return time.Unix(1_000_000, 0) }
	rec := get(g.Data, DataPath+"?node=gpu-0001&range=5m")
	var a Answer
	if err := json.Unmarshal(rec.Body.Bytes(), &a); rec.Code != 200 || err != nil {
		t.Fatalf("data: %d %v %s", rec.Code, err, rec.Body)
	}
	if a.Kind != "node" || a.End != 1_000_000 || a.Start != 1_000_000-300 || a.Step != 1 || len(a.Charts) != 4 {
		t.Fatalf("answer %+v", a)
	}
	util, mem := a.Charts[0], a.Charts[1]
	if util.ID != "utilization" || util.Max != 100 || len(util.Lines) != 2 || util.Lines[0].Label != "GPU 0" || !util.Lines[0].Simulated || len(util.Lines[0].Points) != 5 {
		t.Errorf("utilisation chart %+v", util)
	}
	if mem.ID != "memory" || mem.Max != 40 { // the fake's max answers its highest point
		t.Errorf("memory chart max %v", mem.Max)
	}
	want := []string{
		`gpurack_gpu_utilization_percent{node="gpu-0001"}`,
		`gpurack_gpu_memory_used_mib{node="gpu-0001"}`,
		`max(gpurack_gpu_memory_total_mib{node="gpu-0001"})`,
		`gpurack_gpu_temperature_celsius{node="gpu-0001"}`,
		`gpurack_gpu_power_usage_watts{node="gpu-0001"}`,
	}
	if fmt.Sprint(src.queries) != fmt.Sprint(want) {
		t.Errorf("queries\n%q\nwant\n%q", src.queries, want)
	}

	src.err = errors.New("metrics server http://prom.test:9090 unreachable: connection refused")
	rec = get(g.Data, DataPath+"?node=gpu-0001")
	if rec.Code != 502 || !strings.HasPrefix(message(rec), "metrics server http://prom.test:9090 unreachable") {
		t.Errorf("unreachable metrics server: %d %s", rec.Code, rec.Body)
	}
	// A tenant the metrics server cannot check is not refused: its data says why.
	if rec := get(g.Page, "/graphs?tenant=vision"); rec.Code != 200 {
		t.Errorf("tenant page while the metrics server is down: %d", rec.Code)
	}
}

func TestTenantQueries(t *testing.T) {
	cs := Charts(Request{KindTenant, "vision", Ranges[2]})
	if len(cs) != 5 || cs[4].ID != "held" || cs[4].Query != `sum by (Hostname) (gpurack:tenant_gpus_allocated:count{tenant="vision"})` {
		t.Fatalf("tenant charts %+v", cs)
	}
	want := `gpurack_gpu_power_usage_watts * on (Hostname, UUID) group_left () max by (Hostname, UUID) (gpurack_gpu_allocated * on (namespace) group_left (tenant) max by (tenant, namespace) (gpurack_tenant_namespace{tenant="vision"}))`
	if cs[3].Query != want {
		t.Errorf("power query\n%s\nwant\n%s", cs[3].Query, want)
	}
	if got := label("a\"b\\c\n"); got != `"a\"b\\c\n"` {
		t.Errorf("label escaping: %s", got)
	}
	if got := TenantKnown("vision", time.Hour); got != `count(last_over_time(gpurack_tenant_namespace{tenant="vision"}[3600s]))` {
		t.Errorf("TenantKnown: %s", got)
	}
}
