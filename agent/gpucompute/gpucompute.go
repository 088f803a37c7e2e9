// Package gpucompute makes a GPU compute and measures it, with no CUDA toolkit: it
// loads the driver's libcuda.so.1 at run time (dlopen, so a node without it still runs
// the agent) and runs kernels written as PTX text (ptx/*.ptx, embedded), which the
// driver JIT-compiles for the GPU it finds. Three measurements per GPU (docs/compute-check.md):
//
//   - an FP32 tiled SGEMM, timed (TFLOPS = 2·N³ / time) and verified against a CPU
//     reference on a sample of entries;
//   - device-memory bandwidth: a copy kernel, bytes read + written / time;
//   - host↔device copy bandwidth, from and to pinned host memory.
//
// The figures are plain data (Figures, Report); Evaluate judges them against the
// profile's expectations (gpu.compute) and is pure, so agent/checks (gpu.compute)
// uses it without touching a GPU. On the simulator nothing runs: a Report says
// Simulated and carries no figures, never numbers that could pass for real ones.
//
// It is not a benchmark suite (no tuning per architecture, no tensor cores): the
// figures are for comparing like machines and catching a slow or broken GPU.
package gpucompute

import (
	"fmt"
	"math"
)

// Figures are one GPU's measurements.
type Figures struct {
	// TFLOPSFP32 is the SGEMM rate: 2·N³ floating-point operations per run over its time.
	TFLOPSFP32 float64 `json:"tflopsFP32"`
	// DeviceGBps is the copy kernel's device-memory rate: bytes read plus written, in
	// 10⁹ bytes per second.
	DeviceGBps float64 `json:"deviceGBps"`
	// H2DGBps and D2HGBps are pinned host-to-device and device-to-host copy rates.
	H2DGBps float64 `json:"h2dGBps"`
	D2HGBps float64 `json:"d2hGBps"`
	// SGEMMN is the matrix order.
	SGEMMN int `json:"sgemmN"`
	// SGEMMSamples entries of C were checked against the CPU; SGEMMMaxError is the
	// largest |gpu − cpu| / Σ|a·b| among them (Verify).
	SGEMMSamples  int     `json:"sgemmSamples"`
	SGEMMMaxError float64 `json:"sgemmMaxError"`
	// SGEMMVerified is false when an entry was off by more than SGEMMTolerance: the GPU
	// computed a wrong result, whatever its speed.
	SGEMMVerified bool `json:"sgemmVerified"`
	// CopyVerified is false when the copy kernel's destination differs from its source.
	CopyVerified bool `json:"copyVerified"`
	// VerifyError says what was wrong when a result was not verified.
	VerifyError string `json:"verifyError,omitempty"`
}

// GPUResult is one GPU's outcome: figures, or the error that stopped its measurement.
type GPUResult struct {
	// Index is the GPU's NVML index when the agent chose it by PCI bus id, else its
	// CUDA ordinal.
	Index    int      `json:"index"`
	PCIBusID string   `json:"pciBusId,omitempty"`
	Name     string   `json:"name,omitempty"`
	Figures  *Figures `json:"figures,omitempty"`
	Err      string   `json:"error,omitempty"`
}

// Report is a run over a node's GPUs.
type Report struct {
	// Simulated: the GPUs are the simulator's; nothing ran and there are no figures.
	Simulated bool `json:"simulated"`
	// Library is the libcuda that was loaded (or asked for).
	Library string `json:"library,omitempty"`
	// DriverAPIVersion is cuDriverGetVersion's figure (12040 for CUDA 12.4).
	DriverAPIVersion int `json:"driverApiVersion,omitempty"`
	// Err is why nothing could be measured (no libcuda, cuInit failed).
	Err  string      `json:"error,omitempty"`
	GPUs []GPUResult `json:"gpus,omitempty"`
}

