package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// pcieLinkWidth: the link runs at the profile's width (widths do not drop at idle, so
// a narrower link is a fault: gcm check_pci).
func pcieLinkWidth(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	want := in.expect().PCIe.Width
	if !g.PCIe.CurWidth.OK() {
		return unknownFrom(g.PCIe.CurWidth, "PCIe width")
	}
	obs := fmt.Sprintf("x%d", g.PCIe.CurWidth.V)
	if g.PCIe.MaxWidth.OK() {
		obs += fmt.Sprintf(" (max x%d)", g.PCIe.MaxWidth.V)
	}
	exp := fmt.Sprintf("x%d", want)
	if g.PCIe.CurWidth.V < want {
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s's link trained at x%d instead of x%d.", gpuName(g), g.PCIe.CurWidth.V, want),
			Remedy:  fmt.Sprintf("Reseat the GPU or replace the riser; the link trained at x%d.", g.PCIe.CurWidth.V)}
	}
	return pass(obs, exp, "PCIe link at full width.")
}
