package cdi

import (
	"context"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Source is what Write needs of the node's GPU backend (agent/gpu.Backend is one).
type Source interface {
	// Simulated is true for the simulator.
	Simulated() bool
	// Library is the loaded NVML, or why there is none.
	Library() (nvml.Interface, error)
}

// Options configure Write.
type Options struct {
	// Dir is the spec directory; empty: Dir. DevDir holds the simulated device nodes;
	// empty: SimDevDir.
	Dir, DevDir string
	// SimGPUs are the simulated GPUs; called only on the simulator.
	SimGPUs func() []GPU
	Log     *slog.Logger
}

// Write writes the node's spec for src: on the simulator the simulated spec over
// null-device nodes (WriteSimulated), else nvidia.yaml from NVML (WriteNVML). It is
// the one place the agent chooses between them; simulated says which it wrote.
func Write(ctx context.Context, src Source, o Options) (path string, simulated bool, err error) {
	if src.Simulated() {
		path, err = WriteSimulated(ctx, SimOptions{Dir: o.Dir, DevDir: o.DevDir, GPUs: o.SimGPUs()})
		return path, true, err
	}
	lib, err := src.Library()
	if err != nil {
		return "", false, err
	}
	path, err = WriteNVML(ctx, NVMLOptions{Dir: o.Dir, NVML: lib, Log: o.Log})
	return path, false, err
}
