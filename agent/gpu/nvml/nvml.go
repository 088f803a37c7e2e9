// Package nvml is the GPU backend for real hardware: go-nvml over the driver's
// libnvidia-ml.so.1, loaded with dlopen at run time.
//
// go-nvml binds NVML symbols lazily: calling any NVML function while the library is
// not loaded (no driver installed) kills the process with a symbol lookup error, and so
// does calling a function an older driver lacks. This package therefore hands out the
// library only after Init succeeded, and agent/gpu probes every symbol with
// Extensions().LookupSymbol before calling it. It is not for tests without a GPU: use
// agent/gpu/sim there.
package nvml

import (
	"errors"
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Backend is the NVML library. Its zero value is not usable; call Open.
type Backend struct {
	mu      sync.Mutex
	lib     gonvml.Interface
	initErr error
	closed  bool
}

// Open loads and initialises NVML. It never fails: when NVML cannot be used, the
// returned Backend's Library reports why, so callers can report gpu.driver.loaded as
// failed and keep serving.
func Open(libraryPath string) *Backend {
	var opts []gonvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, gonvml.WithLibraryPath(libraryPath))
	}
	lib := gonvml.New(opts...)
	b := &Backend{}
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		b.initErr = unavailable(ret)
		return b
	}
	b.lib = lib
	return b
}

// unavailable explains an Init failure. Return.Error is safe here: without a loaded
// library go-nvml answers from its own table.
func unavailable(ret gonvml.Return) error {
	var hint string
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		hint = "libnvidia-ml.so.1 could not be loaded; install the NVIDIA driver's NVML library (libnvidia-ml1) or pass --nvml-library"
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		hint = "the NVIDIA kernel driver is not loaded; check `lsmod | grep nvidia` and the kernel log"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		hint = "libnvidia-ml and the loaded kernel module are different driver versions; reboot into a consistent image"
	case gonvml.ERROR_NO_PERMISSION:
		hint = "no permission to open /dev/nvidia*; run as root"
	default:
		hint = "NVML initialisation failed"
	}
	return fmt.Errorf("NVML not available: %s (%s)", ret.Error(), hint)
}

// ErrClosed is returned by Library after Close.
var ErrClosed = errors.New("NVML not available: backend closed")

// Name is "nvml".
func (b *Backend) Name() string { return "nvml" }

// Simulated is false.
func (b *Backend) Simulated() bool { return false }

// Library returns the initialised library, or why there is none.
func (b *Backend) Library() (gonvml.Interface, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return nil, ErrClosed
	case b.initErr != nil:
		return nil, b.initErr
	}
	return b.lib, nil
}

// Close shuts NVML down. Callers stop every reader first: after Shutdown the library
// is unloaded and a late call would crash.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.lib == nil {
		b.closed = true
		return nil
	}
	b.closed = true
	if ret := b.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", ret.Error())
	}
	return nil
}

// BusID is p's PCI bus id as NVML writes it ("00000000:3B:00.0"): its NUL-terminated
// char array as a string.
func BusID(p gonvml.PciInfo) string {
	out := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
