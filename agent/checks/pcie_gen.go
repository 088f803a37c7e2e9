package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// pcieLinkGen: the link can run at the profile's generation (fail otherwise) and runs
// at it now (warn otherwise: an idle GPU trains down to save power, so only a loaded
// GPU's current generation is conclusive).
func pcieLinkGen(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	want := in.expect().PCIe.Gen
	if !g.PCIe.MaxGen.OK() {
		return unknownFrom(g.PCIe.MaxGen, "PCIe max generation")
	}
	if !g.PCIe.CurGen.OK() {
		return unknownFrom(g.PCIe.CurGen, "PCIe generation")
	}
	obs := fmt.Sprintf("Gen%d (max Gen%d)", g.PCIe.CurGen.V, g.PCIe.MaxGen.V)
	exp := fmt.Sprintf("Gen%d", want)
	switch {
	case g.PCIe.MaxGen.V < want:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s's link cannot run faster than Gen%d.", gpuName(g), g.PCIe.MaxGen.V),
			Remedy:  "Check the slot, riser and BIOS PCIe settings; the platform limits the link generation."}
	case g.PCIe.CurGen.V < want:
		return Result{Status: Warn, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s's link runs at Gen%d now; idle GPUs train down, so re-check under load.", gpuName(g), g.PCIe.CurGen.V),
			Remedy:  "Re-run the check while the GPU is busy; if it stays low, reseat the GPU or replace the riser."}
	}
	return pass(obs, exp, "PCIe link at the expected generation.")
}
