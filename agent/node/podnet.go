package node

import (
	"context"
	"net/netip"

	"github.com/gpurack/gpurack/agent/podnet"
	"github.com/gpurack/gpurack/internal/profile"
)

// podNetworkService runs the node's pod network (agent/podnet) with kubelet's node
// kubeconfig, once kubelet has joined. Simulation mode has no kubelet and no pods.
type podNetworkService struct {
	statusCell
	cfg podnet.Config
}

func (n *node) podNetwork(kubeconfig, nodeName string) *podNetworkService {
	s := &podNetworkService{}
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

func (s *podNetworkService) Run(ctx context.Context) error {
	s.set(Starting, "starting")
	return podnet.Run(ctx, s.cfg)
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
