package protoconv

import (
	"testing"

	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/monitor"
)

// TestChecklistSimulated: the commissioning report gpuboot receives says simulated
// exactly when the agent's checklist does (CONTRACTS §11).
func TestChecklistSimulated(t *testing.T) {
	for _, sim := range []bool{false, true} {
		out := Checklist(&monitor.Checklist{Phase: monitor.PhaseCommissioning, Simulated: sim}, facts.Identity{BootMAC: "52:54:00:00:00:01"}, "", "")
		if out.GetSimulated() != sim {
			t.Errorf("Checklist(simulated=%v).Simulated = %v", sim, out.GetSimulated())
		}
	}
}
