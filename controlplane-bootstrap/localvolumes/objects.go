// Package localvolumes is the control-plane side of gpurack's node-local volumes
// (the gpurack-local StorageClass, decision 0676): the StorageClass, the CSIDriver
// object whose storageCapacity makes the scheduler read the per-node capacity
// objects, the namespace those live in, the RBAC that lets every node's agent
// provision volumes with the node's own identity (the kubelet's credentials,
// system:node:NAME in system:nodes), and the ValidatingAdmissionPolicy that holds
// each node to its own volumes and its own capacity. controlplane-bootstrap applies
// them at every `init`, with the join material.
//
// Names come from internal/localvol, which the agent (agent/localpv) reads too. It
// does not provision volumes, run a CSI driver (none runs: the volumes are `local`
// PersistentVolumes) or talk to nodes; objects are built by pure functions and
// applied by joinconfig.Apply.
package localvolumes

import (
	"context"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/localvol"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

const (
	// Role names the ClusterRole and ClusterRoleBinding (volumes, claims, classes,
	// events) and the Role and RoleBinding in localvol.Namespace (capacity objects)
	// granted to system:nodes.
	Role = "gpurack:local-volumes"
	// Policy names the ValidatingAdmissionPolicy, and its binding, that narrows what
	// Role grants a node to that node's own volumes and capacity.
	Policy = "gpurack-local-volumes"
)

var (
	gvrNamespace    = corev1.SchemeGroupVersion.WithResource("namespaces")
	gvrCSIDriver    = storagev1.SchemeGroupVersion.WithResource("csidrivers")
	gvrStorageClass = storagev1.SchemeGroupVersion.WithResource("storageclasses")
	gvrVAP          = admissionv1.SchemeGroupVersion.WithResource("validatingadmissionpolicies")
)

// Objects returns what init applies for local volumes, and for shared volumes on nfs
// (nil: none; shared.go), in an order that lets each exist when the next needs it
// (the namespace before its Role, the policy before its binding).
func Objects(nfs *clusterconfig.NFS) []joinconfig.Object {
	nodes := joinconfig.Group(joinconfig.NodesGroup)
	return append([]joinconfig.Object{
		{GVR: gvrNamespace, Obj: Namespace()},
		{GVR: gvrCSIDriver, Obj: CSIDriver()},
		{GVR: gvrStorageClass, Obj: StorageClass()},
		joinconfig.ClusterRole(Role, ClusterRules()...),
		joinconfig.ClusterRoleBinding(Role, Role, nodes),
		joinconfig.Role(localvol.Namespace, Role, CapacityRules()...),
		joinconfig.RoleBinding(localvol.Namespace, Role, nodes),
		{GVR: gvrVAP, Obj: AdmissionPolicy(nfs)},
		joinconfig.PolicyBinding(Policy),
	}, sharedObjects(nfs)...)
}

// Namespace holds the CSIStorageCapacity objects, one per node and StorageClass.
func Namespace() *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: localvol.Namespace},
	}
}

// CSIDriver is named for the provisioner. No CSI driver runs under it: it exists
// for storageCapacity, which makes the scheduler place a WaitForFirstConsumer
// claim of the provisioner's classes only on a node whose CSIStorageCapacity has
// room for it. Nothing attaches (the volumes are directories) and kubelet passes no
// pod information.
func CSIDriver() *storagev1.CSIDriver {
	no, yes := false, true
	return &storagev1.CSIDriver{
		TypeMeta:   metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: "CSIDriver"},
		ObjectMeta: metav1.ObjectMeta{Name: localvol.Provisioner},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       &no,
			PodInfoOnMount:       &no,
			StorageCapacity:      &yes,
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		},
	}
}

