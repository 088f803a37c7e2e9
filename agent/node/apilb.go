package node

import (
	"context"
	"net/url"
	"os"
	"path/filepath"

	"github.com/gpurack/gpurack/agent/kubejoin"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// APILBUnit is the transient unit the node's API load balancer runs as: outside the
// agent's own unit, so that kubelet keeps the API while the agent restarts.
const APILBUnit = "gpurack-apilb.service"

// apiLBCAFile is the cluster CA the balancer verifies the API servers' /readyz with,
// in the agent's key directory.
const apiLBCAFile = "apilb-ca.crt"

// startAPILB starts `gpuagent apilb` over the bundle's API servers as APILBUnit, or
// finds it running from before an agent restart, and returns the URL kubelet is to use.
// It returns false, and kubelet talks to the bundle's API server directly, when the
// balancer is off (Config.APILB empty), the host cannot start units of its own (tests'
// hosts), the bundle names no API server, or the unit does not start (said in the log).
func (n *node) startAPILB(ctx context.Context, host kubejoin.Host, bundle *bootv1.JoinBundle) (string, bool) {
	units, ok := host.(kubejoin.ServiceHost)
	if !ok || n.cfg.APILB == "" {
		return "", false
	}
	upstreams := bundle.GetApiServers()
	if len(upstreams) == 0 {
		if u, err := url.Parse(bundle.GetApiServerEndpoint()); err == nil && u.Host != "" {
			upstreams = []string{u.Host}
		}
	}
	if len(upstreams) == 0 {
		return "", false
	}
	exe, err := os.Executable()
	if err != nil {
		n.log.Warn("the API load balancer did not start: kubelet talks to the API server directly", "error", err)
		return "", false
	}
	ca := filepath.Join(n.cfg.KeyDir, apiLBCAFile)
	if err := os.WriteFile(ca, []byte(bundle.GetClusterCaPem()), 0o644); err != nil {
		n.log.Warn("the API load balancer did not start: kubelet talks to the API server directly", "error", err)
		return "", false
	}
	argv := []string{exe, "apilb", "--listen", n.cfg.APILB, "--ca", ca}
	for _, u := range upstreams {
		argv = append(argv, "--upstream", u)
	}
	started, err := units.EnsureService(ctx, APILBUnit, "gpurack's load balancer over the cluster's API servers (gpuagent apilb)", argv)
	if err != nil {
		n.log.Warn("the API load balancer did not start: kubelet talks to the API server directly", "unit", APILBUnit, "error", err)
		return "", false
	}
	n.log.Info("the API load balancer runs; kubelet reaches the API through it", "unit", APILBUnit, "listen", n.cfg.APILB, "upstreams", upstreams, "started", started)
	return "https://" + n.cfg.APILB, true
}
