package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runGPUImage(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	cmd := newRootCommand()
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		errOut.WriteString(err.Error())
		return out.String(), errOut.String(), exitCode(err)
	}
	return out.String(), errOut.String(), 0
}

func TestLintShippedProfiles(t *testing.T) {
	paths, _ := filepath.Glob("../../../profiles/*.yaml")
	out, errOut, code := runGPUImage(append([]string{"lint"}, paths...)...)
	if code != 0 || strings.Count(out, "ok  ") != len(paths) {
		t.Fatalf("lint of the shipped profiles: code %d\n%s%s", code, out, errOut)
	}
}

// A simulated GPU profile (gpu.simulator) lints, and lint says it is simulated; naming
// an unknown model or giving it a driver is an error with its line.
func TestLintSimulatedGPUProfile(t *testing.T) {
	tiny, err := os.ReadFile("../../../profiles/tiny.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gpu := "gpu:\n  vendor: nvidia\n  simulator: dgxh100\n  expect: {count: 8, product: NVIDIA H100 80GB HBM3, memoryMiB: 81559, pcie: {gen: 5, width: 16}}\n"
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(path, append(tiny, gpu...), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runGPUImage("lint", path)
	if code != 0 || !strings.Contains(out, "8x NVIDIA H100 80GB HBM3, SIMULATED (simulator dgxh100, no driver)") {
		t.Errorf("lint of a simulated GPU profile: exit %d\n%s%s", code, out, errOut)
	}
	bad := strings.Replace(string(tiny)+gpu, "simulator: dgxh100", "simulator: dgx-h100\n  driver: {version: 535.261.03, flavor: open}", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runGPUImage("lint", path)
	for _, want := range []string{`gpu.simulator: unknown simulator model "dgx-h100"`, "did you mean \"dgxh100\"", "gpu.driver: a simulated GPU node ships no driver"} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("lint of a bad simulated GPU profile: exit %d, want 1 and %q:\n%s", code, want, errOut)
		}
	}
}

func TestLintReportsKeyAndLine(t *testing.T) {
	tiny, err := os.ReadFile("../../../profiles/tiny.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nv, err := os.ReadFile("../../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cases := map[string]struct {
		src  string
		want []string
	}{
		"unknown.yaml":   {string(tiny) + "surprise: 1\n", []string{"unknown.yaml:", `unknown field "surprise"`}},
		"noversion.yaml": {strings.Replace(string(nv), "    version: 535.261.03\n", "", 1), []string{"noversion.yaml:", "gpu.driver.version: is required"}},
		"images.yaml":    {string(tiny) + "images:\n  - path: images/gone.tar\n", []string{"images.yaml: images[0]", filepath.Join(dir, "images/gone.tar"), "no such file"}},
		"flavor.yaml":    {strings.Replace(string(nv), "flavor: open", "flavor: propietary", 1), []string{"flavor.yaml:", `gpu.driver.flavor: unknown flavor "propietary"`, `did you mean "proprietary"`}},
	}
	for name, c := range cases {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		_, errOut, code := runGPUImage("lint", path)
		if code != 1 {
			t.Errorf("%s: exit %d, want 1", name, code)
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%s: output lacks %q:\n%s", name, w, errOut)
			}
		}
	}
}

func TestLintStaleLock(t *testing.T) {
	dir := t.TempDir()
	tiny, _ := os.ReadFile("../../../profiles/tiny.yaml")
	os.WriteFile(filepath.Join(dir, "tiny.yaml"), tiny, 0o644)
	sum := strings.Repeat("0", 64)
	lock := `{"schemaVersion":1,"profile":"tiny","profileDigest":"sha256:` + sum + `",
"release":[{"suite":"bookworm","archive":"Debian","digest":"sha256:` + sum + `","date":"d"}],
"packages":[{"name":"bash","version":"1","architecture":"all","area":"main","filename":"pool/a.deb","size":1,"sha256":"` + sum + `"}],
"build":[],"extraDebs":[]}`
	os.WriteFile(filepath.Join(dir, "tiny.lock.json"), []byte(lock), 0o644)
	_, errOut, code := runGPUImage("lint", filepath.Join(dir, "tiny.yaml"))
	if code != 1 || !strings.Contains(errOut, "stale") {
		t.Fatalf("want a stale-lock failure, got %d:\n%s", code, errOut)
	}
}
