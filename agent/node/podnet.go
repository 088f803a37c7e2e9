package node

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/gpurack/gpurack/agent/podnet"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/profile"
)

// podNetworkService runs the node's pod network (agent/podnet) with kubelet's node
// kubeconfig, once kubelet has joined. Simulation mode has no kubelet and no pods.
type podNetworkService struct {
	statusCell
	cfg podnet.Config
}

func (n *node) podNetwork(kubeconfig, nodeName string, pn profile.PodNetwork) *podNetworkService {
	s := &podNetworkService{}
	// podNetworkSettings checked the subnet.
	subnet, _ := netip.ParsePrefix(pn.PodSubnet)
	s.cfg = podnet.Config{Kubeconfig: kubeconfig, NodeName: nodeName, Log: n.log.With("service", "pod-network"),
		CNIBinDir: n.cfg.CNIBinDir, CNIConfDir: n.cfg.CNIConfDir,
		Backend: pn.Backend, PodSubnet: subnet,
		Progress: s.progress(n.cfg.Console, "pod network")}
	return s
}

// progress is a Progress callback for a node service: what it says becomes its status
// (running once up) and a console line "gpuagent: WHAT: MSG".
func (c *statusCell) progress(console, what string) func(msg string, up bool) {
	return func(msg string, up bool) {
		state := Starting
		if up {
			state = Running
		}
		c.set(state, msg)
		consoleLine(console, "gpuagent: "+what+": "+msg)
	}
}

func (s *podNetworkService) Name() string { return "pod-network" }

// attempt brings the pod network up and keeps it up; the supervisor restarts it
// (serviceRestart): a node whose pod network is down stays NotReady, so giving up would
// only hide it. The CNI conflist waits for the service's upAfter gate (kube-proxy's
// rules).
func (s *podNetworkService) attempt(ctx context.Context, g gated) error {
	cfg := s.cfg
	cfg.ServicesReady = g.wait
	return podnet.Run(ctx, cfg)
}

// podNetworkSettings are the pod network settings the node runs with: the
// JoinBundle's (gpuboot's cluster.podNetwork) where it sets a field, else the
// profile's, else the defaults. A bundle value that is not valid is an error: it
// names the bundle, since the image's own setting may be what the operator expects.
func (n *node) podNetworkSettings(bundle *bootv1.JoinBundle) (profile.PodNetwork, error) {
	pn := profile.Kubernetes{}.PodNetworkSettings()
	if n.cfg.Profile != nil {
		pn = n.cfg.Profile.Kubernetes.PodNetworkSettings() // validated when it was loaded
	}
	bpn := bundle.GetPodNetwork()
	if s := bpn.GetSubnet(); s != "" {
		if !profile.ValidPodSubnet(s) {
			return pn, fmt.Errorf("the JoinBundle's pod network subnet %q is not a network in CIDR form like 10.244.0.0/16 (gpuboot's cluster.podNetwork.subnet)", s)
		}
		pn.PodSubnet = s
	}
	if b := bpn.GetBackend(); b != "" {
		if !profile.ValidPodNetworkBackend(b) {
			return pn, fmt.Errorf("the JoinBundle's pod network backend %q is not vxlan or host-gw (gpuboot's cluster.podNetwork.backend)", b)
		}
		pn.Backend = b
	}
	return pn, nil
}
