// Package monitoring tests the metrics server, Alertmanager and kube-state-metrics as
// `controlplane-bootstrap init` starts them (cluster.yaml's monitoring.enabled): a real
// control plane, Prometheus, Alertmanager and kube-state-metrics from `make k8s-bins`,
// gpuagents on the GPU
// simulator (labelled simulated) whose Node objects the test registers in place of
// kubelets, and an httptest webhook as the receiver. See docs/testing.md.
package monitoring

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/docs/monitoring"
	"github.com/gpurack/gpurack/test/rigimage"
)

// Test timings: a scrape and a rule evaluation every second, Alertmanager's group_wait
// 200 ms. The shipped rules' `for` clauses stay as shipped.
const (
	scrapeInterval = time.Second
	evalInterval   = time.Second
	groupWait      = 200 * time.Millisecond
	agentInterval  = time.Second // gpuagent --interval
)

func alertmanagerConfig(t *testing.T, hook string) string {
	path := filepath.Join(t.TempDir(), "alertmanager.yml")
	cfg := fmt.Sprintf(`route:
  receiver: hook
  group_by: [alertname, Hostname, node]
  group_wait: %s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: %s
        send_resolved: true
`, groupWait, hook)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMetricsServer starts a control plane with monitoring enabled and follows the
// data: every scrape job of the control-plane host is up with its credential, the
// shipped rules are loaded and healthy, two simulated nodes' agents are found through
// the Node objects, a fatal XID injected on one reaches the webhook with the node, the
// GPU and the runbook link, a killed agent's target goes down and its alert pends, and
// the simulated nodes' conditions and a quarantine taint reach the node alerts through
// kube-state-metrics.
func TestMetricsServer(t *testing.T) {
	testcluster.Require(t, "prometheus", "alertmanager", "kube-state-metrics", components.Kueue)
	dir := t.TempDir()
	hook := newWebhook(t)
	amConfig := alertmanagerConfig(t, hook.srv.URL)
	prefix, agentPort := loopbackPrefix(t, 2)
	exporterPort, ok := portFreeOn(prefix, 2)
	if !ok {
		t.Fatal("no port free for node_exporter on the simulated nodes' addresses")
	}
	// A site's own rule file (monitoring.prometheus.ruleFiles), loaded beside the
	// shipped ones.
	siteRules := filepath.Join(dir, "site.yml")
	if err := os.WriteFile(siteRules, []byte(siteRuleFile), 0o644); err != nil {
		t.Fatal(err)
	}
	var promURL, amURL string
	c := testcluster.NewWith(t, testcluster.Options{Configure: func(cfg *clusterconfig.Config) {
		ports, err := testcluster.FreePorts(7)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Monitoring.Enabled = true
		// The queues too: Kueue's /metrics takes only a bearer token (init's scrape token).
		cfg.Queues.Enabled = true
		cfg.Queues.WebhookPort, cfg.Queues.HealthPort, cfg.Queues.MetricsPort = ports[4], ports[5], ports[6]
		cfg.Monitoring.Prometheus.Port, cfg.Monitoring.Alertmanager.Port = ports[0], ports[1]
		cfg.Monitoring.KubeStateMetrics.Port, cfg.Monitoring.KubeStateMetrics.TelemetryPort = ports[2], ports[3]
		cfg.Monitoring.Prometheus.ScrapeInterval = "1s"
		cfg.Monitoring.Prometheus.EvaluationInterval = "1s"
		cfg.Monitoring.Alertmanager.ConfigFile = amConfig
		cfg.Monitoring.GPUAgentPort = agentPort
		cfg.Monitoring.NodeExporterPort = exporterPort
		cfg.Monitoring.Prometheus.RuleFiles = []string{siteRules}
		promURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		amURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	}})
	cs := c.Clientset(t)
	bin := buildAgent(t, dir)
	caFile := writeCA(t, dir, c.CAPEM)
	a := startAgent(t, bin, dir, "sim-node-a", host(prefix, 0), agentPort, agentInterval, cs, caFile)
	b := startAgent(t, bin, dir, "sim-node-b", host(prefix, 1), agentPort, agentInterval, cs, caFile)
	startNodeExporter(t, dir, a.node, host(prefix, 0), exporterPort, c.CAPEM)
	startNodeExporter(t, dir, b.node, host(prefix, 1), exporterPort, c.CAPEM)

	t.Run("control plane jobs up", func(t *testing.T) { controlPlaneJobsUp(t, promURL) })
	t.Run("rules loaded", func(t *testing.T) { rulesLoaded(t, promURL) })
	t.Run("agents discovered", func(t *testing.T) {
		eventually(t, time.Minute, "both agents scraped through node discovery", func() error {
			return upByNode(promURL, "gpuagent", map[string]string{a.node: "1", b.node: "1"})
		})
	})
	t.Run("node_exporter scraped with the credential", func(t *testing.T) {
		eventually(t, time.Minute, "both nodes' node_exporter scraped through node discovery", func() error {
			return upByNode(promURL, "node", map[string]string{a.node: "1", b.node: "1"})
		})
		anonymousRefused(t, a.addr, net.JoinHostPort(host(prefix, 0), strconv.Itoa(exporterPort)))
	})
	t.Run("fatal XID reaches the webhook", func(t *testing.T) { xidToWebhook(t, hook, a) })
	t.Run("killed agent", func(t *testing.T) { killedAgent(t, promURL, b) })
	t.Run("alertmanager holds the alert", func(t *testing.T) { alertmanagerHolds(t, amURL, a) })
	t.Run("node state through kube-state-metrics", func(t *testing.T) { nodeState(t, promURL, cs, a.node, b.node) })
}

// anonymousRefused checks that the endpoints the metrics server reads with its
// certificate answer no one without one: no TLS client certificate, and plain HTTP.
func anonymousRefused(t *testing.T, addrs ...string) {
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, addr := range addrs {
		if resp, err := noCert.Get("https://" + addr + "/metrics"); err == nil {
			resp.Body.Close()
			t.Errorf("%s answered %s without a client certificate", addr, resp.Status)
		}
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("%s answered plain HTTP", addr)
			}
		}
	}
}

