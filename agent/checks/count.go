package checks

import (
	"fmt"
	"strconv"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// gpuCount: NVML enumerates as many GPUs as the profile expects.
func gpuCount(in *Input, _ *Check, _ Limits, _ *snapshot.GPU) Result {
	want := in.expect().Count
	c := in.Snapshot.Count
	if !c.OK() {
		return unknownFrom(c, "GPU count")
	}
	exp := strconv.Itoa(want)
	if c.V == want {
		return pass(exp, exp, fmt.Sprintf("%d GPUs enumerated.", c.V))
	}
	return Result{Status: Fail, Observed: strconv.Itoa(c.V), Expected: exp,
		Message: fmt.Sprintf("NVML enumerates %d GPUs, the profile expects %d.", c.V, want),
		Remedy:  "Find the GPU that did not enumerate (lspci -d 10de:, kernel log), then reseat or replace it."}
}
