package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/docs/monitoring"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

// monitoringRole is the metrics server's ClusterRole and ClusterRoleBinding (to
// clusterpki.MonitoringUser): discover nodes, read kubelet's and cAdvisor's metrics
// through kubelet's authorizer, and the apiserver's, scheduler's and controller-manager's
// /metrics. Nothing else: it cannot read Secrets or change anything.
const monitoringRole = "gpurack:monitoring"

// kubeStateMetricsRole is kube-state-metrics' ClusterRole and ClusterRoleBinding (to
// clusterpki.KubeStateMetricsUser): list and watch exactly the kinds of its --resources
// (components.KubeStateMetricsResources), all of them in the core group. Not get: it
// works from its watches' caches.
const kubeStateMetricsRole = "gpurack:kube-state-metrics"

func monitoringObjects(cfg *clusterconfig.Config) []joinconfig.Object {
	if !cfg.Monitoring.Enabled {
		return nil
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/metrics", "services", "endpoints", "pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{NonResourceURLs: []string{"/metrics", "/metrics/cadvisor"}, Verbs: []string{"get"}},
	}
	ksm := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: components.KubeStateMetricsResources, Verbs: []string{"list", "watch"}}
	return []joinconfig.Object{
		joinconfig.ClusterRole(monitoringRole, rules...),
		joinconfig.ClusterRoleBinding(monitoringRole, monitoringRole, joinconfig.User(clusterpki.MonitoringUser)),
		joinconfig.ClusterRole(kubeStateMetricsRole, ksm),
		joinconfig.ClusterRoleBinding(kubeStateMetricsRole, kubeStateMetricsRole, joinconfig.User(clusterpki.KubeStateMetricsUser)),
	}
}

// readAlertmanagerConfig returns the routing Alertmanager gets: the operator's
// monitoring.alertmanager.configFile, or the one with no receiver. It is read before
// anything is written, so a missing file stops init with nothing changed.
func readAlertmanagerConfig(cfg *clusterconfig.Config) ([]byte, error) {
	if !cfg.Monitoring.Enabled {
		return nil, nil
	}
	f := cfg.Monitoring.Alertmanager.ConfigFile
	if f == "" {
		return components.EmptyAlertmanagerConfig, nil
	}
	data, err := os.ReadFile(f)
	if err != nil {
		return nil, fmt.Errorf("monitoring.alertmanager.configFile: %w (give the site's routing, docs/monitoring/alertmanager.yml with its placeholders replaced, or leave it empty)", err)
	}
	return data, nil
}

// writeMonitoringFiles writes DIR/monitoring: Prometheus' configuration, the shipped
// rules, Alertmanager's routing, and the data directories (the log store's too, when
// it runs). Each file is written
// whole; the data directories are kept.
func writeMonitoringFiles(l components.Layout, cfg *clusterconfig.Config, amConfig []byte, siteRules map[string][]byte) error {
	if !cfg.Monitoring.Enabled {
		return nil
	}
	prom, err := components.PrometheusConfig(cfg, l)
	if err != nil {
		return err
	}
	type file struct {
		path string
		data []byte
		mode os.FileMode
	}
	files := []file{
		{l.PrometheusConfig(), prom, 0o644},
		// It may hold an SMTP password or a webhook's token.
		{l.AlertmanagerConfig(), amConfig, 0o600},
	}
	for _, name := range monitoring.RuleFiles {
		data, err := monitoring.Rules.ReadFile(name)
		if err != nil {
			return err
		}
		files = append(files, file{filepath.Join(l.RulesDir(), name), data, 0o644})
	}
	for name, data := range siteRules {
		files = append(files, file{filepath.Join(l.RulesDir(), name), data, 0o644})
	}
	if err := removeStaleSiteRules(l, siteRules); err != nil {
		return err
	}
	for _, f := range files {
		if err := atomicfile.WriteMkdirAll(f.path, f.data, f.mode, 0o755); err != nil {
			return err
		}
	}
	dirs := []string{l.PrometheusData(), l.AlertmanagerData()}
	if cfg.Monitoring.LogsEnabled() {
		dirs = append(dirs, l.LogsDir())
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// readSiteRules reads the site's rule files (monitoring.prometheus.ruleFiles) and checks
// them with the pinned promtool, before anything is written: a missing file, or one
// promtool refuses (its answer names the file and the line), stops init with nothing
// changed. It returns their contents by their name in the rules directory.
func readSiteRules(ctx context.Context, cfg *clusterconfig.Config) (map[string][]byte, error) {
	files := cfg.Monitoring.Prometheus.RuleFiles
	if !cfg.Monitoring.Enabled || len(files) == 0 {
		return nil, nil
	}
	out := map[string][]byte{}
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("monitoring.prometheus.ruleFiles[%d]: %w", i, err)
		}
		out[clusterconfig.SiteRuleName(f)] = data
	}
	promtool, err := components.FindBinary(components.BinDir(cfg.BinDir), "promtool")
	if err != nil {
		return nil, fmt.Errorf("monitoring.prometheus.ruleFiles are checked with promtool: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	check, err := exec.CommandContext(ctx, promtool, append([]string{"check", "rules", "--lint=none"}, files...)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("monitoring.prometheus.ruleFiles: promtool check rules refused them (%v); fix the file and line it names and run init again:\n%s", err, strings.TrimSpace(string(check)))
	}
	return out, nil
}

// removeStaleSiteRules removes the site rule files an earlier init copied that are no
// longer in monitoring.prometheus.ruleFiles.
func removeStaleSiteRules(l components.Layout, keep map[string][]byte) error {
	old, err := filepath.Glob(filepath.Join(l.RulesDir(), "site-*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if _, ok := keep[filepath.Base(f)]; !ok {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	return nil
}
