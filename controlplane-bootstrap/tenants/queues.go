package tenants

import (
	"context"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpurack/gpurack/internal/nodecontract"
)

// The job queues' objects (docs/tenants.md "Queues"): made only when the cluster runs
// Kueue (cluster.yaml's queues.enabled).
const (
	// Cohort is the one cohort every tenant's ClusterQueue is in: a tenant borrows the
	// others' idle GPUs in it, and reclaims its own from a borrower.
	Cohort = "gpurack"
	// FlavorDefault is the one ResourceFlavor: any node's GPUs, placed by Kueue's
	// topology-aware scheduling over Topology, one node per domain, so that a pod that
	// fits no node waits in its queue with Kueue's reason instead of being admitted
	// to stay unschedulable (docs/decisions/0702).
	FlavorDefault = "gpurack-default"
	// Topology is the Kueue Topology of FlavorDefault: one level, the node.
	Topology = "gpurack-nodes"
	// TopologyLevel is its level's node label, which kubelet sets on every Node.
	TopologyLevel = "kubernetes.io/hostname"
	// LocalQueueName is the LocalQueue in each of a tenant's namespaces that a Job
	// names with the label kueue.x-k8s.io/queue-name.
	LocalQueueName = "default"
	// QueueNameLabel is the label a Job names its LocalQueue with.
	QueueNameLabel = "kueue.x-k8s.io/queue-name"
	// unlimitedCPU and unlimitedMemory are a queue's CPU and memory quota when the
	// tenant's quota sets none: Kueue admits only what its ClusterQueue covers, and
	// every pod requests CPU and memory (the LimitRange's defaults).
	unlimitedCPU    = "1000000"
	unlimitedMemory = "1Ei"
)

var (
	kueueGV           = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta2"}
	gvrResourceFlavor = kueueGV.WithResource("resourceflavors")
	gvrClusterQueue   = kueueGV.WithResource("clusterqueues")
	gvrLocalQueue     = kueueGV.WithResource("localqueues")
	gvrTopology       = kueueGV.WithResource("topologies")
	queueKinds        = map[schema.GroupVersionResource]string{gvrTopology: "Topology", gvrResourceFlavor: "ResourceFlavor", gvrClusterQueue: "ClusterQueue", gvrLocalQueue: "LocalQueue"}
	// flavorNodeLabels are FlavorDefault's node labels, which Kueue requires of a
	// flavor with a topology and adds to its pods' node selectors: the one every node
	// gpuagent runs has, simulated ones included.
	flavorNodeLabels  = map[string]any{nodecontract.LabelAgent: "true"}
	ClusterQueueGVR   = gvrClusterQueue
	LocalQueueGVR     = gvrLocalQueue
	ResourceFlavorGVR = gvrResourceFlavor
	WorkloadGVR       = kueueGV.WithResource("workloads")
)

// ClusterQueueName is the ClusterQueue of tenant t: its name.
func ClusterQueueName(tenant string) string { return tenant }

func validateQueueLimits(path string, t Tenant) []FieldError {
	var errs []FieldError
	for _, f := range []struct{ field, v string }{
		{"borrowingLimit", t.Queue.BorrowingLimit}, {"lendingLimit", t.Queue.LendingLimit},
	} {
		if f.v != "" && !wholeNumber(f.v) {
			errs = append(errs, FieldError{Field: path + "." + f.field, Msg: fmt.Sprintf("%q: GPUs are counted whole; write a whole number such as 4", f.v)})
		}
	}
	return errs
}

// gpuCeiling is the GPU limit of a tenant's ResourceQuotas when queues are on: its
// quota.gpus plus what it may borrow (its queue.borrowingLimit, or else every other
// tenant's quota.gpus less what each keeps from lending), so that the pods of a Job
// Kueue admits by borrowing are not refused by the quota, while a pod outside Kueue
// still cannot pass it. Empty when the tenant sets no GPU quota.
func gpuCeiling(f *File, t *Tenant) string {
	if t.Quota.GPUs == "" {
		return ""
	}
	own, _ := strconv.ParseInt(t.Quota.GPUs, 10, 64)
	if t.Queue.BorrowingLimit != "" {
		b, _ := strconv.ParseInt(t.Queue.BorrowingLimit, 10, 64)
		return strconv.FormatInt(own+b, 10)
	}
	total := own
	for i := range f.Tenants {
		o := &f.Tenants[i]
		if o.Name == t.Name || o.Quota.GPUs == "" {
			continue
		}
		n, _ := strconv.ParseInt(o.Quota.GPUs, 10, 64)
		if o.Queue.LendingLimit != "" {
			if l, _ := strconv.ParseInt(o.Queue.LendingLimit, 10, 64); l < n {
				n = l
			}
		}
		total += n
	}
	return strconv.FormatInt(total, 10)
}

func queueObject(gvr schema.GroupVersionResource, tenant, ns, name string, spec map[string]any) Object {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(kueueGV.String())
	u.SetKind(queueKinds[gvr])
	u.SetName(name)
	u.SetNamespace(ns)
	u.SetLabels(labels(tenant))
	return Object{GVR: gvr, Obj: u}
}

