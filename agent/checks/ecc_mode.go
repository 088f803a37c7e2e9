package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// eccMode: ECC is on now and stays on after the next reset.
func eccMode(_ *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	if !g.ECC.OK() {
		return unknownFrom(g.ECC, "ECC mode")
	}
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	obs := fmt.Sprintf("current %s, pending %s", onOff(g.ECC.V.Current), onOff(g.ECC.V.Pending))
	switch {
	case !g.ECC.V.Current:
		return Result{Status: Fail, Observed: obs, Expected: "current on, pending on",
			Message: fmt.Sprintf("%s runs with ECC off; memory errors go undetected.", gpuName(g)),
			Remedy:  "Enable ECC (nvidia-smi -e 1) and reset the GPU."}
	case !g.ECC.V.Pending:
		return Result{Status: Warn, Observed: obs, Expected: "current on, pending on",
			Message: fmt.Sprintf("%s turns ECC off at its next reset.", gpuName(g)),
			Remedy:  "Re-enable ECC (nvidia-smi -e 1) before the GPU is reset."}
	}
	return pass(obs, "current on, pending on", "ECC enabled.")
}
