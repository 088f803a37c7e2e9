package localvolumes_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/localvolumes"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/localvol"
)

// TestObjectsStorageClassReadsCapacity checks what makes the scheduler place a
// claim only on a node with room: the class waits for the first consumer, and its
// provisioner is a CSIDriver with storageCapacity true.
func TestObjectsStorageClassReadsCapacity(t *testing.T) {
	var class *storagev1.StorageClass
	var driver *storagev1.CSIDriver
	order := map[string]int{}
	for i, o := range localvolumes.Objects(testNFS) {
		order[o.GVR.Resource] = i
		switch obj := o.Obj.(type) {
		case *storagev1.StorageClass:
			if obj.Name == localvol.StorageClass {
				class = obj
			}
		case *storagev1.CSIDriver:
			driver = obj
		}
	}
	if class == nil || driver == nil {
		t.Fatalf("Objects() has StorageClass %v and CSIDriver %v, want both", class, driver)
	}
	if class.Name != localvol.StorageClass || class.Provisioner != localvol.Provisioner || driver.Name != class.Provisioner {
		t.Errorf("StorageClass %s provisioner %s, CSIDriver %s: want %s, provisioner = CSIDriver = %s",
			class.Name, class.Provisioner, driver.Name, localvol.StorageClass, localvol.Provisioner)
	}
	if class.VolumeBindingMode == nil || *class.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("volumeBindingMode %v, want WaitForFirstConsumer", class.VolumeBindingMode)
	}
	if class.ReclaimPolicy == nil || *class.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("reclaimPolicy %v, want Delete", class.ReclaimPolicy)
	}
	if class.AllowVolumeExpansion == nil || *class.AllowVolumeExpansion || len(class.Parameters) != 0 || len(class.Annotations) != 0 {
		t.Errorf("allowVolumeExpansion %v, parameters %v, annotations %v: want false, none, none (not the default class)",
			class.AllowVolumeExpansion, class.Parameters, class.Annotations)
	}
	if s := driver.Spec; s.StorageCapacity == nil || !*s.StorageCapacity || s.AttachRequired == nil || *s.AttachRequired ||
		!reflect.DeepEqual(s.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		t.Errorf("CSIDriver spec %+v, want storageCapacity true, attachRequired false, Persistent only", s)
	}
	for _, before := range [][2]string{{"namespaces", "roles"}, {"clusterroles", "clusterrolebindings"}, {"roles", "rolebindings"},
		{"validatingadmissionpolicies", "validatingadmissionpolicybindings"}} {
		if order[before[0]] >= order[before[1]] {
			t.Errorf("%s applied after %s", before[0], before[1])
		}
	}
}

// TestInitAppliesLocalVolumes checks, on a control plane that controlplane.Init
// started, that the objects exist as built and that applying them again, as a second
// init does, succeeds (the StorageClass's provisioner and reclaim policy cannot
// change) and changes nothing.
func TestInitAppliesLocalVolumes(t *testing.T) {
	c := testcluster.Shared(t)
	cs := c.Clientset(t)
	ctx := ctxFor(t, time.Minute)
	class, err := cs.StorageV1().StorageClasses().Get(ctx, localvol.StorageClass, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("storage class: %v", err)
	}
	if class.Provisioner != localvol.Provisioner || *class.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("storage class %s: provisioner %s, binding %s", class.Name, class.Provisioner, *class.VolumeBindingMode)
	}
	driver, err := cs.StorageV1().CSIDrivers().Get(ctx, localvol.Provisioner, metav1.GetOptions{})
	if err != nil || driver.Spec.StorageCapacity == nil || !*driver.Spec.StorageCapacity {
		t.Errorf("CSIDriver %s: %v %+v, want storageCapacity true", localvol.Provisioner, err, driver)
	}
	role, err := cs.RbacV1().ClusterRoles().Get(ctx, localvolumes.Role, metav1.GetOptions{})
	if err != nil || !reflect.DeepEqual(role.Rules, localvolumes.ClusterRules()) {
		t.Errorf("cluster role %s: %v %+v", localvolumes.Role, err, role)
	}
	capRole, err := cs.RbacV1().Roles(localvol.Namespace).Get(ctx, localvolumes.Role, metav1.GetOptions{})
	if err != nil || !reflect.DeepEqual(capRole.Rules, localvolumes.CapacityRules()) {
		t.Errorf("role %s/%s: %v %+v", localvol.Namespace, localvolumes.Role, err, capRole)
	}

	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := joinconfig.Apply(ctx, dyn, localvolumes.Objects(testNFS)); err != nil {
		t.Fatalf("applying the objects again: %v", err)
	}
	again, err := cs.StorageV1().StorageClasses().Get(ctx, localvol.StorageClass, metav1.GetOptions{})
	if err != nil || again.ResourceVersion != class.ResourceVersion {
		t.Errorf("storage class after applying again: %v, resourceVersion %s, was %s", err, again.ResourceVersion, class.ResourceVersion)
	}
}

