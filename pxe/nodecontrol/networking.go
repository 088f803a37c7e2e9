package nodecontrol

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Where the cluster publishes its networking facts: kubeadm's ClusterConfiguration,
// which `controlplane-bootstrap init` (and `kubeadm init`) writes and the enroller may
// read (decision 0672).
const (
	KubeadmConfigNamespace = "kube-system"
	KubeadmConfigMap       = "kubeadm-config"
	kubeadmConfigKey       = "ClusterConfiguration"
)

// NetworkingSource names the object the facts come from, for messages.
const NetworkingSource = KubeadmConfigNamespace + "/" + KubeadmConfigMap

// ErrNetworkingUnpublished: the cluster has no kubeadm-config, or the enroller may not
// read it (a cluster bootstrapped before decision 0672 grants it on the next
// `controlplane-bootstrap init`).
var ErrNetworkingUnpublished = errors.New("the cluster's networking facts are not readable")

// Networking are the cluster's networking facts, as the cluster publishes them.
type Networking struct {
	// PodSubnet and ServiceSubnet are networking.podSubnet and serviceSubnet (the
	// first network of a dual-stack list).
	PodSubnet, ServiceSubnet string
	// DNSAddress is the cluster DNS Service's address: the tenth address of the
	// service subnet, where kubeadm and controlplane-bootstrap put kube-dns.
	DNSAddress string
	// DNSDomain is networking.dnsDomain.
	DNSDomain string
	// ControlPlaneEndpoint is the API endpoint the cluster names for nodes
	// (HOST:PORT), "" when it names none.
	ControlPlaneEndpoint string
}

// Networking reads the cluster's networking facts from kube-system/kubeadm-config. An
// error wraps ErrNetworkingUnpublished when the object is missing or not readable.
func (c *Cluster) Networking(ctx context.Context) (Networking, error) {
	cm, err := c.client.CoreV1().ConfigMaps(KubeadmConfigNamespace).Get(ctx, KubeadmConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return Networking{}, fmt.Errorf("%w: %s: %v", ErrNetworkingUnpublished, NetworkingSource, err)
	}
	if err != nil {
		return Networking{}, fmt.Errorf("read %s: %w", NetworkingSource, err)
	}
	n, err := ParseClusterConfiguration(cm.Data[kubeadmConfigKey])
	if err != nil {
		return Networking{}, fmt.Errorf("%s: %w", NetworkingSource, err)
	}
	return n, nil
}

// ParseClusterConfiguration reads the networking facts from a kubeadm
// ClusterConfiguration (YAML). The pod and service subnets are required.
func ParseClusterConfiguration(doc string) (Networking, error) {
	var cc struct {
		ControlPlaneEndpoint string `json:"controlPlaneEndpoint"`
		Networking           struct {
			DNSDomain     string `json:"dnsDomain"`
			ServiceSubnet string `json:"serviceSubnet"`
			PodSubnet     string `json:"podSubnet"`
		} `json:"networking"`
	}
	if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
		return Networking{}, fmt.Errorf("%s: %w", kubeadmConfigKey, err)
	}
	first := func(list string) string { return strings.TrimSpace(strings.Split(list, ",")[0]) }
	n := Networking{
		PodSubnet: first(cc.Networking.PodSubnet), ServiceSubnet: first(cc.Networking.ServiceSubnet),
		DNSDomain: cc.Networking.DNSDomain, ControlPlaneEndpoint: cc.ControlPlaneEndpoint,
	}
	if _, err := netip.ParsePrefix(n.PodSubnet); err != nil {
		return Networking{}, fmt.Errorf("%s networking.podSubnet %q: %v", kubeadmConfigKey, cc.Networking.PodSubnet, err)
	}
	svc, err := netip.ParsePrefix(n.ServiceSubnet)
	if err != nil {
		return Networking{}, fmt.Errorf("%s networking.serviceSubnet %q: %v", kubeadmConfigKey, cc.Networking.ServiceSubnet, err)
	}
	n.DNSAddress = tenthAddress(svc).String()
	return n, nil
}

// tenthAddress is the service subnet's tenth address, kubeadm's cluster DNS address.
func tenthAddress(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	return a
}