// StorageClass is gpurack-local: a claim waits for its first pod, so the scheduler
// picks the node (and the node's agent provisions on it); the volume goes with its
// claim; it cannot grow (the quota is set once); it has no parameters (the default
// directory mode) and is not the cluster's default class. Its provisioner,
// parameters and reclaim policy cannot change once created.
func StorageClass() *storagev1.StorageClass {
	reclaim := corev1.PersistentVolumeReclaimDelete
	binding := storagev1.VolumeBindingWaitForFirstConsumer
	expand := false
	return &storagev1.StorageClass{
		TypeMeta:             metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: "StorageClass"},
		ObjectMeta:           metav1.ObjectMeta{Name: localvol.StorageClass},
		Provisioner:          localvol.Provisioner,
		ReclaimPolicy:        &reclaim,
		VolumeBindingMode:    &binding,
		AllowVolumeExpansion: &expand,
	}
}

// ClusterRules are what a node's provisioner needs cluster-wide (ClusterRole Role,
// bound to every node): write volumes (Policy narrows it to the node's own), read
// claims and update them (to hand a claim back to the scheduler; NodeRestriction
// refuses a node any update of a claim but its status, so the update is not usable
// today), read classes, and record events.
func ClusterRules() []rbacv1.PolicyRule {
	read := []string{"get", "list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: append(read, "create", "update", "patch", "delete")},
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: append(read, "update")},
		{APIGroups: []string{storagev1.GroupName}, Resources: []string{"storageclasses"}, Verbs: read},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
	}
}

// CapacityRules let a node write CSIStorageCapacity objects in localvol.Namespace
// only (Role Role there, bound to every node; Policy narrows it to the node's own).
func CapacityRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{
		APIGroups: []string{storagev1.GroupName}, Resources: []string{"csistoragecapacities"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}}
}

// WaitPolicy waits until the apiserver enforces Policy: a dry-run create of a
// PersistentVolume without the provisioner's annotation, by a node, is refused by
// it. The admission plugin loads a new policy asynchronously, so without this wait
// a just-started cluster would briefly let a node write any volume.
func WaitPolicy(ctx context.Context, admin *rest.Config) error {
	probe := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "gpurack-local-volumes-policy-probe"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				Local: &corev1.LocalVolumeSource{Path: localvol.MountRoot + "/probe"}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: localvol.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"gpurack-local-volumes-probe"}}},
			}}}},
		},
	}
	as := rest.ImpersonationConfig{UserName: "system:node:gpurack-local-volumes-probe", Groups: []string{joinconfig.NodesGroup, "system:authenticated"}}
	return joinconfig.WaitPolicy(ctx, admin, Policy, as, func(ctx context.Context, c kubernetes.Interface, dryRun metav1.CreateOptions) error {
		_, err := c.CoreV1().PersistentVolumes().Create(ctx, probe, dryRun)
		return err
	})
}

// AdmissionPolicy is Policy: it applies to nodes only (members of system:nodes, or
// users named system:node:NAME), fails closed, and lets a node write nothing that
// is not its own local volume or its own capacity:
//
//   - a PersistentVolume it creates, updates (before and after) or deletes must be
//     annotated as provisioned by localvol.Provisioner, labelled localvol.LabelNode
//     with the node's name, a `local` volume under localvol.MountRoot, and have the
//     one node affinity localvol.TopologyKey In [the node];
//   - a CSIStorageCapacity it writes must be in localvol.Namespace, labelled with the
//     node's name, and have the one topology localvol.TopologyKey: the node;
//   - an update of a claim (the main resource, not status) may only remove
//     localvol.AnnSelectedNode naming the node, which the provisioner library does to
//     hand a claim back to the scheduler, and change nothing else. NodeRestriction
//     refuses a node every update of a claim but its status before this policy is
//     asked, so for now this rule only backs it up.
//
// Kubelet, also a node, writes none of these (claims only through status, which the
// policy does not match), so the policy does not touch its work.
func AdmissionPolicy(nfs *clusterconfig.NFS) *admissionv1.ValidatingAdmissionPolicy {
	failClosed := admissionv1.Fail
	rule := func(group string, resource string, ops ...admissionv1.OperationType) admissionv1.NamedRuleWithOperations {
		return admissionv1.NamedRuleWithOperations{RuleWithOperations: admissionv1.RuleWithOperations{
			Operations: ops,
			// The main resource only: persistentvolumeclaims/status, which kubelet
			// writes when it resizes a volume, does not match.
			Rule: admissionv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource}},
		}}
	}
	return &admissionv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: Policy},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &failClosed,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{
				rule("", "persistentvolumes", admissionv1.Create, admissionv1.Update, admissionv1.Delete),
				rule("", "persistentvolumeclaims", admissionv1.Update),
				rule(storagev1.GroupName, "csistoragecapacities", admissionv1.Create, admissionv1.Update, admissionv1.Delete),
			}},
			MatchConditions: []admissionv1.MatchCondition{{
				Name: "is-node",
				Expression: fmt.Sprintf("%q in request.userInfo.groups || request.userInfo.username.startsWith(%q)",
					joinconfig.NodesGroup, nodeUserPrefix),
			}},
			Variables:   policyVariables(),
			Validations: policyValidations(nfs),
		},
	}
}

