package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// retiredPages: pre-Ampere page retirement; the total against Warn (10, gcm) and Fail
// (63, DCGM), and a pending retirement. Ampere and later GPUs remap rows instead and
// answer not-supported.
func retiredPages(_ *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.RetiredPages.OK() {
		return unknownFrom(g.RetiredPages, "retired pages")
	}
	rp := g.RetiredPages.V
	obs := fmt.Sprintf("%d pages (%d DBE, %d SBE)", rp.Total(), rp.DBE, rp.MultipleSBE)
	exp := limitText(l) + " pages"
	n := float64(rp.Total())
	switch {
	case isSet(l.Fail) && n > l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s has retired %d pages, over the limit of %s.", gpuName(g), rp.Total(), fmtLimit(l.Fail)),
			Remedy:  "Replace the GPU (RMA)."}
	case isSet(l.Warn) && n > l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s has retired %d pages.", gpuName(g), rp.Total()),
			Remedy:  "Plan the GPU's replacement; watch the count."}
	case rp.Pending:
		return Result{Status: Warn, Observed: obs + ", retirement pending", Expected: exp,
			Message: fmt.Sprintf("%s has a page retirement pending until the next reset.", gpuName(g)),
			Remedy:  "Drain the node and reset the GPU."}
	}
	return pass(obs, exp, "Page retirement within limits.")
}
