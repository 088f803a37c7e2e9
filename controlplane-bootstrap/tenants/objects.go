package tenants

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// Labels, annotations and names of the objects a tenant gets.
const (
	// LabelTenant carries the tenant's name on its namespaces and on every
	// object made for it.
	LabelTenant = "gpurack.io/tenant"
	// LabelManagedBy is app.kubernetes.io/managed-by; ManagedBy its value
	// on everything `tenants apply` owns. Only such objects are ever pruned.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "gpurack-tenants"
	// AnnotationPriorityClasses lists, comma-separated, the PriorityClasses
	// pods in the namespace may use; PriorityPolicy enforces it.
	AnnotationPriorityClasses = "gpurack.io/priority-classes"

	QuotaName         = "gpurack-quota"
	TierQuotaPrefix   = "gpurack-tier-"
	LimitRangeName    = "gpurack-defaults"
	NetworkPolicyName = "gpurack-tenant-isolation"
	// RoleUser and RoleAdmin are the Roles in every tenant namespace.
	RoleUser  = "gpurack-tenant-user"
	RoleAdmin = "gpurack-tenant-admin"
	// BindingUsers and BindingAdmins bind them to the tenant's groups.
	BindingUsers  = "gpurack-tenant-users"
	BindingAdmins = "gpurack-tenant-admins"
	// ClusterRoleAdmin is what tenant admins may see outside their
	// namespaces: Nodes (GPU capacity) and PriorityClasses, read-only.
	ClusterRoleAdmin = "gpurack:tenant-admin"
	// PriorityPolicy is the ValidatingAdmissionPolicy (and binding) that
	// keeps a tenant's pods to the tenant's own PriorityClasses.
	PriorityPolicy = "gpurack-tenant-priority-classes"
	// VolumePolicy is the ValidatingAdmissionPolicy (and binding) that refuses
	// a tenant's pods inline nfs volumes: gpurack-shared volumes are
	// directories of one export, mounted with no_root_squash, so a pod that
	// mounts the export itself could read every tenant's volumes. Pod
	// Security baseline (the tenants' default) allows nfs volumes.
	VolumePolicy = "gpurack-tenant-volumes"

	// GPUResource is the extended resource the NVIDIA device plugin
	// advertises; quota counts requests of it.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// QuotaGPU is the quota name of GPU requests (extended resources are
	// quota'd by requests only).
	QuotaGPU corev1.ResourceName = corev1.DefaultResourceRequestsPrefix + GPUResource
)

// GroupUsers and GroupAdmins are the groups a tenant's roles are bound to,
// for identities an identity provider vouches for (OIDC). Client
// certificates from `users add` do not carry them; see package tenantusers.
func GroupUsers(tenant string) string  { return "gpurack:tenant:" + tenant + ":users" }
func GroupAdmins(tenant string) string { return "gpurack:tenant:" + tenant + ":admins" }

// Object is one object to apply, as the apiserver's JSON, and its resource.
type Object struct {
	GVR schema.GroupVersionResource
	Obj *unstructured.Unstructured
}

// Key is "resource namespace/name" or "resource name", for messages.
func (o Object) Key() string {
	return key(o.GVR.Resource, o.Obj.GetNamespace(), o.Obj.GetName())
}

func key(resource, ns, name string) string {
	if ns != "" {
		return fmt.Sprintf("%s %s/%s", resource, ns, name)
	}
	return fmt.Sprintf("%s %s", resource, name)
}

