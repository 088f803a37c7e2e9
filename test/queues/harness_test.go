package queues

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// cluster is a control plane with queues on, and its clients.
type cluster struct {
	tc  *testcluster.Cluster
	cs  kubernetes.Interface
	dyn dynamic.Interface
}

// newCluster starts the control plane and registers nodes Nodes of gpus GPUs each, as
// simulated ones (Nodes without a kubelet: pods are bound to them, none runs), which
// Kueue's topology-aware scheduling places pods on.
func newCluster(t *testing.T, nodes, gpus int) *cluster {
	t.Helper()
	testcluster.Require(t, components.Kueue)
	tc := testcluster.NewWith(t, testcluster.Options{Configure: func(cfg *clusterconfig.Config) {
		ports, err := testcluster.FreePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Queues.Enabled = true
		cfg.Queues.WebhookPort, cfg.Queues.HealthPort, cfg.Queues.MetricsPort = ports[0], ports[1], ports[2]
	}})
	t.Cleanup(func() {
		if t.Failed() {
			log := components.Layout{Dir: tc.Dir}.LogFile(components.Kueue)
			t.Logf("last lines of %s:\n%s", log, components.TailFile(log, 40))
		}
	})
	rc := tc.RESTConfig(t)
	rc.QPS, rc.Burst = 200, 400
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{tc: tc, cs: cs, dyn: dyn}
	c.addNodes(t, nodes, gpus)
	return c
}

// addNodes registers n simulated Nodes of gpus GPUs, Ready, with the labels kubelet
// sets, and renews their Ready condition every 10 s until the test ends, so that the
// node lifecycle controller does not taint them unreachable.
func (c *cluster) addNodes(t *testing.T, n, gpus int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started {
			cancel() // a Fatal before the heartbeat began: nothing to wait for
		}
	}()
	alloc := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods: resource.MustParse("110"), tenants.GPUResource: *resource.NewQuantity(int64(gpus), resource.DecimalSI),
	}
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("sim-%02d", i+1)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{
			corev1.LabelHostname: names[i], "gpurack.io/agent": "true", "gpurack.io/simulated": "true"}}}
		if _, err := c.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("register simulated node %s: %v", names[i], err)
		}
	}
	// A node's status is read and written again when the controller-manager wrote the
	// Node in between (a conflict), as kubelet does.
	heartbeat := func() error {
		for _, name := range names {
			err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
				node, err := c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				now := metav1.Now()
				node.Status.Capacity, node.Status.Allocatable = alloc, alloc
				node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
					Reason: "SimulatedKubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
				_, err = c.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				return fmt.Errorf("node %s: %w", name, err)
			}
		}
		return nil
	}
	if err := heartbeat(); err != nil {
		t.Fatalf("simulated nodes' status: %v", err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	started = true
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
				if err := heartbeat(); err != nil && ctx.Err() == nil {
					t.Logf("simulated nodes' heartbeat: %v", err)
				}
			}
		}
	}()
}

// applyTenants runs what `tenants apply --prune` runs, for a cluster with queues.
func (c *cluster) applyTenants(t *testing.T, ctx context.Context, src string) {
	t.Helper()
	f, err := tenants.Parse("tenants.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := tenants.ObjectsFor(f, tenants.Options{Queues: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := tenants.ComputePlan(ctx, c.dyn, objs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tenants.Execute(ctx, c.dyn, p, true); err != nil {
		t.Fatal(err)
	}
	for _, tn := range f.Tenants {
		eventually(t, ctx, "ClusterQueue "+tn.Name+" active", func() (bool, string) {
			cq, err := c.dyn.Resource(tenants.ClusterQueueGVR).Get(ctx, tn.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			ok, msg := condition(cq, "Active")
			return ok, msg
		})
	}
}

// gpuJob is a Job of one pod asking for gpus GPUs, in ns's LocalQueue.
func gpuJob(ns, name string, gpus int64) *batchv1.Job {
	one := int32(1)
	q := resource.NewQuantity(gpus, resource.DecimalSI)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{tenants.QueueNameLabel: tenants.LocalQueueName}},
		Spec: batchv1.JobSpec{
			Parallelism: &one, Completions: &one,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "train", Image: "registry.k8s.io/pause:3.10.1",
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{tenants.GPUResource: *q},
						Limits:   corev1.ResourceList{tenants.GPUResource: *q},
					},
				}},
			}},
		},
	}
}

func (c *cluster) submit(t *testing.T, ctx context.Context, j *batchv1.Job) {
	t.Helper()
	if _, err := c.cs.BatchV1().Jobs(j.Namespace).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Job %s/%s: %v", j.Namespace, j.Name, err)
	}
}

// workload is the Workload Kueue made for Job ns/job, or nil.
func (c *cluster) workload(ctx context.Context, ns, job string) (*unstructured.Unstructured, error) {
	list, err := c.dyn.Resource(tenants.WorkloadGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		for _, o := range list.Items[i].GetOwnerReferences() {
			if o.Kind == "Job" && o.Name == job {
				return &list.Items[i], nil
			}
		}
	}
	return nil, nil
}

// condition is whether u's condition typ is True, and a description of it.
func condition(u *unstructured.Unstructured, typ string) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return m["status"] == "True", fmt.Sprintf("%s=%v reason=%v message=%v", typ, m["status"], m["reason"], m["message"])
		}
	}
	return false, typ + " not set"
}

// waitAdmitted waits until Job ns/name's Workload is Admitted and the Job unsuspended.
func (c *cluster) waitAdmitted(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	eventually(t, ctx, "Job "+ns+"/"+name+" admitted", func() (bool, string) {
		ok, msg := c.admitted(ctx, ns, name)
		return ok, msg
	})
}

// admitted is whether Job ns/name's Workload is Admitted and the Job runs (not suspended).
func (c *cluster) admitted(ctx context.Context, ns, name string) (bool, string) {
	wl, err := c.workload(ctx, ns, name)
	if err != nil || wl == nil {
		return false, fmt.Sprintf("no Workload yet (%v)", err)
	}
	ok, msg := condition(wl, "Admitted")
	if !ok {
		return false, msg
	}
	j, err := c.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	if j.Spec.Suspend != nil && *j.Spec.Suspend {
		return false, "Workload admitted, Job still suspended"
	}
	return true, msg
}

// suspended is whether Job ns/name is suspended.
func (c *cluster) suspended(t *testing.T, ctx context.Context, ns, name string) bool {
	t.Helper()
	j, err := c.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j.Spec.Suspend != nil && *j.Spec.Suspend
}

// eventually polls check until it is true, failing t with its last word at ctx's end.
func eventually(t *testing.T, ctx context.Context, what string, check func() (bool, string)) {
	t.Helper()
	last := ""
	for {
		ok, msg := check()
		if ok {
			return
		}
		last = msg
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not by the deadline; last: %s", what, strings.TrimSpace(last))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
