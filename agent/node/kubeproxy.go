package node

import (
	"context"
	"time"

	"github.com/gpurack/gpurack/agent/kubejoin"
)

// kubeProxyService starts kube-proxy.service once kubelet has joined (decision 0602),
// with kubelet's node kubeconfig, and reports it. kube-proxy itself runs under
// systemd, so a restart of the agent leaves it and its rules alone (StartUnit of a
// running unit does nothing).
type kubeProxyService struct {
	statusCell
	host kubejoin.Host
	path string
	j    kubejoin.KubeProxyJoin
}

func (n *node) kubeProxy(kubeconfig, nodeName, clusterCIDR string) *kubeProxyService {
	host := n.cfg.Host
	if host == nil {
		host = kubejoin.SystemdHost{}
	}
	return &kubeProxyService{host: host, path: kubejoin.DefaultKubeProxyConfig,
		j: kubejoin.KubeProxyJoin{NodeName: nodeName, Kubeconfig: kubeconfig, ClusterCIDR: clusterCIDR}}
}

func (s *kubeProxyService) Name() string { return "kube-proxy" }

func (s *kubeProxyService) Run(ctx context.Context) error {
	if err := kubejoin.CheckNFTables(); err != nil {
		return err
	}
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		err := kubejoin.StartKubeProxy(ctx, s.host, s.path, s.j)
		if err == nil {
			break
		}
		s.set(Starting, "starting kube-proxy failed, retrying: "+err.Error())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	s.set(Running, kubejoin.KubeProxyUnit+" started (nftables mode, "+s.path+")")
	<-ctx.Done()
	return nil
}
