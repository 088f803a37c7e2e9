package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// inforomValid: nvmlDeviceValidateInforom passes, and the InfoROM image version is the
// one most GPUs of the node have.
func inforomValid(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	if !g.InfoROMValid.OK() {
		return unknownFrom(g.InfoROMValid, "InfoROM validation")
	}
	if !g.InfoROMValid.V {
		return Result{Status: Fail, Observed: "checksum invalid", Expected: "valid",
			Message: fmt.Sprintf("%s has a corrupted InfoROM (ERROR_CORRUPTED_INFOROM).", gpuName(g)),
			Remedy:  "Replace the GPU or have the vendor reflash its InfoROM; ECC and page retirement records are unreliable."}
	}
	common := mostCommonInfoROM(in.Snapshot)
	if g.InfoROMImage.OK() && common != "" && g.InfoROMImage.V != common {
		return Result{Status: Warn, Observed: g.InfoROMImage.V, Expected: common,
			Message: fmt.Sprintf("%s has InfoROM image %s, the node's other GPUs %s.", gpuName(g), g.InfoROMImage.V, common),
			Remedy:  "Update the GPU's firmware to match the rest of the node."}
	}
	return pass("valid "+g.InfoROMImage.V, "valid", "InfoROM valid.")
}

func mostCommonInfoROM(s *snapshot.Snapshot) string {
	n := map[string]int{}
	best := ""
	for _, g := range s.GPUs {
		if !g.InfoROMImage.OK() {
			continue
		}
		n[g.InfoROMImage.V]++
		if n[g.InfoROMImage.V] > n[best] || (n[g.InfoROMImage.V] == n[best] && g.InfoROMImage.V < best) {
			best = g.InfoROMImage.V
		}
	}
	return best
}
