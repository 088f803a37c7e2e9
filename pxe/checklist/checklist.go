// Package checklist summarises a machine's commissioning checklist
// (api/machine/v1.Checklist, CONTRACTS §2.6): its overall status and the checks that
// failed. The enrollment engine decides a commissioning move with it; the operator
// surfaces (pxe/admin, the gpuboot CLI) display with it.
//
// It is pure; it does not run checks (the agent does) or render reports (pxe/report).
package checklist

import (
	"fmt"
	"sort"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// Overall recomputes a checklist's overall status (the order machine.proto defines).
func Overall(cl *machinev1.Checklist) machinev1.CheckStatus {
	rank := map[machinev1.CheckStatus]int{
		machinev1.CheckStatus_CHECK_STATUS_FAIL: 5, machinev1.CheckStatus_CHECK_STATUS_WARN: 4,
		machinev1.CheckStatus_CHECK_STATUS_UNKNOWN: 3, machinev1.CheckStatus_CHECK_STATUS_UNSPECIFIED: 3,
		machinev1.CheckStatus_CHECK_STATUS_PASS: 2, machinev1.CheckStatus_CHECK_STATUS_NOT_APPLICABLE: 1,
	}
	best := machinev1.CheckStatus_CHECK_STATUS_NOT_APPLICABLE
	for _, r := range cl.GetResults() {
		st := r.GetStatus()
		if st == machinev1.CheckStatus_CHECK_STATUS_UNSPECIFIED {
			st = machinev1.CheckStatus_CHECK_STATUS_UNKNOWN
		}
		if rank[st] > rank[best] {
			best = st
		}
	}
	return best
}

// FailingChecks lists "id" or "id on GPU n" for each failing result, sorted.
func FailingChecks(cl *machinev1.Checklist) []string {
	var out []string
	for _, r := range cl.GetResults() {
		if r.GetStatus() != machinev1.CheckStatus_CHECK_STATUS_FAIL {
			continue
		}
		if r.GpuIndex != nil && r.GetGpuIndex() >= 0 {
			out = append(out, fmt.Sprintf("%s on GPU %d", r.GetId(), r.GetGpuIndex()))
		} else {
			out = append(out, r.GetId())
		}
	}
	sort.Strings(out)
	return out
}
