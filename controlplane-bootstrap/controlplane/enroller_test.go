package controlplane_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

func TestEnrollerIdentityPermissions(t *testing.T) {
	c := testcluster.Shared(t)
	enroller, err := kubernetes.NewForConfig(testcluster.RESTConfigFrom(t, c.EnrollerKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Clientset(t)
	ctx := ctxFor(t, 2*time.Minute)
	secrets := enroller.CoreV1().Secrets(metav1.NamespaceSystem)

	// Allowed: create and delete a bootstrap-token Secret.
	tok, err := joinconfig.TokenSecret("enrol1.0123456789abcdef", joinconfig.TokenOptions{TTL: 15 * time.Minute}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Create(ctx, tok, metav1.CreateOptions{}); err != nil {
		t.Fatalf("enroller creating a bootstrap token: %v", err)
	}
	if err := secrets.Delete(ctx, tok.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("enroller deleting a bootstrap token: %v", err)
	}

	// Refused: reading any Secret.
	if _, err := secrets.Get(ctx, tok.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller get secret: %v, want Forbidden", err)
	}
	if _, err := secrets.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller list secrets: %v, want Forbidden", err)
	}
	if _, err := enroller.CoreV1().Secrets(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller watch secrets: %v, want Forbidden", err)
	}

	// Refused by the admission policy: another type, or another name.
	opaque := tok.DeepCopy()
	opaque.Name = "bootstrap-token-enrol2"
	opaque.Type = corev1.SecretTypeOpaque
	wrongName := tok.DeepCopy()
	wrongName.Name = "not-a-bootstrap-token"
	for what, s := range map[string]*corev1.Secret{"an Opaque Secret": opaque, "a token Secret named not-a-bootstrap-token": wrongName} {
		_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
		if err == nil {
			t.Errorf("enroller created %s", what)
			secrets.Delete(ctx, s.Name, metav1.DeleteOptions{})
			continue
		}
		if !strings.Contains(err.Error(), joinconfig.EnrollerPolicy) && !strings.Contains(err.Error(), "may only create and delete Secrets") {
			t.Errorf("enroller creating %s: %v, want the admission policy's refusal", what, err)
		}
	}
	// Refused: deleting a Secret that is not a bootstrap token.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "enroller-test-other", Namespace: metav1.NamespaceSystem}, Type: corev1.SecretTypeOpaque}
	if _, err := admin.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, other.Name, metav1.DeleteOptions{})
	if err := secrets.Delete(ctx, other.Name, metav1.DeleteOptions{}); err == nil {
		t.Error("enroller deleted an Opaque Secret")
	}
	// Refused: Secrets elsewhere, Pods.
	s := tok.DeepCopy()
	s.Namespace = metav1.NamespaceDefault
	if _, err := enroller.CoreV1().Secrets(metav1.NamespaceDefault).Create(ctx, s, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller creating a Secret in default: %v, want Forbidden", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "enroller-pod"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.1"}}}}
	if _, err := enroller.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller creating a Pod: %v, want Forbidden", err)
	}
	// ResourceQuotas: list only (the rack report's tenant GPU quotas).
	if _, err := enroller.CoreV1().ResourceQuotas(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("enroller listing ResourceQuotas: %v", err)
	}
	rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "enroller-quota"}}
	if _, err := enroller.CoreV1().ResourceQuotas(metav1.NamespaceDefault).Create(ctx, rq, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller creating a ResourceQuota: %v, want Forbidden", err)
	}

	// ConfigMaps: get kube-system/kubeadm-config only (gpuboot reads the cluster's
	// networking facts there, decision 0672); no other ConfigMap, no list, no write.
	cms := enroller.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	if _, err := cms.Get(ctx, joinconfig.KubeadmConfigMap, metav1.GetOptions{}); err != nil {
		t.Errorf("enroller get kube-system/%s: %v", joinconfig.KubeadmConfigMap, err)
	}
	if _, err := cms.Get(ctx, joinconfig.KubeletConfigMap, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller get kube-system/%s: %v, want Forbidden", joinconfig.KubeletConfigMap, err)
	}
	if _, err := cms.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller list ConfigMaps: %v, want Forbidden", err)
	}
	if _, err := cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: joinconfig.KubeadmConfigMap, Namespace: metav1.NamespaceSystem}}, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller update kube-system/%s: %v, want Forbidden", joinconfig.KubeadmConfigMap, err)
	}

	// Nodes: get, list, watch every Node; patch and delete only gpurack-managed ones
	// (labelled joinconfig.ManagedNodeLabel, as every gpurack agent registers its
	// Node), and of those change only the gpurack.io/ taints (EnrollerNodePolicy).
	nodes := enroller.CoreV1().Nodes()
	mk := func(name string, labels map[string]string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "example.com/dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}}}}
		created, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) })
		return created
	}
	managed := mk("enroller-managed", map[string]string{joinconfig.ManagedNodeLabel: "8", "team": "a"})
	foreign := mk("enroller-foreign", map[string]string{"team": "a"})
	if _, err := nodes.List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("enroller list nodes: %v", err)
	}
	w, err := nodes.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("enroller watch nodes: %v", err)
	} else {
		w.Stop()
	}
	if _, err := nodes.Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("enroller get a foreign node: %v", err)
	}
	// What the node controller does: a JSON patch replacing the taints, adding a
	// gpurack.io/ one and keeping the others.
	taints := func(n *corev1.Node, extra ...corev1.Taint) []byte {
		b, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/taints", "value": append(append([]corev1.Taint{}, n.Spec.Taints...), extra...)}})
		return b
	}
	unhealthy := corev1.Taint{Key: "gpurack.io/gpu-unhealthy", Effect: corev1.TaintEffectNoSchedule}
	got, err := nodes.Patch(ctx, managed.Name, types.JSONPatchType, taints(managed, unhealthy), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("enroller tainting a gpurack-managed node: %v", err)
	}
	hasTaint := func(n *corev1.Node, key string) bool {
		return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
	}
	// (The API server's TaintNodesByCondition may add node.kubernetes.io/not-ready on
	// the way: a test Node has no Ready condition.)
	if !hasTaint(got, unhealthy.Key) || !hasTaint(got, "example.com/dedicated") {
		t.Errorf("taints after patch: %v", got.Spec.Taints)
	}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("enroller %s: allowed", what)
		} else if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), joinconfig.EnrollerUser+" may only") {
			t.Errorf("enroller %s: %v; want the admission policy's refusal", what, err)
		}
	}
	merge := func(name, patch string) error {
		_, err := nodes.Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	refused("tainting a node gpurack does not manage", func() error {
		_, err := nodes.Patch(ctx, foreign.Name, types.JSONPatchType, taints(foreign, unhealthy), metav1.PatchOptions{})
		return err
	}())
	refused("relabelling a managed node", merge(managed.Name, `{"metadata":{"labels":{"team":"b"}}}`))
	refused("removing the managed label", merge(managed.Name, `{"metadata":{"labels":{"`+joinconfig.ManagedNodeLabel+`":null}}}`))
	refused("labelling a foreign node managed", merge(foreign.Name, `{"metadata":{"labels":{"`+joinconfig.ManagedNodeLabel+`":"8"}}}`))
	refused("annotating a managed node", merge(managed.Name, `{"metadata":{"annotations":{"x":"y"}}}`))
	refused("cordoning a managed node", merge(managed.Name, `{"spec":{"unschedulable":true}}`))
	refused("removing a managed node's other taint", func() error {
		b, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/taints", "value": []corev1.Taint{unhealthy}}})
		_, err := nodes.Patch(ctx, managed.Name, types.JSONPatchType, b, metav1.PatchOptions{})
		return err
	}())
	refused("adding a NoExecute taint outside gpurack.io/", func() error {
		cur, _ := nodes.Get(ctx, managed.Name, metav1.GetOptions{})
		_, err := nodes.Patch(ctx, managed.Name, types.JSONPatchType, taints(cur, corev1.Taint{Key: "example.com/evict", Effect: corev1.TaintEffectNoExecute}), metav1.PatchOptions{})
		return err
	}())
	refused("deleting a node gpurack does not manage", nodes.Delete(ctx, foreign.Name, metav1.DeleteOptions{}))
	if _, err := nodes.Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the foreign node after the refused delete: %v", err)
	}
	if n, _ := admin.CoreV1().Nodes().Get(ctx, managed.Name, metav1.GetOptions{}); n.Labels["team"] != "a" || n.Labels[joinconfig.ManagedNodeLabel] != "8" || n.Annotations["x"] != "" || n.Spec.Unschedulable ||
		!hasTaint(n, "example.com/dedicated") || hasTaint(n, "example.com/evict") {
		t.Errorf("the managed node after the refused patches: labels %v unschedulable %v taints %v", n.Labels, n.Spec.Unschedulable, n.Spec.Taints)
	}
	// Status (the agent's GPUHealthy condition): no grant at all.
	if _, err := nodes.Patch(ctx, managed.Name, types.StrategicMergePatchType, []byte(`{"status":{"conditions":[{"type":"GPUHealthy","status":"True"}]}}`),
		metav1.PatchOptions{}, "status"); !apierrors.IsForbidden(err) {
		t.Errorf("enroller patching a node's status: %v, want Forbidden", err)
	}
	// Decommissioning deletes the machine's Node.
	if err := nodes.Delete(ctx, managed.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("enroller deleting a gpurack-managed node: %v", err)
	}
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "enroller-created", Labels: map[string]string{joinconfig.ManagedNodeLabel: "1"}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller creating a node: %v, want Forbidden", err)
	}
}
