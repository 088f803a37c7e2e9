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
