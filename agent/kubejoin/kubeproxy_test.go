package kubejoin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// TestStartKubeProxy writes kube-proxy's configuration for real and reads it back
// strictly as kube-proxy's own KubeProxyConfiguration type: nftables mode, the node's
// name, kubelet's kubeconfig, local traffic by the node's podCIDR, liberal TCP
// conntrack.
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
		c.DetectLocalMode != "NodeCIDR" || c.ClusterCIDR != "10.244.0.0/16" || !c.Conntrack.TCPBeLiberal {
		t.Errorf("config.yaml:\n%s", b)
	}
	h = &fakeHost{fail: errors.New("job failed")}
	if err := StartKubeProxy(context.Background(), h, path, j); err == nil || !strings.Contains(err.Error(), "kube-proxy.service") {
		t.Errorf("failed start: %v", err)
	}
}

// TestCheckConntrackLiberal reads the sysctl back: on is nil, off or unreadable is an
// error that says what it costs.
func TestCheckConntrackLiberal(t *testing.T) {
	dir := t.TempDir()
	on, off := filepath.Join(dir, "on"), filepath.Join(dir, "off")
	os.WriteFile(on, []byte("1\n"), 0o644)
	os.WriteFile(off, []byte("0\n"), 0o644)
	if err := CheckConntrackLiberal(on); err != nil {
		t.Errorf("on: %v", err)
	}
	if err := CheckConntrackLiberal(off); err == nil || !strings.Contains(err.Error(), `is "0", not 1`) || !strings.Contains(err.Error(), "kubernetes#74839") {
		t.Errorf("off: %v", err)
	}
	if err := CheckConntrackLiberal(filepath.Join(dir, "absent")); err == nil || !strings.Contains(err.Error(), "conntrack:") {
		t.Errorf("absent: %v", err)
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

// TestKubeProxySynced reads kube-proxy's metrics: synced only once every IP family it
// runs has a last-sync time; an error for a page that is not metrics.
func TestKubeProxySynced(t *testing.T) {
	page := ""
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, page)
	}))
	defer srv.Close()
	const head = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced\n" +
		"# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n"
	cases := []struct {
		page    string
		status  int
		want    bool
		wantErr bool
	}{
		{"# HELP process_start_time_seconds x\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e9\n", 200, false, false},
		{head + `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7646e+09` + "\n", 200, true, false},
		{head + `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7646e+09` + "\n" +
			`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 0` + "\n", 200, false, false},
		{"not metrics {\n", 200, false, true},
		{"", 500, false, true},
	}
	for _, c := range cases {
		page, status = c.page, c.status
		got, err := KubeProxySynced(t.Context(), srv.Client(), srv.URL+"/metrics")
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("page %q (%d): synced %v, err %v; want %v, error %v", c.page, c.status, got, err, c.want, c.wantErr)
		}
	}
}
