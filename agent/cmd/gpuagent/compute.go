package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpucompute"
	"github.com/gpurack/gpurack/internal/profile"
)

// computeHook is the monitor's compute check (monitor.Config.Compute): the simulator's
// GPUs report simulated; real ones are measured through libcuda by PCI bus id.
func computeHook(library string) func(*gpu.Snapshot) *gpucompute.Report {
	return func(s *gpu.Snapshot) *gpucompute.Report {
		if s.Simulated {
			return gpucompute.SimulatedReport()
		}
		var targets []gpucompute.Target
		for _, g := range s.GPUs {
			if !g.Lost {
				targets = append(targets, gpucompute.Target{Index: g.Index, PCIBusID: g.PCIBusID})
			}
		}
		return gpucompute.Run(gpucompute.Options{Library: library, Targets: targets})
	}
}

// computeFlags are compute-check's own flags.
type computeFlags struct {
	profilePath, backend, library, format string
	opts                                  gpucompute.Options
	expect                                gpucompute.Expect
	minRatio                              float64
}

func newComputeCheckCommand() *cobra.Command {
	var f computeFlags
	cmd := &cobra.Command{
		Use:   "compute-check",
		Short: "Make every GPU compute (PTX kernels through libcuda) and print TFLOPS and GB/s against expectations",
		Long: `compute-check loads the driver's libcuda.so.1 (no CUDA toolkit needed) and, on every GPU
the process sees, runs a tiled FP32 SGEMM verified against a CPU reference, a
device-memory copy kernel and pinned host<->device copies; it prints TFLOPS, device GB/s
and H2D/D2H GB/s, each with its expected figure and ratio (docs/compute-check.md).

Expectations come from --profile's gpu.compute section, or the --expect-* flags, which
win. It needs no NVML and no profile, so it runs in a pod that requests nvidia.com/gpu.
With --gpu-backend sim:MODEL (or a simulated profile) nothing runs and it reports
"simulated". It exits 0 when every GPU passes or warns, 1 when one fails (a wrong result
or a GPU that cannot run a kernel), and 2 when nothing can be measured (no libcuda).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.profilePath, "profile", "", "node profile whose gpu.compute gives the expectations (default: none)")
	fs.StringVar(&f.backend, "gpu-backend", "", "sim:MODEL reports simulated and runs nothing; default: the GPUs libcuda sees")
	fs.StringVar(&f.library, "cuda-library", "", "path of libcuda.so.1 (default: the dynamic loader's search)")
	fs.StringVar(&f.format, "format", "text", "output format: text or json")
	fs.IntVar(&f.opts.N, "sgemm-n", gpucompute.DefaultN, "SGEMM matrix order (a multiple of 64)")
	fs.Int64Var(&f.opts.CopyBytes, "copy-bytes", gpucompute.DefaultCopyBytes, "size of each device-copy buffer in bytes")
	fs.Int64Var(&f.opts.TransferBytes, "transfer-bytes", gpucompute.DefaultTransferBytes, "size of each host<->device copy in bytes")
	fs.IntVar(&f.opts.Iterations, "iterations", gpucompute.DefaultIterations, "timed iterations of each step")
	fs.Float64Var(&f.expect.TFLOPSFP32, "expect-tflops", 0, "expected FP32 SGEMM TFLOPS per GPU (0: not judged)")
	fs.Float64Var(&f.expect.DeviceGBps, "expect-device-gbps", 0, "expected device-memory GB/s (0: not judged)")
	fs.Float64Var(&f.expect.H2DGBps, "expect-h2d-gbps", 0, "expected host-to-device GB/s (0: not judged)")
	fs.Float64Var(&f.expect.D2HGBps, "expect-d2h-gbps", 0, "expected device-to-host GB/s (0: not judged)")
	fs.Float64Var(&f.minRatio, "min-ratio", 0, "warn below this share of an expected figure (default: the profile's, else 0.7)")
	return cmd
}

func (f *computeFlags) run(cmd *cobra.Command) error {
	if f.format != "text" && f.format != "json" {
		return &exitError{2, fmt.Errorf("--format %q: use text or json", f.format)}
	}
	simulated := strings.HasPrefix(f.backend, "sim:")
	if f.backend != "" && !simulated && f.backend != "nvml" {
		return &exitError{2, fmt.Errorf("--gpu-backend %q: use sim:MODEL, or leave it out for the GPUs libcuda sees", f.backend)}
	}
	if f.profilePath != "" {
		p, err := profile.Load(f.profilePath)
		if err != nil {
			return &exitError{2, err}
		}
		simulated = simulated || p.Simulated()
		f.fromProfile(p)
	}
	var rep *gpucompute.Report
	if simulated {
		rep = gpucompute.SimulatedReport()
	} else {
		f.opts.Library = f.library
		rep = gpucompute.Run(f.opts)
	}
	out := gpucompute.Judge(rep, f.expect, f.minRatio)
	var err error
	if f.format == "json" {
		err = out.WriteJSON(cmd.OutOrStdout())
	} else {
		err = out.WriteText(cmd.OutOrStdout())
	}
	switch {
	case err != nil:
		return &exitError{2, err}
	case out.Status == gpucompute.StatusError:
		return &exitError{2, fmt.Errorf("compute check could not run (the report says why)")}
	case out.Status == string(gpucompute.VerdictFail):
		return &exitError{1, fmt.Errorf("compute check failed")}
	}
	return nil
}

// fromProfile takes the expectations the flags leave unset from gpu.compute.
func (f *computeFlags) fromProfile(p *profile.Profile) {
	if p.GPU == nil || p.GPU.Compute == nil {
		return
	}
	c := p.GPU.Compute
	set := func(dst *float64, v float64) {
		if *dst == 0 {
			*dst = v
		}
	}
	set(&f.expect.TFLOPSFP32, c.Expect.TFLOPSFP32)
	set(&f.expect.DeviceGBps, c.Expect.DeviceGBps)
	set(&f.expect.H2DGBps, c.Expect.H2DGBps)
	set(&f.expect.D2HGBps, c.Expect.D2HGBps)
	set(&f.minRatio, c.MinRatio)
}
