package components

import (
	"slices"
	"strings"
	"testing"
)

// TestLogsSpecs: with monitoring the log store runs by default: VictoriaLogs on
// loopback with both retention bounds and its data under DIR/monitoring/logs, and the
// gateway as controlplane-bootstrap's own subcommand on the API server's bind address
// with the serving pair, the cluster CA and the bounds; monitoring.logs.enabled: false
// leaves both out; renewing the gateway's certificate restarts the gateway alone.
func TestLogsSpecs(t *testing.T) {
	l := Layout{Dir: "/cluster"}
	cfg := defaultConfig(t, "apiServer:\n  bindAddress: 0.0.0.0\n  advertiseAddress: 192.0.2.10\nmonitoring:\n  enabled: true\n  logs:\n    retentionPeriod: 14d\n    maxDiskSpaceUsage: 20GiB\n    extraArgs: {memory.allowedPercent: \"20\"}\n")
	vl, ok := Spec(cfg, l, VictoriaLogs)
	if !ok {
		t.Fatal("no victoria-logs component with monitoring on")
	}
	wantVL := []string{"--httpListenAddr=127.0.0.1:9429", "--memory.allowedPercent=20", "--retention.maxDiskSpaceUsageBytes=20GiB",
		"--retentionPeriod=14d", "--storageDataPath=/cluster/monitoring/logs"}
	if !slices.Equal(vl.Args, wantVL) || vl.HealthURL != "http://127.0.0.1:9429/health" || vl.HealthText != "OK" || vl.Self {
		t.Errorf("victoria-logs: %+v, want args %v", vl, wantVL)
	}
	gw, ok := Spec(cfg, l, LogsGateway)
	if !ok {
		t.Fatal("no logs-gateway component")
	}
	wantGW := []string{LogsGatewayCommand, "--cert-file=/cluster/pki/logs-gateway.crt", "--client-ca-file=/cluster/pki/ca.crt",
		"--key-file=/cluster/pki/logs-gateway.key", "--listen=0.0.0.0:9428", "--max-concurrent-requests=8",
		"--max-request-bytes=16777216", "--max-requests-per-node=2", "--metrics-user=gpurack:monitoring", "--upstream=http://127.0.0.1:9429"}
	if !slices.Equal(gw.Args, wantGW) || !gw.Self || gw.HealthURL != "https://127.0.0.1:9428/healthz" {
		t.Errorf("logs-gateway: %+v, want args %v", gw, wantGW)
	}
	unit := string(RenderUnit(gw, "/usr/local/bin/controlplane-bootstrap", VictoriaLogs, "/cluster"))
	if !strings.Contains(unit, "ExecStart=/usr/local/bin/controlplane-bootstrap \\\n\tlogs-gateway \\\n\t--cert-file=") ||
		!strings.Contains(unit, "After=network-online.target gpurack-victoria-logs.service") || !strings.Contains(unit, "CapabilityBoundingSet=\n") {
		t.Errorf("the gateway's unit:\n%s", unit)
	}
	specs := Specs(cfg, l)
	if got := Using(specs, []string{"/cluster/pki/logs-gateway.crt", "/cluster/pki/logs-gateway.key"}); !slices.Equal(got, []string{LogsGateway}) {
		t.Errorf("renewing logs-gateway restarts %v, want logs-gateway", got)
	}
	prom, err := PrometheusConfig(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"job_name: victorialogs", "targets: ['127.0.0.1:9429']", "job_name: logs-gateway", "targets: ['127.0.0.1:9428']"} {
		if !strings.Contains(string(prom), must) {
			t.Errorf("prometheus.yml lacks %q", must)
		}
	}

	if def, _ := Spec(defaultConfig(t, "monitoring:\n  enabled: true\n"), l, VictoriaLogs); !slices.Contains(def.Args, "--memory.allowedPercent=25") {
		t.Errorf("victoria-logs' caches are not bounded to a quarter of the host's memory by default: %v", def.Args)
	}
	off := defaultConfig(t, "monitoring:\n  enabled: true\n  logs:\n    enabled: false\n")
	for _, c := range Specs(off, l) {
		if c.Name == VictoriaLogs || c.Name == LogsGateway {
			t.Errorf("monitoring.logs.enabled false still runs %s", c.Name)
		}
	}
	if prom, _ := PrometheusConfig(off, l); strings.Contains(string(prom), "victorialogs") {
		t.Error("monitoring.logs.enabled false still scrapes victorialogs")
	}
}
