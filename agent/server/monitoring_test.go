package server

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurack/gpurack/agent/logship"
	"github.com/gpurack/gpurack/internal/testreq"
)

const monitoringDir = "../../docs/monitoring"

// exportedNames lists the metric names the collector can export, with those of the
// collectors the agent serves beside it (log shipping's).
func exportedNames(t *testing.T) map[string]bool {
	ch := make(chan *prometheus.Desc, 100)
	(&Collector{}).Describe(ch)
	(&logship.Metrics{}).Describe(ch)
	close(ch)
	names := map[string]bool{}
	re := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		names[m[1]] = true
	}
	return names
}

// TestMonitoringAssetsUseExportedMetrics: every gpurack_* name in the rule files under
// docs/monitoring and the dashboard is one the agent exports, so a renamed metric
// breaks this test, not a dashboard in production. gpurack_tenant_* series come from
// controlplane-bootstrap (tenants.Registry), gpurack_logs_gateway_* from its log
// gateway (logsgateway), whose tests check them. Other names (up,
// kube_*, kubelet_*, node_*, etcd_*, apiserver_*, prometheus_*, alertmanager_*) are
// other exporters' and pass: docs/monitoring.md lists their jobs.
func TestMonitoringAssetsUseExportedMetrics(t *testing.T) {
	names := exportedNames(t)
	re := regexp.MustCompile(`(?:^|[^:a-z_])(gpurack_[a-z_]+)`)
	files := append(ruleFiles(t), filepath.Join(monitoringDir, "gpurack-dashboard.json"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var used []string
		for _, m := range re.FindAllStringSubmatch(string(data), -1) {
			used = append(used, m[1])
		}
		if len(used) == 0 {
			t.Errorf("%s uses no gpurack metric", f)
		}
		for _, n := range used {
			if !names[n] && !strings.HasPrefix(n, "gpurack_io") && !strings.HasPrefix(n, "gpurack_tenant_") && !strings.HasPrefix(n, "gpurack_logs_gateway_") {
				t.Errorf("%s uses %s, which the agent does not export", f, n)
			}
		}
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	data, _ := os.ReadFile(filepath.Join(monitoringDir, "gpurack-dashboard.json"))
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) < 10 {
		t.Errorf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 || p.Targets[0].Expr == "" {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
}

// TestAlertRulesWithPromtool runs `promtool check rules` on every rule file under
// docs/monitoring and `promtool test rules` on each one's .test.yaml.
func TestAlertRulesWithPromtool(t *testing.T) {
	promtool := findTool("promtool")
	if promtool == "" {
		testreq.Missing(t, "promtool is neither in the k8s-bins cache nor in PATH, so the alert rules cannot be checked", "run make k8s-bins")
	}
	var runs [][]string
	for _, f := range ruleFiles(t) {
		base := filepath.Base(f)
		runs = append(runs, []string{"check", "rules", base}, []string{"test", "rules", strings.TrimSuffix(base, ".yaml") + ".test.yaml"})
	}
	for _, args := range runs {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = monitoringDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		} else {
			t.Logf("promtool %v: %s", args, strings.TrimSpace(string(out)))
		}
	}
}

func findTool(name string) string {
	dir := os.Getenv("GPURACK_K8S_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gpurack", "k8s", "v1.34.2")
	}
	if p := filepath.Join(dir, "bin", name); fileExecutable(p) {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

func fileExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&0o111 != 0
}