// TestNodeWritesOnlyItsOwnVolumes checks, as node-a's kubelet credential, that the
// node may create, update and delete its own local volume, and that the policy
// refuses, saying why, a volume on node-b, labelled for node-b, outside the mount
// root, not provisioned by gpurack, and the deletion of node-b's volume.
func TestNodeWritesOnlyItsOwnVolumes(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	pvs := nodeClient(t, c, "node-a").CoreV1().PersistentVolumes()
	ctx := ctxFor(t, 2*time.Minute)

	own := localPV("lv-own-a", "node-a")
	created, err := pvs.Create(ctx, own, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-a creating its own volume: %v", err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		mine, err := pvs.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mine.Labels["example.com/tier"] = "scratch"
		_, err = pvs.Update(ctx, mine, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Errorf("node-a updating its own volume: %v", err)
	}
	if err := pvs.Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("node-a deleting its own volume: %v", err)
	}

	refused := map[string]struct {
		pv    *corev1.PersistentVolume
		words []string
	}{
		"affinity to node-b": {localPV("lv-aff-b", "node-a"), []string{"node node-a", "node affinity", localvol.TopologyKey + " In [node-a]"}},
		"labelled node-b":    {localPV("lv-label-b", "node-b"), []string{"node node-a", localvol.LabelNode + ": node-a"}},
		"path /etc":          {localPV("lv-etc", "node-a"), []string{"node node-a", localvol.MountRoot + "/"}},
		"not provisioned":    {localPV("lv-foreign", "node-a"), []string{"node node-a", localvol.AnnProvisionedBy + ": " + localvol.Provisioner}},
		"two affinity terms": {localPV("lv-two-terms", "node-a"), []string{"node affinity"}},
	}
	refused["affinity to node-b"].pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"node-b"}
	refused["path /etc"].pv.Spec.Local.Path = "/etc"
	delete(refused["not provisioned"].pv.Annotations, localvol.AnnProvisionedBy)
	terms := &refused["two affinity terms"].pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	*terms = append(*terms, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: localvol.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"node-b"}}}})
	for what, r := range refused {
		_, err := pvs.Create(ctx, r.pv, metav1.CreateOptions{})
		wantPolicyRefusal(t, "node-a creating a volume "+what, err, r.words...)
		if err == nil {
			admin.CoreV1().PersistentVolumes().Delete(ctx, r.pv.Name, metav1.DeleteOptions{})
		}
	}

	// The apiserver's validation, before the policy, refuses a way out of the mount root.
	dotdot := localPV("lv-dotdot", "node-a")
	dotdot.Spec.Local.Path = localvol.MountRoot + "/../../../etc"
	if _, err := pvs.Create(ctx, dotdot, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("node-a creating a volume at %s: %v, want Invalid", dotdot.Spec.Local.Path, err)
	}

	// A member of system:nodes that is not a node's own identity may write nothing.
	stranger := impersonate(t, c, "gpurack-test:not-a-node", joinconfig.NodesGroup, "system:authenticated")
	_, err = stranger.CoreV1().PersistentVolumes().Create(ctx, localPV("lv-stranger", "node-a"), metav1.CreateOptions{})
	wantPolicyRefusal(t, "a member of system:nodes not named system:node:NAME creating a volume", err, "not named system:node:NAME")

	other := localPV("lv-other-b", "node-b")
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().PersistentVolumes().Delete(ctx, other.Name, metav1.DeleteOptions{}) })
	wantPolicyRefusal(t, "node-a deleting node-b's volume", pvs.Delete(ctx, other.Name, metav1.DeleteOptions{}), "node node-a")
	// The PV controller updates the volume's status meanwhile: read it afresh then.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		stolen, err := admin.CoreV1().PersistentVolumes().Get(ctx, other.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		stolen.Labels[localvol.LabelNode] = "node-a"
		_, err = pvs.Update(ctx, stolen, metav1.UpdateOptions{})
		return err
	})
	wantPolicyRefusal(t, "node-a relabelling node-b's volume as its own", err, "node node-a")
}

