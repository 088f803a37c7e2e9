package gpu_test

import (
	"testing"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/sim"
)

func newSim(t testing.TB) *sim.Sim {
	t.Helper()
	s, err := sim.New("dgxh100", sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func inject(t testing.TB, s *sim.Sim, spec string) {
	t.Helper()
	f, err := sim.ParseFault(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inject(f, 0); err != nil {
		t.Fatal(err)
	}
}

// TestFastReadRefreshesOnlyFastFields: a fast read sees a new temperature, volatile
// ECC count and PCIe link at once, and keeps the slow fields (row remapping, retired
// pages, NVLink) of the snapshot before until a full read.
func TestFastReadRefreshesOnlyFastFields(t *testing.T) {
	s := newSim(t)
	rd := gpu.NewReader(s)
	full := rd.Read(gpu.Full, nil)
	if len(full.GPUs) != 8 || !full.SlowTakenAt.Equal(full.TakenAt) {
		t.Fatalf("full read: %d GPUs, slow fields at %v, taken at %v", len(full.GPUs), full.SlowTakenAt, full.TakenAt)
	}
	g2 := full.ByIndex(2)
	if g2.TemperatureC.V == 93 || g2.RowRemap.V.Pending || g2.RetiredPages.V.DBE != 0 || g2.ECCUncorrected.V != 0 {
		t.Fatalf("healthy GPU 2 already looks faulty: %+v", g2)
	}
	for _, f := range []string{"temperature:93@gpu2", "ecc-uncorrected:2@gpu2", "pcie-width:8@gpu2",
		"row-remap-pending@gpu2", "retired-pages:3@gpu2", "nvlink-down:2@gpu2"} {
		inject(t, s, f)
	}

	fast := rd.Read(gpu.Fast, &full)
	if !fast.SlowTakenAt.Equal(full.SlowTakenAt) || !fast.TakenAt.After(full.TakenAt) {
		t.Errorf("fast read: slow fields at %v (want %v), taken at %v", fast.SlowTakenAt, full.SlowTakenAt, fast.TakenAt)
	}
	f2 := fast.ByIndex(2)
	if f2.TemperatureC.V != 93 || f2.ECCUncorrected.V != 2 || f2.PCIe.CurWidth.V != 8 {
		t.Errorf("fast read missed a fast field: temperature %v, volatile uncorrected ECC %v, PCIe width %v",
			f2.TemperatureC, f2.ECCUncorrected, f2.PCIe.CurWidth)
	}
	if f2.RowRemap.V.Pending || f2.RetiredPages.V.DBE != 0 || activeLinks(f2) != activeLinks(g2) {
		t.Errorf("fast read refreshed a slow field: row remap %+v, retired pages %+v, %d active links",
			f2.RowRemap.V, f2.RetiredPages.V, activeLinks(f2))
	}
	if f2.UUID != g2.UUID || f2.VBIOS != g2.VBIOS || f2.PCIe.MaxWidth != g2.PCIe.MaxWidth {
		t.Errorf("fast read lost the identity it carries over: %q %v %v", f2.UUID, f2.VBIOS, f2.PCIe.MaxWidth)
	}

	again := rd.Read(gpu.Full, &fast)
	a2 := again.ByIndex(2)
	if !a2.RowRemap.V.Pending || a2.RetiredPages.V.DBE != 3 || activeLinks(a2) != activeLinks(g2)-2 || a2.TemperatureC.V != 93 {
		t.Errorf("full read after the faults: row remap %+v, retired pages %+v, %d active links (was %d), temperature %v",
			a2.RowRemap.V, a2.RetiredPages.V, activeLinks(a2), activeLinks(g2), a2.TemperatureC)
	}
	if !again.SlowTakenAt.Equal(again.TakenAt) {
		t.Error("a full read did not stamp its slow fields")
	}
}

// TestFastReadFallsBackToFull: without a usable previous snapshot, or when the GPU
// count changed (indexes may name other GPUs), a fast read reads everything.
func TestFastReadFallsBackToFull(t *testing.T) {
	s := newSim(t)
	rd := gpu.NewReader(s)
	if first := rd.Read(gpu.Fast, nil); len(first.GPUs) != 8 || first.GPUs[0].UUID == "" || !first.SlowTakenAt.Equal(first.TakenAt) {
		t.Fatalf("fast read with no previous snapshot: %d GPUs, UUID %q", len(first.GPUs), first.GPUs[0].UUID)
	}
	full := rd.Read(gpu.Full, nil)
	inject(t, s, "gpu-missing@gpu7")
	inject(t, s, "row-remap-pending@gpu1")
	got := rd.Read(gpu.Fast, &full)
	if len(got.GPUs) != 7 || !got.SlowTakenAt.Equal(got.TakenAt) || !got.ByIndex(1).RowRemap.V.Pending {
		t.Errorf("fast read after a GPU went missing: %d GPUs, slow fields at %v (taken %v), GPU 1 row remap %+v",
			len(got.GPUs), got.SlowTakenAt, got.TakenAt, got.ByIndex(1).RowRemap.V)
	}

	s.Clear()
	inject(t, s, "driver-unloaded")
	down := rd.Read(gpu.Fast, &full)
	if down.Driver.Loaded || down.Driver.Error == "" || len(down.GPUs) != 0 {
		t.Errorf("fast read without a driver: %+v", down.Driver)
	}
}

func activeLinks(g *gpu.GPU) int {
	n := 0
	for _, l := range g.NVLinks.V {
		if l.Active {
			n++
		}
	}
	return n
}

// BenchmarkRead compares a full read of the simulated 8-GPU node with a fast one.
func BenchmarkRead(b *testing.B) {
	s := newSim(b)
	rd := gpu.NewReader(s)
	prev := rd.Read(gpu.Full, nil)
	for _, tier := range []gpu.Tier{gpu.Full, gpu.Fast} {
		b.Run(tier.String(), func(b *testing.B) {
			for b.Loop() {
				rd.Read(tier, &prev)
			}
		})
	}
}
