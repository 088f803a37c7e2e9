package components

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// The monitoring components (cluster.yaml's monitoring.enabled), also their pinned
// binaries' names (`make k8s-bins`).
const (
	Alertmanager     = "alertmanager"
	KubeStateMetrics = "kube-state-metrics"
	Prometheus       = "prometheus"
)

// MonitoringNames lists the monitoring components in start order: Alertmanager,
// kube-state-metrics and the log store (VictoriaLogs, then its gateway) first, so that
// the metrics server finds them.
var MonitoringNames = []string{Alertmanager, KubeStateMetrics, VictoriaLogs, LogsGateway, Prometheus}

// KubeStateMetricsResources are the kinds kube-state-metrics watches (its --resources),
// which its ClusterRole lets it list and watch: Nodes for the node alerts
// (kube_node_status_condition, kube_node_spec_taint), and the Pods, Namespaces,
// ResourceQuotas and PersistentVolumeClaims of the tenants. Each kind left out is a
// watch and its objects' memory saved.
var KubeStateMetricsResources = []string{"namespaces", "nodes", "persistentvolumeclaims", "pods", "resourcequotas"}

// AllNames is every component init may start, in start order.
var AllNames = slices.Concat(Names, []string{VIP}, MonitoringNames, []string{Kueue, Registry, RegistryAuth})

// The monitoring files, under DIR/monitoring.
func (l Layout) MonitoringDir() string { return filepath.Join(l.Dir, "monitoring") }
func (l Layout) PrometheusConfig() string {
	return filepath.Join(l.Dir, "monitoring", "prometheus.yml")
}

// ScrapeTokenFile is the metrics server's bearer token, for the endpoints that take
// only tokens (Kueue's); init writes it (controlplane/scrapetoken.go).
func (l Layout) ScrapeTokenFile() string { return filepath.Join(l.Dir, "monitoring", "scrape.token") }
func (l Layout) RulesDir() string        { return filepath.Join(l.Dir, "monitoring", "rules") }
func (l Layout) PrometheusData() string  { return filepath.Join(l.Dir, "monitoring", "prometheus") }
func (l Layout) AlertmanagerConfig() string {
	return filepath.Join(l.Dir, "monitoring", "alertmanager.yml")
}
func (l Layout) AlertmanagerData() string { return filepath.Join(l.Dir, "monitoring", "alertmanager") }

func monitoringSpecs(cfg *clusterconfig.Config, l Layout) []Component {
	if !cfg.Monitoring.Enabled {
		return nil
	}
	specs := []Component{alertmanagerSpec(cfg, l), kubeStateMetricsSpec(cfg, l)}
	specs = append(specs, logsSpecs(cfg, l)...)
	return append(specs, prometheusSpec(cfg, l))
}

func alertmanagerSpec(cfg *clusterconfig.Config, l Layout) Component {
	m := cfg.Monitoring
	listen := hostPort(m.ListenAddress, m.Alertmanager.Port)
	flags := map[string]string{
		"config.file":        l.AlertmanagerConfig(),
		"storage.path":       l.AlertmanagerData(),
		"web.listen-address": listen,
		// One Alertmanager: no gossip port (a second control-plane host would add its
		// peers here).
		"cluster.listen-address": "",
	}
	return Component{
		Name:       Alertmanager,
		Args:       render(flags, m.Alertmanager.ExtraArgs),
		Ports:      []Port{{m.ListenAddress, m.Alertmanager.Port, "monitoring.alertmanager.port"}},
		HealthURL:  "http://" + listen + "/-/ready",
		HealthText: "OK",
	}
}

func kubeStateMetricsSpec(cfg *clusterconfig.Config, l Layout) Component {
	m := cfg.Monitoring
	k := m.KubeStateMetrics
	flags := map[string]string{
		// Its flag names the kubeconfig, so `certs renew kube-state-metrics.conf`
		// restarts it (Using).
		"kubeconfig":     l.Kubeconfig(clusterpki.KubeStateMetricsKubeconfig),
		"host":           m.ListenAddress,
		"port":           strconv.Itoa(k.Port),
		"telemetry-host": m.ListenAddress,
		"telemetry-port": strconv.Itoa(k.TelemetryPort),
		"resources":      strings.Join(KubeStateMetricsResources, ","),
	}
	return Component{
		Name: KubeStateMetrics,
		Args: render(flags, k.ExtraArgs),
		Ports: []Port{
			{m.ListenAddress, k.Port, "monitoring.kubeStateMetrics.port"},
			{m.ListenAddress, k.TelemetryPort, "monitoring.kubeStateMetrics.telemetryPort"},
		},
		// It answers "OK" once it serves; the series follow its first list of each kind.
		HealthURL:  "http://" + hostPort(m.ListenAddress, k.Port) + "/healthz",
		HealthText: "OK",
	}
}

