package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// nvlinkErrors: NVLink data-link error counters (replay, recovery, CRC flit, CRC
// data) summed over the GPU's links, against Warn (0, gcm) and Fail.
func nvlinkErrors(in *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.NVLinks.OK() || len(g.NVLinks.V) == 0 {
		if in.expect().NVLinkLinks == 0 || g.NVLinks.NotSupported || g.NVLinks.OK() {
			return Result{Status: NotApplicable, Message: "no NVLink on this GPU"}
		}
		return unknownFrom(g.NVLinks, "NVLink error counters")
	}
	var sum uint64
	worst, worstLink := uint64(0), -1
	for _, link := range g.NVLinks.V {
		sum += link.Errors()
		if link.Errors() > worst {
			worst, worstLink = link.Errors(), link.Link
		}
	}
	r := counterCheck(g, snapshot.Known(sum), l, "NVLink errors", "since the driver loaded",
		"Reset the GPU; if errors keep rising on one link, reseat the baseboard or replace the GPU.")
	if worstLink >= 0 && r.Status != Pass {
		r.Observed += fmt.Sprintf(" (most on link %d: %d)", worstLink, worst)
	}
	return r
}
