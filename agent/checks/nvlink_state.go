package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// nvlinkState: as many NVLink links are active as the profile expects per GPU.
func nvlinkState(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	want := in.expect().NVLinkLinks
	if want == 0 {
		return Result{Status: NotApplicable, Message: "the profile expects no NVLink"}
	}
	exp := fmt.Sprintf("%d links active", want)
	if !g.NVLinks.OK() {
		if g.NVLinks.NotSupported {
			return Result{Status: Fail, Observed: "no NVLink", Expected: exp,
				Message: fmt.Sprintf("%s reports no NVLink, the profile expects %d links.", gpuName(g), want),
				Remedy:  "Check the GPU model and its NVLink bridge or baseboard."}
		}
		return unknownFrom(g.NVLinks, "NVLink state")
	}
	active, down := 0, []int{}
	for _, l := range g.NVLinks.V {
		if l.Active {
			active++
		} else {
			down = append(down, l.Link)
		}
	}
	obs := fmt.Sprintf("%d of %d links active", active, len(g.NVLinks.V))
	if active < want {
		msg := fmt.Sprintf("%s has %d active NVLink links, the profile expects %d.", gpuName(g), active, want)
		if len(down) > 0 {
			msg = fmt.Sprintf("%s has NVLink links %s down (%d active, %d expected).", gpuName(g), joinInts(down), active, want)
		}
		return Result{Status: Fail, Observed: obs, Expected: exp, Message: msg,
			Remedy: "Reset the GPU; if links stay down, reseat the baseboard or replace the GPU."}
	}
	return pass(obs, exp, "All expected NVLink links active.")
}
