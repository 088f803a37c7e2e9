// Package alerting tests the shipped Alertmanager configuration,
// docs/monitoring/alertmanager.yml, with the real alertmanager and amtool that `make
// k8s-bins` builds from module source: amtool checks the file and resolves its routes,
// and a real Alertmanager on loopback delivers, inhibits, silences and retries. The
// receivers' far ends are the test's: an httptest server stands in for the pager, chat
// and gpuboot webhooks, and a small SMTP listener for the site's mail relay.
package alerting

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/internal/testreq"
)

const (
	configPath = "../../docs/monitoring/alertmanager.yml"
	rulesPath  = "../../docs/monitoring/gpurack-alerts.yaml"
)

// tool returns the path of a pinned binary: in the k8s-bins cache
// ($GPURACK_K8S_DIR/bin, default ~/.cache/gpurack/k8s/v1.34.2/bin), else on PATH.
func tool(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("GPURACK_K8S_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gpurack", "k8s", "v1.34.2")
	}
	p := filepath.Join(dir, "bin", name)
	if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	testreq.Missing(t, name+" is neither in the k8s-bins cache nor in PATH", "run make k8s-bins (it builds alertmanager and amtool into its cache)")
	return ""
}

// rule is one alert of the shipped rule file.
type rule struct {
	Alert       string            `yaml:"alert"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// shippedRules reads docs/monitoring/gpurack-alerts.yaml's alerts by name.
func shippedRules(t *testing.T) map[string]rule {
	t.Helper()
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	rules := map[string]rule{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r
		}
	}
	if len(rules) < 30 {
		t.Fatalf("%s: only %d alerts", rulesPath, len(rules))
	}
	return rules
}

// TestAlertmanagerCheckConfig: amtool accepts the shipped file and finds its inhibit
// rules and receivers; a copy whose route names an undefined receiver is refused.
func TestAlertmanagerCheckConfig(t *testing.T) {
	amtool := tool(t, "amtool")
	out, err := exec.Command(amtool, "check-config", configPath).CombinedOutput()
	if err != nil {
		t.Fatalf("amtool check-config %s: %v\n%s", configPath, err, out)
	}
	for _, want := range []string{"SUCCESS", " - 2 inhibit rules", " - 4 receivers"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("amtool check-config does not say %q:\n%s", want, out)
		}
	}
	data, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "broken.yml")
	text := strings.Replace(string(data), "- receiver: tenant-vision", "- receiver: tenant-nobody", 1)
	if err := os.WriteFile(broken, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(amtool, "check-config", broken).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"tenant-nobody"`) {
		t.Errorf("amtool check-config accepted a route to an undefined receiver (err %v):\n%s", err, out)
	}
}

// routes runs `amtool config routes test` on the shipped file and returns the
// receivers an alert with labels resolves to, as amtool prints them.
func routes(t *testing.T, amtool string, labels map[string]string) string {
	t.Helper()
	args := []string{"config", "routes", "test", "--config.file=" + configPath}
	for k, v := range labels {
		args = append(args, fmt.Sprintf("%s=%q", k, v))
	}
	out, err := exec.Command(amtool, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("amtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestAlertmanagerRoutes resolves alerts through the shipped route tree with `amtool
// config routes test`: critical pages, a tenant's alert reaches that tenant's receiver,
// the rest goes to the default webhook, and gpuboot hears everything. Then every alert
// of the shipped rules, with its own severity, is paged exactly when it is critical.
func TestAlertmanagerRoutes(t *testing.T) {
	amtool := tool(t, "amtool")
	cases := []struct {
		name   string
		labels map[string]string
		want   string
	}{
		{"critical GPU alert pages", map[string]string{"alertname": "GpurackXIDFatal", "severity": "critical", "Hostname": "gpu-0001", "gpu_index": "3"}, "gpuboot,paging"},
		{"node down pages", map[string]string{"alertname": "GpurackNodeNotReady", "severity": "critical", "Hostname": "gpu-0001", "node": "gpu-0001"}, "gpuboot,paging"},
		{"tenant warning goes to the tenant", map[string]string{"alertname": "GpurackVolumeNearlyFull", "severity": "warning", "namespace": "vision-dev", "tenant": "vision"}, "gpuboot,tenant-vision"},
		{"tenant critical pages and goes to the tenant", map[string]string{"alertname": "GpurackXIDFatal", "severity": "critical", "Hostname": "gpu-0002", "tenant": "vision"}, "gpuboot,paging,tenant-vision"},
		{"warning without tenant goes to the default", map[string]string{"alertname": "GpurackXIDRate", "severity": "warning", "Hostname": "gpu-0001"}, "gpuboot,gpurack-default"},
		{"info goes to the default", map[string]string{"alertname": "GpurackRackPeerOutlier", "severity": "info", "Hostname": "gpu-0001"}, "gpuboot,gpurack-default"},
		{"a tenant without a receiver falls to the default", map[string]string{"alertname": "GpurackVolumeNearlyFull", "severity": "warning", "tenant": "audio"}, "gpuboot,gpurack-default"},
		{"no severity goes to the default", map[string]string{"alertname": "SomethingElse"}, "gpuboot,gpurack-default"},
	}
	for _, c := range cases {
		if got := routes(t, amtool, c.labels); got != c.want {
			t.Errorf("%s: %v routes to %q, want %q", c.name, c.labels, got, c.want)
		}
	}
	paged := 0
	for name, r := range shippedRules(t) {
		want := "gpuboot,gpurack-default"
		if r.Labels["severity"] == "critical" {
			want, paged = "gpuboot,paging", paged+1
		}
		labels := map[string]string{"alertname": name, "severity": r.Labels["severity"], "Hostname": "gpu-0001"}
		if got := routes(t, amtool, labels); got != want {
			t.Errorf("%s (severity %q) routes to %q, want %q", name, r.Labels["severity"], got, want)
		}
	}
	if paged == 0 {
		t.Error("no shipped alert is critical, so none was seen to page")
	}
}
