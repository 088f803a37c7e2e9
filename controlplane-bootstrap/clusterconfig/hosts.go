package clusterconfig

import (
	"net/url"
	"strings"
)

// ControlPlane says how many control-plane hosts the cluster has in its steady state,
// each with its etcd member, API server, controller-manager and scheduler (issue 31;
// docs/ha.md).
type ControlPlane struct {
	// Hosts is 1, 3 or 5. With more than 1 the controller-manager, the scheduler and
	// Kueue elect a leader, and `join --control-plane` refuses a host beyond it.
	// 2 and 4 are refused: they tolerate no more lost hosts than 1 and 3 do, and
	// with 2 the loss of either stops the cluster.
	Hosts int `yaml:"hosts"`
}

// EtcdJoin is how this host's etcd member joins an existing cluster: written into
// cluster.yaml by `join --control-plane` and read by etcd only on its first start (an
// existing data directory carries the membership).
type EtcdJoin struct {
	// InitialCluster is etcd's --initial-cluster: name=peerURL for every member, this
	// host's included.
	InitialCluster string `yaml:"initialCluster"`
}

// HA is whether the cluster has several control-plane hosts.
func (c *Config) HA() bool { return c.ControlPlane.Hosts > 1 }

func (c *ControlPlane) validate(p *problems) {
	switch c.Hosts {
	case 1, 3, 5:
	case 2:
		p.add("controlPlane.hosts", "2: etcd needs both members for quorum, so losing either host stops the cluster; write 3 (or 1)")
	case 4:
		p.add("controlPlane.hosts", "4: etcd needs 3 members for quorum, so 4 hosts survive the loss of only 1, as 3 do; write 5 (or 3)")
	default:
		p.add("controlPlane.hosts", "%d: write 1, 3 or 5 (the control-plane hosts, each with an etcd member)", c.Hosts)
	}
}

func (e *EtcdJoin) validate(p *problems, self string) {
	if e.InitialCluster == "" {
		return
	}
	found := false
	for _, m := range strings.Split(e.InitialCluster, ",") {
		name, peer, ok := strings.Cut(m, "=")
		u, err := url.Parse(peer)
		if !ok || name == "" || err != nil || u.Scheme != "https" || u.Host == "" {
			p.add("etcd.join.initialCluster", "%q is not name=https://host:port", m)
			continue
		}
		found = found || name == self
	}
	if !found {
		p.add("etcd.join.initialCluster", "names no member %q (this host's nodeName)", self)
	}
}
