package tenants

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestQueueObjects: with queues, each tenant gets a ClusterQueue in the one cohort with
// its GPU quota as the nominal quota and the preemption that reclaims only borrowed
// GPUs, a LocalQueue in each namespace, and ResourceQuotas whose GPU ceiling leaves room
// for what it may borrow; without queues, none of it.
func TestQueueObjects(t *testing.T) {
	f, err := Parse("t.yaml", []byte(`apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: alpha
    quota: {gpus: 4}
    namespaces: [alpha, alpha-dev]
  - name: beta
    quota: {gpus: 6}
    queue: {borrowingLimit: 2, lendingLimit: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ObjectsFor(f, Options{Queues: true})
	if err != nil {
		t.Fatal(err)
	}
	find := func(resource, ns, name string) *unstructured.Unstructured {
		for _, o := range objs {
			if o.GVR.Resource == resource && o.Obj.GetNamespace() == ns && o.Obj.GetName() == name {
				return o.Obj
			}
		}
		t.Fatalf("no %s %s/%s", resource, ns, name)
		return nil
	}
	cq := find("clusterqueues", "", "alpha")
	if c, _, _ := unstructured.NestedString(cq.Object, "spec", "cohortName"); c != Cohort {
		t.Errorf("cohort %q", c)
	}
	if p, _, _ := unstructured.NestedString(cq.Object, "spec", "preemption", "reclaimWithinCohort"); p != "Any" {
		t.Errorf("reclaimWithinCohort %q", p)
	}
	if p, _, _ := unstructured.NestedString(cq.Object, "spec", "preemption", "borrowWithinCohort", "policy"); p != "Never" {
		t.Errorf("borrowWithinCohort %q", p)
	}
	groups, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups")
	flavors := groups[0].(map[string]any)["flavors"].([]any)
	res := flavors[0].(map[string]any)["resources"].([]any)
	if gpu := res[2].(map[string]any); gpu["name"] != string(GPUResource) || gpu["nominalQuota"] != "4" {
		t.Errorf("alpha's GPU quota in its queue: %v", gpu)
	}
	find("localqueues", "alpha-dev", LocalQueueName)
	// alpha may borrow all of beta's but what beta keeps (lends at most 3): 4+3.
	// beta may borrow 2: 6+2.
	for ns, want := range map[string]string{"alpha": "7", "beta": "8"} {
		rq := find("resourcequotas", ns, QuotaName)
		if got, _, _ := unstructured.NestedString(rq.Object, "spec", "hard", string(QuotaGPU)); got != want {
			t.Errorf("%s's ResourceQuota GPUs %q, want %q", ns, got, want)
		}
	}
	plain, err := Objects(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range plain {
		if o.GVR.Group == kueueGV.Group {
			t.Errorf("queues off, yet %s", o.Key())
		}
	}
	bad, _ := Parse("t.yaml", []byte("apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n  - name: a\n    queue: {borrowingLimit: 1.5}\n"))
	if bad != nil {
		t.Error("a fractional borrowingLimit was accepted")
	}
}
