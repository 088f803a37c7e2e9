package kubejoin

import (
	"context"
	"errors"
	"fmt"

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
	}
	if j.ClusterCIDR != "" {
		cfg["clusterCIDR"] = j.ClusterCIDR
	}
	return yaml.Marshal(cfg)
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
