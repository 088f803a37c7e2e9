package health

import (
	"slices"
	"strings"
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
	if s.State != Unhealthy || s.GPUHealthy || s.HealthyGPUs != 6 || !slices.Equal(s.UnhealthyGPUs, []int{1, 3}) {
		t.Fatalf("%+v", s)
	}
	// The PCIe link is the node's problem and names the reason; GPU 3 is withdrawn too.
	if s.Failing[0] != "gpu.ecc.uncorrected" || len(s.Failing) != 3 || s.Reason != "PcieLinkWidth" || !slices.Equal(s.WithdrawnGPUs(), []int{3}) {
		t.Errorf("failing %v reason %s withdrawn %v", s.Failing, s.Reason, s.WithdrawnGPUs())
	}
	if s := Summarize(rs[4:], 8, at); s.State != Degraded || !s.GPUHealthy || s.Warning[0] != "gpu.temperature" || s.Reason != "ChecksWarning" {
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

// TestWithdrawOneGPU: a per-GPU failure costs that GPU, not the node — GPUHealthy
// stays True (no taint) — while a whole-node failure still makes it False.
func TestWithdrawOneGPU(t *testing.T) {
	at := time.Unix(1, 0)
	fail := func(id checkid.ID, gpu int, msg string) checks.Result {
		return checks.Result{ID: id, Status: checks.Fail, GPU: gpu, Message: msg}
	}
	cases := []struct {
		name         string
		rs           []checks.Result
		wantState    State
		wantHealthy  bool
		wantReason   string
		wantWithdraw []int
		wantHealthyN int
	}{
		{"fatal XID on one GPU", []checks.Result{fail(checkid.XIDFatal, 3, "GPU 3 logged fatal XID 79 (reboot).")}, Degraded, true, ReasonGPUsWithdrawn, []int{3}, 7},
		{"uncorrectable ECC", []checks.Result{fail(checkid.ECCUncorrected, 5, "GPU 5 has 1 uncorrected ECC errors.")}, Degraded, true, ReasonGPUsWithdrawn, []int{5}, 7},
		{"pending row remap on two GPUs", []checks.Result{fail(checkid.RowRemapPending, 0, "x"), fail(checkid.RowRemapPending, 6, "y")}, Degraded, true, ReasonGPUsWithdrawn, []int{0, 6}, 6},
		{"NVLink down is the node's", []checks.Result{fail(checkid.NVLinkState, 2, "links down")}, Unhealthy, false, "NvlinkState", nil, 7},
		{"driver version is the node's", []checks.Result{fail(checkid.DriverVersion, -1, "wrong driver")}, Unhealthy, false, "DriverVersion", nil, 8},
		{"a node failure wins over a withdrawal", []checks.Result{fail(checkid.ECCUncorrected, 5, "e"), fail(checkid.Count, -1, "7 GPUs")}, Unhealthy, false, "Count", []int{5}, 7},
		{"a warning beside a withdrawal", []checks.Result{fail(checkid.XIDFatal, 1, "x"), {ID: checkid.Temperature, Status: checks.Warn, GPU: 2}}, Degraded, true, ReasonGPUsWithdrawn, []int{1}, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := Summarize(c.rs, 8, at)
			if s.State != c.wantState || s.GPUHealthy != c.wantHealthy || s.Reason != c.wantReason || s.HealthyGPUs != c.wantHealthyN {
				t.Errorf("state %s GPUHealthy %v reason %s healthy %d; want %s %v %s %d", s.State, s.GPUHealthy, s.Reason, s.HealthyGPUs,
					c.wantState, c.wantHealthy, c.wantReason, c.wantHealthyN)
			}
			if !slices.Equal(s.WithdrawnGPUs(), c.wantWithdraw) && !(len(c.wantWithdraw) == 0 && len(s.Withdrawn) == 0) {
				t.Errorf("withdrawn %v, want %v", s.WithdrawnGPUs(), c.wantWithdraw)
			}
			for _, g := range c.wantWithdraw {
				if !slices.Contains(s.UnhealthyGPUs, g) {
					t.Errorf("withdrawn GPU %d not among UnhealthyGPUs %v (the device plugin reads those)", g, s.UnhealthyGPUs)
				}
			}
		})
	}
	s := Summarize(cases[1].rs, 8, at)
	if !strings.Contains(s.Message, "GPU 5 withdrawn (gpu.ecc.uncorrected: GPU 5 has 1 uncorrected ECC errors.)") || !strings.Contains(s.Message, "other 7 GPUs") {
		t.Errorf("message %q does not say which GPU is withdrawn, why, and what the node keeps", s.Message)
	}
}

func TestHysteresis(t *testing.T) {
	t0 := time.Unix(1000, 0)
	healthy := func(at time.Time) Summary { return Summarize(nil, 8, at) }
	sick := func(at time.Time) Summary {
		return Summarize([]checks.Result{{ID: checkid.NVLinkState, Status: checks.Fail, GPU: 3}}, 8, at)
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

// TestHysteresisPerGPU: each withdrawn GPU clears on its own clock; a GPU withdrawn
// while another clears is published at once; a node-level recovery does not add a
// second delay to a GPU's.
func TestHysteresisPerGPU(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	bad := func(sec int, gpus ...int) Summary {
		var rs []checks.Result
		for _, g := range gpus {
			rs = append(rs, checks.Result{ID: checkid.ECCUncorrected, Status: checks.Fail, GPU: g, Message: "ECC"})
		}
		return Summarize(rs, 8, at(sec))
	}
	tr := Tracker{ClearAfter: 30 * time.Second}
	tr.Update(bad(0))
	steps := []struct {
		sec       int
		raw, want []int
	}{
		{1, []int{5}, []int{5}},     // withdrawn at once
		{10, nil, []int{5}},         // GPU 5 recovered: held
		{20, []int{6}, []int{5, 6}}, // GPU 6 withdrawn at once, 5 still held
		{39, []int{6}, []int{5, 6}},
		{40, []int{6}, []int{6}}, // GPU 5 clears 30 s after it recovered
		{41, nil, []int{6}},
		{70, nil, []int{6}},
		{71, nil, nil}, // GPU 6 clears on its own clock
	}
	var prev []int
	for _, st := range steps {
		s, ch := tr.Update(bad(st.sec, st.raw...))
		got := s.WithdrawnGPUs()
		if !slices.Equal(got, st.want) && !(len(got) == 0 && len(st.want) == 0) {
			t.Fatalf("t+%ds raw %v: published withdrawn %v; want %v", st.sec, st.raw, got, st.want)
		}
		if !slices.Equal(got, prev) && !ch {
			t.Fatalf("t+%ds: the withdrawn GPUs changed from %v to %v but Update said unchanged", st.sec, prev, got)
		}
		prev = got
		if len(st.want) > 0 && (s.State != Degraded || !s.GPUHealthy || s.HealthyGPUs != 8-len(st.want)) {
			t.Fatalf("t+%ds: %+v; want degraded, GPUHealthy, %d healthy GPUs", st.sec, s, 8-len(st.want))
		}
		if len(st.want) == 0 && s.State != Healthy {
			t.Fatalf("t+%ds: state %s, want healthy", st.sec, s.State)
		}
	}
	if s := tr.Current(); s.Reason != "AllChecksPassed" {
		t.Errorf("final reason %s", s.Reason)
	}
	// A held GPU says it is clearing.
	tr = Tracker{ClearAfter: 30 * time.Second}
	tr.Update(bad(0, 2))
	s, _ := tr.Update(bad(5))
	if len(s.Withdrawn) != 1 || !strings.HasPrefix(s.Withdrawn[0].Reason, "clearing: ") {
		t.Errorf("held GPU: %+v", s.Withdrawn)
	}
}

// TestHysteresisNodeAndGPU: while a whole-node recovery is held back, a newly withdrawn
// GPU is still published at once.
func TestHysteresisNodeAndGPU(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	sum := func(sec int, nvlink bool, gpus ...int) Summary {
		var rs []checks.Result
		if nvlink {
			rs = append(rs, checks.Result{ID: checkid.NVLinkState, Status: checks.Fail, GPU: 1, Message: "links down"})
		}
		for _, g := range gpus {
			rs = append(rs, checks.Result{ID: checkid.ECCUncorrected, Status: checks.Fail, GPU: g, Message: "ECC"})
		}
		return Summarize(rs, 8, at(sec))
	}
	tr := Tracker{ClearAfter: 30 * time.Second}
	tr.Update(sum(0, true, 5))
	if s, _ := tr.Update(sum(1, false, 5)); s.State != Unhealthy || s.GPUHealthy {
		t.Fatalf("NVLink recovery published at once: %+v", s)
	}
	s, ch := tr.Update(sum(2, false, 5, 6))
	if !ch || s.State != Unhealthy || !slices.Equal(s.WithdrawnGPUs(), []int{5, 6}) || s.HealthyGPUs != 5 {
		t.Fatalf("GPU 6 not withdrawn at once while the node recovery is held: changed %v %+v", ch, s)
	}
	s, ch = tr.Update(sum(31, false, 5, 6))
	if !ch || s.State != Degraded || !s.GPUHealthy || s.Reason != ReasonGPUsWithdrawn || !slices.Equal(s.WithdrawnGPUs(), []int{5, 6}) {
		t.Fatalf("after 30 s: changed %v %+v; want degraded, GPUHealthy, GPUs 5 and 6 withdrawn", ch, s)
	}
}