// Resources that tenants apply manages, in the order they are applied
// (cluster-wide first, then what lives in the namespaces).
var (
	gvrClusterRole        = rbacv1.SchemeGroupVersion.WithResource("clusterroles")
	gvrVAP                = admissionv1.SchemeGroupVersion.WithResource("validatingadmissionpolicies")
	gvrVAPBinding         = admissionv1.SchemeGroupVersion.WithResource("validatingadmissionpolicybindings")
	gvrPriorityClass      = schedulingv1.SchemeGroupVersion.WithResource("priorityclasses")
	gvrNamespace          = corev1.SchemeGroupVersion.WithResource("namespaces")
	gvrResourceQuota      = corev1.SchemeGroupVersion.WithResource("resourcequotas")
	gvrLimitRange         = corev1.SchemeGroupVersion.WithResource("limitranges")
	gvrRole               = rbacv1.SchemeGroupVersion.WithResource("roles")
	gvrRoleBinding        = rbacv1.SchemeGroupVersion.WithResource("rolebindings")
	gvrNetworkPolicy      = networkingv1.SchemeGroupVersion.WithResource("networkpolicies")
	gvrClusterRoleBinding = rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings")

	managedResources = []schema.GroupVersionResource{
		gvrClusterRole, gvrVAP, gvrVAPBinding, gvrPriorityClass, gvrNamespace,
		gvrResourceQuota, gvrLimitRange, gvrRole, gvrRoleBinding, gvrNetworkPolicy, gvrClusterRoleBinding,
		// The queues' last: a LocalQueue lives in a namespace. Listed (to prune) only
		// where their CRDs are installed.
		gvrTopology, gvrResourceFlavor, gvrClusterQueue, gvrLocalQueue,
	}
	namespaced = map[schema.GroupVersionResource]bool{
		gvrResourceQuota: true, gvrLimitRange: true, gvrRole: true, gvrRoleBinding: true, gvrNetworkPolicy: true,
		gvrLocalQueue: true,
	}
	kinds = map[schema.GroupVersionResource]string{
		gvrClusterRole: "ClusterRole", gvrVAP: "ValidatingAdmissionPolicy", gvrVAPBinding: "ValidatingAdmissionPolicyBinding",
		gvrPriorityClass: "PriorityClass", gvrNamespace: "Namespace", gvrResourceQuota: "ResourceQuota",
		gvrLimitRange: "LimitRange", gvrRole: "Role", gvrRoleBinding: "RoleBinding",
		gvrNetworkPolicy: "NetworkPolicy", gvrClusterRoleBinding: "ClusterRoleBinding",
	}
)

func labels(tenant string) map[string]string {
	l := map[string]string{LabelManagedBy: ManagedBy}
	if tenant != "" {
		l[LabelTenant] = tenant
	}
	return l
}

func objectMeta(tenant, ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels(tenant)}
}

// Options say what the cluster runs beside Kubernetes.
type Options struct {
	// Queues: the cluster runs Kueue (cluster.yaml's queues.enabled), so every tenant
	// gets a ClusterQueue and LocalQueues, and its ResourceQuotas' GPU limit leaves room
	// for what its queue may borrow (gpuCeiling).
	Queues bool
}

// Objects returns every object the file asks for, in apply order, for a cluster without
// queues.
func Objects(f *File) ([]Object, error) { return ObjectsFor(f, Options{}) }

