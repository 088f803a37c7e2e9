package gpucompute

import (
	"fmt"
	"strings"
)

// Target names one GPU to measure: by PCI bus id (NVML's form, as the agent's
// snapshot has it; CUDA's device order differs from NVML's), else by CUDA ordinal.
type Target struct {
	Index    int
	PCIBusID string
}

// Options size a run. Zero fields take the defaults.
type Options struct {
	// Library is the libcuda to load; empty: DefaultLibrary through the loader's path.
	Library string
	// N is the SGEMM matrix order, a multiple of 64 (default 4096: 2·4096³ ≈ 137 GFLOP
	// a run, 192 MiB of device memory).
	N int
	// CopyBytes is each of the copy kernel's two buffers (default 1 GiB, past any L2).
	CopyBytes int64
	// TransferBytes is each host↔device copy (default 256 MiB of pinned host memory);
	// it divides CopyBytes.
	TransferBytes int64
	// Iterations of each timed step (default 10), at least CopyBytes/TransferBytes.
	Iterations int
	// Targets are the GPUs; none: every CUDA device by ordinal.
	Targets []Target
}

// The defaults.
const (
	DefaultN             = 4096
	DefaultCopyBytes     = 1 << 30
	DefaultTransferBytes = 256 << 20
	DefaultIterations    = 10
)

// WithDefaults fills the zero fields.
func (o Options) WithDefaults() Options {
	if o.N == 0 {
		o.N = DefaultN
	}
	if o.CopyBytes == 0 {
		o.CopyBytes = DefaultCopyBytes
	}
	if o.TransferBytes == 0 {
		o.TransferBytes = DefaultTransferBytes
	}
	if o.Iterations == 0 {
		o.Iterations = DefaultIterations
	}
	return o
}

// Validate checks the sizes the kernels and the timing loops rely on.
func (o Options) Validate() error {
	var errs []string
	if o.N < 64 || o.N > 16384 || o.N%64 != 0 {
		errs = append(errs, fmt.Sprintf("SGEMM order %d: use a multiple of 64 from 64 to 16384", o.N))
	}
	if o.TransferBytes < 1<<20 || o.TransferBytes%16 != 0 {
		errs = append(errs, fmt.Sprintf("transfer size %d bytes: use at least 1 MiB, a multiple of 16", o.TransferBytes))
	} else if o.CopyBytes < o.TransferBytes || o.CopyBytes%o.TransferBytes != 0 {
		errs = append(errs, fmt.Sprintf("copy size %d bytes: use a multiple of the transfer size %d", o.CopyBytes, o.TransferBytes))
	} else if o.Iterations < int(o.CopyBytes/o.TransferBytes) {
		errs = append(errs, fmt.Sprintf("%d iterations: use at least copy size / transfer size = %d, so that the transfers fill the copy buffer", o.Iterations, o.CopyBytes/o.TransferBytes))
	}
	if o.Iterations < 1 || o.Iterations > 1000 {
		errs = append(errs, fmt.Sprintf("%d iterations: use 1 to 1000", o.Iterations))
	}
	if len(errs) > 0 {
		return fmt.Errorf("compute check options: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Run loads libcuda and measures every target GPU in turn, each in a context of its
// own. It never panics for want of a library: a node without libcuda gets a Report
// whose Err says what to install.
func Run(o Options) *Report {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return &Report{Library: o.Library, Err: err.Error()}
	}
	path, version, err := open(o.Library)
	rep := &Report{Library: path, DriverAPIVersion: version}
	if err != nil {
		rep.Err = err.Error()
		return rep
	}
	targets := o.Targets
	if len(targets) == 0 {
		n, err := deviceCount()
		if err != nil {
			rep.Err = err.Error()
			return rep
		}
		if n == 0 {
			rep.Err = "libcuda sees no GPU (cuDeviceGetCount is 0): check CUDA_VISIBLE_DEVICES and the container's nvidia.com/gpu request"
		}
		for i := 0; i < n; i++ {
			targets = append(targets, Target{Index: i})
		}
	}
	for _, t := range targets {
		rep.GPUs = append(rep.GPUs, measureGPU(t, o))
	}
	return rep
}

// LibraryError is a libcuda that could not be loaded.
type LibraryError struct {
	Library string
	Reason  string // dlerror's text
}

func (e *LibraryError) Error() string {
	return fmt.Sprintf("cannot load %s (%s): the compute check needs the NVIDIA driver's CUDA library, "+
		"libcuda.so.1 from the driver's user-space libraries (Debian: libcuda1 of the driver's version); "+
		"install it or put its folder on the dynamic loader's path (ldconfig, LD_LIBRARY_PATH), or name it "+
		"with --cuda-library; in a pod, request nvidia.com/gpu so that the GPU runtime mounts it", e.Library, e.Reason)
}
