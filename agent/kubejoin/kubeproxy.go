package kubejoin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/knftables"
	"sigs.k8s.io/yaml"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// kube-proxy on real nodes (decision 0602): the image ships kube-proxy and
// kube-proxy.service, not enabled; after the join the agent writes its configuration
// and starts it. kube-proxy uses kubelet's node kubeconfig, so it acts as
// system:node:NAME, which system:node-proxier (bound to system:nodes by
// controlplane-bootstrap) lets read Services and EndpointSlices.

// KubeProxyUnit is the unit the image ships, not enabled.
const KubeProxyUnit = "kube-proxy.service"

// DefaultKubeProxyConfig is where kube-proxy.service reads its configuration.
const DefaultKubeProxyConfig = "/var/lib/kube-proxy/config.yaml"

// KubeProxyJoin is what kube-proxy's configuration is made from.
type KubeProxyJoin struct {
	NodeName string
	// Kubeconfig is kubelet's node kubeconfig (its rotated client certificate).
	Kubeconfig string
	// ClusterCIDR is the cluster's pod network, for the masquerade of traffic from
	// outside it; empty: kube-proxy's default.
	ClusterCIDR string
	// Mode is "nftables" (the default) or "iptables", the fallback for kernels older
	// than 5.13.
	Mode string
}

// ErrNoNFTables is a kernel, or an image, without what kube-proxy's nftables mode
// needs.
var ErrNoNFTables = errors.New("kube-proxy nftables mode unavailable")

// KubeProxyConfig renders kube-proxy's KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1).
func KubeProxyConfig(j KubeProxyJoin) ([]byte, error) {
	if j.NodeName == "" || j.Kubeconfig == "" {
		return nil, errors.New("kube-proxy config: need the node name and kubelet's kubeconfig")
	}
	mode := j.Mode
	if mode == "" {
		mode = "nftables"
	}
	if mode != "nftables" && mode != "iptables" {
		return nil, fmt.Errorf("kube-proxy config: mode %q, want nftables or iptables", mode)
	}
	cfg := map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"mode":             mode,
		"hostnameOverride": j.NodeName,
		"clientConnection": map[string]any{"kubeconfig": j.Kubeconfig},
		// Local traffic is the node's podCIDR's: no cluster-wide setting needed.
		"detectLocalMode": "NodeCIDR",
		// Where KubeProxySynced reads whether the rules are in place.
		"metricsBindAddress": KubeProxyMetricsAddr,
		// nf_conntrack_tcp_be_liberal=1: a packet of a Service connection that
		// conntrack finds outside the TCP window (a spurious retransmit under load)
		// would otherwise be INVALID, leave un-NATed, and the pod that gets it resets
		// the connection (kubernetes#74839). The nftables mode has no INVALID-drop
		// rule to hide that; this is upstream's workaround for it, and the iptables
		// mode then leaves its drop rule out. CheckConntrackLiberal reads it back.
		"conntrack": map[string]any{"tcpBeLiberal": true},
	}
	if j.ClusterCIDR != "" {
		cfg["clusterCIDR"] = j.ClusterCIDR
	}
	return yaml.Marshal(cfg)
}

// ConntrackLiberalSysctl is the setting kube-proxy's tcpBeLiberal writes, in the
// node's network namespace.
const ConntrackLiberalSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"

// CheckConntrackLiberal returns nil when the sysctl at path (ConntrackLiberalSysctl)
// is on, else an error that says what it costs.
func CheckConntrackLiberal(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	if v := strings.TrimSpace(string(b)); v != "1" {
		return fmt.Errorf("%s is %q, not 1: a connection through a Service can be reset when conntrack "+
			"finds one of its packets outside the TCP window (kubernetes#74839); kube-proxy sets it from "+
			"conntrack.tcpBeLiberal in %s", path, v, DefaultKubeProxyConfig)
	}
	return nil
}

// CheckNFTables returns an error wrapping ErrNoNFTables, saying what to fix, unless
// the nft command runs and the kernel accepts an nftables table (what kube-proxy's
// nftables mode checks at its start).
func CheckNFTables() error {
	if _, err := knftables.New(knftables.IPv4Family, "gpurack-check"); err != nil {
		return fmt.Errorf("%w: %v; kube-proxy's nftables mode needs a kernel 5.13 or newer with nf_tables and Debian's nftables package in the image (the iptables mode is the fallback; docs/controlplane.md)", ErrNoNFTables, err)
	}
	return nil
}

// StartKubeProxy writes kube-proxy's configuration to path and starts kube-proxy.service.
func StartKubeProxy(ctx context.Context, h Host, path string, j KubeProxyJoin) error {
	conf, err := KubeProxyConfig(j)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteMkdirAll(path, conf, 0o644, 0o755); err != nil {
		return fmt.Errorf("kube-proxy config: %w", err)
	}
	if err := h.StartUnit(ctx, KubeProxyUnit); err != nil {
		return fmt.Errorf("start %s: %w", KubeProxyUnit, err)
	}
	return nil
}

// KubeProxyMetricsAddr is where kube-proxy serves its metrics on the node.
const KubeProxyMetricsAddr = "127.0.0.1:10249"

// syncedMetric is the time of kube-proxy's last successful rule sync, per IP family;
// kube-proxy sets it only once a sync has succeeded.
const syncedMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

// KubeProxySynced reports whether the kube-proxy serving metrics at url (e.g.
// "http://127.0.0.1:10249/metrics") has put its Service rules in place: every IP
// family it runs has synced at least once. kube-proxy's /healthz cannot say this: it
// is healthy while it starts.
func KubeProxySynced(ctx context.Context, c *http.Client, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("kube-proxy metrics %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return false, fmt.Errorf("kube-proxy metrics %s: %w", url, err)
	}
	f := families[syncedMetric]
	if f == nil || len(f.GetMetric()) == 0 {
		return false, nil
	}
	for _, m := range f.GetMetric() {
		if m.GetGauge().GetValue() <= 0 {
			return false, nil
		}
	}
	return true, nil
}
