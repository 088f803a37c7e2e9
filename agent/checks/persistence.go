package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// persistenceMode: persistence mode keeps the driver initialised between jobs. Off is
// a warning (DCGM L1 reports it; jobs still run, only slower to start).
func persistenceMode(_ *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	if !g.Persistence.OK() {
		return unknownFrom(g.Persistence, "persistence mode")
	}
	if g.Persistence.V {
		return pass("enabled", "enabled", "Persistence mode enabled.")
	}
	return Result{Status: Warn, Observed: "disabled", Expected: "enabled",
		Message: fmt.Sprintf("%s has persistence mode disabled.", gpuName(g)),
		Remedy:  "Start nvidia-persistenced (the image ships it) or run nvidia-smi -pm 1."}
}
