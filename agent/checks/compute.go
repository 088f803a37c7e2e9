package checks

import (
	"github.com/gpurack/gpurack/agent/gpu/snapshot"
	"github.com/gpurack/gpurack/agent/gpucompute"
)

// compute judges the compute check's figures for one GPU (gpu.compute): opt-in by the
// profile's gpu.compute.enabled, measured at commissioning (agent/gpucompute), judged
// by gpucompute.Evaluate against gpu.compute.expect: fail when a kernel's result was
// wrong or the GPU could not be measured, warn when a figure is below minRatio of its
// expectation. Simulated GPUs are not measured and say so; before the commissioning
// run (pre-approval, or an agent restarted later) there is nothing to judge.
func compute(in *Input, _ *Check, _ Limits, g *snapshot.GPU) Result {
	gs := in.Profile.GPU
	if !gs.ComputeEnabled() {
		return Result{Status: NotApplicable, Message: "opt-in check: set gpu.compute.enabled in the profile to run it at commissioning (docs/compute-check.md)"}
	}
	r := in.Compute
	switch {
	case r == nil:
		return Result{Status: NotApplicable, Message: "not measured yet: the compute check runs with the commissioning checklist only"}
	case r.Simulated:
		return Result{Status: NotApplicable, Observed: "simulated", Message: "simulated GPU: no kernel ran, so there are no figures"}
	case r.Err != "":
		return Result{Status: Fail, Observed: "not measured", Message: r.Err,
			Remedy: "Install the driver's CUDA library (libcuda.so.1) in the image, or turn gpu.compute off; see docs/compute-check.md."}
	}
	gr := r.Result(g.Index)
	switch {
	case gr == nil:
		return Result{Status: Unknown, Message: "the compute check did not measure " + gpuName(g), Remedy: "Run gpuagent compute-check on the node."}
	case gr.Figures == nil:
		return Result{Status: Fail, Observed: "not measured", Message: gpuName(g) + ": " + gr.Err,
			Remedy: "Run gpuagent compute-check on the node for details; a GPU that cannot run a kernel must not take workloads."}
	}
	c := gs.Compute
	e := gpucompute.Expect{TFLOPSFP32: c.Expect.TFLOPSFP32, DeviceGBps: c.Expect.DeviceGBps, H2DGBps: c.Expect.H2DGBps, D2HGBps: c.Expect.D2HGBps}
	verdict, metrics := gpucompute.Evaluate(*gr.Figures, e, c.MinRatio)
	res := Result{Observed: gr.Figures.Summary(), Expected: e.Summary(c.MinRatio)}
	switch verdict {
	case gpucompute.VerdictFail:
		res.Status, res.Message = Fail, gpuName(g)+" computed a wrong result: "+gr.Figures.VerifyError
		res.Remedy = "Withdraw the GPU and run the vendor's diagnostics (DCGM level 3); a GPU that computes wrong results must not run workloads."
	case gpucompute.VerdictWarn:
		res.Status, res.Message = Warn, gpuName(g)+" is slower than expected:"
		for _, m := range metrics {
			if m.Low {
				res.Message += " " + m.Name
			}
		}
		res.Remedy = "Compare with like nodes (gpuagent compute-check); check clocks, power limits, thermals and the PCIe link."
	default:
		res.Status, res.Message = Pass, gpuName(g)+" computes right and at the expected speed"
	}
	return res
}