// ObjectsFor returns every object the file asks for on a cluster as o says, in apply
// order.
func ObjectsFor(f *File, o Options) ([]Object, error) {
	var objs []runtime.Object
	objs = append(objs, sharedObjects()...)
	for i := range f.Tenants {
		t := f.Tenants[i]
		if o.Queues {
			t.Quota.GPUs = gpuCeiling(f, &f.Tenants[i])
		}
		objs = append(objs, tenantObjects(&t)...)
	}
	out := make([]Object, 0, len(objs))
	for _, o := range objs {
		obj, err := toObject(o)
		if err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	if o.Queues {
		out = append(out, queueObjects(f)...)
	}
	// Stable apply order: by resource as listed in managedResources.
	slices.SortStableFunc(out, func(a, b Object) int {
		return slices.Index(managedResources, a.GVR) - slices.Index(managedResources, b.GVR)
	})
	return out, nil
}

func toObject(o runtime.Object) (Object, error) {
	var gvr schema.GroupVersionResource
	switch o.(type) {
	case *rbacv1.ClusterRole:
		gvr = gvrClusterRole
	case *admissionv1.ValidatingAdmissionPolicy:
		gvr = gvrVAP
	case *admissionv1.ValidatingAdmissionPolicyBinding:
		gvr = gvrVAPBinding
	case *schedulingv1.PriorityClass:
		gvr = gvrPriorityClass
	case *corev1.Namespace:
		gvr = gvrNamespace
	case *corev1.ResourceQuota:
		gvr = gvrResourceQuota
	case *corev1.LimitRange:
		gvr = gvrLimitRange
	case *rbacv1.Role:
		gvr = gvrRole
	case *rbacv1.RoleBinding:
		gvr = gvrRoleBinding
	case *networkingv1.NetworkPolicy:
		gvr = gvrNetworkPolicy
	case *rbacv1.ClusterRoleBinding:
		gvr = gvrClusterRoleBinding
	default:
		return Object{}, fmt.Errorf("tenants: no resource for %T", o)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return Object{}, fmt.Errorf("tenants: %T: %w", o, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(gvr.GroupVersion().String())
	u.SetKind(kinds[gvr])
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	return Object{GVR: gvr, Obj: u}, nil
}

var readVerbs = []string{"get", "list", "watch"}
var allVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}

// userRules is what a tenant user may do in the tenant's namespaces: run
// and inspect workloads, keep their configuration and Secrets, and read the
// quota, limits and network policy that bind them. Nothing here lets a
// user grant rights (no roles or bindings) or change the tenant's limits.
func userRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "services", "configmaps", "secrets", "persistentvolumeclaims"}, Verbs: allVerbs},
		{APIGroups: []string{""}, Resources: []string{"pods/log", "pods/status"}, Verbs: readVerbs},
		{APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach", "pods/portforward"}, Verbs: []string{"get", "create"}},
		{APIGroups: []string{""}, Resources: []string{"events", "resourcequotas", "limitranges", "serviceaccounts", "endpoints"}, Verbs: readVerbs},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets", "replicasets"}, Verbs: allVerbs},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments/scale", "statefulsets/scale"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs", "cronjobs"}, Verbs: allVerbs},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: readVerbs},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: readVerbs},
		// Which pods a Service sends to (Endpoints is deprecated since v1.33).
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: readVerbs},
		// The job queues (when the cluster runs them): find the LocalQueue to name and
		// see why a Job waits. Workloads are Kueue's to create, from Jobs.
		{APIGroups: []string{kueueGV.Group}, Resources: []string{"localqueues", "workloads"}, Verbs: readVerbs},
	}
}

// adminRules adds, for tenant admins, service accounts and
// PodDisruptionBudgets, and read access to the namespace's role bindings.
// Admins cannot create Roles or RoleBindings: every grant in a tenant
// namespace goes through `tenants apply` or `users add`, so that `users
// revoke` can find and remove all of a user's grants.
func adminRules() []rbacv1.PolicyRule {
	return append(userRules(),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: allVerbs},
		rbacv1.PolicyRule{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: allVerbs},
		rbacv1.PolicyRule{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}, Verbs: readVerbs},
	)
}

