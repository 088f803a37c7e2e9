// Package joinconfig is the join side of the control plane: the objects that
// let a machine join the cluster the way `kubeadm join` does (RBAC for the
// node bootstrapper and CSR auto-approval, the kube-public/cluster-info
// ConfigMap, the kubeadm-config and kubelet-config ConfigMaps), bootstrap
// tokens, and the enroller identity gpuboot uses to mint tokens and taint
// Nodes (docs/contracts.md §4, §5).
//
// Objects are built by pure functions and applied with server-side apply, so
// running init again changes nothing that is already right. It does not start
// or stop anything (package components) and does not talk to machines.
package joinconfig

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/internal/nodecontract"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
)

// Well-known names, equal to kubeadm's where kubeadm has one.
const (
	// NodeBootstrapGroup is the group bootstrap tokens authenticate into
	// (auth-extra-groups), kubeadm's default.
	NodeBootstrapGroup = "system:bootstrappers:kubeadm:default-node-token"
	NodesGroup         = "system:nodes"

	// EnrollerUser is the user name (certificate CN) of the enroller
	// credential written by `join-config`; EnrollerGroup its O.
	EnrollerUser  = "gpurack:enroller"
	EnrollerGroup = "gpurack:enrollers"
	// EnrollerPolicy names the ValidatingAdmissionPolicy (and its binding)
	// that narrows the enroller's Secret permissions to bootstrap tokens.
	EnrollerPolicy = "gpurack-enroller-bootstrap-tokens-only"
	// EnrollerNodePolicy names the ValidatingAdmissionPolicy (and its binding) that
	// narrows the enroller's Node permissions to gpurack-managed Nodes: it may change
	// only their gpurack.io/ taints, and delete them, and nothing else.
	EnrollerNodePolicy = "gpurack-enroller-managed-node-taints-only"
	// ManagedNodeLabel marks a gpurack-managed Node: every gpurack agent registers its
	// Node with it (agent/kubejoin.AgentLabels, with or without GPUs), and the
	// enroller can neither set nor remove it (EnrollerNodePolicy).
	ManagedNodeLabel = nodecontract.LabelGPUCount

	KubeadmConfigMap = "kubeadm-config"
	KubeletConfigMap = "kubelet-config"
	FieldManager     = "controlplane-bootstrap"
)

// Object is one object to apply and the resource it lives in.
type Object struct {
	GVR schema.GroupVersionResource
	Obj runtime.Object
}

// Name returns "resource namespace/name" for messages.
func (o Object) Name() string {
	m, err := metaOf(o.Obj)
	if err != nil {
		return o.GVR.Resource
	}
	if m.GetNamespace() != "" {
		return fmt.Sprintf("%s %s/%s", o.GVR.Resource, m.GetNamespace(), m.GetName())
	}
	return fmt.Sprintf("%s %s", o.GVR.Resource, m.GetName())
}

var (
	gvrConfigMap          = corev1.SchemeGroupVersion.WithResource("configmaps")
	gvrClusterRole        = rbacv1.SchemeGroupVersion.WithResource("clusterroles")
	gvrClusterRoleBinding = rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings")
	gvrRole               = rbacv1.SchemeGroupVersion.WithResource("roles")
	gvrRoleBinding        = rbacv1.SchemeGroupVersion.WithResource("rolebindings")
	gvrVAP                = admissionv1.SchemeGroupVersion.WithResource("validatingadmissionpolicies")
	gvrVAPBinding         = admissionv1.SchemeGroupVersion.WithResource("validatingadmissionpolicybindings")
)

// Objects returns everything init applies for joining, for cfg with the
// cluster CA certificate caPEM.
func Objects(cfg *clusterconfig.Config, caPEM []byte) ([]Object, error) {
	info, err := ClusterInfo(cfg, caPEM)
	if err != nil {
		return nil, err
	}
	objs := []Object{{gvrConfigMap, info}}
	objs = append(objs, nodeBootstrapRBAC()...)
	objs = append(objs, kubeadmConfigMaps(cfg)...)
	objs = append(objs, enrollerObjects()...)
	objs = append(objs, nodeServiceRBAC()...)
	objs = append(objs, apiserverKubeletRBAC())
	return objs, nil
}