// SimulatedReport is the report for simulated GPUs: no figures, labelled.
func SimulatedReport() *Report { return &Report{Simulated: true} }

// Result returns the result for the GPU with NVML index i, or nil.
func (r *Report) Result(i int) *GPUResult {
	if r == nil {
		return nil
	}
	for k := range r.GPUs {
		if r.GPUs[k].Index == i {
			return &r.GPUs[k]
		}
	}
	return nil
}

// Expect are the figures a healthy GPU of the node's class reaches with these
// kernels; zero leaves a figure unjudged. The profile's gpu.compute.expect.
type Expect struct {
	TFLOPSFP32 float64
	DeviceGBps float64
	H2DGBps    float64
	D2HGBps    float64
}

// DefaultMinRatio is the share of an expected figure below which a figure warns.
const DefaultMinRatio = 0.7

// Verdict is a judgement of one GPU's figures.
type Verdict string

// The verdicts.
const (
	VerdictPass Verdict = "pass"
	VerdictWarn Verdict = "warn" // a figure below minRatio × expected
	VerdictFail Verdict = "fail" // a kernel computed a wrong result
)

// Metric is one figure against its expectation.
type Metric struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Measured float64 `json:"measured"`
	// Expected is 0 when the profile sets none; Ratio and Low are then unset.
	Expected float64 `json:"expected,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Low      bool    `json:"low,omitempty"`
}

// Evaluate judges figures against expectations: fail when a kernel's result was
// wrong, warn when any expected figure is below minRatio of it (minRatio ≤ 0 means
// DefaultMinRatio), else pass. The metrics come in a fixed order: TFLOPS, device,
// H2D, D2H.
func Evaluate(f Figures, e Expect, minRatio float64) (Verdict, []Metric) {
	if minRatio <= 0 || math.IsNaN(minRatio) {
		minRatio = DefaultMinRatio
	}
	ms := []Metric{
		{Name: "sgemm-fp32", Unit: "TFLOPS", Measured: f.TFLOPSFP32, Expected: e.TFLOPSFP32},
		{Name: "device-memory", Unit: "GB/s", Measured: f.DeviceGBps, Expected: e.DeviceGBps},
		{Name: "host-to-device", Unit: "GB/s", Measured: f.H2DGBps, Expected: e.H2DGBps},
		{Name: "device-to-host", Unit: "GB/s", Measured: f.D2HGBps, Expected: e.D2HGBps},
	}
	v := VerdictPass
	for i := range ms {
		m := &ms[i]
		if m.Expected > 0 {
			m.Ratio = m.Measured / m.Expected
			m.Low = !(m.Ratio >= minRatio) // NaN measured counts as low
			if m.Low {
				v = VerdictWarn
			}
		}
	}
	if !f.SGEMMVerified || !f.CopyVerified {
		v = VerdictFail
	}
	return v, ms
}

// Summary is one line of the figures, for a check's observed field and the text report.
func (f Figures) Summary() string {
	return fmt.Sprintf("%.2f TFLOPS FP32 (SGEMM N=%d), device %.0f GB/s, H2D %.1f GB/s, D2H %.1f GB/s",
		f.TFLOPSFP32, f.SGEMMN, f.DeviceGBps, f.H2DGBps, f.D2HGBps)
}

// Summary is one line of the expectations, "–" for unset ones.
func (e Expect) Summary(minRatio float64) string {
	if minRatio <= 0 {
		minRatio = DefaultMinRatio
	}
	g := func(v float64, unit string) string {
		if v <= 0 {
			return "– " + unit
		}
		return fmt.Sprintf("%g %s", v, unit)
	}
	return fmt.Sprintf("≥ %g × (%s FP32, device %s, H2D %s, D2H %s)", minRatio,
		g(e.TFLOPSFP32, "TFLOPS"), g(e.DeviceGBps, "GB/s"), g(e.H2DGBps, "GB/s"), g(e.D2HGBps, "GB/s"))
}
