package cdi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpurack/gpurack/internal/testreq"
)

// source is a GPU backend as Write sees it.
type source struct {
	simulated bool
	libErr    error
}

func (s source) Simulated() bool                  { return s.simulated }
func (s source) Library() (nvml.Interface, error) { return nil, s.libErr }

// Write chooses by the backend: the simulated spec on the simulator (asking for the
// simulated GPUs only there), NVML's otherwise, and NVML's absence is its error.
func TestWriteChoosesByBackend(t *testing.T) {
	testreq.Root(t, "mknod of the simulated device nodes needs CAP_MKNOD")
	gpus, _ := simGPUs(t)
	noNVML := errors.New("NVML not available: no driver")
	for _, tc := range []struct {
		name      string
		src       source
		file      string // written, or "" for none
		simulated bool
		err       error
	}{
		{"simulator", source{simulated: true, libErr: noNVML}, SimulatedFile, true, nil},
		{"nvml without a driver", source{libErr: noNVML}, "", false, noNVML},
	} {
		dir, devDir := t.TempDir(), filepath.Join(t.TempDir(), "sim-dev")
		asked := false
		path, simulated, err := Write(context.Background(), tc.src, Options{Dir: dir, DevDir: devDir,
			SimGPUs: func() []GPU { asked = true; return gpus }})
		if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) || simulated != tc.simulated || asked != tc.simulated {
			t.Errorf("%s: Write = %q, simulated %v, %v (GPUs asked: %v)", tc.name, path, simulated, err, asked)
		}
		entries, _ := os.ReadDir(dir)
		switch {
		case tc.file == "" && len(entries) != 0:
			t.Errorf("%s: wrote %v", tc.name, entries)
		case tc.file != "" && path != filepath.Join(dir, tc.file):
			t.Errorf("%s: path %q, want %s", tc.name, path, tc.file)
		}
	}
}
