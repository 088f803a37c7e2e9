package podres

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// TestTenantsFromNamespaces: against the real apiserver, a namespace's tenant is its
// label, kept for MaxAge (a relabel shows after it), a namespace without the label or
// not there has none, and Allocation carries each holder's tenant.
func TestTenantsFromNamespaces(t *testing.T) {
	c := testcluster.Shared(t)
	cs := c.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, labels := range map[string]map[string]string{"podres-vision": {TenantLabel: "alpha"}, "podres-plain": nil} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	tn := &Tenants{Client: cs, MaxAge: 2 * time.Second}
	cached := time.Now()
	if got := tn.Of(ctx, "podres-vision"); got != "alpha" {
		t.Errorf("podres-vision: tenant %q, want alpha", got)
	}
	if got := tn.Of(ctx, "podres-plain"); got != "" {
		t.Errorf("podres-plain: tenant %q, want none", got)
	}
	if got := tn.Of(ctx, "podres-absent"); got != "" {
		t.Errorf("a namespace that is not there: tenant %q, want none", got)
	}
	patch := []byte(`{"metadata":{"labels":{"` + TenantLabel + `":"beta"}}}`)
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, "podres-vision", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Only while MaxAge has not passed since the first lookup (a loaded machine can take
	// longer than that to get here: then the kept value may rightly be gone).
	if got := tn.Of(ctx, "podres-vision"); got != "alpha" && time.Since(cached) < tn.MaxAge {
		t.Errorf("within MaxAge: tenant %q, want the kept alpha", got)
	}
	time.Sleep(time.Until(cached.Add(tn.MaxAge + 100*time.Millisecond)))
	if got := tn.Of(ctx, "podres-vision"); got != "beta" {
		t.Errorf("after MaxAge: tenant %q, want beta", got)
	}

	a := Allocation(ctx, Holders{"GPU-b": {{Namespace: "podres-plain", Pod: "p", Container: "c"}},
		"GPU-a": {{Namespace: "podres-vision", Pod: "q", Container: "c"}, {Namespace: "podres-vision", Pod: "r", Container: "c"}}}, tn.Of)
	var got []string
	for _, h := range a.GetHolders() {
		got = append(got, h.GetGpuUuid()+" "+h.GetNamespace()+"/"+h.GetPod()+" "+h.GetTenant())
	}
	want := []string{"GPU-a podres-vision/q beta", "GPU-a podres-vision/r beta", "GPU-b podres-plain/p "}
	if len(got) != len(want) {
		t.Fatalf("allocation %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("holder %d: %q, want %q", i, got[i], want[i])
		}
	}

	// Without a kubeconfig yet (before the join): no tenant, no error.
	if got := (&Tenants{Kubeconfig: t.TempDir() + "/none"}).Of(ctx, "podres-vision"); got != "" {
		t.Errorf("without a kubeconfig: tenant %q, want none", got)
	}
}
