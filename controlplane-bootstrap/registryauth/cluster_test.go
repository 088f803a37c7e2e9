package registryauth_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

const registryTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: reg-a
    namespaces: [reg-a, reg-a-dev]
    quota: {gpus: 1}
  - name: reg-b
    quota: {gpus: 1}
`

func applyTenants(t *testing.T, ctx context.Context, dyn dynamic.Interface, src string) {
	t.Helper()
	f, err := tenants.Parse("tenants.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := tenants.Objects(f)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tenants.ComputePlan(ctx, dyn, objs)
	if err != nil {
		t.Fatal(err)
	}
	var keep tenants.Plan // other tests' tenants stay
	for _, ch := range p.Changes {
		if ch.Action != tenants.Delete {
			keep.Changes = append(keep.Changes, ch)
		}
	}
	if err := tenants.Execute(ctx, dyn, &keep, false); err != nil {
		t.Fatal(err)
	}
}

// ours keeps the tenants of this test from the namespaces' map.
func ours(all map[string][]string) map[string][]string {
	out := map[string][]string{}
	for t, nss := range all {
		if strings.HasPrefix(t, "reg-") {
			out[t] = nss
		}
	}
	return out
}

func TestPullSecretsInTenantNamespaces(t *testing.T) {
	c := testcluster.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := c.Clientset(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	applyTenants(t, ctx, dyn, registryTenants)
	// An operator's own pull secret on an account stays.
	ensureSA(t, ctx, cs, "reg-a-dev", []corev1.LocalObjectReference{{Name: "mirror"}})

	const registry = "10.20.0.1:5000"
	robotsPath := filepath.Join(t.TempDir(), registryauth.RobotsFile)
	robots, _ := registryauth.LoadRobots(robotsPath)
	byTenant, err := registryauth.TenantNamespaces(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	byTenant = ours(byTenant)
	if !slices.Equal(byTenant["reg-a"], []string{"reg-a", "reg-a-dev"}) || !slices.Equal(byTenant["reg-b"], []string{"reg-b"}) {
		t.Fatalf("tenant namespaces %v", byTenant)
	}
	res, err := registryauth.ApplyPullSecrets(ctx, cs, robots, byTenant, registry, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Issued, []string{"reg-a", "reg-b"}) || len(res.Written) < 3 {
		t.Errorf("first apply: %+v", res)
	}
	if err := robots.Save(robotsPath); err != nil {
		t.Fatal(err)
	}
	pwA := checkPullSecret(t, ctx, cs, "reg-a", registry)
	if got := checkPullSecret(t, ctx, cs, "reg-a-dev", registry); got != pwA {
		t.Error("the namespaces of one tenant hold different passwords")
	}
	pwB := checkPullSecret(t, ctx, cs, "reg-b", registry)
	sa, _ := cs.CoreV1().ServiceAccounts("reg-a-dev").Get(ctx, "default", metav1.GetOptions{})
	if !slices.Contains(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: "mirror"}) {
		t.Errorf("the operator's pull secret was dropped: %v", sa.ImagePullSecrets)
	}
	if data, _ := os.ReadFile(robotsPath); strings.Contains(string(data), pwA) || strings.Contains(string(data), pwB) {
		t.Error("a pull password is in the robots file in plaintext")
	}
	users := &tenantusers.Store{}
	if p, ok, _ := registryauth.Authenticate(users, robots, registryauth.RobotUser("reg-a"), pwA, time.Now()); !ok || p.Tenant != "reg-a" || p.Role != registryauth.RoleRobot {
		t.Errorf("reg-a's robot with the password of its Secret: %+v %v", p, ok)
	}
	if _, ok, _ := registryauth.Authenticate(users, robots, registryauth.RobotUser("reg-b"), pwA, time.Now()); ok {
		t.Error("reg-b's robot with reg-a's password")
	}

	// A pod that names no account gets the pull secret from the default account
	// (the ServiceAccount admission plugin), so it pulls without naming it.
	checkPodGetsPullSecret(t, ctx, cs, "reg-a")

	// Applying again changes nothing: same password, no writes.
	again, err := registryauth.ApplyPullSecrets(ctx, cs, robots, byTenant, registry, time.Now())
	if err != nil || len(again.Issued) != 0 || len(again.Written) != 0 || len(again.Removed) != 0 {
		t.Errorf("second apply: %+v %v", again, err)
	}
	if checkPullSecret(t, ctx, cs, "reg-a", registry) != pwA {
		t.Error("a second apply changed reg-a's password")
	}

	// A removed tenant's robot goes, and is refused.
	delete(byTenant, "reg-b")
	gone, err := registryauth.ApplyPullSecrets(ctx, cs, robots, byTenant, registry, time.Now())
	if err != nil || !slices.Equal(gone.Removed, []string{"reg-b"}) || robots.Find("reg-b") != nil {
		t.Errorf("after removing reg-b: %+v %v", gone, err)
	}
	if _, ok, _ := registryauth.Authenticate(users, robots, registryauth.RobotUser("reg-b"), pwB, time.Now()); ok {
		t.Error("a removed tenant's robot authenticated")
	}

	// A Secret edited by hand no longer verifies: the tenant gets a new password.
	s, _ := cs.CoreV1().Secrets("reg-a").Get(ctx, registryauth.PullSecretName, metav1.GetOptions{})
	s.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{}}`)
	cs.CoreV1().Secrets("reg-a").Update(ctx, s, metav1.UpdateOptions{})
	cs.CoreV1().Secrets("reg-a-dev").Delete(ctx, registryauth.PullSecretName, metav1.DeleteOptions{})
	fresh, err := registryauth.ApplyPullSecrets(ctx, cs, robots, byTenant, registry, time.Now())
	if err != nil || !slices.Equal(fresh.Issued, []string{"reg-a"}) {
		t.Errorf("after the Secrets were tampered with: %+v %v", fresh, err)
	}
	if pw := checkPullSecret(t, ctx, cs, "reg-a", registry); pw == pwA || checkPullSecret(t, ctx, cs, "reg-a-dev", registry) != pw {
		t.Error("no new password, or the namespaces disagree")
	}
}

