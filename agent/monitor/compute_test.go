package monitor

import (
	"testing"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpucompute"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

// TestComputeRunsAtCommissioningOnly: the compute hook runs for a commissioning
// checklist when the profile turns gpu.compute on, never for continuous or
// pre-approval runs, which judge its last report.
func TestComputeRunsAtCommissioningOnly(t *testing.T) {
	m, _ := newMon(t, 0)
	p := *m.cfg.Profile
	g := *p.GPU
	g.Compute = &profile.Compute{Enabled: true}
	p.GPU = &g
	calls := 0
	m.cfg.Profile = &p
	m.cfg.Compute = func(s *gpu.Snapshot) *gpucompute.Report {
		calls++
		if !s.Simulated || len(s.GPUs) == 0 {
			t.Errorf("hook got snapshot simulated=%t with %d GPUs", s.Simulated, len(s.GPUs))
		}
		return gpucompute.SimulatedReport()
	}
	status := func(cl *Checklist) checks.Status {
		for _, r := range cl.Results {
			if r.ID == checkid.Compute {
				if r.Observed != "simulated" && r.Status != checks.NotApplicable {
					t.Errorf("compute result %+v", r)
				}
				return r.Status
			}
		}
		t.Fatal("no gpu.compute result")
		return 0
	}
	for _, phase := range []Phase{PhaseContinuous, PhasePreApproval} {
		if st := status(m.RunChecks(phase)); calls != 0 || st != checks.NotApplicable {
			t.Fatalf("phase %d: %d hook calls, status %s", phase, calls, st)
		}
	}
	cl := m.RunChecks(PhaseCommissioning)
	status(cl)
	if calls != 1 {
		t.Fatalf("commissioning: %d hook calls, want 1", calls)
	}
	m.RunChecks(PhaseContinuous)
	if calls != 1 {
		t.Fatalf("a continuous run after commissioning measured again (%d calls)", calls)
	}
	p.GPU.Compute.Enabled = false
	m.RunChecks(PhaseCommissioning)
	if calls != 1 {
		t.Fatalf("measured with gpu.compute disabled (%d calls)", calls)
	}
}
