package clusterconfig

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Monitoring configures the metrics server (Prometheus), Alertmanager and
// kube-state-metrics that init starts beside the control-plane components when Enabled
// (docs/monitoring.md; docs/decisions/0692-prometheus-as-the-metrics-server.md).
// Prometheus and Alertmanager read files init writes under DIR/monitoring: the scrape
// configuration, the shipped alert and recording rules, and the routing;
// kube-state-metrics reads the API with DIR/kube-state-metrics.conf.
type Monitoring struct {
	// Enabled starts Prometheus, Alertmanager and kube-state-metrics with the control
	// plane. Off by default: they need `make k8s-bins`' prometheus, alertmanager and
	// kube-state-metrics binaries.
	Enabled bool `yaml:"enabled"`
	// ListenAddress is the IP all three listen on; default 127.0.0.1 (their HTTP APIs
	// have no authentication: open them to other hosts through a proxy that has).
	ListenAddress    string           `yaml:"listenAddress"`
	Prometheus       Prometheus       `yaml:"prometheus"`
	Alertmanager     Alertmanager     `yaml:"alertmanager"`
	KubeStateMetrics KubeStateMetrics `yaml:"kubeStateMetrics"`
	// GPUAgentPort is the port of every node's gpuagent /metrics (its --metrics-listen),
	// scraped over TLS with pki/monitoring-client.crt (decision 0693).
	GPUAgentPort int `yaml:"gpuagentPort"`
	// NodeExporterPort is the port of node_exporter on every node (gpuagent
	// --node-exporter-listen), scraped over TLS with pki/monitoring-client.crt; 0 or
	// unset: 9100, which every node image ships; -1: the node job is not configured.
	NodeExporterPort int `yaml:"nodeExporterPort"`
	// Gpuboot lists gpuboot's addresses (HOST:PORT) whose /metrics are scraped: its
	// operator TLS port (listen.tls, 8443), with GpubootTLS's metrics-reader
	// credential (decision 0693); with GpubootTLS.PlainHTTP, its HTTP port.
	Gpuboot    []string   `yaml:"gpuboot"`
	GpubootTLS GpubootTLS `yaml:"gpubootTLS"`
	// Logs is the log store and its ingestion gateway (docs/monitoring.md "Logs").
	Logs Logs `yaml:"logs"`
}

// Logs configures the log store, VictoriaLogs, and the gateway nodes write to it
// through (docs/contracts.md §15; decision 0694).
type Logs struct {
	// Enabled starts VictoriaLogs and the gateway with the monitoring components; unset
	// (the default): on when monitoring.enabled is. They need `make k8s-bins`'
	// victoria-logs binary.
	Enabled *bool `yaml:"enabled"`
	// Port is VictoriaLogs' HTTP port on 127.0.0.1 only (its query API has no
	// authentication); default 9429.
	Port int `yaml:"port"`
	// RetentionPeriod deletes lines older than it, a day at a time (-retentionPeriod): a
	// number and one of h, d, w, M (months), y; at least 1d; default 30d.
	RetentionPeriod string `yaml:"retentionPeriod"`
	// MaxDiskSpaceUsage drops the oldest days once DIR/monitoring/logs is larger
	// (-retention.maxDiskSpaceUsageBytes): a number and one of KB, MB, GB, TB, KiB,
	// MiB, GiB, TiB; default 50GiB.
	MaxDiskSpaceUsage string `yaml:"maxDiskSpaceUsage"`
	// ExtraArgs are VictoriaLogs flags, without leading dashes (memory.allowedPercent).
	ExtraArgs map[string]string `yaml:"extraArgs"`
	Gateway   LogsGateway       `yaml:"gateway"`
}

