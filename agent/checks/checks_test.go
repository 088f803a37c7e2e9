package checks

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

func loadProfile(t testing.TB, name string) *profile.Profile {
	t.Helper()
	p, err := profile.Load("../../profiles/" + name + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// simInput reads a simulated dgxh100 with the faults applied.
func simInput(t testing.TB, p *profile.Profile, faults ...string) *Input {
	t.Helper()
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range faults {
		f, err := sim.ParseFault(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inject(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	snap := gpu.Read(s)
	return &Input{Snapshot: &snap, Profile: p, Phase: Commissioning, Now: snap.TakenAt}
}

func TestRegistryOrderMatchesCheckIDs(t *testing.T) {
	var ids []checkid.ID
	for _, c := range Registry {
		ids = append(ids, c.ID)
		if c.Source == "" {
			t.Errorf("%s cites no source", c.ID)
		}
		if (isSet(c.Defaults.Warn) || isSet(c.Defaults.Fail)) && c.Unit == "" {
			t.Errorf("%s has thresholds but no unit", c.ID)
		}
	}
	if !slices.Equal(ids, checkid.All) {
		t.Fatalf("registry order %v\nwant checkid.All %v", ids, checkid.All)
	}
}

func TestHealthySimulatorPasses(t *testing.T) {
	for _, name := range []string{"debian12-nvidia535", "debian13-nvidia550"} {
		p := loadProfile(t, name)
		in := simInput(t, p)
		if name == "debian13-nvidia550" {
			s, _ := sim.New("dgxh200", sim.Options{DriverVersion: p.GPU.Driver.Version})
			snap := gpu.Read(s)
			in.Snapshot = &snap
		}
		seen := map[checkid.ID]bool{}
		for _, r := range Run(in) {
			seen[r.ID] = true
			want := Pass
			if r.ID == checkid.RackPeerOutlier || r.ID == checkid.Compute { // no peers; compute is opt-in
				want = NotApplicable
			}
			if r.Status != want {
				t.Errorf("%s: %s gpu%d = %s (%s; observed %q expected %q), want %s", name, r.ID, r.GPU, r.Status, r.Message, r.Observed, r.Expected, want)
			}
			if r.Status == Pass && r.Remedy != "" {
				t.Errorf("%s: passing result has a remedy", r.ID)
			}
		}
		for _, id := range checkid.All {
			if !seen[id] {
				t.Errorf("%s: no result for %s", name, id)
			}
		}
	}
}

// TestEveryCheckFails makes each check fail (or warn, where that is its worst
// default) on a simulator snapshot, and checks the result is on the faulty GPU, with an
// observed value, an expectation and a remedy.
func TestEveryCheckFails(t *testing.T) {
	p := loadProfile(t, "debian12-nvidia535")
	cases := []struct {
		id     checkid.ID
		faults []string
		mutate func(in *Input)
		want   Status
		gpu    int // -1: node-level
	}{
		{checkid.DriverLoaded, []string{"driver-unloaded"}, nil, Fail, -1},
		{checkid.DriverVersion, []string{"driver-mismatch"}, nil, Fail, -1},
		{checkid.Count, []string{"gpu-missing@gpu3"}, nil, Fail, -1},
		{checkid.Product, nil, func(in *Input) { in.Snapshot.GPUs[3].Name.V = "NVIDIA A100-SXM4-80GB" }, Fail, 3},
		{checkid.Memory, nil, func(in *Input) { in.Snapshot.GPUs[3].MemoryTotalMiB.V = 40960 }, Fail, 3},
		{checkid.VBIOSConsistent, nil, func(in *Input) { in.Snapshot.GPUs[3].VBIOS.V = "96.00.74.00.0A" }, Fail, -1},
		{checkid.InfoROMValid, nil, func(in *Input) { in.Snapshot.GPUs[3].InfoROMValid.V = false }, Fail, 3},
		{checkid.InfoROMValid, nil, func(in *Input) { in.Snapshot.GPUs[3].InfoROMImage.V = "G520.0100.00.01" }, Warn, 3},
		{checkid.PersistenceMode, nil, func(in *Input) { in.Snapshot.GPUs[3].Persistence.V = false }, Warn, 3},
		{checkid.ECCMode, nil, func(in *Input) { in.Snapshot.GPUs[3].ECC.V.Current = false }, Fail, 3},
		{checkid.ECCMode, nil, func(in *Input) { in.Snapshot.GPUs[3].ECC.V.Pending = false }, Warn, 3},
		{checkid.ECCUncorrected, []string{"ecc-uncorrected:1@gpu3"}, nil, Fail, 3},
		{checkid.ECCCorrected, []string{"ecc-corrected:20000@gpu3"}, nil, Warn, 3},
		{checkid.ECCCorrected, []string{"ecc-corrected:60000000@gpu3"}, nil, Fail, 3},
		{checkid.RowRemapPending, []string{"row-remap-pending@gpu3"}, nil, Fail, 3},
		{checkid.RowRemapFailed, []string{"row-remap-failed@gpu3"}, nil, Fail, 3},
		{checkid.RowRemapFailed, []string{"row-remap-uncorrectable:513@gpu3"}, nil, Fail, 3},
		{checkid.RetiredPages, []string{"retired-pages:11@gpu3"}, nil, Warn, 3},
		{checkid.RetiredPages, []string{"retired-pages:64@gpu3"}, nil, Fail, 3},
		{checkid.PCIeLinkGen, []string{"pcie-gen:3@gpu3"}, nil, Warn, 3},
		{checkid.PCIeLinkGen, nil, func(in *Input) { in.Snapshot.GPUs[3].PCIe.MaxGen.V = 4 }, Fail, 3},
		{checkid.PCIeLinkWidth, []string{"pcie-width:8@gpu3"}, nil, Fail, 3},
		{checkid.PCIeReplays, []string{"pcie-replays:500@gpu3"}, func(in *Input) {
			prev := *in.Snapshot
			prev.GPUs = slices.Clone(prev.GPUs)
			prev.GPUs[3].PCIe.Replays.V = 0
			prev.TakenAt = in.Snapshot.TakenAt.Add(-time.Minute)
			in.Previous = &prev
		}, Warn, 3},
		{checkid.NVLinkState, []string{"nvlink-down:2@gpu3"}, nil, Fail, 3},
		{checkid.NVLinkErrors, []string{"nvlink-errors:7@gpu3"}, nil, Warn, 3},
		{checkid.FabricState, []string{"fabric-unhealthy@gpu3"}, nil, Fail, 3},
		{checkid.Temperature, []string{"temperature:80@gpu3"}, nil, Warn, 3},
		{checkid.Temperature, []string{"temperature:90@gpu3"}, nil, Fail, 3},
		{checkid.ClockEvents, []string{"power-brake@gpu3"}, nil, Warn, 3},
		{checkid.ClockEvents, []string{"thermal-slowdown@gpu3"}, nil, Warn, 3},
		{checkid.Processes, []string{"stray-process:300@gpu3"}, nil, Fail, 3},
		{checkid.Processes, nil, func(in *Input) { in.Snapshot.GPUs[3].MemoryUsedMiB.V = 600 }, Warn, 3},
		{checkid.RecoveryAction, []string{"recovery-action:2@gpu3"}, nil, Fail, 3},
		{checkid.RecoveryAction, []string{"recovery-action:3@gpu3"}, nil, Warn, 3},
		{checkid.XIDFatal, []string{"gpu-lost@gpu3"}, nil, Fail, 3},
		{checkid.XIDFatal, nil, func(in *Input) {
			in.XIDs = []XIDEvent{{GPU: 3, Code: 48, Class: "reset-gpu", Fatal: true, At: in.Now}}
		}, Fail, 3},
		{checkid.XIDRecent, nil, func(in *Input) {
			in.XIDs = []XIDEvent{{GPU: 3, Code: 63, Class: "recoverable", At: in.Now.Add(-time.Minute)}}
		}, Warn, 3},
		{checkid.RackPeerOutlier, []string{"temperature:75@gpu3"}, func(in *Input) {
			for i, t := range []float64{34, 35, 33, 36} {
				in.Peers = append(in.Peers, Peer{Node: string(rune('a' + i)), Figures: Figures{MaxTemperatureC: t, PCIeReplaysPerMin: math.NaN(), ECCCorrectedPerHour: math.NaN()}})
			}
		}, Warn, -1},
	}
	for _, c := range cases {
		t.Run(string(c.id)+"/"+c.want.String(), func(t *testing.T) {
			in := simInput(t, p, c.faults...)
			if c.mutate != nil {
				c.mutate(in)
			}
			rs := Run(in, c.id)
			var hit *Result
			for i := range rs {
				r := &rs[i]
				if r.GPU == c.gpu {
					hit = r
				} else if r.Status != Pass && c.id != checkid.Count {
					t.Errorf("gpu%d also %s: %s", r.GPU, r.Status, r.Message)
				}
			}
			if hit == nil {
				t.Fatalf("no result for gpu %d in %+v", c.gpu, rs)
			}
			if hit.Status != c.want {
				t.Fatalf("status %s (%s), want %s", hit.Status, hit.Message, c.want)
			}
			if hit.Remedy == "" || hit.Message == "" || (hit.Observed == "" && c.id != checkid.DriverLoaded) {
				t.Errorf("incomplete result %+v", hit)
			}
			if c.gpu >= 0 && hit.GPUUUID == "" && !in.Snapshot.GPUs[c.gpu].Lost {
				t.Error("GPU result without UUID")
			}
			// The same input with the check fixed by the healthy simulator passes: the
			// test could fail.
			healthy := simInput(t, p)
			hs := Run(healthy, c.id)
			if len(hs) == 0 {
				t.Fatalf("healthy %s: no result", c.id)
			}
			for _, r := range hs {
				if r.Status != Pass && !(c.id == checkid.RackPeerOutlier && r.Status == NotApplicable) {
					t.Errorf("healthy %s gpu%d = %s", c.id, r.GPU, r.Status)
				}
			}
		})
	}
}

func TestProfileWithoutGPU(t *testing.T) {
	p := loadProfile(t, "tiny")
	s, _ := sim.New("dgxh100", sim.Options{})
	snap := gpu.Read(s)
	rs := Run(&Input{Snapshot: &snap, Profile: p})
	if len(rs) != len(checkid.All) {
		t.Fatalf("%d results, want one per check", len(rs))
	}
	for _, r := range rs {
		if r.Status != NotApplicable {
			t.Errorf("%s = %s, want not-applicable", r.ID, r.Status)
		}
	}
	if Overall(rs) != NotApplicable {
		t.Errorf("overall %s", Overall(rs))
	}
}

func TestDriverNotLoaded(t *testing.T) {
	p := loadProfile(t, "debian12-nvidia535")
	in := simInput(t, p, "driver-unloaded")
	rs := Run(in)
	for _, r := range rs {
		want := Unknown
		switch r.ID {
		case checkid.DriverLoaded:
			want = Fail
		case checkid.RackPeerOutlier:
			want = NotApplicable
		}
		if r.Status != want {
			t.Errorf("%s = %s, want %s", r.ID, r.Status, want)
		}
	}
	if Overall(rs) != Fail {
		t.Errorf("overall %s", Overall(rs))
	}
}

func TestProfileOverrides(t *testing.T) {
	p := loadProfile(t, "debian12-nvidia535")
	ten, zero := 10.0, 0.0
	p.Checks = map[string]profile.CheckOverride{
		string(checkid.ECCUncorrected): {Fail: &ten},
		string(checkid.ClockEvents):    {Fail: &zero},
		string(checkid.PCIeLinkWidth):  {Disabled: true},
	}
	in := simInput(t, p, "ecc-uncorrected:5@gpu1", "hw-slowdown@gpu1", "pcie-width:4@gpu1")
	got := map[checkid.ID]Status{}
	for _, r := range Run(in, checkid.ECCUncorrected, checkid.ClockEvents, checkid.PCIeLinkWidth) {
		if r.GPU == 1 || r.GPU == -1 {
			got[r.ID] = r.Status
		}
	}
	want := map[checkid.ID]Status{checkid.ECCUncorrected: Pass, checkid.ClockEvents: Fail, checkid.PCIeLinkWidth: NotApplicable}
	for id, w := range want {
		if g, ok := got[id]; !ok {
			t.Errorf("%s: no result for gpu1 or the node", id)
		} else if g != w {
			t.Errorf("%s = %s, want %s", id, g, w)
		}
	}
}

func TestContinuousPhaseAllowsProcesses(t *testing.T) {
	in := simInput(t, loadProfile(t, "debian12-nvidia535"), "stray-process:300@gpu2")
	in.Phase = Continuous
	onGPU2 := false
	for _, r := range Run(in, checkid.Processes) {
		onGPU2 = onGPU2 || r.GPU == 2
		if r.Status != Pass {
			t.Errorf("gpu%d %s while workloads may run", r.GPU, r.Status)
		}
	}
	if !onGPU2 {
		t.Error("no gpu.processes result for gpu2, the GPU with the stray process")
	}
}

func TestOverallOrder(t *testing.T) {
	rs := func(ss ...Status) []Result {
		var out []Result
		for _, s := range ss {
			out = append(out, Result{Status: s})
		}
		return out
	}
	for _, c := range []struct {
		in   []Status
		want Status
	}{
		{nil, NotApplicable},
		{[]Status{Pass, NotApplicable}, Pass},
		{[]Status{Pass, Unknown}, Unknown},
		{[]Status{Unknown, Warn}, Warn},
		{[]Status{Warn, Fail, Pass}, Fail},
	} {
		if got := Overall(rs(c.in...)); got != c.want {
			t.Errorf("Overall(%v) = %s, want %s", c.in, got, c.want)
		}
	}
	for s := NotApplicable; s <= Fail; s++ {
		if back, ok := ParseStatus(s.String()); !ok || back != s {
			t.Errorf("ParseStatus(%q) = %v", s, back)
		}
	}
}

func BenchmarkChecklist(b *testing.B) {
	p := loadProfile(b, "debian12-nvidia535")
	in := simInput(b, p)
	for b.Loop() {
		Run(in)
	}
}

// TestDocsListEveryCheck keeps docs/agent.md's threshold table equal to the registry.
func TestDocsListEveryCheck(t *testing.T) {
	data, err := os.ReadFile("../../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), MarkdownTable()) {
		t.Errorf("docs/agent.md lacks the current check table; replace it with:\n%s", MarkdownTable())
	}
}
