package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// recorder collects Progress calls.
type recorder struct {
	mu   sync.Mutex
	msgs []string
	up   bool
}

func (r *recorder) progress(msg string, up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msg)
	r.up = up
}

func (r *recorder) seen() ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...), r.up
}

// TestRunWithNodeIdentity runs the pod network service against a real apiserver and
// kube-controller-manager with a node's own credential (TLS bootstrap, as kubelet
// does it): it waits for the Node, gets the podCIDR kube-controller-manager allocated
// and writes a conflist for it with the image's CNI plugins.
func TestRunWithNodeIdentity(t *testing.T) {
	testreq.File(t, filepath.Join(DefaultCNIBinDir, "bridge"), "install Debian's containernetworking-plugins")
	c := testcluster.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "podnet-node-1"
	dir := t.TempDir()
	cfg, kubeconfig := nodeKubeconfig(t, ctx, c, name, dir)
	rec := &recorder{}
	confDir := filepath.Join(dir, "net.d")
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	// kube-proxy's first sync, which the conflist waits for.
	services := make(chan struct{})
	servicesReady := func(ctx context.Context) error {
		select {
		case <-services:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	go func() {
		done <- Run(rctx, Config{Kubeconfig: kubeconfig, NodeName: name, CNIConfDir: confDir, Progress: rec.progress, ServicesReady: servicesReady})
	}()
	// The Node does not exist yet: the service says so and waits.
	waitUntil(t, func() bool { m, _ := rec.seen(); return len(m) > 0 }, "the first progress report")
	if m, _ := rec.seen(); m[0] != "waiting for Node "+name+" to register" {
		t.Errorf("first report %q", m[0])
	}
	// The node registers itself (kubelet would); kube-controller-manager allocates.
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubejoin.Register(ctx, nodeClient, kubejoin.NodeSpec{Name: name}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		m, _ := rec.seen()
		return strings.Contains(m[len(m)-1], "waiting for kube-proxy's Service rules")
	}, "the wait for kube-proxy")
	if _, err := os.Stat(filepath.Join(confDir, ConflistName)); !os.IsNotExist(err) {
		t.Errorf("the conflist is there before kube-proxy's rules are (%v): kubelet would report Ready too soon", err)
	}
	close(services)
	waitUntil(t, func() bool { _, up := rec.seen(); return up }, "the conflist")
	node, err := c.Clientset(t).CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ccfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	podCIDR := netip.MustParsePrefix(node.Spec.PodCIDR)
	if !netip.MustParsePrefix(ccfg.Networking.PodSubnet).Contains(podCIDR.Addr()) {
		t.Errorf("podCIDR %s outside the cluster's podSubnet %s", podCIDR, ccfg.Networking.PodSubnet)
	}
	b, err := os.ReadFile(filepath.Join(confDir, ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	var cl struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type string `json:"type"`
			IPAM struct {
				Type   string                `json:"type"`
				Ranges [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &cl); err != nil {
		t.Fatalf("conflist: %v\n%s", err, b)
	}
	if len(cl.Plugins) != 2 || cl.Plugins[0].Type != "bridge" || cl.Plugins[1].Type != "portmap" ||
		cl.Plugins[0].IPAM.Type != "host-local" || cl.Plugins[0].IPAM.Ranges[0][0]["subnet"] != podCIDR.String() {
		t.Errorf("conflist for podCIDR %s:\n%s", podCIDR, b)
	}
	for _, p := range cl.Plugins {
		if _, err := os.Stat(filepath.Join(DefaultCNIBinDir, p.Type)); err != nil {
			t.Errorf("conflist names plugin %s: %v", p.Type, err)
		}
	}
	msgs, _ := rec.seen()
	t.Logf("progress: %q", msgs)
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run after its context ended: %v", err)
	}
}

// nodeKubeconfig does a node's TLS bootstrap and writes its kubeconfig in dir, as
// kubelet's would be.
func nodeKubeconfig(t *testing.T, ctx context.Context, c *testcluster.Cluster, name, dir string) (*rest.Config, string) {
	t.Helper()
	cfg, err := kubejoin.Bootstrap(ctx, c.Server, c.CAPEM, c.JoinToken(t), name)
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "node"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return cfg, kubeconfig
}

// TestRunRefusesPodCIDROutsideThePodSubnet: a profile whose podSubnet is not the
// cluster's gets the named error that says which setting to change, before flannel
// touches the machine, and no conflist.
func TestRunRefusesPodCIDROutsideThePodSubnet(t *testing.T) {
	testreq.File(t, filepath.Join(DefaultCNIBinDir, "bridge"), "install Debian's containernetworking-plugins")
	c := testcluster.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "podnet-node-2"
	dir := t.TempDir()
	cfg, kubeconfig := nodeKubeconfig(t, ctx, c, name, dir)
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubejoin.Register(ctx, nodeClient, kubejoin.NodeSpec{Name: name}); err != nil {
		t.Fatal(err)
	}
	confDir := filepath.Join(dir, "net.d")
	// A documentation network (no cluster allocates there) that is none of this
	// machine's networks, which would be the other named error.
	hosts, err := HostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	var wrong netip.Prefix
	for _, p := range []string{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"} {
		if CheckOverlap("", netip.MustParsePrefix(p), hosts) == nil {
			wrong = netip.MustParsePrefix(p)
			break
		}
	}
	if !wrong.IsValid() {
		t.Fatalf("every documentation network overlaps one of this machine's networks %v", hosts)
	}
	err = Run(ctx, Config{Kubeconfig: kubeconfig, NodeName: name, CNIConfDir: confDir, Backend: "vxlan", PodSubnet: wrong, RunDir: filepath.Join(dir, "run")})
	var oe *OutsidePodSubnetError
	if !errors.As(err, &oe) || oe.PodSubnet != wrong || !strings.Contains(err.Error(), "kubernetes.podNetwork.podSubnet") {
		t.Fatalf("Run with podSubnet %s: %v, want OutsidePodSubnetError", wrong, err)
	}
	if _, err := os.Stat(filepath.Join(confDir, ConflistName)); err == nil {
		t.Error("a conflist was written for a refused pod network")
	}
}

func TestWaitingForPodCIDR(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	if got := waitingFor(n); got != WaitingForPodCIDR || !strings.Contains(got, "--allocate-node-cidrs") {
		t.Errorf("Node without podCIDR: %q", got)
	}
	n.Spec.PodCIDR = "10.244.3.0/24"
	if got := waitingFor(n); got != "" {
		t.Errorf("Node with podCIDR: %q", got)
	}
}

func TestCheckPlugins(t *testing.T) {
	dir := t.TempDir()
	err := CheckPlugins(dir)
	var me *MissingPluginError
	if !errors.Is(err, ErrMissingPlugin) || !errors.As(err, &me) || me.Plugin != "bridge" || !strings.Contains(err.Error(), dir) {
		t.Fatalf("empty dir: %v", err)
	}
	for _, p := range RequiredPlugins[:len(RequiredPlugins)-1] {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// loopback is there but not executable.
	if err := os.WriteFile(filepath.Join(dir, "loopback"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckPlugins(dir); !errors.As(err, &me) || me.Plugin != "loopback" {
		t.Errorf("loopback not executable: %v", err)
	}
}

func TestCheckPluginsInTheImagesDir(t *testing.T) {
	testreq.File(t, filepath.Join(DefaultCNIBinDir, "bridge"), "install Debian's containernetworking-plugins")
	if err := CheckPlugins(DefaultCNIBinDir); err != nil {
		t.Error(err)
	}
}

func TestCheckOverlap(t *testing.T) {
	hosts := []HostNetwork{{"eth0", netip.MustParsePrefix("10.0.2.0/24")}, {"eth1", netip.MustParsePrefix("192.168.50.0/24")}}
	if err := CheckOverlap("podCIDR", netip.MustParsePrefix("10.244.1.0/24"), hosts); err != nil {
		t.Errorf("disjoint: %v", err)
	}
	err := CheckOverlap("pod network", netip.MustParsePrefix("192.168.0.0/16"), hosts)
	var oe *OverlapError
	if !errors.Is(err, ErrOverlap) || !errors.As(err, &oe) || oe.Interface != "eth1" ||
		!strings.Contains(err.Error(), "networking.podSubnet") || !strings.Contains(err.Error(), "192.168.50.0/24") {
		t.Errorf("overlap: %v", err)
	}
}

func TestHostNetworksLeaveOutLoopback(t *testing.T) {
	hosts, err := HostNetworks()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		if h.Prefix.Addr().IsLoopback() || h.Prefix != h.Prefix.Masked() {
			t.Errorf("host network %v", h)
		}
	}
}

func TestConflistRejectsNoPodCIDR(t *testing.T) {
	if _, err := Conflist(netip.Prefix{}, 0, true); err == nil {
		t.Error("conflist without a podCIDR")
	}
}

func waitUntil(t *testing.T, ok func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
