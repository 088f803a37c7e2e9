package checks

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// vbiosConsistent: every GPU of the node runs the same VBIOS (gcm vbios_mismatch).
func vbiosConsistent(in *Input, _ *Check, _ Limits, _ *snapshot.GPU) Result {
	byVersion := map[string][]int{}
	for _, g := range in.Snapshot.GPUs {
		if g.VBIOS.OK() {
			byVersion[g.VBIOS.V] = append(byVersion[g.VBIOS.V], g.Index)
		}
	}
	switch len(byVersion) {
	case 0:
		return Result{Status: Unknown, Message: "no GPU's VBIOS version could be read"}
	case 1:
		for v := range byVersion {
			return pass(v, "one version on all GPUs", "All GPUs run the same VBIOS.")
		}
	}
	versions := make([]string, 0, len(byVersion))
	for v, idx := range byVersion {
		versions = append(versions, fmt.Sprintf("%s (GPU %s)", v, joinInts(idx)))
	}
	slices.Sort(versions)
	return Result{Status: Fail, Observed: strings.Join(versions, ", "), Expected: "one version on all GPUs",
		Message: fmt.Sprintf("The GPUs run %d different VBIOS versions.", len(byVersion)),
		Remedy:  "Flash all GPUs to the same VBIOS with the vendor's firmware update tool."}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
