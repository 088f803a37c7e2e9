package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

var recoveryActions = map[int]struct {
	name   string
	status Status
	remedy string
}{
	0: {"none", Pass, ""},
	1: {"GPU reset", Fail, "Drain the node and reset the GPU (nvidia-smi -r)."},
	2: {"node reboot", Fail, "Drain and reboot the node."},
	3: {"drain P2P", Warn, "Drain peer-to-peer workloads from the GPU, then reset it."},
	4: {"drain and reset", Fail, "Drain the node and reset the GPU."},
	5: {"recover IMEX domain", Fail, "Restart the IMEX domain the GPU belongs to."},
	6: {"bus reset", Fail, "Drain the node and reset the GPU's PCIe bus."},
	7: {"system reboot", Fail, "Drain and reboot the node."},
}

// recoveryAction: the driver's recommended recovery (FI_DEV_GET_GPU_RECOVERY_ACTION)
// is none. Drivers before the field existed answer not-supported.
func recoveryAction(_ *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	if !g.RecoveryAction.OK() {
		return unknownFrom(g.RecoveryAction, "recovery action")
	}
	a, ok := recoveryActions[g.RecoveryAction.V]
	if !ok {
		return Result{Status: Warn, Observed: fmt.Sprintf("action %d", g.RecoveryAction.V), Expected: "none",
			Message: fmt.Sprintf("%s's driver asks for recovery action %d, which this agent does not know.", gpuName(g), g.RecoveryAction.V),
			Remedy:  "Look the action up in NVIDIA's nvmlDeviceGpuRecoveryAction_t documentation."}
	}
	if a.status == Pass {
		return pass(a.name, "none", "The driver asks for no recovery.")
	}
	return Result{Status: a.status, Observed: a.name, Expected: "none", Remedy: a.remedy,
		Message: fmt.Sprintf("%s's driver asks for a %s.", gpuName(g), a.name)}
}
