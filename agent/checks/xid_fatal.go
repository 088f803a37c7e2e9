package checks

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// xidFatal: no XID that needs a GPU reset, a reboot or a replacement since boot (or
// the GPU's last reset). A lost GPU (ERROR_GPU_IS_LOST) counts as XID 79.
func xidFatal(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	var codes []string
	if g.Lost {
		codes = append(codes, "79 (GPU lost)")
	}
	for _, e := range in.XIDs {
		if e.GPU == g.Index && e.Fatal {
			c := fmt.Sprintf("%d (%s)", e.Code, e.Class)
			if !slices.Contains(codes, c) && !(e.Code == 79 && g.Lost) {
				codes = append(codes, c)
			}
		}
	}
	if len(codes) == 0 {
		return pass("none", "none", "No fatal XID.")
	}
	obs := "XID " + strings.Join(codes, ", ")
	return Result{Status: Fail, Observed: obs, Expected: "none",
		Message: fmt.Sprintf("%s logged fatal %s.", gpuName(g), obs),
		Remedy:  xidRemedy(in, g)}
}

// xidRemedy picks the strongest action among the GPU's fatal XIDs.
func xidRemedy(in *Input, g *snapshot.GPU) string {
	reboot, replace := g.Lost, false
	for _, e := range in.XIDs {
		if e.GPU != g.Index || !e.Fatal {
			continue
		}
		switch e.Class {
		case "reboot":
			reboot = true
		case "fatal":
			replace = true
		}
	}
	switch {
	case replace:
		return "Drain the node and replace the GPU (RMA); collect nvidia-bug-report.sh output first."
	case reboot:
		return "Drain and reboot the node; if the XID returns, reseat or replace the GPU."
	}
	return "Drain the node and reset the GPU (nvidia-smi -r); if the XID returns, replace it."
}
