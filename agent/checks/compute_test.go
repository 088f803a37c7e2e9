package checks

import (
	"strings"
	"testing"

	"github.com/gpurack/gpurack/agent/gpucompute"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

func TestComputeCheck(t *testing.T) {
	good := gpucompute.Figures{SGEMMN: 4096, TFLOPSFP32: 20, DeviceGBps: 4000, H2DGBps: 50, D2HGBps: 50, SGEMMVerified: true, CopyVerified: true}
	slow, wrong := good, good
	slow.DeviceGBps = 1000
	wrong.SGEMMVerified, wrong.VerifyError = false, "SGEMM result wrong: C[0][0] = 1, the CPU computes 2"
	measured := func(f gpucompute.Figures) *gpucompute.Report {
		r := &gpucompute.Report{Library: "libcuda.so.1"}
		for i := 0; i < 8; i++ {
			f := f
			r.GPUs = append(r.GPUs, gpucompute.GPUResult{Index: i, Figures: &f})
		}
		return r
	}
	on := &profile.Compute{Enabled: true, MinRatio: 0.7, Expect: profile.ComputeExpect{TFLOPSFP32: 20, DeviceGBps: 4000}}
	for _, tc := range []struct {
		name    string
		setting *profile.Compute
		report  *gpucompute.Report
		phase   Phase
		want    Status
		says    string
	}{
		{"off", nil, measured(good), Commissioning, NotApplicable, "opt-in"},
		{"disabled", &profile.Compute{Enabled: false}, measured(good), Commissioning, NotApplicable, "opt-in"},
		{"not measured yet", on, nil, Commissioning, NotApplicable, "commissioning checklist only"},
		{"not measured, continuous", on, nil, Continuous, NotApplicable, "not measured yet"},
		{"simulated", on, gpucompute.SimulatedReport(), Commissioning, NotApplicable, "simulated"},
		{"no libcuda", on, &gpucompute.Report{Err: "cannot load libcuda.so.1"}, Commissioning, Fail, "libcuda.so.1"},
		{"pass", on, measured(good), Commissioning, Pass, "computes right"},
		{"slow", on, measured(slow), Continuous, Warn, "device-memory"},
		{"wrong", on, measured(wrong), Commissioning, Fail, "C[0][0]"},
		{"one GPU missing", on, &gpucompute.Report{}, Commissioning, Unknown, "did not measure"},
		{"GPU error", on, &gpucompute.Report{GPUs: []gpucompute.GPUResult{{Index: 0, Err: "CUDA_ERROR_INVALID_PTX"}}}, Commissioning, Fail, "CUDA_ERROR_INVALID_PTX"},
	} {
		p := *loadProfile(t, "debian12-nvidia535")
		g := *p.GPU
		g.Compute = tc.setting
		p.GPU = &g
		in := simInput(t, &p)
		in.Phase, in.Compute = tc.phase, tc.report
		rs := Run(in, checkid.Compute)
		if len(rs) != len(in.Snapshot.GPUs) {
			t.Fatalf("%s: %d results for %d GPUs", tc.name, len(rs), len(in.Snapshot.GPUs))
		}
		r := rs[0]
		if r.Status != tc.want || !strings.Contains(r.Message, tc.says) {
			t.Errorf("%s: %s %q, want %s saying %q", tc.name, r.Status, r.Message, tc.want, tc.says)
		}
		if tc.want == Pass && (!strings.Contains(r.Observed, "20.00 TFLOPS") || !strings.Contains(r.Expected, "20 TFLOPS")) {
			t.Errorf("%s: observed %q, expected %q", tc.name, r.Observed, r.Expected)
		}
		if (tc.want == Fail || tc.want == Warn) && r.Remedy == "" {
			t.Errorf("%s: no remedy", tc.name)
		}
		if tc.name == "simulated" && (r.Observed != "simulated" || r.Expected != "") {
			t.Errorf("simulated result carries figures: %+v", r)
		}
	}
}
