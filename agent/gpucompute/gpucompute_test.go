package gpucompute

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestKernelsMatchPTX holds the launcher to the PTX text: every entry it calls exists,
// with the parameter types it passes in that order, in a module whose ISA version and
// target any driver of CUDA 11.8 or later JIT-compiles.
func TestKernelsMatchPTX(t *testing.T) {
	for _, k := range Kernels {
		m, err := ParsePTX(*k.PTX)
		if err != nil {
			t.Fatalf("%s: %v", k.Entry, err)
		}
		if m.Major != 7 || m.Minor > 8 {
			t.Errorf("%s: PTX ISA %s; keep to 7.8 or lower so that CUDA 11.8 drivers JIT it", k.Entry, m.Version)
		}
		if m.Target != "sm_70" {
			t.Errorf("%s: target %s, want sm_70 (Volta and later)", k.Entry, m.Target)
		}
		e := m.Entry(k.Entry)
		if e == nil {
			t.Errorf("PTX has no entry %s (has %v)", k.Entry, m.Entries)
			continue
		}
		var types []string
		for _, p := range e.Params {
			types = append(types, p.Type)
			if !strings.HasPrefix(p.Name, k.Entry+"_param_") {
				t.Errorf("%s: parameter %s is not named %s_param_*", k.Entry, p.Name, k.Entry)
			}
		}
		if strings.Join(types, ",") != strings.Join(k.Params, ",") {
			t.Errorf("%s: PTX parameters %v, the launcher passes %v", k.Entry, types, k.Params)
		}
		// Every parameter the PTX declares is read.
		for _, p := range e.Params {
			if !strings.Contains(*k.PTX, "["+p.Name+"]") {
				t.Errorf("%s: parameter %s is never loaded", k.Entry, p.Name)
			}
		}
	}
}

// TestLaunchWrappersMatchKernels reads the C launch wrappers in cuda.go: their
// kernelParams arrays must list the arguments in the order and of the PTX types of
// Kernels, since cuLaunchKernel trusts the caller for both.
func TestLaunchWrappersMatchKernels(t *testing.T) {
	src, err := os.ReadFile("cuda.go")
	if err != nil {
		t.Fatal(err)
	}
	ctype := map[string]string{"CUdeviceptr": "u64", "unsigned int": "u32", "unsigned long long": "u64"}
	wrappers := map[string]string{"sgemm_tiled": "gc_launch_sgemm", "copy_f4": "gc_launch_copy"}
	for _, k := range Kernels {
		name := wrappers[k.Entry]
		re := regexp.MustCompile(`static CUresult ` + name + `\(CUfunction f, ([^)]*)\) \{\n\tvoid \*params\[\] = \{([^}]*)\};`)
		m := re.FindSubmatch(src)
		if m == nil {
			t.Errorf("cuda.go has no wrapper %s building kernelParams", name)
			continue
		}
		var args, types []string
		for _, decl := range strings.Split(string(m[1]), ",") {
			decl = strings.TrimSpace(decl)
			i := strings.LastIndex(decl, " ")
			if decl[:i] == "unsigned int" && decl[i+1:] == "blocks" {
				continue // the grid size, not a kernel parameter
			}
			args = append(args, "&"+decl[i+1:])
			types = append(types, ctype[decl[:i]])
		}
		if got := strings.Join(strings.Fields(strings.ReplaceAll(string(m[2]), ",", " ")), " "); got != strings.Join(args, " ") {
			t.Errorf("%s: kernelParams {%s}, want the arguments in order %v", name, got, args)
		}
		if strings.Join(types, ",") != strings.Join(k.Params, ",") {
			t.Errorf("%s passes %v, %s takes %v", name, types, k.Entry, k.Params)
		}
	}
}

func TestParsePTXRejects(t *testing.T) {
	for _, text := range []string{
		"", ".target sm_70\n.visible .entry f()\n{}",
		".version 7.0\n.visible .entry f()\n{}",
		".version 7.0\n.target sm_70\n",
		".version 7.0\n.target sm_70\n.visible .entry f(.param u64 x)\n{}",
	} {
		if m, err := ParsePTX(text); err == nil {
			t.Errorf("ParsePTX(%q) = %+v, want an error", text, m)
		}
	}
}

