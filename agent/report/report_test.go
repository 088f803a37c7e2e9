package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/internal/checkid"
)

func TestText(t *testing.T) {
	var rs []checks.Result
	for g := 0; g < 8; g++ {
		st, obs := checks.Pass, "x16"
		if g == 5 {
			st, obs = checks.Fail, "x8"
		}
		rs = append(rs, checks.Result{ID: checkid.PCIeLinkWidth, Status: st, GPU: g, Observed: obs, Expected: "x16", Message: "m", Remedy: "Reseat."})
	}
	c := &monitor.Checklist{Results: rs, Overall: checks.Fail, StartedAt: time.Unix(0, 0), FinishedAt: time.Unix(0, 1e6), Profile: "p"}
	var b bytes.Buffer
	if err := Write(&b, "text", c, facts.Identity{}, ""); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"PASS    gpu.pcie.link-width  0-4  x16       x16",
		"FAIL    gpu.pcie.link-width  5    x8        x16",
		"PASS    gpu.pcie.link-width  6-7  x16       x16",
		"- FAIL gpu.pcie.link-width [gpu5]: m Remedy: Reseat.",
		"overall: FAIL",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	if err := Write(&b, "yaml", c, facts.Identity{}, ""); err == nil {
		t.Error("unknown format accepted")
	}
}

func TestRemediesGroupRepeatedProblems(t *testing.T) {
	var rs []checks.Result
	rs = append(rs, checks.Result{ID: checkid.DriverLoaded, Status: checks.Fail, GPU: -1, Message: "no NVML", Remedy: "Load the driver."})
	for _, id := range []checkid.ID{checkid.Count, checkid.Product, checkid.Memory} {
		rs = append(rs, checks.Result{ID: id, Status: checks.Unknown, GPU: -1, Message: "not readable", Remedy: "Fix gpu.driver.loaded first."})
	}
	rs = append(rs, checks.Result{ID: checkid.Temperature, Status: checks.Warn, GPU: 2, Message: "hot"})
	var b strings.Builder
	remedies(&b, rs, "- ")
	want := "\nproblems:\n" +
		"- FAIL gpu.driver.loaded: no NVML Remedy: Load the driver.\n" +
		"- UNKNOWN gpu.count, gpu.product, gpu.memory: not readable Remedy: Fix gpu.driver.loaded first.\n" +
		"- WARN gpu.temperature [gpu2]: hot\n"
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}
