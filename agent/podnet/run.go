package podnet

import (
	"context"
	"fmt"
	"log/slog"

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
	Log                   *slog.Logger
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
	path, err := WriteConflist(cfg.CNIConfDir, podCIDR, 0, true)
	if err != nil {
		return err
	}
	cfg.progress(fmt.Sprintf("podCIDR %s; CNI conflist %s written", podCIDR, path), true)
	<-ctx.Done()
	return nil
}
