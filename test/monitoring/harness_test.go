package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/agent/nodeexporter"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/test/promtest"
	"github.com/gpurack/gpurack/test/rigimage"
)

// The shared helpers, under the names this package's tests use.
var (
	eventually = promtest.Eventually
	getJSON    = promtest.GetJSON
	query      = promtest.Query
)

func buildAgent(t *testing.T, dir string) string { return promtest.BuildAgent(t, dir) }

// webhook is an Alertmanager webhook receiver: it keeps every notification with the
// time it arrived.
type webhook struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []received
}

type received struct {
	at time.Time
	n  notification
}

// notification is Alertmanager's webhook payload, as much as the test reads.
type notification struct {
	Receiver string `json:"receiver"`
	Status   string `json:"status"`
	Alerts   []struct {
		Status      string            `json:"status"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"alerts"`
}

func newWebhook(t *testing.T) *webhook {
	w := &webhook{}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var n notification
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&n); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		w.mu.Lock()
		w.got = append(w.got, received{time.Now(), n})
		w.mu.Unlock()
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// firing returns the first notification that carries a firing alert named name, and
// when it arrived.
func (w *webhook) firing(name string) (received, int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.got {
		for i, a := range r.n.Alerts {
			if a.Status == "firing" && a.Labels["alertname"] == name {
				return r, i, true
			}
		}
	}
	return received{}, 0, false
}

// simAgent is a gpuagent on the GPU simulator, its /metrics on addr; a Node object
// whose InternalIP is addr's host stands in for the kubelet that would register it.
type simAgent struct {
	node, addr, socket string
	cmd                *exec.Cmd
}

// loopbackPrefix picks a 127.X.0.0/16 whose first n hosts (127.X.H/256.H%256+1) have a
// port free on each, so that every simulated node's agent listens on the one port the
// scrape configuration names. host(prefix, i) names the i-th.
func loopbackPrefix(t *testing.T, n int) (string, int) {
	for range 50 {
		prefix := fmt.Sprintf("127.%d.", 100+rand.IntN(100))
		if port, ok := portFreeOn(prefix, n); ok {
			return prefix, port
		}
	}
	t.Fatal("no free loopback addresses for the simulated nodes' agents")
	return "", 0
}

// portFreeOn picks a port free on the first n hosts under prefix.
func portFreeOn(prefix string, n int) (int, bool) {
	for range 20 {
		port := 20000 + rand.IntN(20000)
		ok := true
		for i := range n {
			l, err := net.Listen("tcp", net.JoinHostPort(host(prefix, i), strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return port, true
		}
	}
	return 0, false
}

// writeCA writes the cluster CA for the agents' --metrics-client-ca (they do not join,
// so no JoinBundle brings it) and returns its path.
func writeCA(t *testing.T, dir string, caPEM []byte) string {
	path := filepath.Join(dir, "cluster-ca.crt")
	if err := os.WriteFile(path, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startNodeExporter runs the real node_exporter (make k8s-bins) on ip:port as a node's
// gpuagent would start it after the join: with the web configuration
// agent/nodeexporter writes (TLS; a client certificate of the cluster CA with the
// metrics server's SAN required). Two collectors keep it light beside the rest.
func startNodeExporter(t *testing.T, dir, node, ip string, port int, caPEM []byte) {
	bin, err := components.FindBinary(components.BinDir(""), "node_exporter")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := metricsauth.ServingCert(node, []string{node}, []net.IP{net.ParseIP(ip)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	files := filepath.Join(dir, node, "node-exporter")
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	if err := nodeexporter.Write(files, nodeexporter.Files{ClusterCAPEM: caPEM, Serving: serving,
		AllowedSANs: []string{metricsauth.MonitoringSAN}, Listen: addr}); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, node+"-node_exporter.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--web.config.file="+filepath.Join(files, nodeexporter.WebConfigFile), "--web.listen-address="+addr,
		"--collector.disable-defaults", "--collector.filesystem", "--collector.meminfo")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
}

// host is the i-th simulated node's address under prefix.
func host(prefix string, i int) string { return fmt.Sprintf("%s%d.%d", prefix, i/250, i%250+1) }

// startAgent starts a simulated node's gpuagent and registers its Node. Its /metrics
// answers the cluster CA's monitoring certificate (caFile, --metrics-client-ca).
func startAgent(t *testing.T, bin, dir, node, ip string, port int, interval time.Duration, cs kubernetes.Interface, caFile string) *simAgent {
	a := &simAgent{node: node, addr: net.JoinHostPort(ip, strconv.Itoa(port))}
	state := filepath.Join(dir, node)
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	a.socket = filepath.Join(state, "agent.sock")
	profile := filepath.Join(rigimage.RepoRoot(t), "profiles", "debian12-nvidia535.yaml")
	log, err := os.Create(filepath.Join(dir, node+".log"))
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(bin, "run", "--gpu-backend", "sim:dgxh100", "--profile", profile,
		"--listen", "", "--metrics-listen", a.addr, "--metrics-client-ca", caFile, "--socket", a.socket, "--node-name", node,
		"--key-dir", filepath.Join(state, "key"), "--kubelet-dir", filepath.Join(state, "kubelet"),
		"--cdi-dir", filepath.Join(state, "cdi"), "--gossip-bind", net.JoinHostPort(ip, "0"),
		"--kmsg", "off", "--interval", interval.String(), "--sim-seed", node)
	a.cmd.Stdout, a.cmd.Stderr = log, log
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.kill(); log.Close() })
	registerNode(t, cs, node, ip)
	return a
}

func (a *simAgent) kill() {
	if a.cmd.Process != nil && a.cmd.ProcessState == nil {
		a.cmd.Process.Kill()
		a.cmd.Wait()
	}
}

// registerNode creates the Node object a kubelet would, with host as its InternalIP
// and labelled simulated.
func registerNode(t *testing.T, cs kubernetes.Interface, name, host string) {
	ctx := context.Background()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{"gpurack.io/simulated": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node lifecycle controller changes a new Node too (its taints): read it again
	// on a conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}, {Type: corev1.NodeHostName, Address: name}}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
