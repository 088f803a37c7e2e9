package graphs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/admin/admintest"
	"github.com/gpurack/gpurack/test/promtest"
	"github.com/gpurack/gpurack/test/rigimage"
)

// client bounds every request the test makes itself.
var client = &http.Client{Timeout: 10 * time.Second}

// artifactDir is where the test keeps its screenshots and DOMs:
// $GPURACK_TEST_ARTIFACTS/test-graphs/<test> when set, else the test's temporary
// directory.
func artifactDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("GPURACK_TEST_ARTIFACTS")
	if root == "" {
		return t.TempDir()
	}
	dir := filepath.Join(root, "test-graphs", t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// pinned returns the path of a binary `make k8s-bins` builds, or stops t (a failure
// with GPURACK_K8S_REQUIRED=1).
func pinned(t *testing.T, name string) string {
	t.Helper()
	p, err := components.FindBinary(components.BinDir(""), name)
	if err != nil {
		testreq.Missing(t, err.Error(), "run make k8s-bins", testcluster.RequiredEnv)
	}
	return p
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// kubelet stands in for a node's kubelet where gpuagent reads it: the pod-resources
// API on <kubelet dir>/pod-resources/kubelet.sock, answering List with the
// containers the test gave GPUs to.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods []*podresourcesapi.PodResources
}

func startKubelet(t *testing.T, kubeletDir string) *kubelet {
	t.Helper()
	sock := filepath.Join(kubeletDir, "pod-resources", "kubelet.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{}
	gs := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(gs, k)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return k
}

func (k *kubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return &podresourcesapi.ListPodResourcesResponse{PodResources: k.pods}, nil
}

// allocate gives GPUs (UUIDs) to one container of pod in namespace, as kubelet's
// device manager would.
func (k *kubelet) allocate(namespace, pod string, uuids ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = append(k.pods, &podresourcesapi.PodResources{Name: pod, Namespace: namespace, Containers: []*podresourcesapi.ContainerResources{{
		Name: "main", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: uuids}}}}})
}

// simNode is a gpuagent on the GPU simulator (8 simulated H100s) with its /metrics on
// addr, and the stand-in kubelet it reads allocations from. Its /metrics is plain HTTP
// (--metrics-plaintext): this test is about the graphs, and test/monitoring scrapes
// the agents with the scrape credential.
type simNode struct {
	name, addr string
	kubelet    *kubelet
}

func buildAgent(t *testing.T) string { return promtest.BuildAgent(t, t.TempDir()) }

func startNode(t *testing.T, bin, dir, name string) *simNode {
	t.Helper()
	state := filepath.Join(dir, name)
	n := &simNode{name: name, addr: freeAddr(t), kubelet: startKubelet(t, filepath.Join(state, "kubelet"))}
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--gpu-backend", "sim:dgxh100", "--profile", filepath.Join(rigimage.RepoRoot(t), "profiles", "debian12-nvidia535.yaml"),
		"--listen", "", "--metrics-listen", n.addr, "--metrics-plaintext", "--socket", filepath.Join(state, "agent.sock"), "--node-name", name,
		"--key-dir", filepath.Join(state, "key"), "--kubelet-dir", filepath.Join(state, "kubelet"),
		"--cdi-dir", filepath.Join(state, "cdi"), "--gossip-bind", "127.0.0.1:0",
		"--kmsg", "off", "--interval", "1s", "--sim-seed", name)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	return n
}

var gpuUUID = regexp.MustCompile(`^gpurack_gpu_utilization_percent\{.*\bUUID="([^"]+)".*\bgpu="(\d+)"`)

