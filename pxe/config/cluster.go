package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// ClusterFacts are the cluster's own networking facts, as pxe/nodecontrol reads them
// from the cluster (decision 0672).
type ClusterFacts struct {
	// PodSubnet and ServiceSubnet are networking.podSubnet and serviceSubnet.
	PodSubnet, ServiceSubnet string
	// DNSAddress is the cluster DNS Service's address (the tenth address of the
	// service subnet).
	DNSAddress string
	// DNSDomain is networking.dnsDomain; "" when the cluster names none.
	DNSDomain string
	// Source names where they were read, e.g. "kube-system/kubeadm-config".
	Source string
}

// WithCluster returns the cluster settings nodes are given, from the cluster's facts
// and gpuboot.yaml's overrides: each of cluster.podNetwork.subnet, cluster.dns and
// cluster.domain the file leaves out is the cluster's; one it sets must agree with the
// cluster (cluster.dns must list the cluster's DNS address), else it is an error
// naming both values and where each came from. It is pure.
func (c *Config) WithCluster(f ClusterFacts) (Cluster, error) {
	out := c.Cluster
	out.DNS = slices.Clone(c.Cluster.DNS)
	var errs strictyaml.Errors
	contradicts := func(field, value, what, fact, from string) {
		errs = append(errs, c.pos.At(c.Source, field, fmt.Sprintf(
			"%s contradicts the cluster's %s %s (%s in %s): leave the setting out to take the cluster's, or correct it",
			value, what, fact, from, f.Source)))
	}
	switch set := out.PodNetwork.Subnet; {
	case set == "":
		out.PodNetwork.Subnet = f.PodSubnet
	case !samePrefix(set, f.PodSubnet):
		contradicts("cluster.podNetwork.subnet", set, "pod subnet", f.PodSubnet, "networking.podSubnet")
	}
	switch {
	case len(out.DNS) == 0:
		out.DNS = []string{f.DNSAddress}
	case !slices.ContainsFunc(out.DNS, func(a string) bool { return sameAddr(a, f.DNSAddress) }):
		contradicts("cluster.dns", "["+strings.Join(out.DNS, ", ")+"]", "DNS address", f.DNSAddress,
			"the tenth address of networking.serviceSubnet "+f.ServiceSubnet)
	}
	switch set := out.Domain; {
	case set == "":
		out.Domain = f.DNSDomain
	case f.DNSDomain != "" && !strings.EqualFold(strings.TrimSuffix(set, "."), strings.TrimSuffix(f.DNSDomain, ".")):
		contradicts("cluster.domain", set, "DNS domain", f.DNSDomain, "networking.dnsDomain")
	}
	if len(errs) > 0 {
		return Cluster{}, errs.Sorted()
	}
	return out, nil
}

func samePrefix(a, b string) bool {
	pa, errA := netip.ParsePrefix(a)
	pb, errB := netip.ParsePrefix(b)
	return errA == nil && errB == nil && pa.Masked() == pb.Masked()
}

func sameAddr(a, b string) bool {
	pa, errA := netip.ParseAddr(a)
	pb, errB := netip.ParseAddr(b)
	return errA == nil && errB == nil && pa == pb
}