func TestReferenceSGEMM(t *testing.T) {
	// [1 2; 3 4]·[5 6; 7 8] = [19 22; 43 50]
	c := CPUSGEMM([]float32{1, 2, 3, 4}, []float32{5, 6, 7, 8}, 2)
	if want := []float32{19, 22, 43, 50}; !slicesEqual(c, want) {
		t.Fatalf("CPUSGEMM = %v, want %v", c, want)
	}
	v, scale := ReferenceEntry([]float32{1, -2, 3, 4}, []float32{5, 6, 7, 8}, 2, 0, 1)
	if v != 1*6-2*8 || scale != 6+16 {
		t.Fatalf("ReferenceEntry = %v, %v; want -10, 22", v, scale)
	}
	const n = 128
	a, b := make([]float32, n*n), make([]float32, n*n)
	FillMatrix(a, 1)
	FillMatrix(b, 2)
	c = CPUSGEMM(a, b, n)
	entries := SampleEntries(n, 64)
	if len(entries) != 64 || entries[3] != (Position{n - 1, n - 1}) {
		t.Fatalf("SampleEntries: %v", entries[:4])
	}
	if e, err := Verify(a, b, c, n, entries); err != nil || e > 1e-6 {
		t.Fatalf("the CPU's own product does not verify: %v (max error %g)", err, e)
	}
	// A transposed-B kernel (a classic indexing slip) must fail verification.
	bt := make([]float32, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			bt[i*n+j] = b[j*n+i]
		}
	}
	if _, err := Verify(a, b, CPUSGEMM(a, bt, n), n, entries); err == nil || !strings.Contains(err.Error(), "SGEMM result wrong") {
		t.Fatalf("A·Bᵀ passed as A·B: %v", err)
	}
	// One wrong corner, and one NaN, fail too.
	for _, bad := range []float32{c[n*n-1] + 1, float32(math.NaN())} {
		d := append([]float32(nil), c...)
		d[n*n-1] = bad
		if _, err := Verify(a, b, d, n, entries); err == nil || !strings.Contains(err.Error(), "C[127][127]") {
			t.Errorf("corner %v: %v", bad, err)
		}
	}
	// FP32 rounding of a correct kernel is within tolerance: accumulate in float32.
	f32 := make([]float32, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for k := 0; k < n; k++ {
				s = float32(math.FMA(float64(a[i*n+k]), float64(b[k*n+j]), float64(s)))
			}
			f32[i*n+j] = s
		}
	}
	if _, err := Verify(a, b, f32, n, entries); err != nil {
		t.Fatalf("float32 accumulation fails the tolerance: %v", err)
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPattern(t *testing.T) {
	w := make([]uint32, 1000)
	FillPattern(w)
	if err := CheckPattern(w); err != nil {
		t.Fatal(err)
	}
	copy(w[500:], w[499:]) // shifted by one word
	if err := CheckPattern(w); err == nil || !strings.Contains(err.Error(), "word 500") {
		t.Fatalf("a shifted copy passed: %v", err)
	}
}

func TestEvaluate(t *testing.T) {
	good := Figures{TFLOPSFP32: 20, DeviceGBps: 4000, H2DGBps: 50, D2HGBps: 50, SGEMMVerified: true, CopyVerified: true}
	exp := Expect{TFLOPSFP32: 25, DeviceGBps: 4000, H2DGBps: 55}
	for _, tc := range []struct {
		name     string
		f        Figures
		e        Expect
		ratio    float64
		want     Verdict
		lowNames string
	}{
		{"within 0.7", good, exp, 0, VerdictPass, ""},
		{"tflops below 0.9", good, exp, 0.9, VerdictWarn, "sgemm-fp32"},
		{"no expectations", good, Expect{}, 0.99, VerdictPass, ""},
		{"slow device memory", withDevice(good, 1000), exp, 0.7, VerdictWarn, "device-memory"},
		{"NaN figure", withDevice(good, math.NaN()), exp, 0.7, VerdictWarn, "device-memory"},
		{"wrong SGEMM", Figures{TFLOPSFP32: 99, DeviceGBps: 9999, H2DGBps: 99, CopyVerified: true}, exp, 0.7, VerdictFail, ""},
		{"wrong copy", Figures{TFLOPSFP32: 99, DeviceGBps: 9999, H2DGBps: 99, SGEMMVerified: true}, exp, 0.7, VerdictFail, ""},
	} {
		v, ms := Evaluate(tc.f, tc.e, tc.ratio)
		var low []string
		for _, m := range ms {
			if m.Low {
				low = append(low, m.Name)
			}
			if m.Expected == 0 && (m.Ratio != 0 || m.Low) {
				t.Errorf("%s: %s judged without an expectation", tc.name, m.Name)
			}
		}
		if v != tc.want || strings.Join(low, ",") != tc.lowNames || len(ms) != 4 {
			t.Errorf("%s: %s low %v (%d metrics), want %s low %q", tc.name, v, low, len(ms), tc.want, tc.lowNames)
		}
	}
	_, ms := Evaluate(good, exp, 0)
	if ms[0].Ratio != 0.8 || ms[2].Ratio != 50.0/55 {
		t.Errorf("ratios %v, %v; want 0.8, 50/55", ms[0].Ratio, ms[2].Ratio)
	}
}

func withDevice(f Figures, gbps float64) Figures { f.DeviceGBps = gbps; return f }

// TestSimulatedReportHasNoFigures: on the simulator the outcome says simulated, and
// neither its text nor its JSON carries a figure that could pass for a measured one.
func TestSimulatedReportHasNoFigures(t *testing.T) {
	o := Judge(SimulatedReport(), Expect{TFLOPSFP32: 25, DeviceGBps: 4000}, 0.7)
	if o.Status != StatusSimulated || len(o.GPUs) != 0 {
		t.Fatalf("outcome %+v", o)
	}
	var text, js bytes.Buffer
	if err := o.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if err := o.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "compute check: simulated") || strings.ContainsAny(text.String(), "0123456789") {
		t.Errorf("text: %q", text.String())
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back["status"] != "simulated" || back["gpus"] != nil || strings.Contains(js.String(), "GBps") || strings.Contains(js.String(), "tflops") {
		t.Errorf("JSON: %s", js.String())
	}
}

// TestMissingLibrary runs the real loader on a library that does not exist, as on a
// node without the driver's user-space libraries: the report names the library and
// what to install, and no GPU is reported.
func TestMissingLibrary(t *testing.T) {
	r := Run(Options{Library: "libcuda-absent-for-a-test.so.1"})
	if r.Err == "" || len(r.GPUs) != 0 {
		t.Fatalf("report %+v", r)
	}
	wants := []string{"libcuda-absent-for-a-test.so.1", "libcuda1", "dynamic loader", "--cuda-library"}
	if !cgoEnabled {
		wants = []string{"built without cgo", "libcuda.so.1"}
	}
	for _, want := range wants {
		if !strings.Contains(r.Err, want) {
			t.Errorf("error %q does not say %q", r.Err, want)
		}
	}
	o := Judge(r, Expect{}, 0)
	var text bytes.Buffer
	_ = o.WriteText(&text)
	if o.Status != StatusError || !strings.Contains(text.String(), "compute check: error") {
		t.Errorf("outcome %s: %s", o.Status, text.String())
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, o := range []Options{
		{N: 100}, {N: 32}, {N: 32768},
		{TransferBytes: 1000}, {CopyBytes: 300 << 20},
		{Iterations: 2}, {Iterations: 5000},
	} {
		if err := o.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	r := Run(Options{N: 100})
	if !strings.Contains(r.Err, "multiple of 64") {
		t.Errorf("Run with N=100: %q", r.Err)
	}
}

func TestJudgeGPUError(t *testing.T) {
	r := &Report{Library: "libcuda.so.1", DriverAPIVersion: 12040, GPUs: []GPUResult{
		{Index: 0, Name: "GPU", Figures: &Figures{SGEMMN: 4096, TFLOPSFP32: 20, SGEMMVerified: true, CopyVerified: true}},
		{Index: 1, Err: "JIT of the PTX of sgemm_tiled: CUDA_ERROR_INVALID_PTX"},
	}}
	o := Judge(r, Expect{}, 0)
	if o.Status != "fail" || o.GPUs[0].Status != VerdictPass || o.GPUs[1].Status != VerdictFail || o.GPUs[1].Message == "" {
		t.Fatalf("outcome %+v", o)
	}
	var text bytes.Buffer
	_ = o.WriteText(&text)
	for _, want := range []string{"CUDA driver API 12.4", "sgemm-fp32", "20.00 TFLOPS", "no expectation set", "CUDA_ERROR_INVALID_PTX"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}
