package tenants

import (
	"testing"

	"github.com/gpurack/gpurack/agent/podres"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
)

// TestAgentReadsTheTenantLabel: gpuagent names a GPU holder's tenant by the label this
// package puts on tenant namespaces.
func TestAgentReadsTheTenantLabel(t *testing.T) {
	if podres.TenantLabel != LabelTenant {
		t.Fatalf("agent/podres reads %q, tenants apply writes %q", podres.TenantLabel, LabelTenant)
	}
}

// TestGpubootReadsTheTenantQuota: gpuboot's rack report finds a tenant's GPU quota by
// the names this package writes.
func TestGpubootReadsTheTenantQuota(t *testing.T) {
	if nodecontrol.TenantLabel != LabelTenant || nodecontrol.TenantQuotaName != QuotaName || nodecontrol.QuotaGPU != QuotaGPU {
		t.Fatalf("pxe/nodecontrol reads %q %q %q, tenants apply writes %q %q %q", nodecontrol.TenantLabel, nodecontrol.TenantQuotaName,
			nodecontrol.QuotaGPU, LabelTenant, QuotaName, QuotaGPU)
	}
}