// nodeUserPrefix starts a node's user name, system:node:NAME.
const nodeUserPrefix = "system:node:"

// policyVariables: node, the node's name ("" for a user not named system:node:NAME);
// written, the objects a volume or capacity write must leave right (the new object
// of a create, the old of a delete, both of an update); oldAnnotations and
// newAnnotations, a claim's annotations before and after an update ({} for none);
// claimSpecs, its spec before and after (a variable, not object.spec in the
// validation: the apiserver type-checks each validation against every matched kind
// and would warn that a CSIStorageCapacity has no spec).
func policyVariables() []admissionv1.Variable {
	annotations := func(obj string) string {
		return fmt.Sprintf("%[1]s == null || !has(%[1]s.metadata.annotations) ? {} : %[1]s.metadata.annotations", obj)
	}
	return []admissionv1.Variable{
		{Name: "node", Expression: fmt.Sprintf("request.userInfo.username.startsWith(%[1]q) ? request.userInfo.username.substring(%[2]d) : ''",
			nodeUserPrefix, len(nodeUserPrefix))},
		{Name: "written", Expression: "request.operation == 'CREATE' ? [object] : request.operation == 'DELETE' ? [oldObject] : [oldObject, object]"},
		{Name: "oldAnnotations", Expression: annotations("oldObject")},
		{Name: "newAnnotations", Expression: annotations("object")},
		{Name: "claimSpecs", Expression: "request.operation == 'UPDATE' ? [oldObject.spec, object.spec] : []"},
	}
}

// check is a validation of the writes of one resource ("" for all): expr must hold
// for them, and message says what the node may do, with {node} for its name.
func check(resource, expr, message string) admissionv1.Validation {
	if resource != "" {
		expr = fmt.Sprintf("request.resource.resource != %q || (%s)", resource, expr)
	}
	var parts []string
	for _, p := range strings.Split(message, "{node}") {
		parts = append(parts, fmt.Sprintf("%q", p))
	}
	return admissionv1.Validation{
		Expression:        expr,
		Message:           strings.ReplaceAll(message, "{node}", "the node"),
		MessageExpression: strings.Join(parts, " + variables.node + "),
		Reason:            ptr(metav1.StatusReasonForbidden),
	}
}

