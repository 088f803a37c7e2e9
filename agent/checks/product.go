package checks

import (
	"fmt"
	"strings"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// product: the GPU's NVML name starts with the profile's product (so "NVIDIA H200"
// matches "NVIDIA H200 141GB HBM3e").
func product(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	want := in.expect().Product
	if !g.Name.OK() {
		return unknownFrom(g.Name, "product name")
	}
	if strings.HasPrefix(g.Name.V, want) {
		return pass(g.Name.V, want, "The GPU is the expected product.")
	}
	return Result{Status: Fail, Observed: g.Name.V, Expected: want,
		Message: fmt.Sprintf("%s is a %s, the profile expects %s.", gpuName(g), g.Name.V, want),
		Remedy:  "Install the GPU model the profile expects, or assign the machine to a profile for this model."}
}
