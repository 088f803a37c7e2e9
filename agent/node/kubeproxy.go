package node

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/retry"
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
	// metrics is kube-proxy's metrics URL, asked whether its rules are in place.
	metrics string
	console string
}

func (n *node) kubeProxy(kubeconfig, nodeName, clusterCIDR string) *kubeProxyService {
	host := n.cfg.Host
	if host == nil {
		host = kubejoin.SystemdHost{}
	}
	return &kubeProxyService{host: host, path: kubejoin.DefaultKubeProxyConfig,
		j:       kubejoin.KubeProxyJoin{NodeName: nodeName, Kubeconfig: kubeconfig, ClusterCIDR: clusterCIDR},
		metrics: "http://" + kubejoin.KubeProxyMetricsAddr + "/metrics", console: n.cfg.Console}
}

func (s *kubeProxyService) Name() string { return "kube-proxy" }

// kubeProxyPoll is how often kube-proxy's metrics are asked for its first rule sync.
var kubeProxyPoll = retry.Backoff{First: time.Second, Max: time.Second}

// errNotSynced is kube-proxy answering that its rules are not in place yet.
var errNotSynced = errors.New("kube-proxy: no rule sync yet")

// attempt starts kube-proxy.service (a kernel without nftables is final; a failed
// start the supervisor tries again), waits for its first rule sync, then opens its
// gate (kube-proxy synced) and holds until ctx ends.
func (s *kubeProxyService) attempt(ctx context.Context, g gated) error {
	if err := kubejoin.CheckNFTables(); err != nil {
		return retry.Permanent(err)
	}
	if err := kubejoin.StartKubeProxy(ctx, s.host, s.path, s.j); err != nil {
		return err
	}
	started := kubejoin.KubeProxyUnit + " started (nftables mode, " + s.path + ")"
	s.set(Starting, started+"; waiting for its first rule sync")
	client := &http.Client{Timeout: 5 * time.Second}
	last := ""
	if kubeProxyPoll.Do(ctx, func(ctx context.Context) error {
		ok, err := kubejoin.KubeProxySynced(ctx, client, s.metrics)
		switch {
		case ok:
			return nil
		case err == nil:
			return errNotSynced
		}
		return err
	}, func(f retry.Failure) {
		if f.Err != errNotSynced && f.Err.Error() != last { // each new reason once, not every second
			last = f.Err.Error()
			s.set(Starting, started+"; waiting for its first rule sync: "+last)
		}
	}) != nil {
		return nil // ctx ended
	}
	g.open()
	inPlace := "Service rules in place; TCP conntrack liberal"
	if err := kubejoin.CheckConntrackLiberal(kubejoin.ConntrackLiberalSysctl); err != nil {
		inPlace = "Service rules in place; WARNING: " + err.Error()
	}
	s.set(Running, started+"; "+inPlace)
	consoleLine(s.console, "gpuagent: kube-proxy: "+inPlace)
	<-ctx.Done()
	return nil
}