// sharedObjects are the cluster-wide objects every tenant shares: the
// tenant-admin ClusterRole and the admission policies for tenant pods.
func sharedObjects() []runtime.Object {
	objs := []runtime.Object{
		&rbacv1.ClusterRole{
			ObjectMeta: objectMeta("", "", ClusterRoleAdmin),
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: readVerbs},
				{APIGroups: []string{"scheduling.k8s.io"}, Resources: []string{"priorityclasses"}, Verbs: readVerbs},
			},
		},
	}
	objs = append(objs, podPolicy(PriorityPolicy, admissionv1.Validation{
		Expression: fmt.Sprintf(`!has(object.spec.priorityClassName) || object.spec.priorityClassName == "" || `+
			`(has(namespaceObject.metadata.annotations) && %[1]q in namespaceObject.metadata.annotations && `+
			`namespaceObject.metadata.annotations[%[1]q].split(",").exists(c, c == object.spec.priorityClassName))`, AnnotationPriorityClasses),
		MessageExpression: fmt.Sprintf(`"priorityClassName " + object.spec.priorityClassName + " is not one of this tenant's tiers; `+
			`use one of: " + (has(namespaceObject.metadata.annotations) && %[1]q in namespaceObject.metadata.annotations ? `+
			`namespaceObject.metadata.annotations[%[1]q] : "none")`, AnnotationPriorityClasses),
		Reason: ptr(metav1.StatusReasonForbidden),
	})...)
	// Only pods: controllers make pods from templates, and a pod's volumes
	// cannot change after it is created.
	objs = append(objs, podPolicy(VolumePolicy, admissionv1.Validation{
		Expression: `!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.nfs))`,
		MessageExpression: fmt.Sprintf(`"pods in tenant namespaces may not mount NFS directly (volume " + `+
			`object.spec.volumes.filter(v, has(v.nfs))[0].name + "): use a PersistentVolumeClaim of %s"`, sharedvol.StorageClass),
		Reason: ptr(metav1.StatusReasonForbidden),
	})...)
	return objs
}

// podPolicy is a ValidatingAdmissionPolicy named name, and its binding, that
// checks v on every pod created in a tenant's namespaces. It fails closed: a
// pod the policy cannot be evaluated for is refused.
func podPolicy(name string, v admissionv1.Validation) []runtime.Object {
	failClosed := admissionv1.Fail
	return []runtime.Object{
		&admissionv1.ValidatingAdmissionPolicy{
			ObjectMeta: objectMeta("", "", name),
			Spec: admissionv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: &failClosed,
				MatchConstraints: &admissionv1.MatchResources{
					NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
						{Key: LabelTenant, Operator: metav1.LabelSelectorOpExists},
					}},
					ResourceRules: []admissionv1.NamedRuleWithOperations{{
						RuleWithOperations: admissionv1.RuleWithOperations{
							Operations: []admissionv1.OperationType{admissionv1.Create},
							Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
						},
					}},
				},
				Validations: []admissionv1.Validation{v},
			},
		},
		&admissionv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: objectMeta("", "", name),
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        name,
				ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			},
		},
	}
}

