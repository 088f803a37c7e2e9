package tenants

import (
	"os"
	"reflect"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestRegistryGauges(t *testing.T) {
	us := []Usage{{
		Tenant:     "vision",
		Namespaces: []string{"vision", "vision-dev"},
		Hard:       corev1.ResourceList{QuotaGPU: resource.MustParse("8"), corev1.ResourceRequestsMemory: resource.MustParse("1Gi")},
		Used:       corev1.ResourceList{QuotaGPU: resource.MustParse("3")},
		TierGPUs:   map[string][2]resource.Quantity{"training": {resource.MustParse("2"), resource.MustParse("4")}},
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
		"gpurack_tenant_namespace namespace=vision tenant=vision":                  1,
		"gpurack_tenant_namespace namespace=vision-dev tenant=vision":              1,
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

// A tenant's quota of each StorageClass shows in `tenants status` and in the
// gauges, under the resource names Kubernetes gives it.
func TestStorageClassQuotaInStatusAndGauges(t *testing.T) {
	local, shared := StorageClassResource("gpurack-local", corev1.ResourceRequestsStorage), StorageClassResource("gpurack-shared", corev1.ResourceRequestsStorage)
	localClaims := StorageClassResource("gpurack-local", corev1.ResourcePersistentVolumeClaims)
	u := Usage{
		Tenant: "vision",
		Hard: corev1.ResourceList{local: resource.MustParse("1Gi"), localClaims: resource.MustParse("2"), shared: resource.MustParse("10Ti"),
			corev1.ResourceRequestsStorage: resource.MustParse("20Ti")},
		Used: corev1.ResourceList{local: resource.MustParse("600Mi"), localClaims: resource.MustParse("1")},
	}
	got := u.StorageClasses()
	want := []string{"gpurack-local 600Mi/1Gi 1/2 claims", "gpurack-shared 0/10Ti"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("StorageClasses() = %q; want %q", got, want)
	}
	mfs, err := Registry([]Usage{u}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauges := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range m.GetLabel() {
				k += " " + l.GetName() + "=" + l.GetValue()
			}
			gauges[k] = m.GetGauge().GetValue()
		}
	}
	for k, v := range map[string]float64{
		"gpurack_tenant_quota_hard resource=gpurack-local.storageclass.storage.k8s.io/requests.storage tenant=vision":       1 << 30,
		"gpurack_tenant_quota_used resource=gpurack-local.storageclass.storage.k8s.io/requests.storage tenant=vision":       600 << 20,
		"gpurack_tenant_quota_used resource=gpurack-local.storageclass.storage.k8s.io/persistentvolumeclaims tenant=vision": 1,
		"gpurack_tenant_quota_hard resource=gpurack-shared.storageclass.storage.k8s.io/requests.storage tenant=vision":      10 << 40,
	} {
		if g, ok := gauges[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v); want %v", k, g, ok, v)
		}
	}
}

// Every gpurack_tenant_* series the tenant recording rules read is one Registry
// exports (promtool runs the rules in agent/server's tests).
func TestTenantRulesUseRegistry(t *testing.T) {
	data, err := os.ReadFile("../../docs/monitoring/gpurack-tenants.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := Registry([]Usage{{Tenant: "t", Namespaces: []string{"t"}, Hard: corev1.ResourceList{QuotaGPU: resource.MustParse("1")},
		TierGPUs: map[string][2]resource.Quantity{"training": {}}}}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	used := regexp.MustCompile(`gpurack_tenant_[a-z_]+`).FindAllString(string(data), -1)
	if len(used) == 0 {
		t.Fatal("the tenant rules read no gpurack_tenant_ series")
	}
	for _, n := range used {
		if !exported[n] {
			t.Errorf("gpurack-tenants.yaml reads %s, which tenants.Registry does not export", n)
		}
	}
}
