package components

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/docs/monitoring"
)

// notConfigured are the jobs docs/monitoring.md names that the default configuration
// leaves out (none: node_exporter is in every node image, decision 0693).
var notConfigured = []string{}

// promScrape is one scrape_config, as much as the tests read.
type promScrape struct {
	JobName string `yaml:"job_name"`
	Scheme  string `yaml:"scheme"`
	TLS     struct {
		CAFile             string `yaml:"ca_file"`
		CertFile           string `yaml:"cert_file"`
		KeyFile            string `yaml:"key_file"`
		InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
	} `yaml:"tls_config"`
}

// scrapeConfig is job's scrape_config in the rendered prometheus.yml.
func scrapeConfig(t *testing.T, yamlText, job string) promScrape {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []promScrape `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(yamlText), &cfg); err != nil {
		t.Fatalf("the rendered prometheus.yml is not YAML: %v\n%s", err, yamlText)
	}
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName == job {
			return sc
		}
	}
	t.Fatalf("no job %s in prometheus.yml:\n%s", job, yamlText)
	return promScrape{}
}

func scrapeJobs(t *testing.T, yamlText string) map[string]bool {
	t.Helper()
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(yamlText), &cfg); err != nil {
		t.Fatalf("the rendered prometheus.yml is not YAML: %v\n%s", err, yamlText)
	}
	jobs := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		if jobs[sc.JobName] {
			t.Errorf("job %s twice", sc.JobName)
		}
		jobs[sc.JobName] = true
	}
	return jobs
}

// TestPrometheusConfigJobs: the rendered configuration has the jobs the rules select
// on, under the names docs/monitoring.md gives; node_exporter's unless its port is -1,
// gpuboot's only with targets, over TLS with its metrics-reader credential unless
// plainHTTP.
func TestPrometheusConfigJobs(t *testing.T) {
	cfg := defaultConfig(t, "monitoring:\n  enabled: true\n")
	l := Layout{Dir: "/cluster"}
	data, err := PrometheusConfig(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	jobs := scrapeJobs(t, string(data))
	want := []string{"alertmanager", "apiserver", "cadvisor", "etcd", "gpuagent", "kube-controller-manager", "kube-scheduler", "kube-state-metrics", "kubelet", "logs-gateway", "node", "prometheus", "victorialogs"}
	if got := slices.Sorted(maps.Keys(jobs)); !slices.Equal(got, want) {
		t.Errorf("jobs %v, want %v", got, want)
	}
	// The registry's job comes with the registry, on its loopback debug port.
	cfg.Registry.Enabled = true
	withRegistry, err := PrometheusConfig(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	if sc := scrapeConfig(t, string(withRegistry), "registry"); sc.Scheme != "" || !strings.Contains(string(withRegistry), "targets: ['127.0.0.1:5002']") {
		t.Errorf("job registry: %+v, want plain HTTP to 127.0.0.1:5002:\n%s", sc, withRegistry)
	}
	cfg.Registry.Enabled = false
	// Kueue's comes with the queues, over TLS to its certificate of the cluster CA.
	cfg.Queues.Enabled = true
	withQueues, err := PrometheusConfig(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	if sc := scrapeConfig(t, string(withQueues), "kueue"); sc.Scheme != "https" || !strings.Contains(string(withQueues), "targets: ['127.0.0.1:9445']") {
		t.Errorf("job kueue: %+v, want https to 127.0.0.1:9445:\n%s", sc, withQueues)
	}
	cfg.Queues.Enabled = false
	for _, must := range []string{"/cluster/monitoring/rules/*.yaml", "/cluster/pki/monitoring-client.crt", "replacement: '${1}:9410'", "replacement: '${1}:9100'", "cluster: \"gpurack\"", "targets: ['127.0.0.1:8082']"} {
		if !strings.Contains(string(data), must) {
			t.Errorf("prometheus.yml lacks %q:\n%s", must, data)
		}
	}
	// Every node job is HTTPS with the monitoring certificate (decision 0693).
	for _, job := range []string{"gpuagent", "node", "kubelet", "cadvisor"} {
		sc := scrapeConfig(t, string(data), job)
		if sc.Scheme != "https" || sc.TLS.CertFile != "/cluster/pki/monitoring-client.crt" || sc.TLS.KeyFile != "/cluster/pki/monitoring-client.key" || !sc.TLS.InsecureSkipVerify {
			t.Errorf("job %s: %+v, want https with the monitoring certificate", job, sc)
		}
	}

	cfg = defaultConfig(t, "monitoring:\n  enabled: true\n  nodeExporterPort: -1\n  gpuboot: [gpuboot.example:8443]\n"+
		"  gpubootTLS: {caFile: /etc/gpurack/prometheus/gpuboot/ca.crt, certFile: /etc/gpurack/prometheus/gpuboot/operator.crt, keyFile: /etc/gpurack/prometheus/gpuboot/operator.key}\n")
	data, err = PrometheusConfig(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	jobs = scrapeJobs(t, string(data))
	if jobs["node"] || !jobs["gpuboot"] || !strings.Contains(string(data), "'gpuboot.example:8443'") {
		t.Errorf("without node_exporter, with gpuboot: %v", slices.Sorted(maps.Keys(jobs)))
	}
	if sc := scrapeConfig(t, string(data), "gpuboot"); sc.Scheme != "https" || sc.TLS.CAFile != "/etc/gpurack/prometheus/gpuboot/ca.crt" ||
		sc.TLS.CertFile != "/etc/gpurack/prometheus/gpuboot/operator.crt" || sc.TLS.KeyFile != "/etc/gpurack/prometheus/gpuboot/operator.key" || sc.TLS.InsecureSkipVerify {
		t.Errorf("gpuboot job %+v, want https verifying gpuboot with its CA, with the metrics-reader certificate", sc)
	}
	cfg = defaultConfig(t, "monitoring:\n  enabled: true\n  gpuboot: [gpuboot.example:8080]\n  gpubootTLS: {plainHTTP: true}\n")
	if data, err = PrometheusConfig(cfg, l); err != nil {
		t.Fatal(err)
	}
	if sc := scrapeConfig(t, string(data), "gpuboot"); sc.Scheme != "" || sc.TLS.CertFile != "" {
		t.Errorf("gpuboot job with plainHTTP: %+v", sc)
	}
	// The rules' jobs, against the default node job and a gpuboot target.
	jobs = scrapeJobs(t, string(data))
	// Every job an alert selects is configured, or one of those not built yet.
	jobRef := regexp.MustCompile(`job=~?"([^"]+)"`)
	for _, f := range monitoring.RuleFiles {
		rules, err := monitoring.Rules.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range jobRef.FindAllStringSubmatch(string(rules), -1) {
			for _, j := range strings.Split(strings.ReplaceAll(m[1], `\\|`, "|"), "|") {
				if !jobs[j] && !slices.Contains(notConfigured, j) {
					t.Errorf("%s selects job %q, which prometheus.yml does not scrape", f, j)
				}
			}
		}
	}
}