func tenantObjects(t *Tenant) []runtime.Object {
	var objs []runtime.Object
	var classes []string
	for _, tier := range t.Tiers {
		cls := PriorityClassName(t.Name, tier.Name)
		classes = append(classes, cls)
		policy := corev1.PreemptNever
		if tier.Preempt {
			policy = corev1.PreemptLowerPriority
		}
		objs = append(objs, &schedulingv1.PriorityClass{
			ObjectMeta:       objectMeta(t.Name, "", cls),
			Value:            int32(tier.Priority),
			PreemptionPolicy: &policy,
			Description:      fmt.Sprintf("gpurack tenant %s, tier %s", t.Name, tier.Name),
		})
	}
	for _, ns := range t.Namespaces {
		nsMeta := objectMeta(t.Name, "", ns)
		nsMeta.Labels["pod-security.kubernetes.io/enforce"] = t.PodSecurity
		nsMeta.Annotations = map[string]string{AnnotationPriorityClasses: strings.Join(classes, ",")}
		objs = append(objs, &corev1.Namespace{ObjectMeta: nsMeta})
		objs = append(objs, &corev1.ResourceQuota{
			ObjectMeta: objectMeta(t.Name, ns, QuotaName),
			Spec:       corev1.ResourceQuotaSpec{Hard: quotaHard(t.Quota)},
		})
		for _, tier := range t.Tiers {
			gpus := tier.GPUs
			if gpus == "" {
				gpus = t.Quota.GPUs
			}
			if gpus == "" {
				continue
			}
			objs = append(objs, &corev1.ResourceQuota{
				ObjectMeta: objectMeta(t.Name, ns, TierQuotaPrefix+tier.Name),
				Spec: corev1.ResourceQuotaSpec{
					Hard: corev1.ResourceList{QuotaGPU: resource.MustParse(gpus)},
					ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
						ScopeName: corev1.ResourceQuotaScopePriorityClass,
						Operator:  corev1.ScopeSelectorOpIn,
						Values:    []string{PriorityClassName(t.Name, tier.Name)},
					}}},
				},
			})
		}
		objs = append(objs, &corev1.LimitRange{
			ObjectMeta: objectMeta(t.Name, ns, LimitRangeName),
			Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
				Type: corev1.LimitTypeContainer,
				DefaultRequest: corev1.ResourceList{
					corev1.ResourceCPU:    resource.MustParse(t.Defaults.CPU),
					corev1.ResourceMemory: resource.MustParse(t.Defaults.Memory),
				},
			}}},
		})
		objs = append(objs,
			&rbacv1.Role{ObjectMeta: objectMeta(t.Name, ns, RoleUser), Rules: userRules()},
			&rbacv1.Role{ObjectMeta: objectMeta(t.Name, ns, RoleAdmin), Rules: adminRules()},
			&rbacv1.RoleBinding{
				ObjectMeta: objectMeta(t.Name, ns, BindingUsers),
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleUser},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: GroupUsers(t.Name)}},
			},
			&rbacv1.RoleBinding{
				ObjectMeta: objectMeta(t.Name, ns, BindingAdmins),
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleAdmin},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: GroupAdmins(t.Name)}},
			},
			networkPolicy(t, ns),
		)
	}
	objs = append(objs, &rbacv1.ClusterRoleBinding{
		ObjectMeta: objectMeta(t.Name, "", "gpurack:tenant:"+t.Name+":admins"),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ClusterRoleAdmin},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: GroupAdmins(t.Name)}},
	})
	return objs
}

func quotaHard(q Quota) corev1.ResourceList {
	hard := corev1.ResourceList{}
	set := func(name corev1.ResourceName, v string) {
		if v != "" {
			hard[name] = resource.MustParse(v)
		}
	}
	set(QuotaGPU, q.GPUs)
	set(corev1.ResourceRequestsCPU, q.CPU)
	set(corev1.ResourceRequestsMemory, q.Memory)
	set(corev1.ResourcePods, q.Pods)
	set(corev1.ResourceRequestsStorage, q.Storage)
	for _, class := range slices.Sorted(maps.Keys(q.StorageClasses)) {
		set(StorageClassResource(class, corev1.ResourceRequestsStorage), q.StorageClasses[class].Requests)
		set(StorageClassResource(class, corev1.ResourcePersistentVolumeClaims), q.StorageClasses[class].Claims)
	}
	return hard
}

// storageClassDomain follows a StorageClass's name in the prefix of the
// quota resources Kubernetes counts per class.
const storageClassDomain = ".storageclass.storage.k8s.io"

// StorageClassResource is the quota resource that counts r (requests.storage
// or persistentvolumeclaims) of the claims of one StorageClass only:
// CLASS.storageclass.storage.k8s.io/r, as Kubernetes' quota evaluator for
// PersistentVolumeClaims names it.
func StorageClassResource(class string, r corev1.ResourceName) corev1.ResourceName {
	return corev1.ResourceName(class + storageClassDomain + "/" + string(r))
}

// networkPolicy denies ingress to every pod of ns except from the tenant's
// own namespaces, from kube-system (cluster DNS, monitoring) and from the
// namespaces the tenant lists in allowFrom. Egress is not restricted.
func networkPolicy(t *Tenant, ns string) *networkingv1.NetworkPolicy {
	peers := []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelTenant: t.Name}}},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: metav1.NamespaceSystem}}},
	}
	if len(t.AllowFrom) > 0 {
		peers = append(peers, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: t.AllowFrom}},
		}})
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: objectMeta(t.Name, ns, NetworkPolicyName),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: peers}},
		},
	}
}

func ptr[T any](v T) *T { return &v }
