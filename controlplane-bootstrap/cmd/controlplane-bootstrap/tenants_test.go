package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

const cliTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: gamma
    quota: {gpus: 1, pods: 5}
    tiers: [{name: batch, priority: 10}]
  - name: delta
    quota: {gpus: 2}
`

func TestCLITenantsAndUsers(t *testing.T) {
	c := testcluster.Shared(t)
	work := t.TempDir()
	file := filepath.Join(work, "tenants.yaml")
	os.WriteFile(file, []byte(cliTenants), 0o644)

	out, err := cli(t, "", "tenants", "diff", "--dir", c.Dir, file)
	if err != nil || !strings.Contains(out, "create    namespaces gamma") || !strings.Contains(out, "0 to delete") {
		t.Fatalf("tenants diff: %v", err)
	}
	if _, err := c.Clientset(t).CoreV1().Namespaces().Get(context.Background(), "gamma", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("diff created namespace gamma: %v", err)
	}
	if out, err = cli(t, "", "tenants", "apply", "--dir", c.Dir, "--registry", testRegistry, file); err != nil || !strings.Contains(out, "applied") ||
		!strings.Contains(out, "registry  new pull credential for delta, gamma") {
		t.Fatalf("tenants apply: %v", err)
	}
	checkTenantPullSecret(t, c, "gamma")
	if out, err = cli(t, "", "tenants", "apply", "--dir", c.Dir, "--registry", testRegistry, file); err != nil || !strings.Contains(out, "0 to create, 0 to update") ||
		strings.Contains(out, "registry  ") {
		t.Fatalf("second tenants apply is not a no-op: %v", err)
	}

	bad := filepath.Join(work, "bad.yaml")
	os.WriteFile(bad, []byte(strings.Replace(cliTenants, "gpus: 2", "gpu: 2", 1)), 0o644)
	if out, err = cli(t, "", "tenants", "apply", "--dir", c.Dir, bad); err == nil || !strings.Contains(out, bad+`:8: tenants[1].quota.gpu: unknown field "gpu"`) {
		t.Errorf("a misspelt field: %v", err)
	}

	kc := filepath.Join(work, "carol.kubeconfig")
	if out, err = cli(t, "", "users", "add", "--dir", c.Dir, "carol", "--tenant", "gamma", "--role", "user", "--ttl", "1h", "--out", kc, "--registry", testRegistry); err != nil ||
		!strings.Contains(out, "user of tenant gamma") || !strings.Contains(out, "wrote "+filepath.Join(work, "carol.registry-auth.json")) {
		t.Fatalf("users add: %v", err)
	}
	if !strings.Contains(out, "work directory: PVC gamma/work-carol (gpurack-shared, 50Gi); mount it in a pod as claimName: work-carol") {
		t.Errorf("users add does not name carol's work directory:\n%s", out)
	}
	issuer := startIssuerProcess(t, c)
	carolAuth := filepath.Join(work, "carol.registry-auth.json")
	if code, body := issuer.token(t, carolAuth, "repository:gamma/train:pull,push"); code != 200 {
		t.Errorf("carol's push token for gamma/train: %d %s", code, body)
	}
	if code, body := issuer.token(t, carolAuth, "repository:delta/train:pull"); code != 403 || !strings.Contains(body, "user carol of tenant gamma may push and pull only under gamma/; delta/train is outside it") {
		t.Errorf("carol asking for delta/train: %d %s", code, body)
	}
	if out, err = cli(t, "", "users", "add", "--dir", c.Dir, "carol", "--tenant", "gamma"); err == nil || !strings.Contains(out, "already holds credential") {
		t.Errorf("adding an active user again: %v", err)
	}
	if out, err = cli(t, "", "users", "list", "--dir", c.Dir); err != nil || !strings.Contains(out, "carol") || !strings.Contains(out, "active") {
		t.Errorf("users list: %v", err)
	}
	carol, err := kubernetes.NewForConfig(testcluster.RESTConfigFrom(t, kc))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if _, err = carol.CoreV1().Pods("gamma").List(ctx, metav1.ListOptions{}); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("carol's kubeconfig: %v", err)
	}
	if out, err = cli(t, "", "users", "revoke", "--dir", c.Dir, "carol"); err != nil || !strings.Contains(out, "deleted rolebinding gamma/gpurack-user-carol") {
		t.Fatalf("users revoke: %v", err)
	}
	if !strings.Contains(out, "work-carol kept; delete it with kubectl delete pvc -n gamma work-carol once its data is saved") {
		t.Errorf("users revoke does not say carol's work directory is kept:\n%s", out)
	}
	if _, err := c.Clientset(t).CoreV1().PersistentVolumeClaims("gamma").Get(ctx, "work-carol", metav1.GetOptions{}); err != nil {
		t.Errorf("carol's work directory after revoke: %v", err)
	}
	if _, err = carol.CoreV1().Pods("gamma").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("carol's kubeconfig after revoke: %v; want Forbidden", err)
	}
	if code, body := issuer.token(t, carolAuth, "repository:gamma/train:pull"); code != 401 {
		t.Errorf("carol's registry password after revoke: %d %s; want 401", code, body)
	}
	if out, err = cli(t, "", "users", "list", "--dir", c.Dir); err != nil || !strings.Contains(out, "revoked") {
		t.Errorf("users list after revoke: %v", err)
	}

	prom := filepath.Join(work, "tenants.prom")
	if out, err = cli(t, "", "tenants", "status", "--dir", c.Dir, "--textfile", prom); err != nil || !regexp.MustCompile(`(?m)^gamma +gamma +0/1 `).MatchString(out) {
		t.Errorf("tenants status: %v", err)
	}
	if data, _ := os.ReadFile(prom); !strings.Contains(string(data), `gpurack_tenant_quota_hard{resource="requests.nvidia.com/gpu",tenant="gamma"} 1`) {
		t.Errorf("textfile lacks gamma's GPU quota:\n%s", data)
	}

	// Dropping delta from the file: refused unless confirmed.
	os.WriteFile(file, []byte(cliTenants[:strings.Index(cliTenants, "  - name: delta")]), 0o644)
	out, err = cli(t, "no\n", "tenants", "apply", "--dir", c.Dir, file)
	if err == nil || !strings.Contains(out, "namespaces delta (and every object in it") || !strings.Contains(out, "nothing was deleted") {
		t.Errorf("apply without delta, answered no: %v", err)
	}
	if ns, err := c.Clientset(t).CoreV1().Namespaces().Get(ctx, "delta", metav1.GetOptions{}); err != nil || ns.DeletionTimestamp != nil {
		t.Fatalf("namespace delta after answering no: %v", err)
	}
	if out, err = cli(t, "", "tenants", "apply", "--dir", c.Dir, "--prune", "--registry", testRegistry, file); err != nil || !strings.Contains(out, "applied") ||
		!strings.Contains(out, "registry  pull credential of delta removed") {
		t.Errorf("apply --prune: %v", err)
	}
	if ns, err := c.Clientset(t).CoreV1().Namespaces().Get(ctx, "delta", metav1.GetOptions{}); err == nil && ns.DeletionTimestamp == nil {
		t.Error("namespace delta still there after --prune")
	}
}
