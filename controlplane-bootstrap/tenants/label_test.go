package tenants

import (
	"testing"

	"github.com/gpurack/gpurack/agent/podres"
)

// TestAgentReadsTheTenantLabel: gpuagent names a GPU holder's tenant by the label this
// package puts on tenant namespaces.
func TestAgentReadsTheTenantLabel(t *testing.T) {
	if podres.TenantLabel != LabelTenant {
		t.Fatalf("agent/podres reads %q, tenants apply writes %q", podres.TenantLabel, LabelTenant)
	}
}
