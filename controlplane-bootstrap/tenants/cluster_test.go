package tenants_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

const twoTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: alpha
    quota: {gpus: 2, cpu: "4", memory: 8Gi, pods: 10, storage: 100Gi}
    tiers:
      - {name: training, priority: 100, gpus: 1}
      - {name: inference, priority: 1000, preempt: true}
  - name: beta
    quota: {gpus: 1}
    tiers:
      - {name: training, priority: 100}
    allowFrom: [monitoring]
`

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustApply(t *testing.T, ctx context.Context, dyn dynamic.Interface, src string, prune bool) *tenants.Plan {
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
	if err := tenants.Execute(ctx, dyn, p, prune); err != nil {
		t.Fatal(err)
	}
	return p
}

// applyKeepingOthers applies src but deletes nothing, so that the other
// tests' tenants stay.
func applyKeepingOthers(t *testing.T, ctx context.Context, dyn dynamic.Interface, src string) {
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
	var keep tenants.Plan
	for _, ch := range p.Changes {
		if ch.Action != tenants.Delete {
			keep.Changes = append(keep.Changes, ch)
		}
	}
	if err := tenants.Execute(ctx, dyn, &keep, false); err != nil {
		t.Fatal(err)
	}
}

func countActions(p *tenants.Plan) map[tenants.Action]int {
	n := map[tenants.Action]int{}
	for _, c := range p.Changes {
		n[c.Action]++
	}
	return n
}

// userClient issues a credential and returns a clientset that uses the
// kubeconfig exactly as written.
func userClient(t *testing.T, ctx context.Context, c *testcluster.Cluster, admin kubernetes.Interface, store *tenantusers.Store, name, tenant, role string) (kubernetes.Interface, *tenantusers.Credential) {
	t.Helper()
	set, err := clusterpki.Load(c.ControlPlane().Layout.PKIDir())
	if err != nil {
		t.Fatal(err)
	}
	issued, err := tenantusers.Add(ctx, admin, set, store, tenantusers.AddOptions{
		User: name, Tenant: tenant, Role: role, TTL: time.Hour, ClusterName: "testcluster", Server: c.Server,
	})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(issued.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, &issued.Credential
}

// eventually retries f until it returns nil: RBAC, quota status and
// admission policies reach the apiserver's caches by watch, a moment after
// the write.
func eventually(t *testing.T, ctx context.Context, what string, f func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		last = f()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last: %v)", what, err, last)
	}
}

func gpuPod(name, class string, gpus int64) *corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{tenants.GPUResource: q, corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{tenants.GPUResource: q},
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			PriorityClassName: class,
			Containers:        []corev1.Container{{Name: "c", Image: "registry.invalid/none:1", Resources: res}},
		},
	}
}

func wantForbidden(t *testing.T, what string, err error, contains string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want refused", what)
		return
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), contains) {
		t.Errorf("%s: %v; want Forbidden mentioning %q", what, err, contains)
	}
}

func TestTenantsWithARealAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := ctxFor(t, 8*time.Minute)
	admin := c.Clientset(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}

	first := mustApply(t, ctx, dyn, twoTenants, false)
	if n := countActions(first); n[tenants.Create] == 0 || n[tenants.Delete] != 0 {
		t.Fatalf("first apply: %v", n)
	}
	again := mustApply(t, ctx, dyn, twoTenants, false)
	if n := countActions(again); n[tenants.Create] != 0 || n[tenants.Update] != 0 || n[tenants.Delete] != 0 {
		for _, ch := range again.Changes {
			if ch.Action != tenants.Unchanged {
				t.Logf("%s %s", ch.Action, ch.Object.Key())
			}
		}
		t.Fatalf("second apply of the same file is not a no-op: %v", n)
	}

	// Quota admission refuses pods until the quota controller has
	// recorded the quota's status.
	eventually(t, ctx, "quota status", func() error {
		for _, ns := range []string{"alpha", "beta"} {
			rq, err := admin.CoreV1().ResourceQuotas(ns).Get(ctx, tenants.QuotaName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, ok := rq.Status.Hard[tenants.QuotaGPU]; !ok {
				return errors.New("no status.hard yet in " + ns)
			}
		}
		return nil
	})

	store := &tenantusers.Store{}
	ann, annCred := userClient(t, ctx, c, admin, store, "ann", "alpha", tenantusers.RoleUser)
	adam, _ := userClient(t, ctx, c, admin, store, "adam", "alpha", tenantusers.RoleAdmin)
	bob, _ := userClient(t, ctx, c, admin, store, "bob", "beta", tenantusers.RoleUser)
	for name, cs := range map[string]kubernetes.Interface{"ann": ann, "adam": adam} {
		eventually(t, ctx, name+" lists pods in alpha", func() error {
			_, err := cs.CoreV1().Pods("alpha").List(ctx, metav1.ListOptions{})
			return err
		})
	}
	eventually(t, ctx, "bob lists pods in beta", func() error {
		_, err := bob.CoreV1().Pods("beta").List(ctx, metav1.ListOptions{})
		return err
	})

	t.Run("priority classes of another tenant are refused", func(t *testing.T) {
		eventually(t, ctx, "the admission policy refuses beta-training in alpha", func() error {
			_, err := ann.CoreV1().Pods("alpha").Create(ctx, gpuPod("wrong-class", "beta-training", 0), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil {
				return errors.New("admitted")
			}
			if !strings.Contains(err.Error(), "not one of this tenant's tiers") {
				return err
			}
			return nil
		})
	})

	t.Run("GPU quota", func(t *testing.T) {
		_, err := ann.CoreV1().Pods("alpha").Create(ctx, gpuPod("training-2", "alpha-training", 2), metav1.CreateOptions{})
		wantForbidden(t, "2 GPUs in the training tier (tier cap 1)", err, "exceeded quota: "+tenants.TierQuotaPrefix+"training")
		if _, err := ann.CoreV1().Pods("alpha").Create(ctx, gpuPod("inference-2", "alpha-inference", 2), metav1.CreateOptions{}); err != nil {
			t.Fatalf("2 GPUs in the inference tier, within quota: %v", err)
		}
		_, err = ann.CoreV1().Pods("alpha").Create(ctx, gpuPod("one-more", "", 1), metav1.CreateOptions{})
		wantForbidden(t, "a third GPU", err, "exceeded quota: "+tenants.QuotaName)
		_, err = bob.CoreV1().Pods("beta").Create(ctx, gpuPod("two", "", 2), metav1.CreateOptions{})
		wantForbidden(t, "beta: 2 GPUs with a quota of 1", err, "exceeded quota: "+tenants.QuotaName)
		eventually(t, ctx, "tenants status shows alpha's GPUs", func() error {
			us, err := tenants.Status(ctx, admin)
			if err != nil {
				return err
			}
			for _, u := range us {
				if u.Tenant == "alpha" {
					if used, hard := u.GPUs(); used != 2 || hard != 2 {
						return errors.New("alpha GPUs not 2/2 yet")
					}
					if q := u.TierGPUs["inference"]; q[0].Value() != 2 {
						return errors.New("inference tier not at 2 yet")
					}
					return nil
				}
			}
			return errors.New("no alpha in the status")
		})
	})

	t.Run("a pod without requests gets the LimitRange defaults", func(t *testing.T) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "no-requests"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
		}
		got, err := ann.CoreV1().Pods("alpha").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req := got.Spec.Containers[0].Resources.Requests
		if req.Cpu().String() != tenants.DefaultCPURequest || req.Memory().String() != tenants.DefaultMemoryRequest {
			t.Errorf("requests %v; want cpu %s memory %s", req, tenants.DefaultCPURequest, tenants.DefaultMemoryRequest)
		}
	})

	t.Run("no reading another tenant", func(t *testing.T) {
		if _, err := admin.CoreV1().Secrets("beta").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "beta-secret"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := ann.CoreV1().Pods("beta").List(ctx, metav1.ListOptions{})
		wantForbidden(t, "ann lists beta's pods", err, `cannot list resource "pods"`)
		_, err = ann.CoreV1().Secrets("beta").Get(ctx, "beta-secret", metav1.GetOptions{})
		wantForbidden(t, "ann reads beta's Secret", err, `cannot get resource "secrets"`)
		_, err = adam.CoreV1().Secrets("beta").List(ctx, metav1.ListOptions{})
		wantForbidden(t, "adam (alpha admin) lists beta's Secrets", err, `cannot list resource "secrets"`)
		if _, err := ann.CoreV1().Secrets("alpha").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("ann lists her own tenant's Secrets: %v", err)
		}
	})

	t.Run("nodes only for admins", func(t *testing.T) {
		_, err := ann.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		wantForbidden(t, "a tenant user lists nodes", err, `cannot list resource "nodes"`)
		if _, err := adam.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("a tenant admin lists nodes: %v", err)
		}
		err = adam.CoreV1().Nodes().Delete(ctx, "control-plane-1", metav1.DeleteOptions{})
		wantForbidden(t, "a tenant admin deletes a node", err, `cannot delete resource "nodes"`)
	})

	t.Run("no escalation to cluster-admin", func(t *testing.T) {
		for name, cs := range map[string]kubernetes.Interface{"user": ann, "admin": adam} {
			crb := &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "escalate-" + name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "ann"}},
			}
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
			wantForbidden(t, name+" binds cluster-admin cluster-wide", err, "clusterrolebindings")
			rb := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "escalate-" + name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "ann"}},
			}
			_, err = cs.RbacV1().RoleBindings("alpha").Create(ctx, rb, metav1.CreateOptions{})
			wantForbidden(t, name+" binds cluster-admin in its namespace", err, "rolebindings")
			_, err = cs.RbacV1().Roles("alpha").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "all"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}}, metav1.CreateOptions{})
			wantForbidden(t, name+" creates a Role", err, "roles")
			_, err = cs.CoreV1().ResourceQuotas("alpha").Update(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: tenants.QuotaName}}, metav1.UpdateOptions{})
			wantForbidden(t, name+" changes its quota", err, "resourcequotas")
			_, err = cs.CoreV1().Namespaces().Update(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "alpha"}}, metav1.UpdateOptions{})
			wantForbidden(t, name+" relabels its namespace", err, "namespaces")
		}
	})

	t.Run("revocation", func(t *testing.T) {
		deleted, err := tenantusers.Revoke(ctx, admin, store, "ann", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(deleted) == 0 {
			t.Fatal("revoke deleted no bindings")
		}
		// The very next request with the old kubeconfig is refused.
		_, err = ann.CoreV1().Pods("alpha").List(ctx, metav1.ListOptions{})
		wantForbidden(t, "the revoked kubeconfig lists pods", err, `cannot list resource "pods"`)
		if st := store.Credentials[0].State(time.Now()); store.Credentials[0].ID != annCred.ID || st != "revoked" {
			t.Errorf("store: %+v state %s", store.Credentials[0], st)
		}
		// Re-adding the user issues a new credential; the old certificate
		// stays powerless.
		ann2, cred2 := userClient(t, ctx, c, admin, store, "ann", "alpha", tenantusers.RoleUser)
		if cred2.ID == annCred.ID || cred2.Serial == annCred.Serial {
			t.Errorf("re-add reused credential %s / serial %s", cred2.ID, cred2.Serial)
		}
		eventually(t, ctx, "the new kubeconfig works", func() error {
			_, err := ann2.CoreV1().Pods("alpha").List(ctx, metav1.ListOptions{})
			return err
		})
		_, err = ann.CoreV1().Pods("alpha").List(ctx, metav1.ListOptions{})
		wantForbidden(t, "the old kubeconfig after re-add", err, `cannot list resource "pods"`)
	})

	t.Run("removing a tenant asks first", func(t *testing.T) {
		alphaOnly := twoTenants[:strings.Index(twoTenants, "  - name: beta")]
		f, err := tenants.Parse("tenants.yaml", []byte(alphaOnly))
		if err != nil {
			t.Fatal(err)
		}
		objs, _ := tenants.Objects(f)
		p, err := tenants.ComputePlan(ctx, dyn, objs)
		if err != nil {
			t.Fatal(err)
		}
		err = tenants.Execute(ctx, dyn, p, false)
		var refused *tenants.PruneRefusedError
		if !errors.As(err, &refused) {
			t.Fatalf("apply without prune: %v", err)
		}
		for _, want := range []string{"namespaces beta (and every object in it", "priorityclasses beta-training", "clusterrolebindings gpurack:tenant:beta:admins"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal does not name %q:\n%v", want, err)
			}
		}
		if strings.Contains(err.Error(), "resourcequotas beta/") {
			t.Errorf("refusal lists the namespace's contents one by one:\n%v", err)
		}
		ns, err := admin.CoreV1().Namespaces().Get(ctx, "beta", metav1.GetOptions{})
		if err != nil || ns.DeletionTimestamp != nil {
			t.Fatalf("namespace beta after a refused apply: %v %v", err, ns.DeletionTimestamp)
		}
		if err := tenants.Execute(ctx, dyn, p, true); err != nil {
			t.Fatal(err)
		}
		ns, err = admin.CoreV1().Namespaces().Get(ctx, "beta", metav1.GetOptions{})
		if err == nil && ns.DeletionTimestamp == nil {
			t.Error("namespace beta still there after --prune")
		}
		if _, err := admin.SchedulingV1().PriorityClasses().Get(ctx, "beta-training", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("PriorityClass beta-training after prune: %v", err)
		}
	})
}

func TestChangingATierPriorityNamesTheFix(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := ctxFor(t, 3*time.Minute)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	const file = "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: epsilon\n  tiers: [{name: batch, priority: 10}]\n"
	applyKeepingOthers(t, ctx, dyn, file)
	f, err := tenants.Parse("tenants.yaml", []byte(strings.Replace(file, "priority: 10", "priority: 20", 1)))
	if err != nil {
		t.Fatal(err)
	}
	objs, _ := tenants.Objects(f)
	_, err = tenants.ComputePlan(ctx, dyn, objs)
	if err == nil || !strings.Contains(err.Error(), "priorityclasses epsilon-batch") || !strings.Contains(err.Error(), "give the tier a new name") {
		t.Errorf("changing a tier's priority: %v", err)
	}
}

func claim(name, class, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
}

// A tenant's quota of one StorageClass holds its claims of that class to
// their requested size and number, and leaves claims of other classes alone.
// The classes need not exist: quota admission reads only the claim.
func TestStorageClassQuotaWithARealAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := ctxFor(t, 3*time.Minute)
	admin := c.Clientset(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	// The longest class name the file accepts is one the apiserver takes too.
	longest := strings.Repeat("s", 225)
	applyKeepingOthers(t, ctx, dyn, "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: zeta\n  quota:\n    storageClasses:\n"+
		"      gpurack-local: {requests: 1Gi, claims: 2}\n      "+longest+": {claims: 1}\n")
	local := tenants.StorageClassResource("gpurack-local", corev1.ResourceRequestsStorage)
	localClaims := tenants.StorageClassResource("gpurack-local", corev1.ResourcePersistentVolumeClaims)
	eventually(t, ctx, "quota status", func() error {
		rq, err := admin.CoreV1().ResourceQuotas("zeta").Get(ctx, tenants.QuotaName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := rq.Status.Hard[local]; !ok {
			return errors.New("no status.hard yet")
		}
		return nil
	})
	pvcs := admin.CoreV1().PersistentVolumeClaims("zeta")
	if _, err := pvcs.Create(ctx, claim("first", "gpurack-local", "600Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("600Mi of a 1Gi quota: %v", err)
	}
	_, err = pvcs.Create(ctx, claim("second", "gpurack-local", "600Mi"), metav1.CreateOptions{})
	wantForbidden(t, "another 600Mi", err, "exceeded quota: "+tenants.QuotaName+", requested: "+string(local)+"=600Mi, used: "+string(local)+"=600Mi, limited: "+string(local)+"=1Gi")
	t.Logf("over the size: %v", err)
	if _, err := pvcs.Create(ctx, claim("small", "gpurack-local", "100Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("100Mi more, within size and count: %v", err)
	}
	_, err = pvcs.Create(ctx, claim("third", "gpurack-local", "1Mi"), metav1.CreateOptions{})
	wantForbidden(t, "a third claim", err, "exceeded quota: "+tenants.QuotaName+", requested: "+string(localClaims)+"=1")
	t.Logf("over the count: %v", err)
	for _, name := range []string{"other-1", "other-2", "other-3"} {
		if _, err := pvcs.Create(ctx, claim(name, "gpurack-shared", "5Gi"), metav1.CreateOptions{}); err != nil {
			t.Errorf("a claim of a class the quota does not name: %v", err)
		}
	}
	eventually(t, ctx, "tenants status shows zeta's storage", func() error {
		us, err := tenants.Status(ctx, admin)
		if err != nil {
			return err
		}
		for _, u := range us {
			if u.Tenant != "zeta" {
				continue
			}
			got := strings.Join(u.StorageClasses(), "; ")
			if want := "gpurack-local 700Mi/1Gi 2/2 claims; " + longest + " 0/1 claims"; got != want {
				return fmt.Errorf("status %q; want %q", got, want)
			}
			return nil
		}
		return errors.New("no zeta in the status")
	})
}

// volumePod is a pod with an emptyDir and a volume named data of source v.
func volumePod(v corev1.VolumeSource) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mounts"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}},
			Volumes: []corev1.Volume{
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "data", VolumeSource: v},
			},
		},
	}
}

// A tenant's pod may not mount the NFS export itself, which would show it
// every tenant's gpurack-shared volumes; a claim is how it gets one. Pods
// elsewhere are not the policy's business.
func TestTenantPodsMayNotMountNFS(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := ctxFor(t, 3*time.Minute)
	admin := c.Clientset(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	applyKeepingOthers(t, ctx, dyn, "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: eta\n")
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	nfs := corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: testcluster.TestNFS.Server, Path: testcluster.TestNFS.Share}}
	const want = "pods in tenant namespaces may not mount NFS directly (volume data): use a PersistentVolumeClaim of gpurack-shared"
	// Until the namespace's default ServiceAccount and the policy are in
	// the apiserver's caches, the answer is another refusal, or none.
	eventually(t, ctx, "the admission policy refuses an nfs volume in eta", func() error {
		_, err := admin.CoreV1().Pods("eta").Create(ctx, volumePod(nfs), dryRun)
		if err == nil {
			return errors.New("admitted")
		}
		if !strings.Contains(err.Error(), want) {
			return err
		}
		return nil
	})
	_, err = admin.CoreV1().Pods("eta").Create(ctx, volumePod(nfs), dryRun)
	wantForbidden(t, "an inline nfs volume in a tenant namespace", err, tenants.VolumePolicy)
	t.Logf("refused: %v", err)

	claim := corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "work-ann"}}
	if _, err := admin.CoreV1().Pods("eta").Create(ctx, volumePod(claim), dryRun); err != nil {
		t.Errorf("a claim in a tenant namespace: %v", err)
	}
	if _, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, volumePod(nfs), dryRun); err != nil {
		t.Errorf("an inline nfs volume outside the tenants' namespaces: %v", err)
	}
}
