package tenants

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Usage is one tenant's quota use, summed over its namespaces, as the
// quota controller last recorded it in the ResourceQuotas' status.
type Usage struct {
	Tenant     string
	Namespaces []string
	// Used and Hard are keyed by quota resource name (requests.nvidia.com/gpu,
	// requests.cpu, ...). Hard lacks resources the tenant's quota leaves open.
	Used, Hard corev1.ResourceList
	// TierGPUs is each tier's GPU requests (used and hard), from the
	// tier-scoped ResourceQuotas.
	TierGPUs map[string][2]resource.Quantity
}

// GPUs returns the tenant's GPU requests in use and its GPU quota (-1 when
// the tenant has no GPU quota).
func (u Usage) GPUs() (used, hard int64) {
	q, ok := u.Hard[QuotaGPU]
	hard = -1
	if ok {
		hard = q.Value()
	}
	used = u.Used.Name(QuotaGPU, resource.DecimalSI).Value()
	return used, hard
}

// StorageClasses describes the tenant's quota of each StorageClass it
// limits, sorted by class, for a table: "CLASS USED/HARD" of requested
// storage, then "USED/HARD claims" ("gpurack-local 600Mi/1Gi 1/2 claims"),
// each part only where the quota sets it.
func (u Usage) StorageClasses() []string {
	limits := map[string][]string{}
	for _, r := range []corev1.ResourceName{corev1.ResourceRequestsStorage, corev1.ResourcePersistentVolumeClaims} {
		for name, hard := range u.Hard {
			class, ok := strings.CutSuffix(string(name), storageClassDomain+"/"+string(r))
			if !ok {
				continue
			}
			used := u.Used[name]
			part := used.String() + "/" + hard.String()
			if r == corev1.ResourcePersistentVolumeClaims {
				part += " claims"
			}
			limits[class] = append(limits[class], part)
		}
	}
	out := make([]string, 0, len(limits))
	for class, parts := range limits {
		out = append(out, class+" "+strings.Join(parts, " "))
	}
	sort.Strings(out)
	return out
}

// Status reads every ResourceQuota that tenants apply created and sums them
// per tenant, sorted by tenant name.
func Status(ctx context.Context, client kubernetes.Interface) ([]Usage, error) {
	list, err := client.CoreV1().ResourceQuotas(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("list resource quotas: %w", err)
	}
	byTenant := map[string]*Usage{}
	for _, rq := range list.Items {
		t := rq.Labels[LabelTenant]
		if t == "" {
			continue
		}
		u := byTenant[t]
		if u == nil {
			u = &Usage{Tenant: t, Used: corev1.ResourceList{}, Hard: corev1.ResourceList{}, TierGPUs: map[string][2]resource.Quantity{}}
			byTenant[t] = u
		}
		if tier, ok := strings.CutPrefix(rq.Name, TierQuotaPrefix); ok {
			cur := u.TierGPUs[tier]
			cur[0].Add(rq.Status.Used[QuotaGPU])
			cur[1].Add(rq.Spec.Hard[QuotaGPU])
			u.TierGPUs[tier] = cur
			continue
		}
		if rq.Name != QuotaName {
			continue
		}
		u.Namespaces = append(u.Namespaces, rq.Namespace)
		for name, q := range rq.Spec.Hard {
			sum := u.Hard[name]
			sum.Add(q)
			u.Hard[name] = sum
			used := u.Used[name]
			used.Add(rq.Status.Used[name])
			u.Used[name] = used
		}
	}
	out := make([]Usage, 0, len(byTenant))
	for _, u := range byTenant {
		sort.Strings(u.Namespaces)
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out, nil
}