func prometheusSpec(cfg *clusterconfig.Config, l Layout) Component {
	m := cfg.Monitoring
	listen := hostPort(m.ListenAddress, m.Prometheus.Port)
	flags := map[string]string{
		"config.file":                 l.PrometheusConfig(),
		"storage.tsdb.path":           l.PrometheusData(),
		"storage.tsdb.retention.time": m.Prometheus.RetentionTime,
		"storage.tsdb.retention.size": m.Prometheus.RetentionSize,
		"web.listen-address":          listen,
	}
	return Component{
		Name: Prometheus,
		// POST /-/reload: a re-run of init rewrites the configuration and reloads it. A
		// switch: Prometheus' flag parser takes no "=true".
		Args:       append(render(flags, m.Prometheus.ExtraArgs), "--web.enable-lifecycle"),
		Ports:      []Port{{m.ListenAddress, m.Prometheus.Port, "monitoring.prometheus.port"}},
		HealthURL:  "http://" + listen + "/-/ready",
		HealthText: "Ready",
	}
}

// EmptyAlertmanagerConfig is the routing written when monitoring.alertmanager.configFile
// is empty: one receiver with no integration, so alerts stay in Alertmanager.
var EmptyAlertmanagerConfig = []byte(`# Written by controlplane-bootstrap init: monitoring.alertmanager.configFile is empty,
# so alerts reach no one (amtool alert query lists them). Give the site's routing there
# (docs/monitoring/alertmanager.yml, its placeholders replaced) and run init again.
route:
  receiver: nobody
receivers:
  - name: nobody
`)

// promConfig is the metrics server's configuration. The jobs are the ones
// docs/monitoring.md's "Scrape jobs" table names, which the rules select on.
var promConfig = template.Must(template.New("prometheus.yml").Parse(`# Written by controlplane-bootstrap init from cluster.yaml; it is rewritten on the next init.
global:
  scrape_interval: {{.M.Prometheus.ScrapeInterval}}
  evaluation_interval: {{.M.Prometheus.EvaluationInterval}}
  external_labels:
    cluster: {{.Cluster}}
rule_files:
  - {{.Rules}}/*.yaml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['{{.Alertmanager}}']
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ['{{.Prometheus}}']
  - job_name: alertmanager
    static_configs:
      - targets: ['{{.Alertmanager}}']
  - job_name: kube-state-metrics
    static_configs:
      - targets: ['{{.KubeStateMetrics}}']
  - job_name: etcd
    static_configs:
      - targets: ['{{.Etcd}}']
{{- if .Logs}}
  - job_name: victorialogs
    static_configs:
      - targets: ['{{.VictoriaLogs}}']
{{- end}}
{{- if .Registry}}
  - job_name: registry
    static_configs:
      - targets: ['{{.Registry}}']
{{- end}}
  - job_name: apiserver
    scheme: https
    tls_config: &client
      ca_file: {{.CA}}
      cert_file: {{.Cert}}
      key_file: {{.Key}}
    static_configs:
      - targets: ['{{.APIServer}}']
{{- if .Kueue}}
  # Kueue's queue metrics (kueue_pending_workloads, kueue_admitted_workloads_total,
  # kueue_cluster_queue_resource_usage…): its serving certificate is the cluster CA's
  # for 127.0.0.1, and it lets in clients the API server authorizes.
  - job_name: kueue
    scheme: https
    tls_config:
      ca_file: {{.CA}}
    authorization:
      credentials_file: {{.ScrapeToken}}
    static_configs:
      - targets: ['{{.Kueue}}']
{{- end}}
{{- if .Logs}}
  - job_name: logs-gateway
    scheme: https
    tls_config: *client
    static_configs:
      - targets: ['{{.LogsGateway}}']
{{- end}}
{{- range .Loopback}}
  - job_name: {{.Job}}
    scheme: https
    tls_config:
      # Its serving certificate is self-signed (its --cert-dir), on loopback only.
      cert_file: {{$.Cert}}
      key_file: {{$.Key}}
      insecure_skip_verify: true
    static_configs:
      - targets: ['{{.Addr}}']
{{- end}}
{{- range .NodeJobs}}
  - job_name: {{.Job}}
    scheme: https
    metrics_path: {{.Path}}
    tls_config:
      # The node's serving certificate is its own self-signed one (kubelet's, and
      # gpuagent's and node_exporter's, decision 0693); the client certificate is
      # what they check.
      cert_file: {{$.Cert}}
      key_file: {{$.Key}}
      insecure_skip_verify: true
    kubernetes_sd_configs:
      - role: node
        api_server: {{$.APIServerURL}}
        tls_config: *client
    relabel_configs:
      - source_labels: [__meta_kubernetes_node_name]
        target_label: node
      {{- if .Port}}
      - source_labels: [__meta_kubernetes_node_address_InternalIP]
        regex: '(.+)'
        replacement: '${1}:{{.Port}}'
        target_label: __address__
      {{- end}}
{{- end}}
{{- if .M.Gpuboot}}
  - job_name: gpuboot
    {{- if not .M.GpubootTLS.PlainHTTP}}
    # gpuboot's operator TLS port, to its metrics-reader certificate (decision 0693).
    scheme: https
    tls_config:
      ca_file: {{.M.GpubootTLS.CAFile}}
      cert_file: {{.M.GpubootTLS.CertFile}}
      key_file: {{.M.GpubootTLS.KeyFile}}
    {{- end}}
    static_configs:
      - targets:
        {{- range .M.Gpuboot}}
          - '{{.}}'
        {{- end}}
{{- end}}
`))

