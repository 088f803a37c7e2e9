package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// pcieReplays: the PCIe replay rate per minute against Warn (16/min, DCGM's Gen4 x16
// tolerance). The rate needs an earlier reading of the same GPU; a single run
// (validate) reports the count since driver load and passes.
func pcieReplays(in *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.PCIe.Replays.OK() {
		return unknownFrom(g.PCIe.Replays, "PCIe replay counter")
	}
	exp := limitText(l) + "/min"
	rate, ok := ratePerMinute(in, g, func(p *snapshot.GPU) snapshot.Value[uint64] { return p.PCIe.Replays })
	if !ok {
		return pass(fmt.Sprintf("%d since driver load", g.PCIe.Replays.V), exp,
			"One reading only: the replay rate needs two.")
	}
	obs := fmt.Sprintf("%.1f/min", rate)
	switch {
	case isSet(l.Fail) && rate > l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s replays %.1f PCIe packets a minute.", gpuName(g), rate),
			Remedy:  "Reseat the GPU or replace the riser or cable; the link is noisy."}
	case isSet(l.Warn) && rate > l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s replays %.1f PCIe packets a minute.", gpuName(g), rate),
			Remedy:  "Reseat the GPU or replace the riser or cable if the rate stays high."}
	}
	return pass(obs, exp, "PCIe replay rate normal.")
}

// ratePerMinute is the increase of a counter per minute between in.Previous and now,
// matching the GPU by UUID. A counter that went down (driver reload) has no rate.
func ratePerMinute(in *Input, g *snapshot.GPU, get func(*snapshot.GPU) snapshot.Value[uint64]) (float64, bool) {
	if in.Previous == nil {
		return 0, false
	}
	dt := in.Snapshot.TakenAt.Sub(in.Previous.TakenAt).Minutes()
	if dt <= 0 {
		return 0, false
	}
	for i := range in.Previous.GPUs {
		p := &in.Previous.GPUs[i]
		if p.UUID != g.UUID || p.UUID == "" {
			continue
		}
		prev, cur := get(p), get(g)
		if !prev.OK() || !cur.OK() || cur.V < prev.V {
			return 0, false
		}
		return float64(cur.V-prev.V) / dt, true
	}
	return 0, false
}