// controlPlaneJobsUp waits until the control-plane host's jobs answer: the apiserver,
// the scheduler and the controller-manager only to the monitoring client certificate,
// Kueue only to the metrics server's token.
func controlPlaneJobsUp(t *testing.T, promURL string) {
	jobs := []string{"prometheus", "alertmanager", "kube-state-metrics", "etcd", "apiserver", "kube-scheduler", "kube-controller-manager", "kueue"}
	eventually(t, time.Minute, "control-plane scrape jobs up", func() error {
		s, err := query(promURL, `up`)
		if err != nil {
			return err
		}
		up := map[string]string{}
		for _, x := range s {
			up[x.Metric["job"]] = fmt.Sprint(x.Value[1])
		}
		for _, j := range jobs {
			if up[j] != "1" {
				return fmt.Errorf("job %s: up=%q (all: %v)", j, up[j], up)
			}
		}
		return nil
	})
	// The scrape reached the apiserver's own metrics, which anonymous clients are denied.
	s, err := query(promURL, `sum(apiserver_request_total{job="apiserver"})`)
	if err != nil || len(s) != 1 {
		t.Fatalf("apiserver_request_total through the apiserver job: %v %v", s, err)
	}
	// And Kueue's own series, which it serves to no one its API server has not
	// authorized.
	s, err = query(promURL, `count({job="kueue", __name__=~"kueue_.+"})`)
	if err != nil || len(s) != 1 {
		t.Fatalf("Kueue's kueue_* series through the kueue job: %v %v", s, err)
	}
}

// siteRuleFile is the site's rule file TestMetricsServer gives init: one recording
// rule, which rulesLoaded finds beside the shipped ones.
const siteRuleFile = `groups:
  - name: site
    rules:
      - record: site:gpuagent_up:sum
        expr: sum(up{job="gpuagent"})
`

