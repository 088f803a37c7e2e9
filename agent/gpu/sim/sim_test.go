package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/internal/profile"
)

func newSim(t *testing.T, model string) *Sim {
	t.Helper()
	s, err := New(model, Options{DriverVersion: "535.261.03", Seed: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestHealthyModels(t *testing.T) {
	for _, m := range Models() {
		t.Run(m, func(t *testing.T) {
			s := newSim(t, m)
			snap := gpu.Read(s)
			if !snap.Driver.Loaded || snap.Driver.Version != "535.261.03" {
				t.Fatalf("driver = %+v, want loaded 535.261.03", snap.Driver)
			}
			if snap.Backend != "sim:"+m || !snap.Simulated {
				t.Errorf("backend %q simulated %v", snap.Backend, snap.Simulated)
			}
			if len(snap.GPUs) != 8 || snap.Count.V != 8 {
				t.Fatalf("%d GPUs, count %+v; want 8", len(snap.GPUs), snap.Count)
			}
			uuids := map[string]bool{}
			for _, g := range snap.GPUs {
				if g.Lost || !strings.HasPrefix(g.UUID, "GPU-") || !strings.HasPrefix(g.PCIBusID, "00000000:") {
					t.Errorf("gpu%d identity: lost %v uuid %q bus %q", g.Index, g.Lost, g.UUID, g.PCIBusID)
				}
				uuids[g.UUID] = true
				for name, v := range map[string]gpu.Value[uint64]{"eccUnc": g.ECCUncorrected, "eccCorr": g.ECCCorrected, "replays": g.PCIe.Replays} {
					if !v.OK() || v.V != 0 {
						t.Errorf("gpu%d %s = %+v, want 0", g.Index, name, v)
					}
				}
				if !g.Persistence.V || !g.ECC.V.Current || !g.InfoROMValid.V || g.RowRemap.V.Pending || g.RowRemap.V.Failed {
					t.Errorf("gpu%d not healthy: %+v", g.Index, g)
				}
				if g.PCIe.CurGen.V != g.PCIe.MaxGen.V || g.PCIe.CurWidth.V != 16 {
					t.Errorf("gpu%d PCIe %+v", g.Index, g.PCIe)
				}
				for _, l := range g.NVLinks.V {
					if !l.Active || l.Errors() != 0 {
						t.Errorf("gpu%d link %+v", g.Index, l)
					}
				}
				if g.TemperatureC.V >= g.SlowdownC.V || g.ClockEvents.V&^uint64(nvml.ClocksEventReasonGpuIdle) != 0 {
					t.Errorf("gpu%d temp %v/%v clocks %#x", g.Index, g.TemperatureC, g.SlowdownC, g.ClockEvents.V)
				}
				if !g.RecoveryAction.OK() || g.RecoveryAction.V != 0 || len(g.Processes.V) != 0 {
					t.Errorf("gpu%d recovery %+v processes %+v", g.Index, g.RecoveryAction, g.Processes)
				}
			}
			if len(uuids) != 8 {
				t.Errorf("UUIDs not distinct: %v", uuids)
			}
		})
	}
	a := gpu.Read(newSim(t, "dgxh100"))
	b := gpu.Read(newSim(t, "dgxh100"))
	if a.GPUs[0].UUID != b.GPUs[0].UUID {
		t.Errorf("same seed gave different UUIDs %s, %s", a.GPUs[0].UUID, b.GPUs[0].UUID)
	}
}

func TestUnknownModel(t *testing.T) {
	if _, err := New("dgx-nope", Options{}); err == nil || !strings.Contains(err.Error(), "dgxh100") {
		t.Fatalf("error %v should list the models", err)
	}
}

func inject(t *testing.T, s *Sim, spec string) string {
	t.Helper()
	f, err := ParseFault(spec)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Inject(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestFaultsChangeReadings(t *testing.T) {
	cases := []struct {
		spec  string
		check func(g *gpu.GPU) bool
	}{
		{"ecc-uncorrected:2@gpu3", func(g *gpu.GPU) bool { return g.ECCUncorrected.V == 2 }},
		{"ecc-corrected:20000@gpu3", func(g *gpu.GPU) bool { return g.ECCCorrected.V == 20000 }},
		{"row-remap-pending@gpu3", func(g *gpu.GPU) bool { return g.RowRemap.V.Pending }},
		{"row-remap-failed@gpu3", func(g *gpu.GPU) bool { return g.RowRemap.V.Failed }},
		{"row-remap-uncorrectable:600@gpu3", func(g *gpu.GPU) bool { return g.RowRemap.V.Uncorrected == 600 }},
		{"retired-pages:70@gpu3", func(g *gpu.GPU) bool { return g.RetiredPages.V.Total() == 70 }},
		{"pcie-gen:3@gpu3", func(g *gpu.GPU) bool { return g.PCIe.CurGen.V == 3 }},
		{"pcie-width:8@gpu3", func(g *gpu.GPU) bool { return g.PCIe.CurWidth.V == 8 }},
		{"pcie-replays:500@gpu3", func(g *gpu.GPU) bool { return g.PCIe.Replays.V == 500 }},
		{"nvlink-down:2@gpu3", func(g *gpu.GPU) bool {
			n := 0
			for _, l := range g.NVLinks.V {
				if !l.Active {
					n++
				}
			}
			return n == 2
		}},
		{"nvlink-errors:7@gpu3", func(g *gpu.GPU) bool { return g.NVLinks.V[0].CRCFlit == 7 }},
		{"temperature:95@gpu3", func(g *gpu.GPU) bool { return g.TemperatureC.V == 95 }},
		{"fabric-unhealthy@gpu3", func(g *gpu.GPU) bool { return g.Fabric.V.State != nvml.GPU_FABRIC_STATE_COMPLETED }},
		{"gpu-lost@gpu3", func(g *gpu.GPU) bool { return g.Lost && !g.Name.OK() }},
		{"hw-slowdown@gpu3", func(g *gpu.GPU) bool { return g.ClockEvents.V&nvml.ClocksThrottleReasonHwSlowdown != 0 }},
		{"thermal-slowdown@gpu3", func(g *gpu.GPU) bool { return g.ClockEvents.V&nvml.ClocksThrottleReasonHwThermalSlowdown != 0 }},
		{"power-brake@gpu3", func(g *gpu.GPU) bool { return g.ClockEvents.V&nvml.ClocksThrottleReasonHwPowerBrakeSlowdown != 0 }},
		{"stray-process:300@gpu3", func(g *gpu.GPU) bool { return len(g.Processes.V) == 1 && g.MemoryUsedMiB.V == 300 }},
		{"recovery-action:2@gpu3", func(g *gpu.GPU) bool { return g.RecoveryAction.V == 2 }},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			s := newSim(t, "dgxh100")
			id := inject(t, s, c.spec)
			snap := gpu.Read(s)
			if !c.check(&snap.GPUs[3]) {
				t.Errorf("fault not visible on gpu3: %+v", snap.GPUs[3])
			}
			if c.check(&snap.GPUs[2]) {
				t.Errorf("fault leaked to gpu2")
			}
			if n := s.Clear(id); n != 1 {
				t.Errorf("Clear removed %d", n)
			}
			if snap := gpu.Read(s); c.check(&snap.GPUs[3]) {
				t.Errorf("fault still visible after Clear")
			}
		})
	}
}

func TestNodeFaults(t *testing.T) {
	s := newSim(t, "dgxh100")
	inject(t, s, "gpu-missing@gpu2")
	snap := gpu.Read(s)
	if snap.Count.V != 7 || len(snap.GPUs) != 7 || snap.GPUs[2].PCIBusID != "00000000:5d:00.0" {
		t.Fatalf("gpu-missing: count %v, gpu2 bus %s", snap.Count, snap.GPUs[2].PCIBusID)
	}
	s.Clear()
	inject(t, s, "driver-mismatch")
	if v := gpu.Read(s).Driver.Version; v == "535.261.03" || v == "" {
		t.Errorf("driver-mismatch: version %q", v)
	}
	s.Clear()
	inject(t, s, "driver-unloaded")
	snap = gpu.Read(s)
	if snap.Driver.Loaded || !strings.Contains(snap.Driver.Error, "NVML not available") {
		t.Errorf("driver-unloaded: %+v", snap.Driver)
	}
	s.Clear()
	if !gpu.Read(s).Driver.Loaded {
		t.Error("driver still unloaded after Clear")
	}
	if _, err := s.Inject(Fault{Kind: KindXID, GPU: 8, Value: 79}, 0); err == nil {
		t.Error("fault on gpu8 of an 8-GPU node accepted")
	}
}

func TestFaultExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	s, _ := New("dgxh100", Options{Now: func() time.Time { return now }})
	f, _ := ParseFault("temperature:99@gpu0")
	if _, err := s.Inject(f, time.Minute); err != nil {
		t.Fatal(err)
	}
	if len(s.Active()) != 1 || gpu.Read(s).GPUs[0].TemperatureC.V != 99 {
		t.Fatal("fault not active")
	}
	now = now.Add(time.Minute)
	if len(s.Active()) != 0 || gpu.Read(s).GPUs[0].TemperatureC.V == 99 {
		t.Fatal("fault did not expire")
	}
}

func TestXIDEvents(t *testing.T) {
	s := newSim(t, "dgxh100")
	lib, _ := s.Library()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer set.Free()
	for i := 0; i < 8; i++ {
		d, _ := lib.DeviceGetHandleByIndex(i)
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	inject(t, s, "xid:48@gpu5")
	e, ret := set.Wait(1000)
	if ret != nvml.SUCCESS || e.EventData != 48 || e.EventType != nvml.EventTypeXidCriticalError {
		t.Fatalf("event %+v %v", e, ret)
	}
	if idx, _ := e.Device.GetIndex(); idx != 5 {
		t.Errorf("event on gpu%d, want gpu5", idx)
	}
	if len(s.Active()) != 0 {
		t.Error("XID fault kept as active")
	}
	inject(t, s, "ecc-uncorrected:1@gpu1") // DBE events not registered: nothing arrives
	inject(t, s, "gpu-lost@gpu2")
	if e, ret := set.Wait(1000); ret != nvml.SUCCESS || e.EventData != 79 {
		t.Fatalf("gpu-lost event %+v %v, want XID 79", e, ret)
	}
	if _, ret := set.Wait(1); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("extra event: %v", ret)
	}
}

// A profile's gpu.simulator names a model of this package: internal/profile keeps the
// list (it cannot import the simulator), and it must be this one.
func TestProfileSimulatorModels(t *testing.T) {
	if got := Models(); !slices.Equal(got, profile.SimulatorModels) {
		t.Fatalf("sim.Models() = %v, profile.SimulatorModels = %v: update internal/profile", got, profile.SimulatorModels)
	}
}
