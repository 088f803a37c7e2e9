package kubejoin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// TestStartKubeProxy writes kube-proxy's configuration for real and reads it back
// strictly as kube-proxy's own KubeProxyConfiguration type: nftables mode, the node's
// name, kubelet's kubeconfig, local traffic by the node's podCIDR.
func TestStartKubeProxy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kube-proxy", "config.yaml")
	h := &fakeHost{}
	j := KubeProxyJoin{NodeName: "node-1", Kubeconfig: "/var/lib/kubelet/kubeconfig", ClusterCIDR: "10.244.0.0/16"}
	if err := StartKubeProxy(context.Background(), h, path, j); err != nil {
		t.Fatal(err)
	}
	if strings.Join(h.calls, ",") != "start kube-proxy.service" {
		t.Errorf("D-Bus calls %v", h.calls)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c kubeproxyv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("config.yaml is not a KubeProxyConfiguration: %v\n%s", err, b)
	}
	if c.Kind != "KubeProxyConfiguration" || c.APIVersion != "kubeproxy.config.k8s.io/v1alpha1" || c.Mode != "nftables" ||
		c.HostnameOverride != "node-1" || c.ClientConnection.Kubeconfig != j.Kubeconfig ||
		c.DetectLocalMode != "NodeCIDR" || c.ClusterCIDR != "10.244.0.0/16" {
		t.Errorf("config.yaml:\n%s", b)
	}
	h = &fakeHost{fail: errors.New("job failed")}
	if err := StartKubeProxy(context.Background(), h, path, j); err == nil || !strings.Contains(err.Error(), "kube-proxy.service") {
		t.Errorf("failed start: %v", err)
	}
}

func TestKubeProxyConfigRefuses(t *testing.T) {
	for _, j := range []KubeProxyJoin{{Kubeconfig: "k"}, {NodeName: "n"}, {NodeName: "n", Kubeconfig: "k", Mode: "ipvs"}} {
		if _, err := KubeProxyConfig(j); err == nil {
			t.Errorf("%+v: no error", j)
		}
	}
	b, err := KubeProxyConfig(KubeProxyJoin{NodeName: "n", Kubeconfig: "k", Mode: "iptables"})
	if err != nil || !strings.Contains(string(b), "mode: iptables") {
		t.Errorf("iptables fallback: %v\n%s", err, b)
	}
}
