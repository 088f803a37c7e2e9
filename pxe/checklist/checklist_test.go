package checklist

import (
	"slices"
	"testing"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

func result(id string, st machinev1.CheckStatus, gpu ...int32) *machinev1.CheckResult {
	r := &machinev1.CheckResult{Id: id, Status: st}
	if len(gpu) == 1 {
		r.GpuIndex = &gpu[0]
	}
	return r
}

// TestOverall: the worst status wins in machine.proto's order; UNSPECIFIED counts as
// UNKNOWN; an empty checklist is NOT_APPLICABLE.
func TestOverall(t *testing.T) {
	const (
		fail = machinev1.CheckStatus_CHECK_STATUS_FAIL
		warn = machinev1.CheckStatus_CHECK_STATUS_WARN
		unk  = machinev1.CheckStatus_CHECK_STATUS_UNKNOWN
		uns  = machinev1.CheckStatus_CHECK_STATUS_UNSPECIFIED
		pass = machinev1.CheckStatus_CHECK_STATUS_PASS
		na   = machinev1.CheckStatus_CHECK_STATUS_NOT_APPLICABLE
	)
	for _, tc := range []struct {
		in   []machinev1.CheckStatus
		want machinev1.CheckStatus
	}{
		{nil, na},
		{[]machinev1.CheckStatus{na, pass}, pass},
		{[]machinev1.CheckStatus{pass, uns}, unk},
		{[]machinev1.CheckStatus{unk, warn, pass}, warn},
		{[]machinev1.CheckStatus{pass, fail, warn}, fail},
	} {
		cl := &machinev1.Checklist{}
		for i, st := range tc.in {
			cl.Results = append(cl.Results, result(string(rune('a'+i)), st))
		}
		if got := Overall(cl); got != tc.want {
			t.Errorf("Overall(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestFailingChecks(t *testing.T) {
	cl := &machinev1.Checklist{Results: []*machinev1.CheckResult{
		result("gpu.xid.fatal", machinev1.CheckStatus_CHECK_STATUS_FAIL, 3),
		result("pcie.width", machinev1.CheckStatus_CHECK_STATUS_PASS, 0),
		result("driver.loaded", machinev1.CheckStatus_CHECK_STATUS_FAIL),
		result("gpu.count", machinev1.CheckStatus_CHECK_STATUS_FAIL, -1),
	}}
	want := []string{"driver.loaded", "gpu.count", "gpu.xid.fatal on GPU 3"}
	if got := FailingChecks(cl); !slices.Equal(got, want) {
		t.Errorf("FailingChecks = %q, want %q", got, want)
	}
}
