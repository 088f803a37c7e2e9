package podnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is what the pod network runs with.
type Config struct {
	// Kubeconfig is kubelet's node kubeconfig, whose client certificate kubelet
	// rotates: the service acts as system:node:NAME and as nothing else.
	Kubeconfig string
	NodeName   string
	// CNIBinDir and CNIConfDir are containerd's; empty: the image's.
	CNIBinDir, CNIConfDir string
	// Backend is flannel's backend, "vxlan" or "host-gw"; empty: no cross-node
	// network (only this node's pods reach each other; the bridge masquerades).
	Backend string
	// PodSubnet is the cluster's pod network, which every Node's podCIDR lies in.
	PodSubnet netip.Prefix
	// ServicesReady, when set, is waited for before the conflist is written (what
	// makes kubelet report Ready): kube-proxy's first rule sync, so that a Ready
	// node's pods reach Services from their first packet.
	ServicesReady func(context.Context) error
	// RunDir holds flannel's net-conf.json; empty: DefaultRunDir.
	RunDir string
	Log    *slog.Logger
	// Progress, when set, gets what the service is doing; up is true once the
	// conflist is written.
	Progress func(msg string, up bool)
}

func (c *Config) progress(msg string, up bool) {
	if c.Log != nil {
		c.Log.Info("pod network", "status", msg)
	}
	if c.Progress != nil {
		c.Progress(msg, up)
	}
}

// DefaultRunDir is where the pod network keeps its runtime files.
const DefaultRunDir = "/run/gpurack/podnet"

// Run brings the node's pod network up and keeps it until ctx ends. An error means
// it cannot come up as configured; it names what to fix.
func Run(ctx context.Context, cfg Config) error {
	if cfg.CNIBinDir == "" {
		cfg.CNIBinDir = DefaultCNIBinDir
	}
	if cfg.CNIConfDir == "" {
		cfg.CNIConfDir = DefaultCNIConfDir
	}
	if err := CheckPlugins(cfg.CNIBinDir); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("pod network: node kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("pod network: node kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	podCIDR, err := WaitPodCIDR(ctx, client, cfg.NodeName, func(msg string) { cfg.progress(msg, false) })
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	hosts, err := HostNetworks()
	if err != nil {
		return fmt.Errorf("pod network: reading the machine's addresses: %w", err)
	}
	if err := CheckOverlap("podCIDR", podCIDR, hosts); err != nil {
		return err
	}
	mtu, masq, via := 0, true, "this node only (no backend configured)"
	var wg sync.WaitGroup
	defer wg.Wait()
	// Whatever flannel started stops when Run returns, error or not (the cancel runs
	// before the Wait), so a failed attempt can be retried in the same process.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Backend != "" {
		if !cfg.PodSubnet.IsValid() {
			return errors.New("pod network: no pod subnet for the " + cfg.Backend + " backend")
		}
		if err := CheckOverlap("pod network", cfg.PodSubnet, hosts); err != nil {
			return err
		}
		if !(cfg.PodSubnet.Bits() <= podCIDR.Bits() && cfg.PodSubnet.Contains(podCIDR.Addr())) {
			return &OutsidePodSubnetError{PodCIDR: podCIDR, PodSubnet: cfg.PodSubnet}
		}
		if cfg.RunDir == "" {
			cfg.RunDir = DefaultRunDir
		}
		cfg.progress(fmt.Sprintf("podCIDR %s; starting flannel (%s)", podCIDR, cfg.Backend), false)
		if mtu, err = startFlannel(ctx, &wg, cfg, cfg.PodSubnet); err != nil {
			return err
		}
		masq, via = false, "flannel "+cfg.Backend+" across "+cfg.PodSubnet.String()
	}
	if cfg.ServicesReady != nil {
		cfg.progress(fmt.Sprintf("podCIDR %s via %s; waiting for kube-proxy's Service rules", podCIDR, via), false)
		if err := cfg.ServicesReady(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("pod network: waiting for kube-proxy: %w", err)
		}
	}
	path, err := WriteConflist(cfg.CNIConfDir, podCIDR, mtu, masq)
	if err != nil {
		return err
	}
	cfg.progress(fmt.Sprintf("podCIDR %s via %s; CNI conflist %s written", podCIDR, via, path), true)
	<-ctx.Done()
	return nil
}
