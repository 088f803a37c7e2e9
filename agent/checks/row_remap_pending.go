package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// rowRemapPending: a row remapping waits for a GPU reset to take effect.
func rowRemapPending(_ *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	if !g.RowRemap.OK() {
		return unknownFrom(g.RowRemap, "row remapping")
	}
	if g.RowRemap.V.Pending {
		return Result{Status: Fail, Observed: "pending", Expected: "none pending",
			Message: fmt.Sprintf("%s has a row remapping pending; it takes effect at the next GPU reset.", gpuName(g)),
			Remedy:  "Drain the node and reset the GPU (nvidia-smi -r) or reboot."}
	}
	return pass("none pending", "none pending", "No row remapping pending.")
}
