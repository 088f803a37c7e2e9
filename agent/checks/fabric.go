package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

var fabricStates = map[int]string{0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}

// fabricState: the GPU finished registering with the NVSwitch fabric
// (nvmlDeviceGetGpuFabricInfoV: state COMPLETED, status SUCCESS); degraded bandwidth
// warns. Not applicable without NVSwitch or on drivers without the call.
func fabricState(_ *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	if !g.Fabric.OK() {
		return unknownFrom(g.Fabric, "fabric state")
	}
	f := g.Fabric.V
	obs := fmt.Sprintf("%s, %s", fabricStates[f.State], f.Status)
	const exp = "completed, SUCCESS"
	switch {
	case f.State != 3:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s has not completed NVSwitch fabric registration (%s).", gpuName(g), fabricStates[f.State]),
			Remedy:  "Start nvidia-fabricmanager (same version as the driver) and check its log."}
	case f.Status != "SUCCESS":
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s's fabric registration failed: %s.", gpuName(g), f.Status),
			Remedy:  "Check nvidia-fabricmanager's log and the NVSwitch health; restart Fabric Manager."}
	case f.DegradedBandwidth:
		return Result{Status: Warn, Observed: obs + ", degraded bandwidth", Expected: exp,
			Message: fmt.Sprintf("%s runs on the fabric with degraded bandwidth.", gpuName(g)),
			Remedy:  "Check NVSwitch and NVLink health (gpu.nvlink.*); a trunk link may be down."}
	}
	return pass(obs, exp, "Fabric registration completed.")
}
