package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// rowRemapFailed: no remapping failed, and rows remapped for uncorrectable errors stay
// within Fail (512, the GPU's spare rows).
func rowRemapFailed(_ *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.RowRemap.OK() {
		return unknownFrom(g.RowRemap, "row remapping")
	}
	rr := g.RowRemap.V
	obs := fmt.Sprintf("failed %v, %d uncorrectable rows", rr.Failed, rr.Uncorrected)
	exp := "no failure, " + limitText(l) + " uncorrectable rows"
	switch {
	case rr.Failed:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s failed to remap a row: it has no spare rows left in that bank.", gpuName(g)),
			Remedy:  "Replace the GPU (RMA); a failed row remap is not repairable in the field."}
	case isSet(l.Fail) && float64(rr.Uncorrected) > l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s has %d rows remapped for uncorrectable errors.", gpuName(g), rr.Uncorrected),
			Remedy:  "Replace the GPU (RMA)."}
	case isSet(l.Warn) && float64(rr.Uncorrected) > l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s has %d rows remapped for uncorrectable errors.", gpuName(g), rr.Uncorrected),
			Remedy:  "Plan the GPU's replacement."}
	}
	return pass(obs, exp, "Row remapping healthy.")
}
