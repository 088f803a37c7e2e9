//go:build linux

// Package apiha tests a node through the death of one of its API servers (issue 31,
// part 4): a real kubelet and containerd (hostnode) reach two real kube-apiservers,
// over one etcd, through the node's API load balancer (agent/apilb).
package apiha

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/hostnode"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// TestNodeThroughAPIServerDeath: the node's kubelet reaches API servers A (the
// cluster's) and B (a second kube-apiserver over the same etcd and certificates)
// through the load balancer, B first. Once kubelet holds a connection through B, B is
// frozen (SIGSTOP): its sockets stay open and unanswered, as when a host drops off the
// network, so nothing but the balancer ends kubelet's connections through it. The
// balancer's check times out, it closes those connections, kubelet reconnects through
// A, and the node's Lease goes on being renewed, the Node stays Ready, its pod keeps
// running, and a pod created after B's death runs. The time from the freeze to the
// first Lease renewal after it is logged.
func TestNodeThroughAPIServerDeath(t *testing.T) {
	hostnode.Require(t)
	c := testcluster.New(t)
	cs := c.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	b := startSecondAPIServer(t, ctx, c)
	a := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Config.APIServer.Port))
	hn := hostnode.Start(t, c, hostnode.Options{Name: "apiha-node", APIServers: []string{b.addr, a}})
	hn.WaitReady(t, ctx)
	before := runPod(t, ctx, cs, hn, "before")

	waitFor(t, ctx, 2*time.Minute, "kubelet holding a connection through B", func() (bool, string) {
		st := hn.APILB.Status()
		return st[0].Active > 0, fmt.Sprintf("%+v", st)
	})
	lease0 := renewTime(ctx, cs, hn.Name)
	held := hn.APILB.Status()[0].Active
	killed := time.Now()
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, 30*time.Second, "B unhealthy in the balancer, its connections closed", func() (bool, string) {
		st := hn.APILB.Status()
		return !st[0].Healthy && st[0].Active == 0, fmt.Sprintf("%+v", st)
	})
	var renewed time.Time
	waitFor(t, ctx, 90*time.Second, "the node's Lease renewed after B's death", func() (bool, string) {
		r := renewTime(ctx, cs, hn.Name)
		if r.After(lease0) && r.After(killed) {
			renewed = r
			return true, ""
		}
		return false, fmt.Sprintf("renewTime %v (before the kill: %v)", r, lease0)
	})
	// kubelet renews its Lease every 10 s (a quarter of 40 s): two more after the first.
	waitFor(t, ctx, 60*time.Second, "two more Lease renewals through A", func() (bool, string) {
		r := renewTime(ctx, cs, hn.Name)
		return r.Sub(renewed) >= 15*time.Second, fmt.Sprintf("renewTime %v, first after the kill %v", r, renewed)
	})
	st := hn.APILB.Status()
	if st[1].Active == 0 {
		t.Errorf("no connection through A after B's death: %+v", st)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, hn.Name, metav1.GetOptions{})
	if err != nil || !hostnode.Ready(node) {
		t.Errorf("node %s after B's death: Ready=%v (%v)", hn.Name, err == nil && hostnode.Ready(node), err)
	}
	if p, err := cs.CoreV1().Pods("default").Get(ctx, before, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod %s after B's death: %v", before, err)
	}
	runPod(t, ctx, cs, hn, "after")
	t.Logf("figure: B (a kube-apiserver) frozen with %d of kubelet's connections through it; the balancer closed them and kubelet's Lease was renewed through A %s after the freeze (kubelet renews every 10 s; checks every 1 s with a 1 s limit; host kubelet, 2 API servers over one etcd on loopback)",
		held, renewed.Sub(killed).Round(100*time.Millisecond))
}

// apiServer is a kube-apiserver process the test started.
type apiServer struct {
	addr string
	cmd  *exec.Cmd
}

// startSecondAPIServer starts a second kube-apiserver for c, with c's flags (so the
// same etcd, certificates and keys) but its own port and audit log, and waits until it
// is ready. It is killed when t ends.
func startSecondAPIServer(t *testing.T, ctx context.Context, c *testcluster.Cluster) *apiServer {
	t.Helper()
	ports, err := testcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := *c.Config
	cfg.APIServer.Port = ports[0]
	cfg.APIServer.ExtraArgs = maps.Clone(c.Config.APIServer.ExtraArgs)
	if cfg.APIServer.ExtraArgs == nil {
		cfg.APIServer.ExtraArgs = map[string]string{}
	}
	cfg.APIServer.ExtraArgs["audit-log-path"] = filepath.Join(t.TempDir(), "audit-b.log")
	spec, ok := components.Spec(&cfg, components.Layout{Dir: c.Dir}, components.APIServer)
	if !ok {
		t.Fatal("no kube-apiserver in the control plane's components")
	}
	bin, err := components.FindBinary(components.BinDir(""), components.APIServer)
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "apiserver-b.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, spec.Args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	s := &apiServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), cmd: cmd}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CAPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	waitFor(t, ctx, 2*time.Minute, "the second kube-apiserver ready", func() (bool, string) {
		resp, err := client.Get("https://" + s.addr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return s
}

// runPod runs a pause pod on the node and waits for it to run; it returns its name.
func runPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, hn *hostnode.Node, name string) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: hn.Name, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "pause", Image: hn.PauseImage, ImagePullPolicy: corev1.PullNever}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	waitFor(t, ctx, 2*time.Minute, "pod "+name+" running", func() (bool, string) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
	return name
}

// renewTime is the node's Lease's renewTime, zero when it cannot be read.
func renewTime(ctx context.Context, cs kubernetes.Interface, node string) time.Time {
	var l *coordinationv1.Lease
	l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}

// waitFor polls cond every 250 ms until it holds, or fails t after limit with what
// cond last said.
func waitFor(t *testing.T, ctx context.Context, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited %s for %s: %s", limit, what, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