func ensureSA(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string, refs []corev1.LocalObjectReference) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}, ImagePullSecrets: refs}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.ImagePullSecrets = refs
		if _, err := cs.CoreV1().ServiceAccounts(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// checkPullSecret checks ns's pull Secret and default ServiceAccount and returns the
// password the Secret holds for registry.
func checkPullSecret(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns, registry string) string {
	t.Helper()
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, registryauth.PullSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pull secret in %s: %v", ns, err)
	}
	if s.Type != corev1.SecretTypeDockerConfigJson || s.Labels[tenants.LabelTenant] == "" {
		t.Errorf("secret %s/%s: type %s labels %v", ns, s.Name, s.Type, s.Labels)
	}
	pw, ok := registryauth.PasswordIn(s.Data[corev1.DockerConfigJsonKey], registry, registryauth.RobotUser(s.Labels[tenants.LabelTenant]))
	if !ok || len(pw) != 43 {
		t.Errorf("secret %s/%s holds no password for %s: %s", ns, s.Name, registry, s.Data[corev1.DockerConfigJsonKey])
	}
	sa, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, registryauth.ServiceAccount, metav1.GetOptions{})
	if err != nil || !slices.Contains(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: registryauth.PullSecretName}) {
		t.Errorf("serviceaccount %s/default: %v %v", ns, sa, err)
	}
	return pw
}

func checkPodGetsPullSecret(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pull-check", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "10.20.0.1:5000/" + ns + "/app:1"}}},
	}
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Logf("dry-run pod in %s: %v", ns, err)
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("dry-run pod in %s: %v", ns, err)
	}
	if !slices.Contains(got.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: registryauth.PullSecretName}) {
		t.Errorf("a pod in %s that names no account got imagePullSecrets %v", ns, got.Spec.ImagePullSecrets)
	}
}
