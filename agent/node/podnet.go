package node

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/gpurack/gpurack/agent/podnet"
	"github.com/gpurack/gpurack/internal/profile"
)

// podNetworkService runs the node's pod network (agent/podnet) with kubelet's node
// kubeconfig, once kubelet has joined. Simulation mode has no kubelet and no pods.
type podNetworkService struct {
	statusCell
	cfg     podnet.Config
	console string
}

func (n *node) podNetwork(kubeconfig, nodeName string) *podNetworkService {
	s := &podNetworkService{console: n.cfg.Console}
	pn := n.podNetworkSettings()
	// The profile was validated when it was loaded.
	subnet, _ := netip.ParsePrefix(pn.PodSubnet)
	s.cfg = podnet.Config{Kubeconfig: kubeconfig, NodeName: nodeName, Log: n.log.With("service", "pod-network"),
		CNIBinDir: n.cfg.CNIBinDir, CNIConfDir: n.cfg.CNIConfDir,
		Backend: pn.Backend, PodSubnet: subnet,
		Progress: func(msg string, up bool) {
			state := Starting
			if up {
				state = Running
			}
			s.set(state, msg)
			consoleLine(n.cfg.Console, "gpuagent: pod network: "+msg)
		}}
	return s
}

func (s *podNetworkService) Name() string { return "pod-network" }

// podNetworkRetry bounds the wait between attempts to bring the pod network up.
var podNetworkRetry = struct{ first, max time.Duration }{5 * time.Second, time.Minute}

// Run brings the pod network up and keeps it up. A failed attempt (an apiserver not
// answering, a kernel module still loading, a named error an operator must fix) is
// said on the console and in Status, and tried again with backoff: a node whose pod
// network is down stays NotReady, so giving up would only hide it.
func (s *podNetworkService) Run(ctx context.Context) error {
	s.set(Starting, "starting")
	wait := podNetworkRetry.first
	for {
		err := podnet.Run(ctx, s.cfg)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		msg := fmt.Sprintf("failed: %v (trying again in %s)", err, wait)
		s.set(Failed, msg)
		s.cfg.Log.Error("pod network", "error", err, "retry", wait)
		consoleLine(s.console, "gpuagent: pod network "+msg)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, podNetworkRetry.max)
	}
}

// podNetworkSettings are the profile's pod network settings, defaults filled in.
func (n *node) podNetworkSettings() profile.PodNetwork {
	if n.cfg.Profile != nil {
		return n.cfg.Profile.Kubernetes.PodNetworkSettings()
	}
	return profile.Kubernetes{}.PodNetworkSettings()
}

// podSubnet is the cluster's pod network as the profile gives it.
func (n *node) podSubnet() string { return n.podNetworkSettings().PodSubnet }
