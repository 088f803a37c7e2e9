package clusterconfig

import (
	"os"
	"strings"
	"testing"
)

func TestParseEmptyGivesDefaults(t *testing.T) {
	cfg, err := Parse("cluster.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	d.applyDefaults()
	if cfg.APIServer.Endpoint != "127.0.0.1:6443" || cfg.Etcd.ClientPort != 2379 || cfg.NodeName != d.NodeName {
		t.Errorf("defaults: %+v", cfg)
	}
	if !cfg.LoopbackAdvertised() {
		t.Error("the default advertises loopback")
	}
	if got := cfg.ServiceIP().String(); got != "10.96.0.1" {
		t.Errorf("service IP %s", got)
	}
}

func TestParseExampleFile(t *testing.T) {
	data, err := os.ReadFile("../../docs/examples/cluster.yaml")
	if err != nil {
		t.Fatalf("the shipped example docs/examples/cluster.yaml is gone or unreadable: %v", err)
	}
	if _, err := Parse("docs/examples/cluster.yaml", data); err != nil {
		t.Fatalf("the shipped example does not parse:\n%v", err)
	}
}

func TestMarshalRoundTrips(t *testing.T) {
	cfg, err := Parse("in.yaml", []byte("apiServer:\n  port: 7443\n  extraArgs:\n    v: \"2\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("out.yaml", out)
	if err != nil {
		t.Fatalf("re-parse:\n%s\n%v", out, err)
	}
	if again.APIServer.Port != 7443 || again.APIServer.ExtraArgs["v"] != "2" || again.APIServer.Endpoint != "127.0.0.1:7443" {
		t.Errorf("round trip lost fields: %+v", again.APIServer)
	}
}

// Every bad input names the file, the line and the field.
func TestParseErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "apiServer:\n  prot: 6443\n", []string{"x.yaml:2: apiServer.prot: unknown field", "port"}},
		{"case typo", "apiserver:\n  port: 6443\n", []string{"x.yaml:1: apiserver: unknown field \"apiserver\" (did you mean \"apiServer\"?)"}},
		{"port not a number", "etcd:\n  clientPort: two\n", []string{"x.yaml:2: etcd.clientPort: expected a whole number, found \"two\""}},
		{"port out of range", "scheduler:\n  port: 70000\n", []string{"x.yaml:2: scheduler.port: 70000 is not a port"}},
		{"apiserver port out of range", "apiServer:\n  port: 99999\n", []string{"x.yaml:2: apiServer.port: 99999 is not a port"}},
		{"port clash", "etcd:\n  clientPort: 6443\n", []string{"x.yaml:2: etcd.clientPort: 6443 is also apiServer.port"}},
		{"bad CIDR", "networking:\n  serviceSubnet: 10.96.0.0/33\n", []string{"x.yaml:2: networking.serviceSubnet", "not a CIDR"}},
		{"overlap", "networking:\n  podSubnet: 10.96.0.0/16\n", []string{"x.yaml:2: networking.podSubnet", "overlaps"}},
		{"bad address", "apiServer:\n  advertiseAddress: my-host\n", []string{"x.yaml:2: apiServer.advertiseAddress: \"my-host\" is not an IP address"}},
		{"unspecified address", "apiServer:\n  advertiseAddress: 0.0.0.0\n", []string{"apiServer.advertiseAddress", "unspecified"}},
		{"bad endpoint", "apiServer:\n  endpoint: nohost\n", []string{"x.yaml:2: apiServer.endpoint", "host:port"}},
		{"bad SAN", "apiServer:\n  certSANs: [ok.example, \"bad name\"]\n", []string{"apiServer.certSANs[1]"}},
		{"wrong version", "kubernetesVersion: v1.35.0\n", []string{"x.yaml:1: kubernetesVersion", "v1.34.2"}},
		{"wrong kind", "kind: Cluster\n", []string{"x.yaml:1: kind: is \"Cluster\"; write \"ClusterConfig\""}},
		{"bad ttl", "bootstrapTokens:\n  ttl: forever\n", []string{"x.yaml:2: bootstrapTokens.ttl"}},
		{"dashed flag", "apiServer:\n  extraArgs:\n    --v: \"2\"\n", []string{"x.yaml:3: apiServer.extraArgs[--v]", "without leading dashes"}},
		{"list for string", "clusterName: [a, b]\n", []string{"x.yaml:1: clusterName: expected text, found a list"}},
		{"bad cluster name", "clusterName: My_Cluster\n", []string{"x.yaml:1: clusterName"}},
		{"not yaml", "apiServer: [\n", []string{"x.yaml:", "not valid YAML"}},
		{"two documents", "clusterName: a\n---\nclusterName: b\n", []string{"more than one YAML document"}},
		{"duplicate key", "clusterName: a\nclusterName: b\n", []string{"x.yaml:2: clusterName: field \"clusterName\" is given twice"}},
		{"alias", "clusterName: &n a\nnodeName: *n\n", []string{"x.yaml:2: nodeName: YAML aliases are not supported"}},
		{"unquoted boolean flag value", "etcd:\n  extraArgs:\n    enable-pprof: true\n", []string{"x.yaml:3: etcd.extraArgs[enable-pprof]: expected text, found the boolean true; quote it"}},
		{"list for a flag value", "etcd:\n  extraArgs:\n    v: [1, 2]\n", []string{"x.yaml:3: etcd.extraArgs[v]: expected text, found a list"}},
		{"every problem at once", "clusterName: [a]\netcd:\n  clientPort: two\n  peerPrt: 1\n", []string{"x.yaml:1: clusterName", "x.yaml:3: etcd.clientPort", "x.yaml:4: etcd.peerPrt"}},
		{"oidc http issuer", "apiServer:\n  oidc:\n    issuerURL: http://idp\n    clientID: k\n", []string{"x.yaml:3: apiServer.oidc.issuerURL", "not an https URL"}},
		{"oidc without client", "apiServer:\n  oidc:\n    issuerURL: https://idp\n", []string{"x.yaml:2: apiServer.oidc.clientID: is required"}},
		{"oidc groups without prefix", "apiServer:\n  oidc:\n    issuerURL: https://idp\n    clientID: k\n    groupsClaim: groups\n", []string{"apiServer.oidc.groupsPrefix", "system:masters"}},
		{"oidc fields without issuer", "apiServer:\n  oidc:\n    clientID: k\n", []string{"x.yaml:2: apiServer.oidc.issuerURL: is required"}},
		{"every invalid value at once", "clusterName: A\nnetworking:\n  podSubnet: x\n", []string{"x.yaml:1: clusterName", "x.yaml:3: networking.podSubnet"}},
		{"monitoring retention size", "monitoring:\n  enabled: true\n  prometheus:\n    retentionSize: 50G\n", []string{"x.yaml:4: monitoring.prometheus.retentionSize: \"50G\" is not a size"}},
		{"monitoring rule file relative", "monitoring:\n  enabled: true\n  prometheus:\n    ruleFiles: [rules/site.yaml]\n", []string{"monitoring.prometheus.ruleFiles[0]", "not an absolute path"}},
		{"monitoring rule files same name", "monitoring:\n  enabled: true\n  prometheus:\n    ruleFiles: [/a/gpu.yaml, /b/gpu.yml]\n", []string{"monitoring.prometheus.ruleFiles[1]", "same base name as /a/gpu.yaml", "rules/site-gpu.yaml"}},
		{"monitoring retention time", "monitoring:\n  enabled: true\n  prometheus:\n    retentionTime: 2 weeks\n", []string{"x.yaml:4: monitoring.prometheus.retentionTime", "not a Prometheus duration"}},
		{"monitoring scrape interval", "monitoring:\n  enabled: true\n  prometheus:\n    scrapeInterval: 0s\n", []string{"monitoring.prometheus.scrapeInterval"}},
		{"monitoring listen address", "monitoring:\n  enabled: true\n  listenAddress: localhost\n", []string{"x.yaml:3: monitoring.listenAddress", "not an IP address"}},
		{"monitoring port clash", "monitoring:\n  enabled: true\n  alertmanager:\n    port: 6443\n", []string{"x.yaml:4: monitoring.alertmanager.port: 6443 is also apiServer.port"}},
		{"kube-state-metrics port clash", "monitoring:\n  enabled: true\n  kubeStateMetrics:\n    telemetryPort: 8082\n", []string{"x.yaml:4: monitoring.kubeStateMetrics.telemetryPort: 8082 is also monitoring.kubeStateMetrics.port"}},
		{"kube-state-metrics extra flag", "monitoring:\n  enabled: true\n  kubeStateMetrics:\n    extraArgs:\n      --resources: nodes\n", []string{"monitoring.kubeStateMetrics.extraArgs[--resources]", "without leading dashes"}},
		{"monitoring gpuboot target", "monitoring:\n  enabled: true\n  gpuboot: [\"http://gpuboot:8080\"]\n", []string{"monitoring.gpuboot[0]", "HOST:PORT"}},
		{"monitoring gpuboot without its credential", "monitoring:\n  enabled: true\n  gpuboot: [gpuboot:8080]\n",
			[]string{"monitoring.gpubootTLS.caFile: is empty", "monitoring.gpubootTLS.certFile: is empty", "monitoring.gpubootTLS.keyFile: is empty", "--level metrics-reader", "plainHTTP: true"}},
		{"monitoring gpuboot relative key", "monitoring:\n  enabled: true\n  gpuboot: [gpuboot:8443]\n  gpubootTLS: {caFile: /p/ca.crt, certFile: /p/operator.crt, keyFile: operator.key}\n",
			[]string{"monitoring.gpubootTLS.keyFile", "not an absolute path"}},
		{"monitoring node exporter port", "monitoring:\n  enabled: true\n  nodeExporterPort: -2\n", []string{"x.yaml:3: monitoring.nodeExporterPort", "-1 for no node job"}},
		{"monitoring unknown field", "monitoring:\n  enabeld: true\n", []string{"x.yaml:2: monitoring.enabeld: unknown field"}},
		{"logs retention unit", "monitoring:\n  enabled: true\n  logs:\n    retentionPeriod: \"30\"\n", []string{"x.yaml:4: monitoring.logs.retentionPeriod", "a number and one of h, d"}},
		{"logs retention under a day", "monitoring:\n  enabled: true\n  logs:\n    retentionPeriod: 12h\n", []string{"monitoring.logs.retentionPeriod", "under a day"}},
		{"logs disk size", "monitoring:\n  enabled: true\n  logs:\n    maxDiskSpaceUsage: 50G\n", []string{"x.yaml:4: monitoring.logs.maxDiskSpaceUsage", "not a size"}},
		{"logs port clash", "monitoring:\n  enabled: true\n  logs:\n    port: 9090\n", []string{"monitoring.logs.port: 9090 is also monitoring.prometheus.port"}},
		{"logs gateway address", "monitoring:\n  enabled: true\n  logs:\n    gateway:\n      listenAddress: nodes\n", []string{"x.yaml:5: monitoring.logs.gateway.listenAddress", "not an IP address"}},
		{"logs gateway body bound", "monitoring:\n  enabled: true\n  logs:\n    gateway:\n      maxRequestBytes: 1024\n", []string{"monitoring.logs.gateway.maxRequestBytes"}},
		{"logs per node over all", "monitoring:\n  enabled: true\n  logs:\n    gateway:\n      maxConcurrentRequests: 2\n      maxRequestsPerNode: 3\n", []string{"monitoring.logs.gateway.maxRequestsPerNode", "maxConcurrentRequests (2)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error for:\n%s", tc.yaml)
			}
			if strings.HasPrefix(tc.name, "apiserver port") {
				if strings.Contains(err.Error(), "apiServer.endpoint") {
					t.Errorf("a bad port is reported again as the derived endpoint: %v", err)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestMonitoringGpubootCredential: gpuboot's targets with the three files, or with
// plainHTTP alone, validate; -1 turns the node job off.
func TestMonitoringGpubootCredential(t *testing.T) {
	for _, y := range []string{
		"monitoring:\n  enabled: true\n  gpuboot: [gpuboot.example:8443]\n  gpubootTLS: {caFile: /p/ca.crt, certFile: /p/operator.crt, keyFile: /p/operator.key}\n",
		"monitoring:\n  enabled: true\n  gpuboot: [gpuboot.example:8080]\n  gpubootTLS: {plainHTTP: true}\n",
		"monitoring:\n  enabled: true\n  nodeExporterPort: -1\n",
	} {
		if _, err := Parse("x.yaml", []byte(y)); err != nil {
			t.Errorf("%s: %v", y, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("apiServer:\n  port: 6443\n"))
	f.Add([]byte("networking: {podSubnet: 10.0.0.0/8}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err == nil && len(cfg.Validate()) != 0 {
			t.Fatalf("Parse accepted a config that does not validate: %+v", cfg)
		}
	})
}

// TestMonitoringOffIsNotValidated: a site that does not turn the metrics server on is
// not held to its fields; turned on, the defaults validate.
func TestMonitoringOffIsNotValidated(t *testing.T) {
	if _, err := Parse("x.yaml", []byte("monitoring:\n  prometheus:\n    retentionSize: lots\n")); err != nil {
		t.Errorf("monitoring off: %v", err)
	}
	cfg, err := Parse("x.yaml", []byte("monitoring:\n  enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Monitoring
	if m.ListenAddress != "127.0.0.1" || m.Prometheus.Port != 9090 || m.Alertmanager.Port != 9093 || m.GPUAgentPort != 9410 ||
		m.Prometheus.RetentionTime != "15d" || m.Prometheus.RetentionSize != "50GB" || m.NodeExporterPort != 9100 ||
		m.KubeStateMetrics.Port != 8082 || m.KubeStateMetrics.TelemetryPort != 8083 {
		t.Errorf("defaults: %+v", m)
	}
}

// TestAdvertiseWarning: only loopback advertised with nodes on another endpoint is
// warned about; that cluster's kubernetes Service has no endpoints for pods.
func TestAdvertiseWarning(t *testing.T) {
	for _, c := range []struct {
		yaml string
		warn bool
	}{
		{"", false}, // loopback only: nothing outside this host
		{"apiServer:\n  endpoint: 10.0.2.2:6443\n", true},
		{"apiServer:\n  endpoint: cp.example.org:6443\n", true},
		{"apiServer:\n  advertiseAddress: 10.0.2.2\n  endpoint: 10.0.2.2:6443\n", false},
		{"apiServer:\n  endpoint: localhost:6443\n", false},
	} {
		cfg, err := Parse("cluster.yaml", []byte(c.yaml))
		if err != nil {
			t.Fatal(err)
		}
		w := cfg.AdvertiseWarning()
		if (w != "") != c.warn || (c.warn && !strings.Contains(w, "set apiServer.advertiseAddress")) {
			t.Errorf("%q: AdvertiseWarning = %q, want a warning: %v", c.yaml, w, c.warn)
		}
	}
}