// ClusterInfoKubeconfig is the kubeconfig in kube-public/cluster-info: the
// endpoint nodes use and the cluster CA, no credentials. It is what the
// bootstrapsigner signs with each token.
func ClusterInfoKubeconfig(cfg *clusterconfig.Config, caPEM []byte) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[""] = &clientcmdapi.Cluster{Server: cfg.EndpointURL(), CertificateAuthorityData: caPEM}
	return clientcmd.Write(*kc)
}

// ClusterInfo is the kube-public/cluster-info ConfigMap (without the JWS
// signatures, which the controller-manager's bootstrapsigner adds).
func ClusterInfo(cfg *clusterconfig.Config, caPEM []byte) (*corev1.ConfigMap, error) {
	kc, err := ClusterInfoKubeconfig(cfg, caPEM)
	if err != nil {
		return nil, fmt.Errorf("cluster-info kubeconfig: %w", err)
	}
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespacePublic, Name: bootstrapapi.ConfigMapClusterInfo},
		Data:       map[string]string{bootstrapapi.KubeConfigKey: string(kc)},
	}, nil
}

// ClusterRoleBinding binds ClusterRole role to subjects under name.
func ClusterRoleBinding(name, role string, subjects ...rbacv1.Subject) Object {
	return Object{gvrClusterRoleBinding, &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}}
}

// ClusterRole is a ClusterRole named name with rules.
func ClusterRole(name string, rules ...rbacv1.PolicyRule) Object {
	return Object{gvrClusterRole, &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      rules,
	}}
}

// Role is a Role in namespace ns named name with rules.
func Role(ns, name string, rules ...rbacv1.PolicyRule) Object {
	return Object{gvrRole, &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules:      rules,
	}}
}

// RoleBinding binds the Role of the same name in ns to subjects.
func RoleBinding(ns, name string, subjects ...rbacv1.Subject) Object {
	return Object{gvrRoleBinding, &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subjects,
	}}
}

// Group is an RBAC subject for a group.
func Group(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: name}
}

// User is an RBAC subject for a user.
func User(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

// nodeBootstrapRBAC is what kubeadm init creates for TLS bootstrapping
// (kubeadm's phases/bootstraptoken): token holders may create CSRs and get
// Nodes, their node-client CSRs and the nodes' renewals are approved by the
// controller-manager's csrapproving controller, and anyone may read
// kube-public/cluster-info.
func nodeBootstrapRBAC() []Object {
	return []Object{
		ClusterRoleBinding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", Group(NodeBootstrapGroup)),
		ClusterRole("kubeadm:get-nodes", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"nodes"}}),
		ClusterRoleBinding("kubeadm:get-nodes", "kubeadm:get-nodes", Group(NodeBootstrapGroup)),
		ClusterRoleBinding("kubeadm:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", Group(NodeBootstrapGroup)),
		ClusterRoleBinding("kubeadm:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", Group(NodesGroup)),
		Role(metav1.NamespacePublic, "kubeadm:bootstrap-signer-clusterinfo",
			rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{bootstrapapi.ConfigMapClusterInfo}}),
		RoleBinding(metav1.NamespacePublic, "kubeadm:bootstrap-signer-clusterinfo", User("system:anonymous")),
	}
}

// Names of the read-only grants to every node (docs/contracts.md §10).
const (
	// NodeReaderRole lets a node list and watch every Node: the pod network reads
	// the other nodes' podCIDRs and addresses.
	NodeReaderRole = "gpurack:node-reader"
	// NodeProxierBinding binds Kubernetes' system:node-proxier (read Services,
	// EndpointSlices and Nodes, write Events) to the nodes, for kube-proxy.
	NodeProxierBinding = "gpurack:node-proxier"
	// NodePolicyReaderRole lets a node list and watch pods, namespaces and
	// NetworkPolicies: the node's NetworkPolicy enforcement (agent/netpol) matches
	// the peers of its own pods, which run anywhere in the cluster.
	NodePolicyReaderRole = "gpurack:node-policy-reader"
)

