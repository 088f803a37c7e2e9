package clusterconfig

import (
	"net/netip"
	"regexp"
	"strconv"
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
	// GPUAgentPort is the port of every node's gpuagent /metrics (its --metrics-listen).
	GPUAgentPort int `yaml:"gpuagentPort"`
	// NodeExporterPort is the port of node_exporter on every node; 0 (the default): not
	// scraped, since the node images do not ship node_exporter yet.
	NodeExporterPort int `yaml:"nodeExporterPort"`
	// Gpuboot lists gpuboot's HTTP addresses (HOST:PORT) whose /metrics are scraped.
	Gpuboot []string `yaml:"gpuboot"`
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
	} {
		if *f.p == 0 {
			*f.p = f.v
		}
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
	for i, g := range m.Gpuboot {
		if _, err := netip.ParseAddrPort(g); err != nil && !hostPortName.MatchString(g) {
			p.add("monitoring.gpuboot["+strconv.Itoa(i)+"]", "%q is not HOST:PORT (gpuboot's HTTP address, for example gpuboot.example:8080)", g)
		}
	}
	for _, ea := range []struct {
		field string
		m     map[string]string
	}{
		{"monitoring.prometheus.extraArgs", m.Prometheus.ExtraArgs},
		{"monitoring.alertmanager.extraArgs", m.Alertmanager.ExtraArgs},
		{"monitoring.kubeStateMetrics.extraArgs", m.KubeStateMetrics.ExtraArgs},
	} {
		for k := range ea.m {
			if !flagName.MatchString(k) && !promFlagName.MatchString(k) {
				p.add(ea.field+"["+k+"]", "%q is not a flag name: write it without leading dashes, for example storage.tsdb.wal-compression", k)
			}
		}
	}
}

// promFlagName is a Prometheus or Alertmanager flag: dotted words.
var promFlagName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)

var hostPortName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[0-9]{1,5}$`)
