package config

import (
	"slices"
	"strings"
	"testing"
)

var testFacts = ClusterFacts{PodSubnet: "10.244.0.0/16", ServiceSubnet: "10.96.0.0/12", DNSAddress: "10.96.0.10",
	DNSDomain: "cluster.local", Source: "kube-system/kubeadm-config"}

// TestWithClusterFillsWhatTheFileLeavesOut: without overrides nodes get the cluster's
// pod subnet, DNS address and domain; the backend stays gpuboot.yaml's.
func TestWithClusterFillsWhatTheFileLeavesOut(t *testing.T) {
	c := parseTest(t, "cluster: {kubeconfig: enroller.kubeconfig, podNetwork: {backend: host-gw}}\n")
	got, err := c.WithCluster(testFacts)
	if err != nil {
		t.Fatal(err)
	}
	if got.PodNetwork.Subnet != "10.244.0.0/16" || got.PodNetwork.Backend != "host-gw" || !slices.Equal(got.DNS, []string{"10.96.0.10"}) || got.Domain != "cluster.local" {
		t.Errorf("cluster settings %+v", got)
	}
	if c.Cluster.PodNetwork.Subnet != "" || c.Cluster.DNS != nil {
		t.Errorf("WithCluster changed the Config: %+v", c.Cluster)
	}
}

// TestWithClusterAgreeingOverrides: overrides that say what the cluster says, in
// another spelling, are kept; cluster.dns may list more addresses than the cluster's.
func TestWithClusterAgreeingOverrides(t *testing.T) {
	c := parseTest(t, "cluster: {podNetwork: {subnet: 10.244.0.0/16}, dns: [169.254.20.10, 10.96.0.10], domain: Cluster.Local.}\n")
	got, err := c.WithCluster(testFacts)
	if err != nil || !slices.Equal(got.DNS, []string{"169.254.20.10", "10.96.0.10"}) || got.Domain != "Cluster.Local." {
		t.Errorf("%+v, %v", got, err)
	}
}

// TestWithClusterContradiction: an override the cluster contradicts is an error that
// names the setting, its line, its value, the cluster's value and where that came from.
func TestWithClusterContradiction(t *testing.T) {
	c := parseTest(t, "cluster:\n  podNetwork: {subnet: 10.99.0.0/16}\n  dns: [10.96.0.53]\n  domain: rack.example\n")
	_, err := c.WithCluster(testFacts)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"gpuboot.yaml:4: cluster.podNetwork.subnet: 10.99.0.0/16 contradicts the cluster's pod subnet 10.244.0.0/16 (networking.podSubnet in kube-system/kubeadm-config)",
		"gpuboot.yaml:5: cluster.dns: [10.96.0.53] contradicts the cluster's DNS address 10.96.0.10 (the tenth address of networking.serviceSubnet 10.96.0.0/12 in kube-system/kubeadm-config)",
		"gpuboot.yaml:6: cluster.domain: rack.example contradicts the cluster's DNS domain cluster.local (networking.dnsDomain in kube-system/kubeadm-config)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error\n%v\nlacks %q", err, want)
		}
	}
}

// parseTest parses a minimal valid gpuboot.yaml with extra appended.
func parseTest(t *testing.T, extra string) *Config {
	t.Helper()
	c, err := Parse("gpuboot.yaml", []byte("stateDir: /var/lib/gpuboot\nadvertise: 10.0.0.1\n"+extra+
		"dhcp: {enabled: false}\ntftp: {enabled: false}\nimages: {store: /srv/images, trustedKeys: [k.pub]}\nracks: [{name: r1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
