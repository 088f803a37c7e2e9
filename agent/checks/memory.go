package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// memory: the framebuffer NVML reports is at least the profile's size.
func memory(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	want := in.expect().MemoryMiB
	if !g.MemoryTotalMiB.OK() {
		return unknownFrom(g.MemoryTotalMiB, "memory size")
	}
	obs, exp := fmt.Sprintf("%d MiB", g.MemoryTotalMiB.V), fmt.Sprintf("≥ %d MiB", want)
	if g.MemoryTotalMiB.V >= uint64(want) {
		return pass(obs, exp, "The GPU has the expected memory.")
	}
	return Result{Status: Fail, Observed: obs, Expected: exp,
		Message: fmt.Sprintf("%s reports %s of framebuffer, less than the profile's %d MiB.", gpuName(g), obs, want),
		Remedy:  "Check the GPU's ECC and MIG configuration; replace the GPU if the memory is really missing."}
}
