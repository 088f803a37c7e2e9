package tenants

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Registry holds gauges of us, for `tenants status --textfile` (the text
// format node_exporter's textfile collector reads):
//
//	gpurack_tenant_quota_hard{tenant, resource}
//	gpurack_tenant_quota_used{tenant, resource}
//	gpurack_tenant_tier_gpus_used{tenant, tier}
//	gpurack_tenant_namespace{tenant, namespace}   1 for each of a tenant's namespaces
//
// gpurack_tenant_namespace is the join that turns gpuagent's per-container
// gpurack_gpu_allocated{namespace, ...} into per-tenant GPUs
// (docs/monitoring/gpurack-tenants.yaml).
//
// resource is the quota's name (requests.nvidia.com/gpu, requests.cpu,
// ...); values are in the resource's base unit (GPUs, cores, bytes, pods).
func Registry(us []Usage) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	hard := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpurack_tenant_quota_hard", Help: "A tenant's quota, summed over its namespaces.",
	}, []string{"tenant", "resource"})
	used := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpurack_tenant_quota_used", Help: "What a tenant's pods and claims request, as the quota controller last counted it.",
	}, []string{"tenant", "resource"})
	tier := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpurack_tenant_tier_gpus_used", Help: "GPUs requested by a tenant's pods of one priority tier.",
	}, []string{"tenant", "tier"})
	ns := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpurack_tenant_namespace", Help: "1 for each namespace of a tenant: joins per-namespace series (gpuagent's gpurack_gpu_allocated) to tenants.",
	}, []string{"tenant", "namespace"})
	reg.MustRegister(hard, used, tier, ns)
	for _, u := range us {
		for _, n := range u.Namespaces {
			ns.WithLabelValues(u.Tenant, n).Set(1)
		}
		for name, q := range u.Hard {
			hard.WithLabelValues(u.Tenant, string(name)).Set(q.AsApproximateFloat64())
			uq := u.Used[name]
			used.WithLabelValues(u.Tenant, string(name)).Set(uq.AsApproximateFloat64())
		}
		for t, q := range u.TierGPUs {
			tier.WithLabelValues(u.Tenant, t).Set(q[0].AsApproximateFloat64())
		}
	}
	return reg
}
