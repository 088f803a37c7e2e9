package joinconfig

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
)

// ClusterConfiguration renders the kubeadm v1beta4 ClusterConfiguration that
// `kubeadm join` downloads from kube-system/kubeadm-config. Paths are those
// of a kubeadm node (/etc/kubernetes/pki), which is where `kubeadm join`
// writes what it needs on the joining machine.
func ClusterConfiguration(cfg *clusterconfig.Config) string {
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: %s
kubernetesVersion: %s
controlPlaneEndpoint: %s
certificatesDir: /etc/kubernetes/pki
imageRepository: registry.k8s.io
networking:
  dnsDomain: %s
  serviceSubnet: %s
  podSubnet: %s
etcd:
  local:
    dataDir: /var/lib/etcd
apiServer: {}
controllerManager: {}
scheduler: {}
dns: {}
proxy: {}
`, cfg.ClusterName, cfg.KubernetesVersion, cfg.APIServer.Endpoint, cfg.Networking.DNSDomain,
		cfg.Networking.ServiceSubnet, cfg.Networking.PodSubnet)
}

// ClusterDNS is the tenth address of the service subnet, where kubeadm puts
// the cluster DNS Service.
func ClusterDNS(cfg *clusterconfig.Config) string {
	p, err := netip.ParsePrefix(cfg.Networking.ServiceSubnet)
	if err != nil {
		return ""
	}
	a := p.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	return a.String()
}

// KubeletConfiguration renders the cluster-wide KubeletConfiguration of the
// kubelet-config ConfigMap (kubeadm reads it on join and writes it to
// /var/lib/kubelet/config.yaml). The cgroup driver is systemd, what gpurack's
// node images run (docs/contracts.md §6); a node on cgroup v1 without systemd
// overrides it locally.
func KubeletConfiguration(cfg *clusterconfig.Config) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
cgroupDriver: systemd
clusterDNS:
  - %s
clusterDomain: %s
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
`, ClusterDNS(cfg), cfg.Networking.DNSDomain)
}

// kubeadmConfigMaps returns the kubeadm-config and kubelet-config ConfigMaps
// and the Roles kubeadm creates so that token holders and nodes may read
// them.
func kubeadmConfigMaps(cfg *clusterconfig.Config) []Object {
	readers := []rbacv1.Subject{Group(NodeBootstrapGroup), Group(NodesGroup)}
	cm := func(name, key, value string) Object {
		return Object{gvrConfigMap, &corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: name},
			Data:       map[string]string{key: value},
		}}
	}
	get := func(name string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{name}}
	}
	return []Object{
		cm(KubeadmConfigMap, "ClusterConfiguration", ClusterConfiguration(cfg)),
		Role(metav1.NamespaceSystem, "kubeadm:nodes-kubeadm-config", get(KubeadmConfigMap)),
		RoleBinding(metav1.NamespaceSystem, "kubeadm:nodes-kubeadm-config", readers...),
		cm(KubeletConfigMap, "kubelet", KubeletConfiguration(cfg)),
		Role(metav1.NamespaceSystem, "kubeadm:kubelet-config", get(KubeletConfigMap)),
		RoleBinding(metav1.NamespaceSystem, "kubeadm:kubelet-config", readers...),
	}
}
