package nvml_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/nvml"
)

// TestOpenWithoutLibrary loads a library path that does not exist, which is what a
// node without the NVIDIA driver looks like. The process must survive and say why.
func TestOpenWithoutLibrary(t *testing.T) {
	b := nvml.Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	defer b.Close()
	if _, err := b.Library(); err == nil || !strings.HasPrefix(err.Error(), "NVML not available: ERROR_LIBRARY_NOT_FOUND") {
		t.Fatalf("Library() error = %v, want NVML not available: ERROR_LIBRARY_NOT_FOUND", err)
	}
	s := gpu.Read(b)
	if s.Driver.Loaded || !strings.Contains(s.Driver.Error, "NVML not available") || len(s.GPUs) != 0 {
		t.Fatalf("snapshot = %+v, want driver not loaded and no GPUs", s.Driver)
	}
}

// TestOpenDefault uses the system's library the way `gpuagent --gpu-backend nvml`
// does. On machines without a driver it must fail cleanly; with one it must read.
func TestOpenDefault(t *testing.T) {
	b := nvml.Open("")
	defer b.Close()
	s := gpu.Read(b)
	if !s.Driver.Loaded {
		if _, err := os.Stat("/dev/nvidiactl"); err == nil {
			t.Errorf("a driver is present (/dev/nvidiactl) but NVML did not load: %s", s.Driver.Error)
		}
		t.Logf("no NVIDIA driver here: %s", s.Driver.Error)
		return
	}
	t.Logf("driver %s, %d GPUs", s.Driver.Version, len(s.GPUs))
	if s.Count.OK() && s.Count.V != len(s.GPUs) {
		t.Errorf("count %d but %d GPUs read", s.Count.V, len(s.GPUs))
	}
}