// nodeServiceRBAC lets the node-side cluster services (pod network, kube-proxy,
// NetworkPolicy enforcement) run
// with the node's own identity, the kubelet's client certificate system:node:NAME in
// the group system:nodes. The Node authorizer gives a node only what its own pods
// need (and, since Kubernetes 1.32, only its own Node object to read); these grants add
// reads and nothing else. NodeRestriction keeps limiting each node to writing itself,
// so no node holds a credential that can change the rest of the cluster.
func nodeServiceRBAC() []Object {
	return []Object{
		ClusterRole(NodeReaderRole,
			rbacv1.PolicyRule{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"nodes"}}),
		ClusterRoleBinding(NodeReaderRole, NodeReaderRole, Group(NodesGroup)),
		ClusterRoleBinding(NodeProxierBinding, "system:node-proxier", Group(NodesGroup)),
		ClusterRole(NodePolicyReaderRole,
			rbacv1.PolicyRule{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}},
			rbacv1.PolicyRule{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}}),
		ClusterRoleBinding(NodePolicyReaderRole, NodePolicyReaderRole, Group(NodesGroup)),
	}
}

// APIServerKubeletBinding lets the apiserver's client certificate for kubelets
// (clusterpki's kube-apiserver-kubelet-client) through the kubelet's webhook
// authorization: `kubectl logs`, `exec`, `port-forward` and the nodes/proxy reads
// that a node's kubelet checks with a SubjectAccessReview. Its certificate's group,
// kubeadm:cluster-admins, is bound to nothing here (kubeadm binds it to
// cluster-admin); the user gets the kubelet API and nothing else.
const APIServerKubeletBinding = "gpurack:apiserver-kubelet-client"

func apiserverKubeletRBAC() Object {
	return ClusterRoleBinding(APIServerKubeletBinding, "system:kubelet-api-admin",
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: clusterpki.APIServerKubeletUser})
}

// enrollerObjects is the enroller identity's RBAC and the admission policies
// that narrow it (docs/contracts.md §4). The Node policy comes before the Secret policy:
// WaitEnrollerPolicy probes the Secret policy (a probe of the Node policy would need a
// Node to exist), and the admission plugin loads policies in the order they were
// created, so once the later one is enforced the earlier one is too.
func enrollerObjects() []Object {
	return append(enrollerNodeObjects(), []Object{
		Role(metav1.NamespaceSystem, "gpurack:enroller",
			rbacv1.PolicyRule{Verbs: []string{"create", "delete"}, APIGroups: []string{""}, Resources: []string{"secrets"}},
			// gpuboot reads the cluster's networking facts (pod and service subnets,
			// DNS domain, control-plane endpoint) from the kubeadm-config ConfigMap
			// and no other (decision 0672).
			rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{KubeadmConfigMap}},
			// Replicas of gpuboot on the cluster store elect the one that runs the
			// node controller with this Lease (decision 0704).
			rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}},
			rbacv1.PolicyRule{Verbs: []string{"get", "update"}, APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{kubestore.LeaseName}}),
		RoleBinding(metav1.NamespaceSystem, "gpurack:enroller", User(EnrollerUser)),
		ClusterRole("gpurack:enroller",
			// gpuboot's node controller watches Nodes, reads one afresh when its
			// guarded patch finds it changed, and patches taints; decommissioning
			// deletes the machine's Node. EnrollerNodePolicy narrows patch and
			// delete to gpurack-managed Nodes and their gpurack.io/ taints (RBAC
			// cannot select by label). No nodes/status: the agent owns conditions.
			rbacv1.PolicyRule{Verbs: []string{"get", "list", "watch", "patch", "delete"}, APIGroups: []string{""}, Resources: []string{"nodes"}},
			// The tenants' GPU quotas, for the rack report (read only).
			rbacv1.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"resourcequotas"}},
			// A rollout drains a node before it power-cycles it (decision 0687):
			// it lists the node's pods and evicts them through the eviction API,
			// which honours PodDisruptionBudgets; it cannot delete a pod.
			rbacv1.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"pods"}},
			rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{""}, Resources: []string{"pods/eviction"}},
			// gpuboot's inventory on the cluster store (pxe/inventory/kubestore,
			// decision 0704): Machines are written through their status only; no
			// delete, so no gpuboot can erase a machine's record.
			rbacv1.PolicyRule{Verbs: []string{"get", "list", "watch", "create"}, APIGroups: []string{"inventory.gpurack.io"}, Resources: []string{"machines"}},
			rbacv1.PolicyRule{Verbs: []string{"update"}, APIGroups: []string{"inventory.gpurack.io"}, Resources: []string{"machines/status"}}),
		ClusterRoleBinding("gpurack:enroller", "gpurack:enroller", User(EnrollerUser)),
		enrollerPolicy(EnrollerPolicy, []string{"secrets"}, append([]admissionv1.Variable{{
			Name:       "secret",
			Expression: "request.operation == 'DELETE' ? oldObject : object",
		}}, expiryVariables()...), enrollerValidations()),
		PolicyBinding(EnrollerPolicy),
	}...)
}

