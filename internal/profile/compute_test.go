package profile

import (
	"fmt"
	"strings"
	"testing"
)

// withCompute is the nvidia profile with a gpu.compute section.
func withCompute(section string) string {
	s := strings.Replace(nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  compute:\n"+section, 1)
	return strings.Replace(s, "kubernetes:", "packages: [libcuda1]\nkubernetes:", 1)
}

func TestComputeSection(t *testing.T) {
	p, err := Parse("c.yaml", []byte(withCompute("    enabled: true\n    minRatio: 0.8\n    expect: {tflopsFP32: 20.5, deviceGBps: 3900, h2dGBps: 50, d2hGBps: 48}\n")))
	if err != nil {
		t.Fatal(err)
	}
	c := p.GPU.Compute
	if !p.GPU.ComputeEnabled() || c.MinRatio != 0.8 || c.Expect != (ComputeExpect{TFLOPSFP32: 20.5, DeviceGBps: 3900, H2DGBps: 50, D2HGBps: 48}) {
		t.Fatalf("compute section read as %+v", c)
	}
	q, err := Parse("c.json", p.Canonical())
	if err != nil || *q.GPU.Compute != *c {
		t.Fatalf("canonical form: %+v, %v", q.GPU.Compute, err)
	}
	off, err := Parse("n.yaml", []byte(nvidia))
	if err != nil {
		t.Fatal(err)
	}
	if off.GPU.ComputeEnabled() || strings.Contains(string(off.Canonical()), "compute") {
		t.Fatalf("a profile without gpu.compute has it on or in its canonical form: %s", off.Canonical())
	}
	disabled, err := Parse("d.yaml", []byte(withCompute("    enabled: false\n")))
	if err != nil || disabled.GPU.ComputeEnabled() {
		t.Fatalf("enabled: false parsed as on (%v)", err)
	}
}

func TestComputeSectionErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ section, field, says string }{
		{"    enabled: true\n    minRatio: 1.5\n", "gpu.compute.minRatio", "from 0 to 1"},
		{"    enabled: true\n    minRatio: -0.1\n", "gpu.compute.minRatio", "from 0 to 1"},
		{"    enabled: true\n    minRatio: .nan\n", "gpu.compute.minRatio", "NaN"},
		{"    enabled: true\n    expect: {tflopsFP32: -1}\n", "gpu.compute.expect.tflopsFP32", "got -1"},
		{"    enabled: true\n    expect: {deviceGBps: .inf}\n", "gpu.compute.expect.deviceGBps", "+Inf"},
		{"    enabled: true\n    expect: {h2dGBps: 4800000}\n", "gpu.compute.expect.h2dGBps", "to 100000"},
		{"    enabled: true\n    expect: {d2hGBps: .nan}\n", "gpu.compute.expect.d2hGBps", "NaN"},
		{"    enabled: true\n    expect: {tflops: 60}\n", "tflops", "tflops"},
		{"    enabled: yes-please\n", "enabled", "enabled"},
	} {
		_, err := Parse("c.yaml", []byte(withCompute(tc.section)))
		if err == nil {
			t.Errorf("%q accepted", tc.section)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.field) || !strings.Contains(msg, tc.says) || !strings.HasPrefix(msg, "c.yaml:") {
			t.Errorf("%q: error %q does not name %s with %q and a line", tc.section, msg, tc.field, tc.says)
		}
	}
}

// FuzzComputeSection feeds arbitrary figures through the YAML parser: an accepted
// section is always finite, in range, and survives the canonical form.
func FuzzComputeSection(f *testing.F) {
	f.Add(true, 0.7, 20.0, 3900.0, 50.0, 48.0)
	f.Add(false, 0.0, 0.0, 0.0, 0.0, 0.0)
	f.Add(true, 1.0, 1e5, 1e-300, 5e-324, 99999.9)
	f.Fuzz(func(t *testing.T, on bool, ratio, tflops, dev, h2d, d2h float64) {
		sec := fmt.Sprintf("    enabled: %t\n    minRatio: %v\n    expect: {tflopsFP32: %v, deviceGBps: %v, h2dGBps: %v, d2hGBps: %v}\n", on, ratio, tflops, dev, h2d, d2h)
		sec = strings.NewReplacer("NaN", ".nan", "+Inf", ".inf", "-Inf", "-.inf").Replace(sec)
		p, err := Parse("f.yaml", []byte(withCompute(sec)))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		c := p.GPU.Compute
		for _, v := range []float64{c.MinRatio, c.Expect.TFLOPSFP32, c.Expect.DeviceGBps, c.Expect.H2DGBps, c.Expect.D2HGBps} {
			if !(v >= 0 && v <= ComputeMaxFigure) || c.MinRatio > 1 {
				t.Fatalf("accepted %+v from %q", c, sec)
			}
		}
		q, err := Parse("f.json", p.Canonical())
		if err != nil || q.Digest() != p.Digest() {
			t.Fatalf("canonical form of an accepted compute section: %v", err)
		}
	})
}

// TestComputeNeedsLibcuda: with a driver, enabling the check without libcuda1 in the
// image is an error naming the package; a simulated node needs none.
func TestComputeNeedsLibcuda(t *testing.T) {
	text := strings.Replace(withCompute("    enabled: true\n"), "packages: [libcuda1]\n", "", 1)
	_, err := Parse("c.yaml", []byte(text))
	if err == nil || !strings.Contains(err.Error(), "gpu.compute.enabled") || !strings.Contains(err.Error(), "add libcuda1 to packages") {
		t.Fatalf("enabled without libcuda1: %v", err)
	}
	if _, err := Parse("c.yaml", []byte(strings.Replace(text, "enabled: true", "enabled: false", 1))); err != nil {
		t.Fatalf("disabled without libcuda1: %v", err)
	}
	sim := strings.Replace(text, "  driver:\n    version: 535.261.03\n    flavor: open\n", "  simulator: dgxh100\n", 1)
	if sim == text {
		t.Fatal("the test profile's driver section moved")
	}
	if _, err := Parse("s.yaml", []byte(sim)); err != nil {
		t.Fatalf("simulated node with the compute check on: %v", err)
	}
}