type loopbackJob struct{ Job, Addr string }

// nodeJob is a job over every Node, scraped over TLS with the monitoring certificate.
type nodeJob struct {
	Job, Path string
	Port      int // 0: kubelet's own port, as discovered
}

// PrometheusConfig renders DIR/monitoring/prometheus.yml for cfg.
func PrometheusConfig(cfg *clusterconfig.Config, l Layout) ([]byte, error) {
	m := cfg.Monitoring
	nodeJobs := []nodeJob{
		{Job: "gpuagent", Path: "/metrics", Port: m.GPUAgentPort},
		{Job: "kubelet", Path: "/metrics"},
		{Job: "cadvisor", Path: "/metrics/cadvisor"},
	}
	if m.NodeExporterPort > 0 {
		nodeJobs = append(nodeJobs, nodeJob{Job: "node", Path: "/metrics", Port: m.NodeExporterPort})
	}
	apiHost := cfg.APIServer.BindAddress
	if ip := net.ParseIP(apiHost); ip == nil || ip.IsUnspecified() {
		apiHost = "127.0.0.1"
	}
	data := map[string]any{
		"M":                m,
		"Cluster":          strconv.Quote(cfg.ClusterName),
		"Rules":            l.RulesDir(),
		"Alertmanager":     hostPort(m.ListenAddress, m.Alertmanager.Port),
		"Prometheus":       hostPort(m.ListenAddress, m.Prometheus.Port),
		"KubeStateMetrics": hostPort(m.ListenAddress, m.KubeStateMetrics.Port),
		"Etcd":             hostPort("127.0.0.1", cfg.Etcd.MetricsPort),
		"APIServer":        hostPort(apiHost, cfg.APIServer.Port),
		"APIServerURL":     "https://" + hostPort(apiHost, cfg.APIServer.Port),
		"CA":               l.PKI(clusterpki.CACert),
		"Cert":             l.PKI(clusterpki.MonitoringClientCert),
		"Key":              l.PKI(clusterpki.MonitoringClientKey),
		"Loopback": []loopbackJob{
			{"kube-scheduler", hostPort("127.0.0.1", cfg.Scheduler.Port)},
			{"kube-controller-manager", hostPort("127.0.0.1", cfg.ControllerManager.Port)},
		},
		"NodeJobs": nodeJobs,
		"Logs":     m.LogsEnabled(),
	}
	if cfg.Queues.Enabled {
		data["Kueue"] = hostPort("127.0.0.1", cfg.Queues.MetricsPort)
		data["ScrapeToken"] = l.ScrapeTokenFile()
	}
	if cfg.Registry.Enabled {
		data["Registry"] = RegistryMetricsAddr(cfg) // its debug port, on loopback
	}
	if m.LogsEnabled() {
		gw := m.Logs.Gateway.ListenAddress
		if ip := net.ParseIP(gw); ip == nil || ip.IsUnspecified() {
			gw = "127.0.0.1"
		}
		data["VictoriaLogs"] = hostPort("127.0.0.1", m.Logs.Port)
		data["LogsGateway"] = hostPort(gw, m.Logs.Gateway.Port)
	}
	var b bytes.Buffer
	if err := promConfig.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("render %s: %w", l.PrometheusConfig(), err)
	}
	return b.Bytes(), nil
}
