package tenants

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestRegistryGauges(t *testing.T) {
	us := []Usage{{
		Tenant:   "vision",
		Hard:     corev1.ResourceList{QuotaGPU: resource.MustParse("8"), corev1.ResourceRequestsMemory: resource.MustParse("1Gi")},
		Used:     corev1.ResourceList{QuotaGPU: resource.MustParse("3")},
		TierGPUs: map[string][2]resource.Quantity{"training": {resource.MustParse("2"), resource.MustParse("4")}},
	}}
	mfs, err := Registry(us).Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range m.GetLabel() {
				k += " " + l.GetName() + "=" + l.GetValue()
			}
			got[k] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"gpurack_tenant_quota_hard resource=requests.nvidia.com/gpu tenant=vision": 8,
		"gpurack_tenant_quota_hard resource=requests.memory tenant=vision":         1 << 30,
		"gpurack_tenant_quota_used resource=requests.nvidia.com/gpu tenant=vision": 3,
		"gpurack_tenant_quota_used resource=requests.memory tenant=vision":         0,
		"gpurack_tenant_tier_gpus_used tenant=vision tier=training":                2,
	}
	if len(got) != len(want) {
		t.Errorf("gauges %v; want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v); want %v", k, g, ok, v)
		}
	}
}