// PolicyBinding enforces the ValidatingAdmissionPolicy named policy everywhere
// (Deny), under the same name.
func PolicyBinding(policy string) Object {
	return Object{gvrVAPBinding, &admissionv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: policy},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}}
}

// enrollerNodeObjects is EnrollerNodePolicy and its binding.
func enrollerNodeObjects() []Object {
	return []Object{
		enrollerPolicy(EnrollerNodePolicy, []string{"nodes", "nodes/*"}, enrollerNodeVariables(), enrollerNodeValidations()),
		PolicyBinding(EnrollerNodePolicy),
	}
}

// enrollerPolicy is a ValidatingAdmissionPolicy named name that fails closed and
// applies to the enroller's creates, updates and deletes of resources (core v1).
func enrollerPolicy(name string, resources []string, vars []admissionv1.Variable, validations []admissionv1.Validation) Object {
	failClosed := admissionv1.Fail
	return Object{gvrVAP, &admissionv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &failClosed,
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionv1.RuleWithOperations{
						Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete},
						Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources},
					},
				}},
			},
			MatchConditions: []admissionv1.MatchCondition{{
				Name:       "is-enroller",
				Expression: fmt.Sprintf("request.userInfo.username == %q", EnrollerUser),
			}},
			Variables:   vars,
			Validations: validations,
		},
	}}
}

// enrollerNodeVariables: managed, whether the Node as stored carries
// ManagedNodeLabel; oldTaints and newTaints, the Node's taints outside gpurack.io/
// before and after the change, each as "KEY=VALUE:EFFECT" (strings compare where the
// API server's taint objects did not).
func enrollerNodeVariables() []admissionv1.Variable {
	foreign := func(obj string) string {
		return fmt.Sprintf("%[1]s == null || !has(%[1]s.spec.taints) ? [] : %[1]s.spec.taints.filter(t, !t.key.startsWith(%[2]q))"+
			".map(t, t.key + '=' + (has(t.value) ? t.value : '') + ':' + t.effect)", obj, nodecontract.LabelPrefix)
	}
	return []admissionv1.Variable{
		{Name: "managed", Expression: fmt.Sprintf("oldObject != null && has(oldObject.metadata.labels) && %q in oldObject.metadata.labels", ManagedNodeLabel)},
		{Name: "oldTaints", Expression: foreign("oldObject")},
		{Name: "newTaints", Expression: foreign("object")},
	}
}

// enrollerNodeValidations are EnrollerNodePolicy's checks: the enroller may only
// patch or delete a gpurack-managed Node (never create one, never another Node,
// never a subresource such as status), and a patch may change only the Node's
// gpurack.io/ taints: its labels (so not ManagedNodeLabel either), annotations,
// owners, finalizers, the rest of its spec and every other taint stay as they are
// (bar node.kubernetes.io/ taints, which the API server's own admission may add to the
// patched Node, and which the enroller could therefore add too: no more than it can do
// with gpurack.io/gpu-unhealthy:NoExecute on the same Nodes).
func enrollerNodeValidations() []admissionv1.Validation {
	forbidden := ptr(metav1.StatusReasonForbidden)
	same := func(path string) string {
		return fmt.Sprintf("has(object.%[1]s) == has(oldObject.%[1]s) && (!has(object.%[1]s) || object.%[1]s == oldObject.%[1]s)", path)
	}
	var unchanged []string
	for _, p := range []string{"metadata.labels", "metadata.annotations", "metadata.ownerReferences", "metadata.finalizers",
		"spec.podCIDR", "spec.podCIDRs", "spec.providerID", "spec.unschedulable", "spec.configSource", "spec.externalID"} {
		unchanged = append(unchanged, "("+same(p)+")")
	}
	return []admissionv1.Validation{
		{
			Expression: "request.operation != 'CREATE' && (!has(request.subResource) || request.subResource == '') && variables.managed",
			Message: fmt.Sprintf("%s may only patch and delete Nodes labelled %s (those a gpurack agent registered), never create one or write a subresource such as status",
				EnrollerUser, ManagedNodeLabel),
			Reason: forbidden,
		},
		{
			Expression: "request.operation == 'DELETE' || (" + strings.Join(unchanged, " && ") + ")",
			Message: fmt.Sprintf("%s may only change a Node's %s taints: its labels, annotations, owners, finalizers and the rest of its spec stay as they are",
				EnrollerUser, nodecontract.LabelPrefix),
			Reason: forbidden,
		},
		{
			// Nothing else removed; nothing else added but what the API server's own
			// admission adds on the way (TaintNodesByCondition puts
			// node.kubernetes.io/not-ready on a Node without a Ready condition).
			Expression: "request.operation == 'DELETE' || (variables.oldTaints.all(t, t in variables.newTaints) && " +
				"variables.newTaints.all(t, t in variables.oldTaints || t.startsWith('node.kubernetes.io/')))",
			Message: fmt.Sprintf("%s may only add and remove %s taints: every other taint stays as it is",
				EnrollerUser, nodecontract.LabelPrefix),
			Reason: forbidden,
		},
	}
}