// rulesLoaded checks that Prometheus loaded every rule of the shipped files and the
// site's one (siteRuleFile), and that each evaluates without error.
func rulesLoaded(t *testing.T, promURL string) {
	want := 1 // siteRuleFile's
	for _, f := range monitoring.RuleFiles {
		data, err := monitoring.Rules.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want += strings.Count(string(data), "\n      - alert: ") + strings.Count(string(data), "\n      - record: ")
	}
	eventually(t, 30*time.Second, "the shipped rules loaded and evaluated", func() error {
		var r struct {
			Data struct {
				Groups []struct {
					File  string `json:"file"`
					Rules []struct {
						Name, Health, LastError string
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := getJSON(promURL+"/api/v1/rules", &r); err != nil {
			return err
		}
		got := 0
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				got++
				if rule.Health != "ok" {
					return fmt.Errorf("%s in %s: health %q: %s", rule.Name, g.File, rule.Health, rule.LastError)
				}
			}
		}
		if got != want || want == 0 {
			return fmt.Errorf("%d rules loaded, the shipped files and the site's have %d", got, want)
		}
		return nil
	})
}

// upByNode compares up{job=job} by node with want.
func upByNode(promURL, job string, want map[string]string) error {
	return valuesByNode(promURL, fmt.Sprintf(`up{job=%q}`, job), want)
}

// inject injects a simulator fault through the agent's local gRPC socket.
func inject(t *testing.T, a *simAgent, spec string) time.Time {
	conn, err := grpc.NewClient("unix://"+a.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := time.Now()
	if _, err := agentv1.NewAgentServiceClient(conn).InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: spec}}); err != nil {
		t.Fatalf("inject %s on %s: %v", spec, a.node, err)
	}
	return at
}

// xidToWebhook injects XID 79 on GPU 3 of a and waits for GpurackXIDFatal at the
// webhook, with the node, the GPU and the runbook link; it logs the time from the
// injection against the bound the configuration gives.
func xidToWebhook(t *testing.T, hook *webhook, a *simAgent) {
	at := inject(t, a, "xid:79@gpu3")
	var r received
	var i int
	eventually(t, 2*time.Minute, "GpurackXIDFatal at the webhook", func() error {
		var ok bool
		if r, i, ok = hook.firing("GpurackXIDFatal"); !ok {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	got := r.n.Alerts[i]
	if got.Labels["node"] != a.node || got.Labels["gpu_index"] != "3" || got.Labels["severity"] != "critical" {
		t.Errorf("labels %v: want node=%s gpu_index=3 severity=critical", got.Labels, a.node)
	}
	if rb := got.Annotations["runbook_url"]; rb != "docs/operations.md#gpurackxidfatal" {
		t.Errorf("runbook_url %q", rb)
	}
	assertAnchor(t, "gpurackxidfatal")
	bound := agentInterval + scrapeInterval + evalInterval + groupWait
	t.Logf("fatal XID injected → webhook: %s (bound from the intervals: agent check %s + scrape %s + evaluation %s + group_wait %s = %s; the rule has no `for`; simulated GPU)",
		r.at.Sub(at).Round(time.Millisecond), agentInterval, scrapeInterval, evalInterval, groupWait, bound)
}

// assertAnchor checks that docs/operations.md has a heading whose anchor is anchor.
func assertAnchor(t *testing.T, anchor string) {
	data, err := os.ReadFile(filepath.Join(rigimage.RepoRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "#") && strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#"))) == anchor {
			return
		}
	}
	t.Errorf("docs/operations.md has no heading for #%s", anchor)
}

// alertmanagerHolds checks Alertmanager's own view: the XID alert is active there,
// with the cluster's external label.
func alertmanagerHolds(t *testing.T, amURL string, a *simAgent) {
	var alerts []struct {
		Labels map[string]string `json:"labels"`
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := getJSON(amURL+"/api/v2/alerts?filter="+url.QueryEscape(`alertname="GpurackXIDFatal"`), &alerts); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(alerts, func(x struct {
		Labels map[string]string `json:"labels"`
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}) bool {
		return x.Labels["node"] == a.node && x.Status.State == "active" && x.Labels["cluster"] == "testcluster"
	}) {
		t.Errorf("Alertmanager's alerts: %+v, want GpurackXIDFatal active for %s in cluster testcluster", alerts, a.node)
	}
}

// killedAgent kills b's agent: its target goes down and GpurackAgentMissing pends
// (its `for` is 5 minutes: the firing is promtool's to test).
func killedAgent(t *testing.T, promURL string, b *simAgent) {
	b.kill()
	eventually(t, time.Minute, "the killed agent's target down", func() error {
		return upByNode(promURL, "gpuagent", map[string]string{b.node: "0"})
	})
	eventually(t, 30*time.Second, "GpurackAgentMissing pending for the killed agent", func() error {
		return pending(promURL, "GpurackAgentMissing", map[string]string{"node": b.node})
	})
}
