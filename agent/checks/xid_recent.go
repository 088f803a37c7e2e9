package checks

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// RecentXIDWindow is how far back gpu.xid.recent looks (aznhc: 2 h).
const RecentXIDWindow = 2 * time.Hour

// xidRecent: XIDs that are neither fatal nor caused by applications, in the last
// RecentXIDWindow, counted against Warn (0) and Fail.
func xidRecent(in *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	var codes []string
	for _, e := range in.XIDs {
		if e.GPU != g.Index || e.Fatal || e.Application || in.Now.Sub(e.At) > RecentXIDWindow {
			continue
		}
		codes = append(codes, fmt.Sprint(e.Code))
	}
	n := float64(len(codes))
	exp := limitText(l) + " in 2 h"
	if len(codes) == 0 {
		return pass("none", exp, "No recent XID.")
	}
	obs := fmt.Sprintf("%d XIDs: %s", len(codes), strings.Join(codes, ", "))
	remedy := "Look up the XIDs in NVIDIA's Xid catalog; reset the GPU if they repeat."
	switch {
	case isSet(l.Fail) && n > l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp, Remedy: remedy,
			Message: fmt.Sprintf("%s logged %s in the last 2 h.", gpuName(g), obs)}
	case isSet(l.Warn) && n > l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp, Remedy: remedy,
			Message: fmt.Sprintf("%s logged %s in the last 2 h.", gpuName(g), obs)}
	}
	return pass(obs, exp, "Recent XIDs within the limit.")
}
