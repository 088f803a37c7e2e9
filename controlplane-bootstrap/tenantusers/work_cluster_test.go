package tenantusers_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// The shared test cluster has the gpurack-shared class (testcluster.TestNFS)
// and no agent to provision it: work claims stay Pending, which is all these
// tests need.
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// workTenants: iota's namespace named for it is not its first by name; kappa's
// gpurack-shared quota is smaller than a work directory.
const workTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: iota
    namespaces: [a-iota, iota]
    quota:
      storageClasses:
        gpurack-shared: {requests: 100Gi, claims: 2}
  - name: kappa
    quota:
      storageClasses:
        gpurack-shared: {requests: 10Gi}
`

func applyTenants(t *testing.T, ctx context.Context, c *testcluster.Cluster, admin kubernetes.Interface, src string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
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
	if err := tenants.Execute(ctx, dyn, p, false); err != nil {
		t.Fatal(err)
	}
	// Quota admission refuses claims until the quota controller has recorded
	// each quota's status.
	class := tenants.StorageClassResource(sharedvol.StorageClass, corev1.ResourceRequestsStorage)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, ns := range []string{"a-iota", "iota", "kappa"} {
			rq, err := admin.CoreV1().ResourceQuotas(ns).Get(ctx, tenants.QuotaName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if _, ok := rq.Status.Hard[class]; !ok {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("quota status: %v", err)
	}
}

func TestWorkDirectoryWithARealAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin := c.Clientset(t)
	applyTenants(t, ctx, c, admin, workTenants)
	set, err := clusterpki.Load(c.ControlPlane().Layout.PKIDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &tenantusers.Store{}
	add := func(user, tenant string, size, class string) (*tenantusers.Issued, error) {
		return tenantusers.Add(ctx, admin, set, store, tenantusers.AddOptions{
			User: user, Tenant: tenant, Role: tenantusers.RoleUser, TTL: time.Hour, ClusterName: "testcluster", Server: c.Server,
			WorkSize: resource.MustParse(size), WorkClass: class,
		})
	}
	claims := admin.CoreV1().PersistentVolumeClaims("iota")

	issued, err := add("ann.lee", "iota", "50Gi", "")
	if err != nil {
		t.Fatal(err)
	}
	const line = "work directory: PVC iota/work-ann.lee (gpurack-shared, 50Gi); mount it in a pod as claimName: work-ann.lee"
	if w := issued.Work; w.State != tenantusers.WorkMade || w.String() != line {
		t.Errorf("work directory %+v:\n%s\nwant %s", w, w, line)
	}
	made, err := claims.Get(ctx, "work-ann.lee", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if made.Spec.StorageClassName == nil || *made.Spec.StorageClassName != sharedvol.StorageClass ||
		!slices.Equal(made.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}) ||
		made.Spec.Resources.Requests.Storage().String() != "50Gi" ||
		made.Labels[tenants.LabelTenant] != "iota" || made.Labels[tenantusers.LabelUser] != "ann.lee" {
		t.Errorf("claim: labels %v, spec %+v", made.Labels, made.Spec)
	}

	t.Run("revoke keeps it, and adding again leaves it", func(t *testing.T) {
		if _, err := tenantusers.Revoke(ctx, admin, store, "ann.lee", time.Now()); err != nil {
			t.Fatal(err)
		}
		kept, err := tenantusers.WorkClaims(ctx, admin, "ann.lee")
		if err != nil || !slices.Equal(kept, []string{"iota/work-ann.lee"}) {
			t.Errorf("work claims after revoke: %v %v", kept, err)
		}
		again, err := add("ann.lee", "iota", "10Gi", "")
		if err != nil {
			t.Fatal(err)
		}
		if w := again.Work; w.State != tenantusers.WorkKept || w.Size.String() != "50Gi" ||
			!strings.Contains(w.String(), "PVC iota/work-ann.lee (gpurack-shared, 50Gi, already there: left as it was)") {
			t.Errorf("second add: %+v %s", w, w)
		}
		// Not the resourceVersion: the controller-manager annotates a Pending claim of
		// an external provisioner's class when it gets to it, which may be now.
		cur, err := claims.Get(ctx, "work-ann.lee", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cur.UID != made.UID || cur.Spec.Resources.Requests.Storage().String() != "50Gi" ||
			!maps.Equal(cur.Labels, made.Labels) {
			t.Errorf("claim after the second add: uid %s, was %s; size %s, want 50Gi; labels %v, were %v",
				cur.UID, made.UID, cur.Spec.Resources.Requests.Storage(), cur.Labels, made.Labels)
		}
	})

	t.Run("over the quota: no claim and no credential", func(t *testing.T) {
		_, err := add("bob", "kappa", "50Gi", "")
		for _, want := range []string{"exceeded quota: " + tenants.QuotaName, "raise quota.storageClasses.gpurack-shared", "tenant kappa", "no credential was issued"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("a 50Gi work directory on a 10Gi quota: %v; want it to say %q", err, want)
			}
		}
		t.Logf("refused: %v", err)
		if slices.ContainsFunc(store.Credentials, func(c tenantusers.Credential) bool { return c.User == "bob" }) {
			t.Error("bob got a credential")
		}
		if _, err := admin.RbacV1().RoleBindings("kappa").Get(ctx, "gpurack-user-bob", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("bob's binding: %v; want none", err)
		}
	})

	t.Run("no class, or size 0: no claim", func(t *testing.T) {
		for _, tc := range []struct{ user, size, class, state, line string }{
			{"carl", "50Gi", "gpurack-missing", tenantusers.WorkNoClass,
				"no work directory was made: the cluster has no StorageClass gpurack-missing (storage.nfs in cluster.yaml)"},
			{"dana", "0", "", tenantusers.WorkNone, "no work directory (--work-size 0)"},
		} {
			issued, err := add(tc.user, "iota", tc.size, tc.class)
			if err != nil {
				t.Fatal(err)
			}
			if w := issued.Work; w.State != tc.state || w.String() != tc.line {
				t.Errorf("%s: %+v %q; want %s %q", tc.user, w, w, tc.state, tc.line)
			}
			if _, err := claims.Get(ctx, "work-"+tc.user, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s's claim: %v; want none", tc.user, err)
			}
			if len(store.Active(tc.user, time.Now())) != 1 {
				t.Errorf("%s got no credential", tc.user)
			}
		}
	})
}
