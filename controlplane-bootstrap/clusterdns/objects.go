// Package clusterdns is the cluster's DNS: the objects that run CoreDNS as a
// Deployment of two replicas behind the kube-dns Service at the cluster DNS
// address kubelet is given (the tenth address of the service subnet), and the
// Corefile they run. controlplane-bootstrap applies them at every `init`, with
// the join material (decision 0611).
//
// The image is not pulled: it is the archive `make coredns-image` builds from
// pinned source (images/coredns) and a node image preloads, so the pods use
// imagePullPolicy Never. It does not build the image, start processes or talk
// to nodes; objects are built by pure functions and applied by
// joinconfig.Apply.
package clusterdns

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// Version is the CoreDNS release images/coredns/go.mod pins; a test keeps the two
// equal.
const Version = "v1.14.7"

// Image is the reference the archive of `make coredns-image` carries and the
// Deployment runs. Not the upstream image's name: this is gpurack's own build (a
// smaller plugin set), and no node could pull either.
const Image = "gpurack.io/coredns:" + Version

// Names, equal to kubeadm's where kubeadm has one, so tools that look for
// kubeadm's DNS (kubectl cluster-info, k8s-app=kube-dns) find it.
const (
	Namespace           = metav1.NamespaceSystem
	Name                = "coredns" // ServiceAccount, ConfigMap, Deployment
	ServiceName         = "kube-dns"
	ClusterRole         = "system:coredns"
	CorefileKey         = "Corefile"
	AppLabel            = "k8s-app"
	AppLabelValue       = "kube-dns"
	Replicas      int32 = 2
)

// Ports the pod listens on.
const (
	DNSPort     = 53
	HealthPort  = 8080
	ReadyPort   = 8181
	MetricsPort = 9153
)

// configDir is where the ConfigMap is mounted in the pod.
const configDir = "/etc/coredns"

var (
	gvrServiceAccount     = corev1.SchemeGroupVersion.WithResource("serviceaccounts")
	gvrConfigMap          = corev1.SchemeGroupVersion.WithResource("configmaps")
	gvrService            = corev1.SchemeGroupVersion.WithResource("services")
	gvrClusterRole        = rbacv1.SchemeGroupVersion.WithResource("clusterroles")
	gvrClusterRoleBinding = rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings")
	gvrDeployment         = appsv1.SchemeGroupVersion.WithResource("deployments")
)

// Objects returns what init applies for cluster DNS, in an order that lets each
// exist when the next needs it.
func Objects(cfg *clusterconfig.Config) ([]joinconfig.Object, error) {
	ip := joinconfig.ClusterDNS(cfg)
	if ip == "" {
		return nil, fmt.Errorf("cluster DNS: networking.serviceSubnet %q gives no DNS address; set a CIDR such as 10.96.0.0/12", cfg.Networking.ServiceSubnet)
	}
	corefile, err := Corefile(InCluster(cfg.Networking.DNSDomain))
	if err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	return []joinconfig.Object{
		{GVR: gvrServiceAccount, Obj: ServiceAccount()},
		{GVR: gvrClusterRole, Obj: Role()},
		{GVR: gvrClusterRoleBinding, Obj: RoleBinding()},
		{GVR: gvrConfigMap, Obj: ConfigMap(corefile)},
		{GVR: gvrService, Obj: Service(ip)},
		{GVR: gvrDeployment, Obj: Deployment()},
	}, nil
}

func labels() map[string]string { return map[string]string{AppLabel: AppLabelValue} }

// ServiceAccount is the identity the CoreDNS pods run as.
func ServiceAccount() *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name},
	}
}

// Role is everything CoreDNS's kubernetes plugin reads: Services, their
// EndpointSlices (headless Services' records), Namespaces, and Pods (for `pods
// verified`). Read only: DNS writes nothing to the cluster.
func Role() *rbacv1.ClusterRole {
	read := []string{"list", "watch"}
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: ClusterRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		},
	}
}

// RoleBinding binds Role to the coredns ServiceAccount.
func RoleBinding() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: ClusterRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: Namespace, Name: Name}},
	}
}

// ConfigMap holds the Corefile the pods mount.
func ConfigMap(corefile string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name},
		Data:       map[string]string{CorefileKey: corefile},
	}
}

// Service is kube-dns at ip, the address kubelet writes into every pod's
// resolv.conf: DNS on 53 over UDP and TCP, and the metrics port.
func Service(ip string) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ServiceName,
			Labels: map[string]string{AppLabel: AppLabelValue, "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			Selector:  labels(),
			ClusterIP: ip,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: DNSPort, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(DNSPort)},
				{Name: "dns-tcp", Port: DNSPort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(DNSPort)},
				{Name: "metrics", Port: MetricsPort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(MetricsPort)},
			},
		},
	}
}

// Tolerations lets DNS run on every node gpurack makes (decision 0612): DNS
// uses no GPU, so a node whose GPUs are not yet validated or are unhealthy
// serves it; a node that only runs critical add-ons, and a kubeadm control-plane
// node, do too.
func Tolerations() []corev1.Toleration {
	return []corev1.Toleration{
		{Key: nodecontract.TaintUnvalidated, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: nodecontract.TaintGPUUnhealthy, Operator: corev1.TolerationOpExists},
		{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
		{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
}

// Deployment runs Replicas CoreDNS pods from the preloaded Image, spread over
// nodes where it can, as the image's unprivileged user (65535): the pod's
// net.ipv4.ip_unprivileged_port_start lets it bind port 53 without a
// capability (decision 0612).
func Deployment() *appsv1.Deployment {
	replicas := Replicas
	maxUnavailable := intstr.FromInt32(1)
	no, yes := false, true
	user := int64(65535)
	probe := func(path string, port int32) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP}}
	}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name, Labels: labels()},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels()},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &maxUnavailable},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels()},
				Spec: corev1.PodSpec{
					PriorityClassName:  "system-cluster-critical",
					ServiceAccountName: Name,
					// The node's resolvers, not the cluster DNS itself: forward
					// . /etc/resolv.conf must not point back at this Service.
					DNSPolicy:    corev1.DNSDefault,
					NodeSelector: map[string]string{corev1.LabelOSStable: "linux"},
					Tolerations:  Tolerations(),
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								LabelSelector: &metav1.LabelSelector{MatchLabels: labels()},
								TopologyKey:   corev1.LabelHostname,
							},
						}},
					}},
					SecurityContext: &corev1.PodSecurityContext{
						RunAsUser:      &user,
						RunAsGroup:     &user,
						RunAsNonRoot:   &yes,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						Sysctls:        []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: fmt.Sprint(DNSPort)}},
					},
					Containers: []corev1.Container{{
						Name:            Name,
						Image:           Image,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-conf", configDir + "/" + CorefileKey},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: DNSPort, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: DNSPort, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: configDir, ReadOnly: true}},
						LivenessProbe: &corev1.Probe{
							ProbeHandler: probe("/health", HealthPort), InitialDelaySeconds: 60,
							TimeoutSeconds: 5, SuccessThreshold: 1, FailureThreshold: 5,
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler: probe("/ready", ReadyPort), PeriodSeconds: 10,
							TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: &no,
							ReadOnlyRootFilesystem:   &yes,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
					Volumes: []corev1.Volume{{
						Name: "config",
						VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: Name},
							Items:                []corev1.KeyToPath{{Key: CorefileKey, Path: CorefileKey}},
						}},
					}},
				},
			},
		},
	}
}
