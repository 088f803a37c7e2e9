package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

// TestComputeCheckWithoutLibcuda runs the real binary where libcuda is absent: it
// starts, says which library is missing and what to install, and exits 2.
func TestComputeCheckWithoutLibcuda(t *testing.T) {
	args := [][]string{{"compute-check", "--cuda-library", "/nonexistent/libcuda.so.1"}}
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		args = append(args, []string{"compute-check"}) // the loader's own search finds none here
	}
	for _, a := range args {
		out, stderr, code := runAgent(t, a...)
		if code != 2 {
			t.Fatalf("%v: exit %d, want 2\n%s%s", a, code, out, stderr)
		}
		for _, want := range []string{"compute check: error", "libcuda.so.1", "libcuda1"} {
			if !strings.Contains(out+stderr, want) {
				t.Errorf("%v: output lacks %q:\n%s%s", a, want, out, stderr)
			}
		}
	}
}

// TestComputeCheckSimulated: on the simulator it reports simulated, with no figures,
// in text and JSON, and exits 0.
func TestComputeCheckSimulated(t *testing.T) {
	out, stderr, code := runAgent(t, "compute-check", "--gpu-backend", "sim:dgxh100", "--expect-tflops", "20")
	if code != 0 || !strings.Contains(out, "compute check: simulated") || strings.Contains(out, "TFLOPS") {
		t.Fatalf("exit %d:\n%s%s", code, out, stderr)
	}
	out, stderr, code = runAgent(t, "compute-check", "--gpu-backend", "sim:dgxh100", "--format", "json")
	var o struct {
		Status string
		GPUs   []any
	}
	if err := json.Unmarshal([]byte(out), &o); err != nil || code != 0 || o.Status != "simulated" || o.GPUs != nil {
		t.Fatalf("exit %d, %+v, %v:\n%s%s", code, o, err, out, stderr)
	}
	if _, stderr, code := runAgent(t, "compute-check", "--format", "yaml"); code != 2 || !strings.Contains(stderr, "--format") {
		t.Errorf("--format yaml: exit %d, %s", code, stderr)
	}
}

// TestValidateComputeOnSimulator: a profile with gpu.compute on runs the check at
// commissioning; on simulated GPUs it reports simulated, not figures.
func TestValidateComputeOnSimulator(t *testing.T) {
	data, err := os.ReadFile(h100Profile)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(data), "\nkubernetes:", "\n  compute:\n    enabled: true\n    expect: {tflopsFP32: 20}\nkubernetes:", 1)
	text = strings.Replace(text, "\npackages:\n", "\npackages:\n  - libcuda1\n", 1)
	if !strings.Contains(text, "compute:") || !strings.Contains(text, "- libcuda1") {
		testreq.Missing(t, "a gpu section and packages to add gpu.compute and libcuda1 to", "keep profiles/debian12-nvidia535.yaml's gpu section last before kubernetes, and its packages list")
	}
	path := filepath.Join(t.TempDir(), "debian12-nvidia535.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runAgent(t, "validate", "--gpu-backend", "sim:dgxh100", "--profile", path, "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, stderr)
	}
	var cl struct {
		Results []struct{ ID, Status, Observed, Message string }
	}
	if err := json.Unmarshal([]byte(out), &cl); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	n := 0
	for _, r := range cl.Results {
		if r.ID == "gpu.compute" {
			n++
			if r.Status != "CHECK_STATUS_NOT_APPLICABLE" || r.Observed != "simulated" || !strings.Contains(r.Message, "simulated") {
				t.Errorf("gpu.compute result %+v", r)
			}
		}
	}
	if n != 8 {
		t.Errorf("%d gpu.compute results, want one per simulated GPU (8):\n%s", n, out)
	}
}
