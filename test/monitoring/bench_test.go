package monitoring

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestMetricsServerFigures (GPURACK_BENCH_METRICS=1, docs/bench/metrics-server.md)
// measures the metrics server init starts while it scrapes simulated nodes, each a
// gpuagent on an 8-GPU simulated DGX H100 found through its Node object: for each
// count in GPURACK_BENCH_METRICS_NODES (default "20,100"), a fresh control plane,
// that many agents, GPURACK_BENCH_METRICS_FOR (default 10m) of scraping at the shipped
// 30 s interval with the shipped rules, then Prometheus' resident memory (VmRSS, and
// its peak VmHWM), its CPU time over the window, and its head series. Figures are
// appended to GPURACK_BENCH_METRICS_FIGURES when set. The agents run on the same two
// cores, so the CPU figure is Prometheus' own time, not the machine's load.
func TestMetricsServerFigures(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_METRICS", "minutes of scraping simulated racks (docs/bench/metrics-server.md)")
	testcluster.Require(t, "prometheus", "alertmanager", "kube-state-metrics")
	window := 10 * time.Minute
	if v := os.Getenv("GPURACK_BENCH_METRICS_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("GPURACK_BENCH_METRICS_FOR=%q: %v", v, err)
		}
		window = d
	}
	counts := "20,100"
	if v := os.Getenv("GPURACK_BENCH_METRICS_NODES"); v != "" {
		counts = v
	}
	bin := buildAgent(t, t.TempDir())
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			t.Fatalf("GPURACK_BENCH_METRICS_NODES=%q: want counts of nodes, such as 20,100", counts)
		}
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			line := scrapeFigures(t, bin, n, window)
			t.Log(line)
			if f := os.Getenv("GPURACK_BENCH_METRICS_FIGURES"); f != "" {
				appendLine(t, f, line)
			}
		})
	}
}

// scrapeFigures runs one control plane with n simulated nodes for window and returns
// the figures line.
func scrapeFigures(t *testing.T, bin string, n int, window time.Duration) string {
	dir := t.TempDir()
	prefix, agentPort := loopbackPrefix(t, n)
	var promURL string
	c := testcluster.NewWith(t, testcluster.Options{Configure: func(cfg *clusterconfig.Config) {
		ports, err := testcluster.FreePorts(4)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Monitoring.Enabled = true
		cfg.Monitoring.Prometheus.Port, cfg.Monitoring.Alertmanager.Port = ports[0], ports[1]
		cfg.Monitoring.KubeStateMetrics.Port, cfg.Monitoring.KubeStateMetrics.TelemetryPort = ports[2], ports[3]
		cfg.Monitoring.GPUAgentPort = agentPort
		cfg.Monitoring.NodeExporterPort = -1 // the figures are gpuagent's
		promURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	}})
	cs := c.Clientset(t)
	caFile := writeCA(t, dir, c.CAPEM)
	for i := range n {
		startAgent(t, bin, dir, fmt.Sprintf("sim-node-%03d", i), host(prefix, i), agentPort, 10*time.Second, cs, caFile)
	}
	want := map[string]string{}
	for i := range n {
		want[fmt.Sprintf("sim-node-%03d", i)] = "1"
	}
	eventually(t, 3*time.Minute, "every agent scraped", func() error { return upByNode(promURL, "gpuagent", want) })
	pid := readPID(t, filepath.Join(c.Dir, "run", "prometheus.pid"))
	cpu0, at0 := cpuSeconds(t, pid), time.Now()
	time.Sleep(window)
	cpu1, at1 := cpuSeconds(t, pid), time.Now()
	rss, hwm := procStatus(t, pid, "VmRSS"), procStatus(t, pid, "VmHWM")
	series := scalar(t, promURL, `prometheus_tsdb_head_series`)
	perNode := scalar(t, promURL, `count({job="gpuagent"}) / count(up{job="gpuagent"})`)
	return fmt.Sprintf("%s nodes=%d gpus=%d (simulated) window=%s scrape=30s head_series=%.0f gpuagent_series_per_node=%.0f rss_mib=%.1f peak_rss_mib=%.1f cpu_s=%.2f cpu_share=%.4f",
		time.Now().UTC().Format(time.RFC3339), n, 8*n, window, series, perNode, rss/1024, hwm/1024,
		cpu1-cpu0, (cpu1-cpu0)/at1.Sub(at0).Seconds())
}

func readPID(t *testing.T, path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// cpuSeconds is the user and system time of pid (/proc/PID/stat fields 14 and 15).
func cpuSeconds(t *testing.T, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// procStatus reads a kB field of /proc/PID/status.
func procStatus(t *testing.T, pid int, field string) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func scalar(t *testing.T, promURL, q string) float64 {
	s, err := query(promURL, q)
	if err != nil || len(s) != 1 {
		t.Fatalf("%s: %v %v", q, s, err)
	}
	v, err := strconv.ParseFloat(fmt.Sprint(s[0].Value[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func appendLine(t *testing.T, path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Fatal(err)
	}
}