// enrollerValidations are the admission policy's checks (docs/contracts.md §4): the
// enroller may create and delete only bootstrap-token Secrets, and what it creates
// must expire, be usable only for authentication (and
// signing cluster-info), and put its holder in no group but NodeBootstrapGroup.
// Without the last three the enroller could mint a token that never expires in
// system:masters. Deleting is not narrowed further, so expired or foreign tokens
// can still be cleaned up. Secret data reaches CEL as base64 strings (the API server
// has merged stringData into data before admission), so values are compared encoded.
func enrollerValidations() []admissionv1.Validation {
	forbidden := ptr(metav1.StatusReasonForbidden)
	notDelete := "request.operation == 'DELETE' || "
	data := "object.data"
	return []admissionv1.Validation{
		{
			Expression: fmt.Sprintf("has(variables.secret.type) && variables.secret.type == %q && has(variables.secret.metadata.name) && variables.secret.metadata.name.startsWith(%q)",
				string(bootstrapapi.SecretTypeBootstrapToken), bootstrapapi.BootstrapTokenSecretPrefix),
			Message: fmt.Sprintf("%s may only create and delete Secrets of type %s named %s<id>",
				EnrollerUser, bootstrapapi.SecretTypeBootstrapToken, bootstrapapi.BootstrapTokenSecretPrefix),
			Reason: forbidden,
		},
		{
			Expression: notDelete + fmt.Sprintf("has(object.data) && %q in %s", bootstrapapi.BootstrapTokenExpirationKey, data),
			Message: fmt.Sprintf("%s may only create bootstrap tokens that expire (set %s)",
				EnrollerUser, bootstrapapi.BootstrapTokenExpirationKey),
			Reason: forbidden,
		},
		{
			// The expiry, decoded by expiryVariables, at most MaxTokenTTL after the
			// Secret's creation (the API server sets creationTimestamp before
			// validating admission).
			Expression: notDelete + fmt.Sprintf("variables.expiryWellFormed && has(object.metadata.creationTimestamp) && "+
				"timestamp(variables.expiry) <= timestamp(object.metadata.creationTimestamp) + duration(%q)", MaxTokenTTL.String()),
			Message: fmt.Sprintf("%s may only create bootstrap tokens that expire within %s of their creation, with %s in UTC RFC 3339 (2006-01-02T15:04:05Z)",
				EnrollerUser, MaxTokenTTL, bootstrapapi.BootstrapTokenExpirationKey),
			Reason: forbidden,
		},
		{
			Expression: notDelete + fmt.Sprintf("has(object.data) && %s.all(k, !k.startsWith(%q) || k in [%q, %q]) && %q in %s && %s[%q] == %q",
				data, bootstrapapi.BootstrapTokenUsagePrefix,
				bootstrapapi.BootstrapTokenUsageAuthentication, bootstrapapi.BootstrapTokenUsageSigningKey,
				bootstrapapi.BootstrapTokenUsageAuthentication, data, data, bootstrapapi.BootstrapTokenUsageAuthentication, b64("true")),
			Message: fmt.Sprintf("%s may only create bootstrap tokens for authentication (and signing): set %s=true and no other %s* key",
				EnrollerUser, bootstrapapi.BootstrapTokenUsageAuthentication, bootstrapapi.BootstrapTokenUsagePrefix),
			Reason: forbidden,
		},
		{
			Expression: notDelete + fmt.Sprintf("!has(object.data) || !(%q in %s) || %s[%q] == %q",
				bootstrapapi.BootstrapTokenExtraGroupsKey, data, data, bootstrapapi.BootstrapTokenExtraGroupsKey, b64(NodeBootstrapGroup)),
			Message: fmt.Sprintf("%s may only create bootstrap tokens whose %s is %s",
				EnrollerUser, bootstrapapi.BootstrapTokenExtraGroupsKey, NodeBootstrapGroup),
			Reason: forbidden,
		},
	}
}

