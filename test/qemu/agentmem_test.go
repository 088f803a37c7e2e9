//go:build linux

package qemu

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// agentMemory samples a node's gpuagent from the outside while the tests use the
// node: every interval it scrapes the agent's /metrics (:9410, from inside the rack's
// namespace) and keeps the process's resident set (process_resident_memory_bytes,
// VmRSS) and the Go heap in use. The node is what the issue calls node-like because it
// is a node: every service on (enrollment, heartbeats, gossip, the kmsg watch, the pod
// network, kube-proxy, NetworkPolicy, the device plugin serving the real kubelet),
// with the tests' pods, XIDs and restarts happening to it.
type agentMemory struct {
	url      string
	client   *http.Client
	interval time.Duration
	stop     context.CancelFunc
	done     chan struct{}

	mu      sync.Mutex
	start   time.Time
	rss     []float64 // bytes
	heap    []float64 // bytes
	failed  int
	lastErr error
}

// startAgentMemory starts sampling the agent at ip every interval until stop, over
// TLS with the metrics server's certificate in the cluster directory cpDir (the
// agent's /metrics answers no one else, decision 0693).
func startAgentMemory(ctx context.Context, ns, ip, cpDir string, interval time.Duration) (*agentMemory, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(cpDir, "pki", "monitoring-client.crt"), filepath.Join(cpDir, "pki", "monitoring-client.key"))
	if err != nil {
		return nil, fmt.Errorf("the metrics server's certificate, to scrape the agent: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &agentMemory{
		url: fmt.Sprintf("https://%s:9410/metrics", ip),
		client: &http.Client{Transport: &http.Transport{DialContext: nsDial(ns),
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}, Timeout: interval},
		interval: interval, stop: cancel, done: make(chan struct{}), start: time.Now(),
	}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			m.sample(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m, nil
}

func (m *agentMemory) sample(ctx context.Context) {
	values, err := scrapeGauges(ctx, m.client, m.url, "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes")
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			m.failed++
			m.lastErr = err
		}
		return
	}
	m.rss = append(m.rss, values[0])
	m.heap = append(m.heap, values[1])
}

// finish stops the sampling and says what it saw: how many samples over how long,
// and the median and maximum of each figure. It is an error when fewer than minimum
// samples came back or more than a tenth of the scrapes failed.
func (m *agentMemory) finish(minimum int) (string, error) {
	m.stop()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.rss)
	summary := fmt.Sprintf("%d samples every %s over %s (%d scrapes failed): VmRSS median %s, max %s; Go heap in use median %s, max %s",
		n, m.interval, time.Since(m.start).Round(time.Second), m.failed, mibOf(median(m.rss)), mibOf(slices.Max(append([]float64{0}, m.rss...))),
		mibOf(median(m.heap)), mibOf(slices.Max(append([]float64{0}, m.heap...))))
	if n < minimum || m.failed*10 > n+m.failed {
		return summary, fmt.Errorf("too few samples of the agent's memory: %s; last error: %v", summary, m.lastErr)
	}
	return summary, nil
}

// scrapeGauges reads the named samples (without labels) from a Prometheus text
// exposition at url, in the order asked; each must be present.
func scrapeGauges(ctx context.Context, c *http.Client, url string, names ...string) ([]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	found := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s %q: %w", url, name, value, err)
		}
		found[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]float64, len(names))
	for i, n := range names {
		v, ok := found[n]
		if !ok {
			return nil, fmt.Errorf("%s has no %s", url, n)
		}
		out[i] = v
	}
	return out, nil
}

func mibOf(bytes float64) string { return fmt.Sprintf("%.1f MiB", bytes/(1<<20)) }

// agentMappings is the node's gpuagent's memory by mapping (probe mem, in a
// privileged pod in the node's PID namespace).
func agentMappings(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node) string {
	t.Helper()
	pod := probePod(node, "agent-memory", "mem", "gpuagent")
	privileged, root := true, int64(0)
	pod.Spec.HostPID = true
	pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root}
	p, err := runPodToEnd(ctx, admin, pod, 2*time.Minute)
	if err != nil {
		t.Fatalf("probe mem gpuagent on %s: %v\n%s", node.Name, err, terminationMessage(p))
	}
	return terminationMessage(p)
}

// TestScrapeGauges reads the sampler's figures from a real Prometheus exposition
// (client_golang's handler with the process and Go collectors, as the agent serves
// them), and refuses an exposition that lacks one.
func TestScrapeGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got, err := scrapeGauges(t.Context(), srv.Client(), srv.URL, "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes")
	if err != nil {
		t.Fatal(err)
	}
	if got[0] < 1<<20 || got[1] < 1<<10 {
		t.Errorf("resident %v bytes, heap in use %v bytes: not this process's", got[0], got[1])
	}
	if _, err := scrapeGauges(t.Context(), srv.Client(), srv.URL, "no_such_metric"); err == nil || !strings.Contains(err.Error(), "no_such_metric") {
		t.Errorf("a missing metric: %v", err)
	}
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median(3,1,2) = %v", m)
	}
}
