package nodecontrol_test

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
)

// TestNetworkingFromTheCluster reads the networking facts controlplane-bootstrap
// published, with the enroller credential, from a real control plane: the subnets and
// domain of its cluster.yaml, and a DNS address equal to the ClusterIP of the kube-dns
// Service controlplane-bootstrap created (read with the admin credential), so the
// tenth-address rule is checked against what the cluster really runs.
func TestNetworkingFromTheCluster(t *testing.T) {
	c := testcluster.Shared(t)
	cluster, err := nodecontrol.Load(c.EnrollerKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n, err := cluster.Networking(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.ControlPlane().Config
	want := nodecontrol.Networking{PodSubnet: cfg.Networking.PodSubnet, ServiceSubnet: cfg.Networking.ServiceSubnet,
		DNSDomain: cfg.Networking.DNSDomain, ControlPlaneEndpoint: cfg.APIServer.Endpoint}
	admin := c.Clientset(t)
	svc, err := admin.CoreV1().Services(clusterdns.Namespace).Get(ctx, clusterdns.ServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want.DNSAddress = svc.Spec.ClusterIP
	if n != want {
		t.Errorf("networking %+v\nwant      %+v", n, want)
	}

	// A credential that may not read it (the enroller of a cluster bootstrapped before
	// the grant): the facts are unpublished, not an I/O failure.
	rc := c.RESTConfig(t)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "gpurack:test-nobody"}
	nobody, err := nodecontrol.FromRESTConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nobody.Networking(ctx); !errors.Is(err, nodecontrol.ErrNetworkingUnpublished) {
		t.Errorf("without the grant: %v, want ErrNetworkingUnpublished", err)
	}
}

func TestParseClusterConfiguration(t *testing.T) {
	n, err := nodecontrol.ParseClusterConfiguration(`apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
controlPlaneEndpoint: 10.0.2.2:6443
networking:
  dnsDomain: cluster.local
  serviceSubnet: 10.96.0.0/12,fd00:10:96::/108
  podSubnet: 10.244.0.0/16
`)
	want := nodecontrol.Networking{PodSubnet: "10.244.0.0/16", ServiceSubnet: "10.96.0.0/12", DNSAddress: "10.96.0.10",
		DNSDomain: "cluster.local", ControlPlaneEndpoint: "10.0.2.2:6443"}
	if err != nil || n != want {
		t.Errorf("%+v, %v\nwant %+v", n, err, want)
	}
	for _, bad := range []string{"networking: {serviceSubnet: 10.96.0.0/12}", "networking: {podSubnet: 10.244.0.0/16, serviceSubnet: ten}", "[1, 2"} {
		if _, err := nodecontrol.ParseClusterConfiguration(bad); err == nil {
			t.Errorf("ParseClusterConfiguration(%q): no error", bad)
		}
	}
}
