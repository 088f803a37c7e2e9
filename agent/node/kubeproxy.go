package node

import (
	"context"
	"net/http"
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
	// metrics is kube-proxy's metrics URL; synced closes once its rules are in place.
	metrics string
	synced  chan struct{}
	console string
}

func (n *node) kubeProxy(kubeconfig, nodeName, clusterCIDR string) *kubeProxyService {
	host := n.cfg.Host
	if host == nil {
		host = kubejoin.SystemdHost{}
	}
	return &kubeProxyService{host: host, path: kubejoin.DefaultKubeProxyConfig,
		j:       kubejoin.KubeProxyJoin{NodeName: nodeName, Kubeconfig: kubeconfig, ClusterCIDR: clusterCIDR},
		metrics: "http://" + kubejoin.KubeProxyMetricsAddr + "/metrics", synced: make(chan struct{}), console: n.cfg.Console}
}

// WaitSynced returns once kube-proxy has put its Service rules in place, or with
// ctx's error. The pod network waits for it before it lets kubelet report Ready, so
// that a Ready node's pods reach Services from their first packet.
func (s *kubeProxyService) WaitSynced(ctx context.Context) error {
	select {
	case <-s.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
	started := kubejoin.KubeProxyUnit + " started (nftables mode, " + s.path + ")"
	s.set(Starting, started+"; waiting for its first rule sync")
	client := &http.Client{Timeout: 5 * time.Second}
	last := ""
	for {
		ok, err := kubejoin.KubeProxySynced(ctx, client, s.metrics)
		if ok {
			break
		}
		if err != nil && err.Error() != last { // each new reason once, not every second
			last = err.Error()
			s.set(Starting, started+"; waiting for its first rule sync: "+last)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	close(s.synced)
	inPlace := "Service rules in place; TCP conntrack liberal"
	if err := kubejoin.CheckConntrackLiberal(kubejoin.ConntrackLiberalSysctl); err != nil {
		inPlace = "Service rules in place; WARNING: " + err.Error()
	}
	s.set(Running, started+"; "+inPlace)
	consoleLine(s.console, "gpuagent: kube-proxy: "+inPlace)
	<-ctx.Done()
	return nil
}