// TestMonitoringSpecs: off, no monitoring component; on, Alertmanager, kube-state-metrics,
// the log store then Prometheus after the four, on the configured address, Prometheus' lifecycle
// switch last, kube-state-metrics on its kubeconfig with only the kinds its role lists.
func TestMonitoringSpecs(t *testing.T) {
	l := Layout{Dir: "/cluster"}
	if specs := Specs(defaultConfig(t, ""), l); len(specs) != 4 {
		t.Fatalf("monitoring off: %d components", len(specs))
	}
	specs := Specs(defaultConfig(t, "monitoring:\n  enabled: true\n  prometheus:\n    retentionSize: 5GB\n"), l)
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	want := slices.DeleteFunc(slices.Clone(AllNames[:len(AllNames)-3]), func(n string) bool { return n == VIP })
	if !slices.Equal(names, want) {
		t.Fatalf("components %v, want %v (all but %s, %s, %s and %s, which apiServer.vip, queues.enabled and registry.enabled add)", names, want, VIP, Kueue, Registry, RegistryAuth)
	}
	prom := specs[len(specs)-1]
	if prom.HealthURL != "http://127.0.0.1:9090/-/ready" || prom.Args[len(prom.Args)-1] != "--web.enable-lifecycle" ||
		!slices.Contains(prom.Args, "--storage.tsdb.retention.size=5GB") || !slices.Contains(prom.Args, "--storage.tsdb.path=/cluster/monitoring/prometheus") {
		t.Errorf("prometheus: %+v", prom)
	}
	if am := specs[4]; !slices.Contains(am.Args, "--cluster.listen-address=") || am.HealthText != "OK" {
		t.Errorf("alertmanager: %+v", am)
	}
	ksm := specs[5]
	wantArgs := []string{"--host=127.0.0.1", "--kubeconfig=/cluster/kube-state-metrics.conf", "--port=8082",
		"--resources=namespaces,nodes,persistentvolumeclaims,pods,resourcequotas", "--telemetry-host=127.0.0.1", "--telemetry-port=8083"}
	if !slices.Equal(ksm.Args, wantArgs) || ksm.HealthURL != "http://127.0.0.1:8082/healthz" || ksm.HealthText != "OK" || len(ksm.Ports) != 2 {
		t.Errorf("kube-state-metrics: %+v, want args %v", ksm, wantArgs)
	}
	if got := Using(specs, []string{"/cluster/kube-state-metrics.conf"}); !slices.Equal(got, []string{KubeStateMetrics}) {
		t.Errorf("renewing kube-state-metrics.conf restarts %v, want kube-state-metrics", got)
	}
}

// TestKueueSpec: queues on adds Kueue last, on loopback, its kubeconfig and certificate
// folder named in its flags (so renewing either restarts it), and a configuration with
// its certificate management, leader election and the visibility server off.
func TestKueueSpec(t *testing.T) {
	l := Layout{Dir: "/cluster"}
	cfg := defaultConfig(t, "queues:\n  enabled: true\n  webhookPort: 9543\n")
	specs := Specs(cfg, l)
	k := specs[len(specs)-1]
	if k.Name != Kueue || k.HealthURL != "http://127.0.0.1:9444/readyz" || len(k.Ports) != 3 {
		t.Fatalf("kueue spec: %+v", k)
	}
	if got := Using(specs, []string{"/cluster/kueue.conf"}); !slices.Equal(got, []string{Kueue}) {
		t.Errorf("renewing kueue.conf restarts %v", got)
	}
	if got := Using(specs, []string{"/cluster/pki/kueue/tls.crt"}); !slices.Equal(got, []string{Kueue}) {
		t.Errorf("renewing kueue's serving certificate restarts %v", got)
	}
	data, err := KueueConfig(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"port: 9543", `certDir: "/cluster/pki/kueue"`, "leaderElect: false", "enable: false",
		"manageJobsWithoutQueueName: false", "VisibilityOnDemand: false", `bindAddress: "127.0.0.1:9445"`, "- batch/job"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("kueue-config.yaml lacks %q:\n%s", want, data)
		}
	}
}
