package queues

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
)

const twoTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: alpha
    quota: {gpus: 4}
  - name: beta
    quota: {gpus: 4}
`

// TestQueuesAdmitBorrowAndReclaim: two tenants of 4 GPUs each in one cohort.
// (a) a Job within alpha's quota is admitted; (c) alpha borrows beta's idle GPUs;
// (b) a Job over what alpha may use waits, its Workload pending with a reason naming the
// GPUs, the Job suspended, not refused; (d) when beta submits, Kueue preempts alpha's
// borrowing Job and admits beta's, and alpha's Job within its own quota keeps running;
// (e) beta's next Job, over its quota with nothing left to borrow, waits as alpha's did.
func TestQueuesAdmitBorrowAndReclaim(t *testing.T) {
	c := newCluster(t, 2, 4)
	ctx := ctxFor(t, 4*time.Minute)
	c.applyTenants(t, ctx, twoTenants)

	rq, err := c.cs.CoreV1().ResourceQuotas("alpha").Get(ctx, tenants.QuotaName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rq.Spec.Hard[tenants.QuotaGPU]; got.Value() != 8 {
		t.Errorf("alpha's ResourceQuota allows %s GPUs; want 8 (its 4 and beta's 4 it may borrow)", got.String())
	}

	c.bigger(t, ctx)

	c.submit(t, ctx, gpuJob("alpha", "a1", 4))
	c.waitAdmitted(t, ctx, "alpha", "a1")
	node := ""
	eventually(t, ctx, "a1's pod placed on a node by Kueue's topology", func() (bool, string) {
		pods, err := c.cs.CoreV1().Pods("alpha").List(ctx, metav1.ListOptions{LabelSelector: "job-name=a1"})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods.Items), err)
		}
		p := pods.Items[0]
		node = p.Spec.NodeSelector[tenants.TopologyLevel]
		return node != "" && len(p.Spec.SchedulingGates) == 0, fmt.Sprintf("node selector %v, scheduling gates %v", p.Spec.NodeSelector, p.Spec.SchedulingGates)
	})
	t.Logf("(a) alpha's a1 (4 GPUs, its quota) admitted, its pod placed on %s", node)

	// Kueue preempts, among a borrower's Workloads of one priority, the most recently
	// admitted first, by its condition's time, in seconds: a2 is admitted a second later.
	time.Sleep(1100 * time.Millisecond)
	c.submit(t, ctx, gpuJob("alpha", "a2", 4))
	c.waitAdmitted(t, ctx, "alpha", "a2")
	use := ""
	eventually(t, ctx, "alpha's queue borrowing 4 GPUs", func() (bool, string) {
		use = c.gpuUse(ctx, "alpha")
		return use == "GPUs used 8, borrowed 4", use
	})
	t.Logf("(c) alpha's a2 (4 more GPUs) admitted, borrowing beta's idle ones: %s", use)
	if qs, err := tenants.QueueStatus(ctx, c.dyn); err != nil || qs["alpha"].Admitted != 2 {
		t.Errorf("tenants status' queue for alpha: %+v, %v; want 2 admitted", qs["alpha"], err)
	}

	c.submit(t, ctx, gpuJob("alpha", "a3", 1))
	t.Logf("(b) alpha's a3 (1 GPU over) waits, Job suspended: %s", c.waitsQueued(t, ctx, "alpha", "a3"))

	c.submit(t, ctx, gpuJob("beta", "b1", 4))
	c.waitAdmitted(t, ctx, "beta", "b1")
	eventually(t, ctx, "a2 preempted", func() (bool, string) {
		wl, err := c.workload(ctx, "alpha", "a2")
		if err != nil || wl == nil {
			return false, fmt.Sprintf("no Workload (%v)", err)
		}
		evicted, msg := condition(wl, "Evicted")
		return evicted && c.suspended(t, ctx, "alpha", "a2"), msg
	})
	wl, _ := c.workload(ctx, "alpha", "a2")
	_, ev := condition(wl, "Evicted")
	if ok, msg := c.admitted(ctx, "alpha", "a1"); !ok {
		t.Errorf("a1, within alpha's own quota, is no longer running after beta reclaimed its GPUs: %s", msg)
	}
	wl, _ = c.workload(ctx, "alpha", "a1")
	if ev, _ := condition(wl, "Evicted"); ev {
		t.Error("a1, within alpha's own quota, was evicted")
	}
	eventually(t, ctx, "alpha back at its own quota", func() (bool, string) {
		use = c.gpuUse(ctx, "alpha")
		return use == "GPUs used 4, borrowed 0", use
	})
	t.Logf("(d) beta's b1 admitted; alpha's borrowing a2 preempted (%s); a1 kept; alpha: %s", ev, use)

	// Both tenants over their quotas at once: beta's next Job queues too (the cohort's 8
	// GPUs are all in use at the tenants' own quotas), and neither queue takes from the
	// other's nominal quota.
	c.submit(t, ctx, gpuJob("beta", "b2", 1))
	t.Logf("(e) beta's b2 (1 GPU over) waits too, Job suspended: %s", c.waitsQueued(t, ctx, "beta", "b2"))
	if ok, msg := c.admitted(ctx, "alpha", "a1"); !ok {
		t.Errorf("a1 lost its admission when beta went over its quota: %s", msg)
	}
}

// waitsQueued waits until Job name in ns is pending in its queue, its Workload's
// QuotaReserved false with a reason naming the GPUs, and fails t unless the Job is
// suspended (queued, not refused); it returns the reason.
func (c *cluster) waitsQueued(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	why := ""
	eventually(t, ctx, name+" pending with a reason", func() (bool, string) {
		wl, err := c.workload(ctx, ns, name)
		if err != nil || wl == nil {
			return false, fmt.Sprintf("no Workload (%v)", err)
		}
		ok, msg := condition(wl, "QuotaReserved")
		why = msg
		return !ok && strings.Contains(msg, string(tenants.GPUResource)), msg
	})
	if !c.suspended(t, ctx, ns, name) {
		t.Errorf("%s/%s is over its tenant's quota and what it may borrow, yet its Job is not suspended", ns, name)
	}
	return why
}

// bigger: a Job whose pod asks for 5 GPUs, within what alpha may use (4 and 4 to
// borrow) but more than either node has (4), waits in alpha's queue, its Workload
// pending with Kueue's reason (the topology fits none of its pods, GPUs short on every
// node) and its Job suspended; no pod is made. Then it is deleted.
func (c *cluster) bigger(t *testing.T, ctx context.Context) {
	t.Helper()
	c.submit(t, ctx, gpuJob("alpha", "big", 5))
	why := ""
	eventually(t, ctx, "big pending with the topology's reason", func() (bool, string) {
		wl, err := c.workload(ctx, "alpha", "big")
		if err != nil || wl == nil {
			return false, fmt.Sprintf("no Workload (%v)", err)
		}
		ok, msg := condition(wl, "QuotaReserved")
		why = msg
		return !ok && strings.Contains(msg, "topology") && strings.Contains(msg, string(tenants.GPUResource)), msg
	})
	// A second look a few scheduling rounds later: still waiting, never admitted.
	time.Sleep(3 * time.Second)
	if ok, msg := c.admitted(ctx, "alpha", "big"); ok || !c.suspended(t, ctx, "alpha", "big") {
		t.Errorf("a Job asking for more GPUs than any node has was admitted (%s)", msg)
	}
	pods, err := c.cs.CoreV1().Pods("alpha").List(ctx, metav1.ListOptions{LabelSelector: "job-name=big"})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("pods of the Job larger than any node: %d (%v); want none", len(pods.Items), err)
	}
	t.Logf("(0) alpha's big (5 GPUs in one pod; 2 nodes of 4) waits, Job suspended: %s", why)
	bg := metav1.DeletePropagationBackground
	if err := c.cs.BatchV1().Jobs("alpha").Delete(ctx, "big", metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
}

// gpuUse describes ClusterQueue name's GPU use, as `tenants status` reads it.
func (c *cluster) gpuUse(ctx context.Context, name string) string {
	qs, err := tenants.QueueStatus(ctx, c.dyn)
	if err != nil {
		return err.Error()
	}
	q, ok := qs[name]
	if !ok {
		return "no queue for " + name
	}
	return fmt.Sprintf("GPUs used %s, borrowed %s", q.GPUs, q.Borrowed)
}

// TestQueueRBAC (e): a user of tenant alpha reads alpha's LocalQueue and Workloads, but
// cannot create a Workload (Kueue makes them from Jobs), nor a Job in beta's namespace,
// nor read beta's queue. Then beta is removed from the file, and its queue with it.
func TestQueueRBAC(t *testing.T) {
	c := newCluster(t, 1, 8)
	ctx := ctxFor(t, 3*time.Minute)
	c.applyTenants(t, ctx, twoTenants)
	rc := c.tc.RESTConfig(t)
	rc.Impersonate.UserName = "alice"
	rc.Impersonate.Groups = []string{tenants.GroupUsers("alpha"), "system:authenticated"}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(tenants.LocalQueueGVR).Namespace("alpha").Get(ctx, tenants.LocalQueueName, metav1.GetOptions{}); err != nil {
		t.Errorf("alpha's user cannot read alpha's LocalQueue: %v", err)
	}
	if _, err := dyn.Resource(tenants.WorkloadGVR).Namespace("alpha").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("alpha's user cannot list alpha's Workloads: %v", err)
	}
	if _, err := dyn.Resource(tenants.LocalQueueGVR).Namespace("beta").Get(ctx, tenants.LocalQueueName, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alpha's user reading beta's LocalQueue: %v; want Forbidden", err)
	}
	wl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"name": "sneak"},
		"spec": map[string]any{"queueName": tenants.LocalQueueName, "podSets": []any{map[string]any{
			"name": "main", "count": int64(1), "template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "c", "image": "x"}}}}}}},
	}}
	for _, ns := range []string{"alpha", "beta"} {
		if _, err := dyn.Resource(tenants.WorkloadGVR).Namespace(ns).Create(ctx, wl, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("alpha's user creating a Workload in %s's queue: %v; want Forbidden", ns, err)
		}
	}
	cs := c.tc.Impersonate(t, "alice", tenants.GroupUsers("alpha"))
	if _, err := cs.BatchV1().Jobs("beta").Create(ctx, gpuJob("beta", "sneak", 1), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alpha's user creating a Job in beta's namespace: %v; want Forbidden", err)
	}
	if _, err := cs.BatchV1().Jobs("alpha").Create(ctx, gpuJob("alpha", "mine", 1), metav1.CreateOptions{}); err != nil {
		t.Errorf("alpha's user cannot submit a Job to alpha's queue: %v", err)
	}
	c.waitAdmitted(t, ctx, "alpha", "mine")

	// A removed tenant's queue goes with it (apply --prune).
	c.applyTenants(t, ctx, "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n  - name: alpha\n    quota: {gpus: 4}\n")
	eventually(t, ctx, "beta's ClusterQueue removed", func() (bool, string) {
		_, err := c.dyn.Resource(tenants.ClusterQueueGVR).Get(ctx, "beta", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	})
}

// TestQueueAdmissionFigure submits 160 one-GPU Jobs at once, 8 to each of 20 tenants of
// 8 GPUs (a 160-GPU quota), and logs the time until Kueue has admitted every one. A
// figure, not a bound: no kubelets, so no pod runs (simulated GPUs: quota only), and it
// runs on whatever this machine's cores are doing.
func TestQueueAdmissionFigure(t *testing.T) {
	const nTenants, perTenant = 20, 8
	c := newCluster(t, nTenants, perTenant) // a rack of 20 × 8 simulated GPUs
	ctx := ctxFor(t, 6*time.Minute)
	var b strings.Builder
	b.WriteString("apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n")
	for i := range nTenants {
		fmt.Fprintf(&b, "  - name: t%02d\n    quota: {gpus: %d}\n", i, perTenant)
	}
	c.applyTenants(t, ctx, b.String())
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, nTenants*perTenant)
	for i := range nTenants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns := fmt.Sprintf("t%02d", i)
			for j := range perTenant {
				if _, err := c.cs.BatchV1().Jobs(ns).Create(ctx, gpuJob(ns, fmt.Sprintf("j%d", j), 1), metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	submitted := time.Since(start)
	eventually(t, ctx, "all 160 admitted", func() (bool, string) {
		n := 0
		list, err := c.dyn.Resource(tenants.WorkloadGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for i := range list.Items {
			if ok, _ := condition(&list.Items[i], "Admitted"); ok {
				n++
			}
		}
		return n == nTenants*perTenant, fmt.Sprintf("%d of %d Workloads admitted", n, nTenants*perTenant)
	})
	t.Logf("figure: %d one-GPU Jobs across %d tenants (a %d-GPU quota; 20 simulated nodes of 8 GPUs, no kubelets) submitted in %s, all admitted by Kueue %s after the first was submitted",
		nTenants*perTenant, nTenants, nTenants*perTenant, submitted.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