// LogsGateway configures the ingestion gateway, `controlplane-bootstrap logs-gateway`.
type LogsGateway struct {
	// ListenAddress is the IP nodes reach it on; default apiServer.bindAddress (it
	// serves with the API server's names).
	ListenAddress string `yaml:"listenAddress"`
	// Port is its TLS port; default 9428.
	Port int `yaml:"port"`
	// MaxRequestBytes bounds one request's body as sent; larger is 413 and nothing of
	// it is stored. Default 16777216 (16 MiB).
	MaxRequestBytes int64 `yaml:"maxRequestBytes"`
	// MaxConcurrentRequests bounds the requests held at once (each up to
	// MaxRequestBytes in memory), MaxRequestsPerNode those of one node; more are told
	// to retry (429). Default 8 and 2.
	MaxConcurrentRequests int `yaml:"maxConcurrentRequests"`
	MaxRequestsPerNode    int `yaml:"maxRequestsPerNode"`
}

// LogsEnabled reports whether init starts the log store: monitoring on, and
// monitoring.logs.enabled not false.
func (m *Monitoring) LogsEnabled() bool {
	return m.Enabled && (m.Logs.Enabled == nil || *m.Logs.Enabled)
}

// GpubootTLS is the metrics server's credential for gpuboot's /metrics: the files
// `gpuboot certs operator NAME --level metrics-reader` writes on gpuboot's host,
// copied to this host (docs/monitoring.md, "Scrape credentials").
type GpubootTLS struct {
	// CAFile is gpuboot's CA certificate (its ca.crt), which gpuboot's serving
	// certificate chains to: each monitoring.gpuboot target must be a name or address
	// in that certificate (`gpuboot certs server --advertise`).
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile are the metrics-reader certificate and key (operator.crt,
	// operator.key); the key readable by the user init runs as, and by no one else.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// PlainHTTP scrapes gpuboot's plain HTTP port (listen.http) with no credential
	// instead, for a gpuboot whose gpuboot.yaml has metrics.plainHTTP: true (labs).
	PlainHTTP bool `yaml:"plainHTTP"`
}

// Prometheus configures the metrics server.
type Prometheus struct {
	Port int `yaml:"port"`
	// ScrapeInterval and EvaluationInterval are Prometheus durations; default 30s.
	ScrapeInterval     string `yaml:"scrapeInterval"`
	EvaluationInterval string `yaml:"evaluationInterval"`
	// RetentionTime and RetentionSize bound the TSDB in DIR/monitoring/prometheus
	// (--storage.tsdb.retention.time and .size); default 15d and 50GB, whichever is
	// reached first.
	RetentionTime string            `yaml:"retentionTime"`
	RetentionSize string            `yaml:"retentionSize"`
	ExtraArgs     map[string]string `yaml:"extraArgs"`
	// RuleFiles are the site's own alerting and recording rule files on this host
	// (Prometheus' rule file format), loaded beside the shipped ones: init checks them
	// with promtool before it writes anything, so a file with a mistake stops it with
	// the file and line, and copies them into DIR/monitoring/rules as site-NAME.yaml.
	// Their base names must differ.
	RuleFiles []string `yaml:"ruleFiles"`
}

// Alertmanager configures the alert router.
type Alertmanager struct {
	Port int `yaml:"port"`
	// ConfigFile is the routing configuration on this host (docs/monitoring/alertmanager.yml,
	// its placeholders replaced); init copies it into the cluster directory. Empty: a
	// configuration with no receiver, so alerts are kept in Alertmanager (amtool, its
	// API) and reach no one.
	ConfigFile string            `yaml:"configFile"`
	ExtraArgs  map[string]string `yaml:"extraArgs"`
}

// KubeStateMetrics configures kube-state-metrics, which turns the Node, Pod, Namespace,
// ResourceQuota and PersistentVolumeClaim objects into series (job kube-state-metrics).
type KubeStateMetrics struct {
	// Port serves the objects' series (/metrics, scraped) and /healthz; default 8082
	// (8080 is gpuboot's HTTP port, which may run on the same host).
	Port int `yaml:"port"`
	// TelemetryPort serves kube-state-metrics' own metrics; default 8083.
	TelemetryPort int               `yaml:"telemetryPort"`
	ExtraArgs     map[string]string `yaml:"extraArgs"`
}

func defaultMonitoring() Monitoring {
	return Monitoring{
		ListenAddress: "127.0.0.1",
		Prometheus: Prometheus{Port: 9090, ScrapeInterval: "30s", EvaluationInterval: "30s",
			RetentionTime: "15d", RetentionSize: "50GB"},
		Alertmanager:     Alertmanager{Port: 9093},
		KubeStateMetrics: KubeStateMetrics{Port: 8082, TelemetryPort: 8083},
		GPUAgentPort:     9410,
		NodeExporterPort: 9100,
		Logs: Logs{Port: 9429, RetentionPeriod: "30d", MaxDiskSpaceUsage: "50GiB",
			Gateway: LogsGateway{Port: 9428, MaxRequestBytes: 16 << 20, MaxConcurrentRequests: 8, MaxRequestsPerNode: 2}},
	}
}

func (m *Monitoring) applyDefaults() {
	d := defaultMonitoring()
	for _, f := range []struct {
		p *string
		v string
	}{
		{&m.ListenAddress, d.ListenAddress},
		{&m.Prometheus.ScrapeInterval, d.Prometheus.ScrapeInterval},
		{&m.Prometheus.EvaluationInterval, d.Prometheus.EvaluationInterval},
		{&m.Prometheus.RetentionTime, d.Prometheus.RetentionTime},
		{&m.Prometheus.RetentionSize, d.Prometheus.RetentionSize},
		{&m.Logs.RetentionPeriod, d.Logs.RetentionPeriod},
		{&m.Logs.MaxDiskSpaceUsage, d.Logs.MaxDiskSpaceUsage},
	} {
		if *f.p == "" {
			*f.p = f.v
		}
	}
	for _, f := range []struct {
		p *int
		v int
	}{
		{&m.Prometheus.Port, d.Prometheus.Port},
		{&m.Alertmanager.Port, d.Alertmanager.Port},
		{&m.KubeStateMetrics.Port, d.KubeStateMetrics.Port},
		{&m.KubeStateMetrics.TelemetryPort, d.KubeStateMetrics.TelemetryPort},
		{&m.GPUAgentPort, d.GPUAgentPort},
		{&m.NodeExporterPort, d.NodeExporterPort},
		{&m.Logs.Port, d.Logs.Port},
		{&m.Logs.Gateway.Port, d.Logs.Gateway.Port},
		{&m.Logs.Gateway.MaxConcurrentRequests, d.Logs.Gateway.MaxConcurrentRequests},
		{&m.Logs.Gateway.MaxRequestsPerNode, d.Logs.Gateway.MaxRequestsPerNode},
	} {
		if *f.p == 0 {
			*f.p = f.v
		}
	}
	if m.Logs.Gateway.MaxRequestBytes == 0 {
		m.Logs.Gateway.MaxRequestBytes = d.Logs.Gateway.MaxRequestBytes
	}
}

// promDuration is Prometheus' duration syntax (model.ParseDuration): units from
// milliseconds to years, largest first, such as 15d or 1h30m.
var promDuration = regexp.MustCompile(`^([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$`)

// promSize is Prometheus' byte-size syntax (--storage.tsdb.retention.size).
var promSize = regexp.MustCompile(`^[0-9]+(B|KB|MB|GB|TB|PB|EB)$`)

func (m *Monitoring) validate(p *problems) {
	if !m.Enabled {
		return
	}
	if a, err := netip.ParseAddr(m.ListenAddress); err != nil || !a.Is4() && !a.Is6() {
		p.add("monitoring.listenAddress", "%q is not an IP address (127.0.0.1 keeps both on this host)", m.ListenAddress)
	}
	for _, d := range []struct{ field, v string }{
		{"monitoring.prometheus.scrapeInterval", m.Prometheus.ScrapeInterval},
		{"monitoring.prometheus.evaluationInterval", m.Prometheus.EvaluationInterval},
		{"monitoring.prometheus.retentionTime", m.Prometheus.RetentionTime},
	} {
		if d.v == "" || d.v == "0s" || !promDuration.MatchString(d.v) {
			p.add(d.field, "%q is not a Prometheus duration (for example 30s, 15d or 1h30m)", d.v)
		}
	}
	if !promSize.MatchString(m.Prometheus.RetentionSize) {
		p.add("monitoring.prometheus.retentionSize", "%q is not a size (a number and one of B, KB, MB, GB, TB, PB, EB: 50GB)", m.Prometheus.RetentionSize)
	}
	seen := map[string]string{}
	for i, f := range m.Prometheus.RuleFiles {
		field := fmt.Sprintf("monitoring.prometheus.ruleFiles[%d]", i)
		base := SiteRuleName(f)
		switch {
		case f == "" || !filepath.IsAbs(f):
			p.add(field, "%q is not an absolute path of a rule file on this host", f)
		case seen[base] != "":
			p.add(field, "%s has the same base name as %s: both would be copied to rules/%s", f, seen[base], base)
		}
		seen[base] = f
	}
	m.validateLogs(p)
	m.validateScrapeTargets(p)
	for _, ea := range []struct {
		field string
		m     map[string]string
	}{
		{"monitoring.prometheus.extraArgs", m.Prometheus.ExtraArgs},
		{"monitoring.alertmanager.extraArgs", m.Alertmanager.ExtraArgs},
		{"monitoring.kubeStateMetrics.extraArgs", m.KubeStateMetrics.ExtraArgs},
		{"monitoring.logs.extraArgs", m.Logs.ExtraArgs},
	} {
		for k := range ea.m {
			if !flagName.MatchString(k) && !promFlagName.MatchString(k) {
				p.add(ea.field+"["+k+"]", "%q is not a flag name: write it without leading dashes, for example storage.tsdb.wal-compression", k)
			}
		}
	}
}

// validateScrapeTargets checks the node ports and gpuboot's targets and credential.
func (m *Monitoring) validateScrapeTargets(p *problems) {
	if n := m.NodeExporterPort; n != -1 && (n < 1 || n > 65535) {
		p.add("monitoring.nodeExporterPort", "%d is not a port: give node_exporter's port on the nodes (9100), or -1 for no node job", n)
	}
	if n := m.GPUAgentPort; n < 1 || n > 65535 {
		p.add("monitoring.gpuagentPort", "%d is not a port: give gpuagent's --metrics-listen port (9410)", n)
	}
	example := "gpuboot's operator TLS address, for example gpuboot.example:8443"
	if m.GpubootTLS.PlainHTTP {
		example = "gpuboot's HTTP address, for example gpuboot.example:8080"
	}
	for i, g := range m.Gpuboot {
		if _, err := netip.ParseAddrPort(g); err != nil && !hostPortName.MatchString(g) {
			p.add("monitoring.gpuboot["+strconv.Itoa(i)+"]", "%q is not HOST:PORT (%s)", g, example)
		}
	}
	if len(m.Gpuboot) == 0 || m.GpubootTLS.PlainHTTP {
		return
	}
	const how = "gpuboot serves /metrics on its operator TLS port to a metrics-reader certificate (decision 0693): " +
		"issue one on gpuboot's host with `gpuboot certs operator prometheus --level metrics-reader`, copy its ca.crt, operator.crt and operator.key here, " +
		"name them in monitoring.gpubootTLS (caFile, certFile, keyFile) and point monitoring.gpuboot at gpuboot's TLS port (8443); " +
		"for a gpuboot with metrics.plainHTTP: true, monitoring.gpubootTLS.plainHTTP: true scrapes its HTTP port with no credential"
	for _, f := range []struct{ field, v string }{
		{"monitoring.gpubootTLS.caFile", m.GpubootTLS.CAFile},
		{"monitoring.gpubootTLS.certFile", m.GpubootTLS.CertFile},
		{"monitoring.gpubootTLS.keyFile", m.GpubootTLS.KeyFile},
	} {
		if f.v == "" {
			p.add(f.field, "is empty: %s", how)
		} else if !filepath.IsAbs(f.v) {
			p.add(f.field, "%q is not an absolute path (the metrics server reads it from its own directory)", f.v)
		}
	}
}

// promFlagName is a Prometheus or Alertmanager flag: dotted words; VictoriaLogs'
// words are camelCase.
var promFlagName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9.-]*$`)

// vlDuration is VictoriaLogs' retention syntax with its unit required (a bare number
// would be months); vlSize its byte sizes.
var (
	vlDuration = regexp.MustCompile(`^([0-9]{1,6})(h|d|w|M|y)$`)
	vlSize     = regexp.MustCompile(`^[1-9][0-9]{0,15}(KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$`)
)

// validateLogs checks monitoring.logs when the log store runs.
func (m *Monitoring) validateLogs(p *problems) {
	if !m.LogsEnabled() {
		return
	}
	l := m.Logs
	if v := vlDuration.FindStringSubmatch(l.RetentionPeriod); v == nil {
		p.add("monitoring.logs.retentionPeriod", "%q is not a retention period: a number and one of h, d, w, M (months), y, such as 30d", l.RetentionPeriod)
	} else if n, _ := strconv.Atoi(v[1]); n == 0 || v[2] == "h" && n < 24 {
		p.add("monitoring.logs.retentionPeriod", "%q is under a day, the least VictoriaLogs keeps: write 1d or more", l.RetentionPeriod)
	}
	if !vlSize.MatchString(l.MaxDiskSpaceUsage) {
		p.add("monitoring.logs.maxDiskSpaceUsage", "%q is not a size: a positive number and one of KB, MB, GB, TB, KiB, MiB, GiB, TiB, such as 50GiB", l.MaxDiskSpaceUsage)
	}
	if a, err := netip.ParseAddr(l.Gateway.ListenAddress); err != nil || !a.Is4() && !a.Is6() {
		p.add("monitoring.logs.gateway.listenAddress", "%q is not an IP address (the address nodes reach; 0.0.0.0 listens on all)", l.Gateway.ListenAddress)
	}
	if b := l.Gateway.MaxRequestBytes; b < 64<<10 || b > 256<<20 {
		p.add("monitoring.logs.gateway.maxRequestBytes", "%d is not between 65536 (64 KiB, a line's most) and 268435456 (256 MiB)", b)
	}
	g := l.Gateway
	if g.MaxConcurrentRequests < 1 || g.MaxConcurrentRequests > 256 {
		p.add("monitoring.logs.gateway.maxConcurrentRequests", "%d is not between 1 and 256", g.MaxConcurrentRequests)
	}
	if g.MaxRequestsPerNode < 1 || g.MaxRequestsPerNode > g.MaxConcurrentRequests {
		p.add("monitoring.logs.gateway.maxRequestsPerNode", "%d is not between 1 and maxConcurrentRequests (%d)", g.MaxRequestsPerNode, g.MaxConcurrentRequests)
	}
}

var hostPortName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[0-9]{1,5}$`)

// SiteRuleName is the name a site rule file (monitoring.prometheus.ruleFiles) gets in
// DIR/monitoring/rules: site-BASE.yaml, BASE its name without .yaml or .yml, so that
// the rule_files glob (*.yaml) loads it and no shipped file is overwritten.
func SiteRuleName(path string) string {
	base := filepath.Base(path)
	base = strings.TrimSuffix(strings.TrimSuffix(base, ".yaml"), ".yml")
	return "site-" + base + ".yaml"
}
