package health

import (
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/internal/checkid"
)

func TestSummarize(t *testing.T) {
	at := time.Unix(1, 0)
	rs := []checks.Result{
		{ID: checkid.DriverLoaded, Status: checks.Pass, GPU: -1},
		{ID: checkid.XIDFatal, Status: checks.Fail, GPU: 3, Message: "GPU 3 logged fatal XID 79."},
		{ID: checkid.ECCUncorrected, Status: checks.Fail, GPU: 3},
		{ID: checkid.PCIeLinkWidth, Status: checks.Fail, GPU: 1},
		{ID: checkid.Temperature, Status: checks.Warn, GPU: 2},
	}
	s := Summarize(rs, 8, at)
	if s.State != Unhealthy || s.GPUHealthy || s.HealthyGPUs != 6 || len(s.UnhealthyGPUs) != 2 || s.UnhealthyGPUs[0] != 1 {
		t.Fatalf("%+v", s)
	}
	if s.Failing[0] != "gpu.ecc.uncorrected" || len(s.Failing) != 3 || s.Reason != "EccUncorrected" {
		t.Errorf("failing %v reason %s", s.Failing, s.Reason)
	}
	if s := Summarize(rs[4:], 8, at); s.State != Degraded || !s.GPUHealthy || s.Warning[0] != "gpu.temperature" {
		t.Errorf("degraded: %+v", s)
	}
	if s := Summarize(rs[:1], 8, at); s.State != Healthy || s.Reason != "AllChecksPassed" {
		t.Errorf("healthy: %+v", s)
	}
	if got := Reason(checkid.RowRemapPending); got != "RowRemapPending" {
		t.Errorf("Reason = %s", got)
	}
	if got := Reason(checkid.XIDFatal); got != "XidFatal" {
		t.Errorf("Reason = %s", got)
	}
}

func TestHysteresis(t *testing.T) {
	t0 := time.Unix(1000, 0)
	healthy := func(at time.Time) Summary { return Summarize(nil, 8, at) }
	sick := func(at time.Time) Summary {
		return Summarize([]checks.Result{{ID: checkid.XIDFatal, Status: checks.Fail, GPU: 3}}, 8, at)
	}
	tr := Tracker{ClearAfter: 30 * time.Second}
	if s, ch := tr.Update(healthy(t0)); !ch || s.State != Healthy {
		t.Fatal("first summary not adopted")
	}
	if s, ch := tr.Update(sick(t0.Add(time.Second))); !ch || s.State != Unhealthy {
		t.Fatal("a failure must be adopted at once")
	}
	// One good reading, and more within 30 s, do not clear it.
	for _, d := range []time.Duration{2, 10, 30} {
		if s, ch := tr.Update(healthy(t0.Add(d * time.Second))); ch || s.State != Unhealthy {
			t.Fatalf("cleared after %v", d)
		}
	}
	// A relapse restarts the hold.
	tr.Update(sick(t0.Add(31 * time.Second)))
	if s, _ := tr.Update(healthy(t0.Add(40 * time.Second))); s.State != Unhealthy {
		t.Fatal("cleared right after a relapse")
	}
	if s, ch := tr.Update(healthy(t0.Add(70 * time.Second))); !ch || s.State != Healthy {
		t.Fatalf("not cleared after holding 30 s: %+v", s)
	}
	if _, ch := tr.Update(healthy(t0.Add(80 * time.Second))); ch {
		t.Error("unchanged summary reported as a change")
	}
}
