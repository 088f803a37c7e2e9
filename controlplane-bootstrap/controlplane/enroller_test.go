package controlplane_test

import (
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

	// Allowed: Nodes get, list, watch, patch (taints), delete.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "enroller-target"}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{})
	if _, err := enroller.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("enroller list nodes: %v", err)
	}
	w, err := enroller.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("enroller watch nodes: %v", err)
	} else {
		w.Stop()
	}
	taint := []byte(`{"spec":{"taints":[{"key":"gpurack.io/unvalidated","effect":"NoSchedule"}]}}`)
	got, err := enroller.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, taint, metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("enroller tainting a node: %v", err)
	}
	if len(got.Spec.Taints) != 1 || got.Spec.Taints[0].Key != "gpurack.io/unvalidated" {
		t.Errorf("taints after patch: %v", got.Spec.Taints)
	}
	if err := enroller.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("enroller deleting a node: %v", err)
	}
	if _, err := enroller.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller creating a node: %v, want Forbidden", err)
	}
}
