package checks

import (
	"os/exec"
	"strings"
	"testing"
)

// TestChecksNeverImportNVML holds "checks never touch NVML" by construction: the
// package's non-test dependencies must not include go-nvml (checks read the plain
// agent/gpu/snapshot data; agent/gpu reads NVML). Tests may use the simulator.
func TestChecksNeverImportNVML(t *testing.T) {
	const pkg = "github.com/gpurack/gpurack/agent/checks"
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 2 || deps[len(deps)-1] != pkg {
		t.Fatalf("go list -deps %s printed no dependency list:\n%s", pkg, out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/NVIDIA/") || d == "github.com/gpurack/gpurack/agent/gpu" {
			t.Errorf("agent/checks depends on %s; checks must read only agent/gpu/snapshot data, never NVML", d)
		}
	}
}