// policyValidations are AdmissionPolicy's checks, in the order a refusal names
// the first that fails.
func policyValidations(nfs *clusterconfig.NFS) []admissionv1.Validation {
	each := func(cond string) string { return "variables.written.all(o, " + cond + ")" }
	hasEntry := func(m, key, value string) string {
		return fmt.Sprintf("has(o.metadata.%[1]s) && %[2]q in o.metadata.%[1]s && o.metadata.%[1]s[%[2]q] == %[3]s", m, key, value)
	}
	const pvs, capacities, claims = "persistentvolumes", "csistoragecapacities", "persistentvolumeclaims"
	affinity := "has(o.spec.nodeAffinity) && has(o.spec.nodeAffinity.required) && size(o.spec.nodeAffinity.required.nodeSelectorTerms) == 1 && " +
		"o.spec.nodeAffinity.required.nodeSelectorTerms.all(t, (!has(t.matchFields) || size(t.matchFields) == 0) && " +
		"has(t.matchExpressions) && size(t.matchExpressions) == 1 && " +
		fmt.Sprintf("t.matchExpressions.all(e, e.key == %q && e.operator == 'In' && has(e.values) && e.values == [variables.node]))", localvol.TopologyKey)
	topology := fmt.Sprintf("has(o.nodeTopology) && has(o.nodeTopology.matchLabels) && o.nodeTopology.matchLabels == {%q: variables.node} && "+
		"(!has(o.nodeTopology.matchExpressions) || size(o.nodeTopology.matchExpressions) == 0)", localvol.TopologyKey)
	return []admissionv1.Validation{
		check("", "variables.node != ''",
			"a member of "+joinconfig.NodesGroup+" not named "+nodeUserPrefix+"NAME may not write PersistentVolumes, claims or CSIStorageCapacity objects: only a node's own identity may, for itself"),
		check(pvs, each(isShared("o")+" || "+hasEntry("annotations", localvol.AnnProvisionedBy, fmt.Sprintf("%q", localvol.Provisioner))),
			"node {node} may only write PersistentVolumes annotated "+localvol.AnnProvisionedBy+": "+localvol.Provisioner+" (gpurack local volumes) or "+sharedvol.Provisioner+" (gpurack shared volumes)"),
		check(pvs, each(isShared("o")+" || "+hasEntry("labels", localvol.LabelNode, "variables.node")),
			"node {node} may only write PersistentVolumes labelled "+localvol.LabelNode+": {node} (its own local volumes)"),
		// The apiserver's validation refuses a local path with a '..' element.
		check(pvs, each(isShared("o")+" || "+fmt.Sprintf("has(o.spec.local) && o.spec.local.path.startsWith(%q)", localvol.MountRoot+"/")),
			"node {node} may only write local PersistentVolumes whose spec.local.path lies under "+localvol.MountRoot+"/ (its data disks)"),
		check(pvs, each(isShared("o")+" || "+affinity),
			"node {node} may only write PersistentVolumes whose node affinity is the one term "+localvol.TopologyKey+" In [{node}] (volumes on itself)"),
		check(pvs, each("!"+isShared("o")+" || ("+onExport(nfs)+")"), sharedMessage(nfs)),
		check(capacities, fmt.Sprintf("request.namespace == %q", localvol.Namespace),
			"node {node} may only write CSIStorageCapacity objects in namespace "+localvol.Namespace),
		check(capacities, each(hasEntry("labels", localvol.LabelNode, "variables.node")),
			"node {node} may only write CSIStorageCapacity objects labelled "+localvol.LabelNode+": {node} (its own capacity)"),
		check(capacities, each(topology),
			"node {node} may only write CSIStorageCapacity objects whose nodeTopology is matchLabels {"+localvol.TopologyKey+": {node}} and nothing else (its own capacity)"),
		check(claims, claimHandback(),
			"node {node} may only update a claim to remove "+localvol.AnnSelectedNode+": {node} (to hand it back to the scheduler) and change nothing else"),
	}
}

// claimHandback holds when a claim update only removes localvol.AnnSelectedNode,
// which named the node: every other annotation, the labels, finalizers, owners and
// spec are as they were.
func claimHandback() string {
	same := func(path string) string {
		return fmt.Sprintf("has(object.%[1]s) == has(oldObject.%[1]s) && (!has(object.%[1]s) || object.%[1]s == oldObject.%[1]s)", path)
	}
	key := fmt.Sprintf("%q", localvol.AnnSelectedNode)
	return strings.Join([]string{
		key + " in variables.oldAnnotations && variables.oldAnnotations[" + key + "] == variables.node",
		"!(" + key + " in variables.newAnnotations)",
		"size(variables.newAnnotations) == size(variables.oldAnnotations) - 1",
		"variables.newAnnotations.all(k, k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.newAnnotations[k])",
		"(" + same("metadata.labels") + ")",
		"(" + same("metadata.finalizers") + ")",
		"(" + same("metadata.ownerReferences") + ")",
		"variables.claimSpecs[0] == variables.claimSpecs[1]",
	}, " && ")
}

func ptr[T any](v T) *T { return &v }
