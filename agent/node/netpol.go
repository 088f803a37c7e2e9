package node

import (
	"context"

	"github.com/gpurack/gpurack/agent/netpol"
)

// networkPolicyService enforces NetworkPolicy on the node (agent/netpol, with
// kube-network-policies embedded) with kubelet's node kubeconfig, once kubelet has
// joined. Simulation mode has no kubelet and no pods.
type networkPolicyService struct {
	statusCell
	cfg netpol.Config
}

func (n *node) networkPolicy(kubeconfig, nodeName string) *networkPolicyService {
	s := &networkPolicyService{}
	s.cfg = netpol.Config{Kubeconfig: kubeconfig, NodeName: nodeName, Log: n.log.With("service", "network-policy"),
		Progress: s.progress(n.cfg.Console, "network policy")}
	return s
}

func (s *networkPolicyService) Name() string { return "network-policy" }

// attempt enforces NetworkPolicy until ctx ends; the supervisor restarts it
// (serviceRestart): a node that does not enforce them must say so, in its status, until
// it does.
func (s *networkPolicyService) attempt(ctx context.Context, _ gated) error {
	return netpol.Run(ctx, s.cfg)
}
