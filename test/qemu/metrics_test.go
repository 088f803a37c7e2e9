package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/netnstest"
)

// The rack's metrics server: `controlplane-bootstrap init` starts Prometheus and
// Alertmanager (monitoring.enabled) in the rack's namespace, on its loopback, scraping
// every 15 s (half the default, for the alerts' waits); Alertmanager sends every alert
// to alertHook, a webhook in the namespace. Every 5 s was too often for the emulated
// nodes: a scrape of kubelet's or cAdvisor's metrics took the 5 s limit there, so the
// scrapes alone kept the guests' CPUs busy and failed.
const (
	rackPrometheus = "127.0.0.1:9090"
	rackScrape     = 15 * time.Second
)

// alertHook is an Alertmanager webhook receiver listening in the rack's namespace.
type alertHook struct {
	url string
	mu  sync.Mutex
	got []hookAlert
}

// hookAlert is one alert of a notification, with when it arrived.
type hookAlert struct {
	At          time.Time
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func startAlertHook(t *testing.T, ns string) *alertHook {
	t.Helper()
	var l net.Listener
	if err := netnstest.InNamespace(ns, func() (err error) {
		l, err = net.Listen("tcp", joinHost+":0")
		return err
	}); err != nil {
		t.Fatalf("the alert webhook: listen in the rack's namespace: %v", err)
	}
	h := &alertHook{url: "http://" + l.Addr().String() + "/alerts"}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n struct {
			Alerts []hookAlert `json:"alerts"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&n); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		h.mu.Lock()
		for _, a := range n.Alerts {
			a.At = now
			h.got = append(h.got, a)
		}
		h.mu.Unlock()
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return h
}

// first returns the first alert that arrived with name and status whose labels include
// want.
func (h *alertHook) first(name, status string, want map[string]string) (hookAlert, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.got {
		if a.Labels["alertname"] != name || a.Status != status {
			continue
		}
		ok := true
		for k, v := range want {
			ok = ok && a.Labels[k] == v
		}
		if ok {
			return a, true
		}
	}
	return hookAlert{}, false
}

// summary lists the alerts that arrived: name, status and labels.
func (h *alertHook) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, a := range h.got {
		out = append(out, fmt.Sprintf("%s %s %v", a.Labels["alertname"], a.Status, a.Labels))
	}
	return fmt.Sprintf("%d alerts %v", len(out), out)
}

// monitoringConfig is the cluster.yaml section that turns the metrics server on in the
// rack, its Alertmanager routing every alert to hook.
func monitoringConfig(t *testing.T, hook *alertHook) string {
	t.Helper()
	am := filepath.Join(t.TempDir(), "alertmanager.yml")
	routing := `route:
  receiver: hook
  group_by: [alertname, node]
  group_wait: 1s
  group_interval: 5s
receivers:
  - name: hook
    webhook_configs:
      - url: ` + hook.url + `
        send_resolved: true
`
	if err := os.WriteFile(am, []byte(routing), 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`monitoring:
  enabled: true
  prometheus: {scrapeInterval: %s, evaluationInterval: %s}
  alertmanager: {configFile: %s}
  gpuboot: ["%s"]
  # The control plane starts before gpuboot exists, so there is no metrics-reader
  # certificate to name yet: the rig's gpuboot serves /metrics on its HTTP port too
  # (metrics.plainHTTP), scraped with no credential. gpuboot's credentialed /metrics is
  # pxe/server's TestMetricsReaderOnGpuboot's.
  gpubootTLS: {plainHTTP: true}
`, rackScrape, rackScrape, am, joinHTTP)
}

// promClient is an HTTP client whose connections are made inside ns.
func promClient(ns string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: nsDial(ns)}}
}

// promQuery runs an instant query against the rack's Prometheus with client, and
// returns each series' value by job/node, and each series' labels.
func promQuery(ctx context.Context, client *http.Client, q string) (map[string]string, []map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rackPrometheus+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&r); err != nil {
		return nil, nil, fmt.Errorf("%s: HTTP %d: %w", q, resp.StatusCode, err)
	}
	values := map[string]string{}
	var labels []map[string]string
	for _, s := range r.Data.Result {
		values[s.Metric["job"]+"/"+s.Metric["node"]] = fmt.Sprint(s.Value[1])
		labels = append(labels, s.Metric)
	}
	return values, labels, nil
}

// checkRackMetrics checks what the rack's metrics server sees once both nodes have
// run their checks: every node's gpuagent, node_exporter, kubelet and cAdvisor scraped
// through the Node objects, each only with the monitoring certificate (kubelet's
// through RBAC's nodes/metrics; gpuagent's and node_exporter's TLS gates, decision
// 0693), the control plane's and gpuboot's jobs up; and the XID 79 that
// simGPUNodeChecks injected on B's GPU 3 at xidAt at the webhook as GpurackXIDFatal,
// with the node, the GPU and the runbook link.
func checkRackMetrics(t *testing.T, r *Rack, hook *alertHook, nodes []string, xidNode string, xidAt time.Time) {
	var want []string
	for _, job := range []string{"gpuagent", "node", "kubelet", "cadvisor"} {
		for _, n := range nodes {
			want = append(want, job+"/"+n)
		}
	}
	for _, job := range []string{"apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "prometheus", "alertmanager", "kube-state-metrics", "gpuboot", "registry", "kueue"} {
		want = append(want, job+"/")
	}
	prom := promClient(r.ns)
	defer prom.CloseIdleConnections()
	var up map[string]string
	waitFor(t, r.ctx, 2*time.Minute, "every scrape job up", func() bool {
		var err error
		up, _, err = promQuery(r.ctx, prom, "up")
		if err != nil {
			return false
		}
		for _, w := range want {
			if up[w] != "1" {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("up by job/node: %v; want 1 for %v\ntargets down: %s", up, want, downTargets(r.ctx, prom))
	})
	// cAdvisor's series name the node's pods: the scrape reached the real kubelet.
	_, series, err := promQuery(r.ctx, prom, `count by (node) (container_cpu_usage_seconds_total{job="cadvisor"})`)
	if err != nil || len(series) < len(nodes) {
		t.Errorf("cAdvisor's container series by node: %v (%v), want one per node", series, err)
	}
	if xidAt.IsZero() {
		t.Fatal("no XID was injected on " + xidNode + " (its GPU subtest did not get that far)")
	}
	var got hookAlert
	waitFor(t, r.ctx, 2*time.Minute, "GpurackXIDFatal for "+xidNode+" GPU 3 at the webhook", func() bool {
		var ok bool
		got, ok = hook.first("GpurackXIDFatal", "firing", map[string]string{"node": xidNode, "gpu_index": "3"})
		return ok
	}, func() string {
		_, fails, err := promQuery(r.ctx, prom, `max_over_time(gpurack_check_status{check="gpu.xid.fatal",status="fail"}[30m])`)
		return fmt.Sprintf("the webhook got %s; gpu.xid.fatal failing in the last 30 minutes, as scraped: %v (%v)", hook.summary(), fails, err)
	})
	// The agent sets the machine's hostname to the node name when it joins; its series'
	// Hostname must follow, or the inhibition of a down node's GPU alerts misses.
	if got.Labels["Hostname"] != xidNode {
		t.Errorf("GpurackXIDFatal has Hostname %q, want the node's name %s", got.Labels["Hostname"], xidNode)
	}
	if got.Labels["severity"] != "critical" || got.Annotations["runbook_url"] != "docs/operations.md#gpurackxidfatal" {
		t.Errorf("GpurackXIDFatal: labels %v, annotations %v", got.Labels, got.Annotations)
	}
	t.Logf("XID 79 injected on %s GPU 3 (simulated) -> GpurackXIDFatal at the webhook: %s (scrape and evaluation every %s, group_wait 1s)",
		xidNode, got.At.Sub(xidAt).Round(100*time.Millisecond), rackScrape)
	if res, ok := hook.first("GpurackXIDFatal", "resolved", map[string]string{"node": xidNode}); ok {
		t.Logf("and resolved at the webhook %s after the injection (the fault was cleared in the GPU subtest)", res.At.Sub(xidAt).Round(100*time.Millisecond))
	}
}

// downTargets lists the rack's Prometheus' targets that are down, with their last
// scrape error, for a failure's message.
// awaitXIDScraped waits, while the GPU subtest's XID 79 still fails GPU 3 of node, for the
// metrics server to have scraped that (gpurack_check_status of gpu.xid.fatal, fail):
// GpurackXIDFatal fires from one such sample. Cleared sooner, the fault could fall
// between two scrapes (every rackScrape, of an agent in a TCG guest), and the alert check
// later found nothing: one CI run failed so.
func awaitXIDScraped(t *testing.T, r *Rack, node string) {
	t.Helper()
	prom := promClient(r.ns)
	defer prom.CloseIdleConnections()
	t0 := time.Now()
	q := `gpurack_check_status{check="gpu.xid.fatal", status="fail", gpu_index="3", node="` + node + `"} == 1`
	var n int
	waitFor(t, r.ctx, 3*time.Minute, "the metrics server to scrape gpu.xid.fatal failing on "+node+" GPU 3", func() bool {
		_, series, err := promQuery(r.ctx, prom, q)
		n = len(series)
		return err == nil && n > 0
	}, func() string {
		return fmt.Sprintf("%s: %d series; targets down: %s", q, n, downTargets(r.ctx, prom))
	})
	t.Logf("XID 79 on %s GPU 3 scraped by the metrics server %s after this wait began", node, time.Since(t0).Round(100*time.Millisecond))
}

func downTargets(ctx context.Context, client *http.Client) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rackPrometheus+"/api/v1/targets?state=active", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string            `json:"scrapeUrl"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
				Labels    map[string]string `json:"labels"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&r); err != nil {
		return err.Error()
	}
	var down []string
	for _, tg := range r.Data.ActiveTargets {
		if tg.Health != "up" {
			down = append(down, fmt.Sprintf("%s (job %s): %s %s", tg.ScrapeURL, tg.Labels["job"], tg.Health, tg.LastError))
		}
	}
	return fmt.Sprint(down)
}