// TestNodeWritesOnlyItsOwnCapacity checks, as node-a, that the node may create and
// update its capacity object in the capacity namespace, that the policy refuses one
// for node-b's topology or label, and that RBAC refuses one in another namespace.
func TestNodeWritesOnlyItsOwnCapacity(t *testing.T) {
	c := testcluster.Shared(t)
	node := nodeClient(t, c, "node-a")
	ctx := ctxFor(t, time.Minute)
	capacity := func(name, label, topology string) *storagev1.CSIStorageCapacity {
		size := resource.MustParse("100Gi")
		return &storagev1.CSIStorageCapacity{
			ObjectMeta:       metav1.ObjectMeta{Name: name, Labels: map[string]string{localvol.LabelNode: label}},
			NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{localvol.TopologyKey: topology}},
			StorageClassName: localvol.StorageClass,
			Capacity:         &size,
		}
	}
	caps := node.StorageV1().CSIStorageCapacities(localvol.Namespace)
	own, err := caps.Create(ctx, capacity("node-a-gpurack-local", "node-a", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-a creating its capacity: %v", err)
	}
	name := own.Name
	t.Cleanup(func() {
		c.Clientset(t).StorageV1().CSIStorageCapacities(localvol.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
	less := resource.MustParse("40Gi")
	own.Capacity = &less
	if own, err = caps.Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a updating its capacity: %v", err)
	}

	_, err = caps.Create(ctx, capacity("node-b-topology", "node-a", "node-b"), metav1.CreateOptions{})
	wantPolicyRefusal(t, "node-a creating capacity for node-b's topology", err, "node node-a", "nodeTopology")
	_, err = caps.Create(ctx, capacity("node-b-label", "node-b", "node-a"), metav1.CreateOptions{})
	wantPolicyRefusal(t, "node-a creating capacity labelled node-b", err, localvol.LabelNode+": node-a")
	extra := capacity("node-a-expressions", "node-a", "node-a")
	extra.NodeTopology.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpExists}}
	_, err = caps.Create(ctx, extra, metav1.CreateOptions{})
	wantPolicyRefusal(t, "node-a creating capacity with a further topology expression", err, "nothing else")
	// (nodeTopology cannot change once created.)
	own.Labels[localvol.LabelNode] = "node-b"
	_, err = caps.Update(ctx, own, metav1.UpdateOptions{})
	wantPolicyRefusal(t, "node-a relabelling its capacity as node-b's", err, localvol.LabelNode+": node-a")

	elsewhere := capacity("node-a-default", "node-a", "node-a")
	_, err = node.StorageV1().CSIStorageCapacities(metav1.NamespaceDefault).Create(ctx, elsewhere, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node-a creating capacity in %s: %v, want Forbidden (RBAC)", metav1.NamespaceDefault, err)
	}
	if err := caps.Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("node-a deleting its capacity: %v", err)
	}
}

// claimsIn creates namespace ns for t (deleted in t.Cleanup) and returns a maker of
// gpurack-local claims there whose selected node is selected ("" for none), created
// as the scheduler leaves them: annotated with the node and the provisioner.
func claimsIn(t *testing.T, admin kubernetes.Interface, ns string) func(name, selected string) *corev1.PersistentVolumeClaim {
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	return func(name, selected string) *corev1.PersistentVolumeClaim {
		class := localvol.StorageClass
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "train"}, Annotations: map[string]string{
				"volume.kubernetes.io/storage-provisioner":      localvol.Provisioner,
				"volume.beta.kubernetes.io/storage-provisioner": localvol.Provisioner,
				"example.com/owner":                             "team-a",
			}},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: &class,
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if selected != "" {
			pvc.Annotations[localvol.AnnSelectedNode] = selected
		}
		created, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
}

// updateClaim reads claim name afresh, changes it and updates it as client,
// again if a controller changed it meanwhile.
func updateClaim(ctx context.Context, client kubernetes.Interface, ns, name string, change func(*corev1.PersistentVolumeClaim)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(pvc)
		_, err = client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
}