// uuids reads the node's GPUs (index → UUID) from its agent's /metrics, waiting for
// the agent to serve them.
func (n *simNode) uuids(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	eventually(t, 30*time.Second, n.name+"'s gpuagent serving its GPUs' metrics", func() error {
		resp, err := client.Get("http://" + n.addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		for _, line := range strings.Split(string(body), "\n") {
			if m := gpuUUID.FindStringSubmatch(line); m != nil {
				out[m[2]] = m[1]
			}
		}
		if len(out) != 8 {
			return fmt.Errorf("%d GPUs in /metrics", len(out))
		}
		return nil
	})
	return out
}

// eventually is promtest.Eventually.
var eventually = promtest.Eventually

// tenantsTarget serves what `controlplane-bootstrap tenants status --textfile` writes
// (tenants.Registry, the same code) as a scrape target, standing in for node_exporter's
// textfile collector.
func tenantsTarget(t *testing.T, us []tenants.Usage) string {
	srv := httptest.NewServer(promhttp.HandlerFor(tenants.Registry(us), promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// startPrometheus runs the real Prometheus, scraping every second: each node's
// gpuagent as job gpuagent with its node label (what the Kubernetes discovery's
// relabelling gives in production), the tenants' series, and evaluating the shipped
// tenant recording rules. It returns Prometheus' base URL once it is ready.
func startPrometheus(t *testing.T, bin, dir string, nodes []*simNode, tenantsAddr string) string {
	t.Helper()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\nrule_files: [%q]\nscrape_configs:\n",
		filepath.Join(rigimage.RepoRoot(t), "docs", "monitoring", "gpurack-tenants.yaml"))
	cfg.WriteString("  - job_name: gpuagent\n    static_configs:\n")
	for _, n := range nodes {
		fmt.Fprintf(&cfg, "      - {targets: [%q], labels: {node: %q}}\n", n.addr, n.name)
	}
	fmt.Fprintf(&cfg, "  - job_name: tenants\n    static_configs: [{targets: [%q]}]\n", tenantsAddr)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	base := "http://" + addr
	eventually(t, 30*time.Second, "Prometheus ready (see "+log.Name()+")", func() error {
		resp, err := client.Get(base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	})
	return base
}

// samples is how many samples the instant query q's first series has (q is a
// count_over_time), 0 when it has none.
func samples(base, q string) (int, error) {
	resp, err := client.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	m := regexp.MustCompile(`"value":\[[0-9.]+,"([0-9.]+)"\]`).FindSubmatch(body)
	if m == nil {
		return 0, nil
	}
	n, err := strconv.ParseFloat(string(m[1]), 64)
	return int(n), err
}

// gpuboot is gpuboot's operator surface (pxe/admin over the enrollment service and a
// bbolt inventory, with metrics.prometheusURL set) on a loopback HTTPS port that asks
// for client certificates of the gpurack CA, as gpuboot's TLS port does. The machines
// are approved as nodes.
type gpuboot struct {
	url    string
	ca     *x509.Certificate
	token  string // a viewer's bearer token (gpuboot certs operator NAME --token)
	viewer tls.Certificate
}

func startGpuboot(t *testing.T, promURL string, nodes ...string) *gpuboot {
	t.Helper()
	var token string
	a := admintest.Start(t, func(dir string, c *admin.Config) {
		var line string
		var err error
		if token, line, err = admin.NewToken("val", time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		tokensPath := filepath.Join(dir, "operator-tokens")
		if err := os.WriteFile(tokensPath, []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		if c.Tokens, err = admin.LoadTokens(tokensPath); err != nil {
			t.Fatal(err)
		}
		c.PrometheusURL = promURL
	}, nodes...)
	viewer, err := pki.IssueOperatorLevel(a.CA, "vera", pki.LevelViewer)
	if err != nil {
		t.Fatal(err)
	}
	return &gpuboot{url: a.URL, ca: a.CA.Cert, token: token, viewer: viewer.TLSCertificate()}
}

// pool is admintest.Pool.
var pool = admintest.Pool

// tokenProxy is a plain-HTTP loopback front for gpuboot's TLS port that adds the
// viewer's "Authorization: Bearer TOKEN" to each request: Chromium's command line can
// neither present a client certificate nor set a header, and this is the credential a
// browser-less operator uses. gpuboot's own check still decides every request.
func (g *gpuboot) tokenProxy(t *testing.T) string {
	target, _ := url.Parse(g.url)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
			r.Out.Header.Set("Authorization", "Bearer "+g.token)
		},
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(g.ca)}},
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}