// queueObjects are the Topology and the ResourceFlavor, and per tenant a ClusterQueue
// in the cohort and a LocalQueue in each of its namespaces.
func queueObjects(f *File) []Object {
	objs := []Object{
		queueObject(gvrTopology, "", "", Topology, map[string]any{"levels": []any{map[string]any{"nodeLabel": TopologyLevel}}}),
		queueObject(gvrResourceFlavor, "", "", FlavorDefault, map[string]any{"nodeLabels": flavorNodeLabels, "topologyName": Topology}),
	}
	for i := range f.Tenants {
		t := &f.Tenants[i]
		objs = append(objs, clusterQueue(t))
		for _, ns := range t.Namespaces {
			objs = append(objs, queueObject(gvrLocalQueue, t.Name, ns, LocalQueueName,
				map[string]any{"clusterQueue": ClusterQueueName(t.Name)}))
		}
	}
	return objs
}

// clusterQueue is tenant t's ClusterQueue: nominal quota its quota.gpus (and cpu and
// memory), in the cohort, admitting only its own namespaces' workloads. Preemption:
// a workload that fits within the tenant's nominal quota reclaims it from any borrower
// (reclaimWithinCohort Any; Kueue takes victims only from ClusterQueues that use more
// than their nominal quota, and only while they still do); a borrowing workload never
// preempts another tenant's (borrowWithinCohort Never); within the tenant, a workload
// preempts lower priorities.
func clusterQueue(t *Tenant) Object {
	gpus := t.Quota.GPUs
	if gpus == "" {
		gpus = "0"
	}
	gpu := map[string]any{"name": string(GPUResource), "nominalQuota": gpus}
	if t.Queue.BorrowingLimit != "" {
		gpu["borrowingLimit"] = t.Queue.BorrowingLimit
	}
	if t.Queue.LendingLimit != "" {
		gpu["lendingLimit"] = t.Queue.LendingLimit
	}
	cpu, mem := t.Quota.CPU, t.Quota.Memory
	if cpu == "" {
		cpu = unlimitedCPU
	}
	if mem == "" {
		mem = unlimitedMemory
	}
	spec := map[string]any{
		"cohortName":        Cohort,
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{LabelTenant: t.Name}},
		"resourceGroups": []any{map[string]any{
			"coveredResources": []any{"cpu", "memory", string(GPUResource)},
			"flavors": []any{map[string]any{"name": FlavorDefault, "resources": []any{
				map[string]any{"name": "cpu", "nominalQuota": canonical(cpu)},
				map[string]any{"name": "memory", "nominalQuota": canonical(mem)},
				gpu,
			}}},
		}},
		"preemption": map[string]any{
			"reclaimWithinCohort": "Any",
			"borrowWithinCohort":  map[string]any{"policy": "Never"},
			"withinClusterQueue":  "LowerPriority",
		},
	}
	return queueObject(gvrClusterQueue, t.Name, "", ClusterQueueName(t.Name), spec)
}

// canonical writes a quantity as the apiserver returns it, so that a re-apply finds
// nothing changed.
func canonical(q string) string {
	v, err := resource.ParseQuantity(q)
	if err != nil {
		return q
	}
	return v.String()
}

// QueueUsage is one tenant's ClusterQueue as Kueue reports it in its status.
type QueueUsage struct {
	Admitted, Pending int64
	// GPUs and Borrowed are the GPUs its admitted Workloads hold, and how many of those
	// are above its nominal quota (borrowed from the cohort).
	GPUs, Borrowed string
}

// String is "admitted N, pending M, GPUs U (borrowed B)".
func (q QueueUsage) String() string {
	return fmt.Sprintf("admitted %d, pending %d, GPUs %s (borrowed %s)", q.Admitted, q.Pending, q.GPUs, q.Borrowed)
}

// QueueStatus reads the ClusterQueues tenants apply made, by tenant.
func QueueStatus(ctx context.Context, client dynamic.Interface) (map[string]QueueUsage, error) {
	list, err := client.Resource(gvrClusterQueue).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("list ClusterQueues: %w", err)
	}
	out := map[string]QueueUsage{}
	for _, cq := range list.Items {
		t := cq.GetLabels()[LabelTenant]
		if t == "" {
			continue
		}
		q := QueueUsage{GPUs: "0", Borrowed: "0"}
		q.Admitted, _, _ = unstructured.NestedInt64(cq.Object, "status", "admittedWorkloads")
		q.Pending, _, _ = unstructured.NestedInt64(cq.Object, "status", "pendingWorkloads")
		flavors, _, _ := unstructured.NestedSlice(cq.Object, "status", "flavorsUsage")
		for _, f := range flavors {
			fm, _ := f.(map[string]any)
			res, _, _ := unstructured.NestedSlice(fm, "resources")
			for _, r := range res {
				if rm, _ := r.(map[string]any); rm["name"] == string(GPUResource) {
					q.GPUs, q.Borrowed = fmt.Sprint(rm["total"]), fmt.Sprint(rm["borrowed"])
				}
			}
		}
		out[t] = q
	}
	return out, nil
}