// TestNodeClaimWrites checks a node's own claim writes against the real admission
// chain: NodeRestriction refuses node-a any update of a claim's main resource, even
// the removal of its own selected-node annotation (the provisioner library's hand
// back), before the policy is asked; and kubelet's status update of a claim its pod
// uses (as when it resizes a volume) passes, the policy not matching status.
func TestNodeClaimWrites(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	node := nodeClient(t, c, "node-a")
	ctx := ctxFor(t, 2*time.Minute)
	const ns = "localvol-node-claims"
	claim := claimsIn(t, admin, ns)("data", "node-a")

	err := updateClaim(ctx, node, ns, claim.Name, func(pvc *corev1.PersistentVolumeClaim) { delete(pvc.Annotations, localvol.AnnSelectedNode) })
	if err == nil || !strings.Contains(err.Error(), "may only update PVC status") {
		t.Errorf("node-a removing %s from its claim: %v, want NodeRestriction's refusal (may only update PVC status)", localvol.AnnSelectedNode, err)
	}

	// The Node authorizer lets a node write the status of a claim a pod on it uses.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "uses-data", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:   "node-a",
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.1"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}}},
		},
	}
	// Until the namespace's default ServiceAccount exists, admission refuses pods.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("creating a pod on node-a that uses the claim: %v", err)
	}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pvc, err := node.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{
				Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue}}
			_, err = node.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
			return err
		})
		// The authorizer's graph learns of the pod shortly after it is created.
		return last == nil || strings.Contains(last.Error(), localvolumes.Policy), nil
	}); err != nil || last != nil {
		t.Errorf("node-a updating the status of a claim its pod uses: %v", last)
	}
}

// TestPolicyClaimHandback checks the policy's claim rule by itself: as a user named
// system:node:node-a outside system:nodes (so NodeRestriction and the Node authorizer
// pass it by and RBAC grants it localvolumes.Role), the policy lets it remove
// selected-node: node-a and nothing else, and refuses it node-b's claim, a changed
// annotation, label or spec.
func TestPolicyClaimHandback(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	ctx := ctxFor(t, 2*time.Minute)
	const ns, group = "localvol-handback", "gpurack-test:claim-handback"
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: group},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: localvolumes.Role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: group}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), group, metav1.DeleteOptions{})
	})
	user := impersonate(t, c, "system:node:node-a", group, "system:authenticated")
	claim := claimsIn(t, admin, ns)
	mine, theirs := claim("mine", "node-a"), claim("theirs", "node-b")
	unselect := func(pvc *corev1.PersistentVolumeClaim) { delete(pvc.Annotations, localvol.AnnSelectedNode) }

	// RBAC learns of the binding shortly after it is created.
	var err error
	wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err = updateClaim(ctx, user, ns, mine.Name, func(pvc *corev1.PersistentVolumeClaim) {
			unselect(pvc)
			pvc.Annotations["example.com/owner"] = "team-b"
		})
		return err == nil || strings.Contains(err.Error(), localvolumes.Policy), nil
	})
	want := "may only update a claim to remove " + localvol.AnnSelectedNode + ": node-a"
	wantPolicyRefusal(t, "removing selected-node and changing another annotation", err, "node node-a", want)
	err = updateClaim(ctx, user, ns, mine.Name, func(pvc *corev1.PersistentVolumeClaim) { unselect(pvc); pvc.Labels["app"] = "other" })
	wantPolicyRefusal(t, "removing selected-node and changing a label", err, want)
	err = updateClaim(ctx, user, ns, mine.Name, func(pvc *corev1.PersistentVolumeClaim) { unselect(pvc); pvc.Spec.VolumeName = "someone-elses" })
	wantPolicyRefusal(t, "removing selected-node and binding the claim", err, want)
	err = updateClaim(ctx, user, ns, mine.Name, func(pvc *corev1.PersistentVolumeClaim) { pvc.Annotations["example.com/owner"] = "team-b" })
	wantPolicyRefusal(t, "changing an annotation only", err, want)
	err = updateClaim(ctx, user, ns, theirs.Name, unselect)
	wantPolicyRefusal(t, "removing selected-node: node-b", err, want)

	if err := updateClaim(ctx, user, ns, mine.Name, unselect); err != nil {
		t.Fatalf("removing selected-node: node-a and nothing else: %v", err)
	}
	got, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, mine.Name, metav1.GetOptions{})
	if err != nil || got.Annotations[localvol.AnnSelectedNode] != "" || got.Annotations["example.com/owner"] != "team-a" {
		t.Errorf("claim after the hand back: %v %v", err, got.Annotations)
	}
}