// MaxTokenTTL is the longest a bootstrap token the enroller creates may live
// (docs/contracts.md §4): gpuboot's are 15 minutes.
const MaxTokenTTL = time.Hour

// expiryVariables decode a bootstrap token's expiration for the admission policy.
// Secret data reaches CEL base64-encoded and the API server's CEL has no base64
// decoder, so the policy decodes it itself: a UTC RFC 3339 time is 20 bytes, 28
// base64 characters ending in one '='; expiryB64 is their 6-bit values, expiryBytes
// the 20 bytes, expiryWellFormed whether they are digits and separators in the
// RFC 3339 places, and expiry the time as a string (digits rebuilt with string(int),
// since CEL has no function from a byte to a character). Anything else leaves them
// empty and the expiry check refuses the token.
func expiryVariables() []admissionv1.Variable {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	key := fmt.Sprintf("object.data[%q]", bootstrapapi.BootstrapTokenExpirationKey)
	idx := make([]string, 20)
	for i := range idx {
		idx[i] = strconv.Itoa(i)
	}
	bytes := "[" + strings.Join(idx, ", ") + "]"
	v := "variables.expiryB64"
	b := "variables.expiryBytes"
	return []admissionv1.Variable{
		{Name: "expiryB64", Expression: fmt.Sprintf("request.operation == 'DELETE' || !has(object.data) || !(%q in object.data) || !%s.matches('^[A-Za-z0-9+/]{27}=$') ? [] : "+
			"%s.split('').map(c, %q.indexOf(c))", bootstrapapi.BootstrapTokenExpirationKey, key, key, alphabet)},
		{Name: "expiryBytes", Expression: fmt.Sprintf("size(%[1]s) != 28 ? [] : %[2]s.map(i, i %% 3 == 0 ? %[1]s[i / 3 * 4] * 4 + %[1]s[i / 3 * 4 + 1] / 16 : "+
			"i %% 3 == 1 ? %[1]s[i / 3 * 4 + 1] %% 16 * 16 + %[1]s[i / 3 * 4 + 2] / 4 : %[1]s[i / 3 * 4 + 2] %% 4 * 64 + %[1]s[i / 3 * 4 + 3])", v, bytes)},
		{Name: "expiryWellFormed", Expression: fmt.Sprintf("size(%[1]s) == 20 && %[2]s.all(i, i == 4 || i == 7 ? %[1]s[i] == 45 : i == 10 ? %[1]s[i] == 84 : "+
			"i == 13 || i == 16 ? %[1]s[i] == 58 : i == 19 ? %[1]s[i] == 90 : %[1]s[i] >= 48 && %[1]s[i] <= 57) && "+
			// month 1-12, day 1-31, hour 0-23, minute and second 0-59 (what is left,
			// 31 February, fails timestamp() and so the request)
			"[[5, 1, 12], [8, 1, 31], [11, 0, 23], [14, 0, 59], [17, 0, 59]].all(f, "+
			"(%[1]s[f[0]] - 48) * 10 + %[1]s[f[0] + 1] - 48 >= f[1] && (%[1]s[f[0]] - 48) * 10 + %[1]s[f[0] + 1] - 48 <= f[2])", b, bytes)},
		{Name: "expiry", Expression: fmt.Sprintf("!variables.expiryWellFormed ? '' : %[2]s.map(i, i == 4 || i == 7 ? '-' : i == 10 ? 'T' : "+
			"i == 13 || i == 16 ? ':' : i == 19 ? 'Z' : string(%[1]s[i] - 48)).join('')", b, bytes)},
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func ptr[T any](v T) *T { return &v }
