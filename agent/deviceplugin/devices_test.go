package deviceplugin

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/gpu/snapshot"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/internal/checkid"
)

func snap(loaded bool, gpus ...snapshot.GPU) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Driver: snapshot.Driver{Loaded: loaded}, GPUs: gpus}
	if !loaded {
		s.Driver.Error = "NVML not available: ERROR_DRIVER_NOT_LOADED"
	}
	return s
}

func gpus(n int) []snapshot.GPU {
	var out []snapshot.GPU
	for i := range n {
		out = append(out, snapshot.GPU{Index: i, UUID: "GPU-" + string(rune('a'+i))})
	}
	return out
}

func TestRemember(t *testing.T) {
	known := Remember(nil, snap(true, gpus(3)...), func(bus string) int { return 0 })
	if len(known) != 3 || known[2].UUID != "GPU-c" || known[2].NUMANode != 0 {
		t.Fatalf("Remember = %+v", known)
	}
	// NVML lost: nothing forgotten.
	if got := Remember(known, snap(false), nil); !reflect.DeepEqual(got, known) {
		t.Errorf("Remember with NVML lost = %+v, want %+v", got, known)
	}
	// A GPU that is no longer enumerated stays known.
	if got := Remember(known, snap(true, gpus(2)...), nil); len(got) != 3 {
		t.Errorf("Remember after a GPU went missing = %+v, want all 3", got)
	}
}

func TestDecide(t *testing.T) {
	known := Remember(nil, snap(true, gpus(4)...), nil)
	lost := gpus(4)
	lost[1].Lost = true
	// A real summary: one GPU withdrawn, the node's GPUHealthy stays True.
	withdrawn := health.Summarize([]checks.Result{{ID: checkid.ECCUncorrected, Status: checks.Fail, GPU: 2,
		Message: "GPU 2 has 1 uncorrected ECC errors."}}, 4, time.Unix(1, 0))
	if !withdrawn.GPUHealthy {
		t.Fatal("a withdrawn GPU made GPUHealthy False")
	}
	for _, c := range []struct {
		name      string
		snap      *snapshot.Snapshot
		sum       health.Summary
		unhealthy []int
	}{
		{"all healthy", snap(true, gpus(4)...), health.Summary{State: health.Healthy}, nil},
		{"fatal XID on gpu2", snap(true, gpus(4)...), health.Summary{State: health.Unhealthy, UnhealthyGPUs: []int{2}, Failing: []string{"gpu.xid.fatal"}}, []int{2}},
		{"gpu2 withdrawn alone", snap(true, gpus(4)...), withdrawn, []int{2}},
		{"two GPUs failing", snap(true, gpus(4)...), health.Summary{State: health.Unhealthy, UnhealthyGPUs: []int{0, 3}}, []int{0, 3}},
		{"warnings keep GPUs", snap(true, gpus(4)...), health.Summary{State: health.Degraded, Warning: []string{"gpu.temperature"}}, nil},
		{"NVML lost mid-run: every GPU", snap(false), health.Summary{State: health.Unhealthy}, []int{0, 1, 2, 3}},
		{"GPU lost before the summary says so", snap(true, lost...), health.Summary{State: health.Healthy}, []int{1}},
		{"GPU no longer enumerated", snap(true, gpus(3)...), health.Summary{State: health.Healthy}, []int{3}},
		{"no snapshot", nil, health.Summary{}, []int{0, 1, 2, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			devs := Decide(known, c.snap, c.sum)
			if len(devs) != 4 {
				t.Fatalf("%d devices, want 4", len(devs))
			}
			var bad []int
			for _, d := range devs {
				if !d.Healthy {
					bad = append(bad, d.Index)
					if d.Reason == "" {
						t.Errorf("GPU %d unhealthy without a reason", d.Index)
					}
				}
			}
			if !slices.Equal(bad, c.unhealthy) {
				t.Errorf("unhealthy %v, want %v", bad, c.unhealthy)
			}
		})
	}
	if d := Decide(known, snap(true, gpus(4)...), withdrawn)[2]; d.Reason != "withdrawn: gpu.ecc.uncorrected: GPU 2 has 1 uncorrected ECC errors." {
		t.Errorf("withdrawn GPU's reason %q does not say why", d.Reason)
	}
	if d := Decide(known, snap(false), health.Summary{})[0]; d.Reason != "NVML unavailable: NVML not available: ERROR_DRIVER_NOT_LOADED" {
		t.Errorf("NVML-lost reason %q does not say NVML", d.Reason)
	}
}

func TestPreferred(t *testing.T) {
	// Eight GPUs: 0-3 on NUMA node 0, 4-7 on node 1 (a DGX layout).
	var devs []Device
	var ids []string
	for i := range 8 {
		id := "GPU-" + string(rune('a'+i))
		devs = append(devs, Device{GPU: GPU{UUID: id, Index: i, NUMANode: i / 4}, Healthy: true})
		ids = append(ids, id)
	}
	unknown := make([]Device, len(devs))
	for i, d := range devs {
		d.NUMANode = -1
		unknown[i] = d
	}
	pick := func(idx ...int) []string { return picker(ids, idx) }
	for _, c := range []struct {
		name            string
		devs            []Device
		available, must []string
		size            int
		want            []string
	}{
		{"two from all: one NUMA node, lowest index", devs, ids, nil, 2, pick(0, 1)},
		{"must include gpu5: its node", devs, ids, pick(5), 2, pick(4, 5)},
		{"best fit: node 1 has exactly 3 free", devs, pick(0, 1, 2, 3, 5, 6, 7), nil, 3, pick(5, 6, 7)},
		{"best fit prefers the smaller group that suffices", devs, pick(0, 1, 4, 5, 6), nil, 2, pick(0, 1)},
		{"too big for one node: largest first then the rest", devs, pick(0, 4, 5, 6), nil, 4, pick(0, 4, 5, 6)},
		{"spill: 5 from 4+4", devs, ids, nil, 5, pick(0, 1, 2, 3, 4)},
		{"no topology: stable index order", unknown, pick(6, 2, 4), nil, 2, pick(2, 4)},
		{"unknown IDs are left out", devs, []string{"GPU-zzz", ids[3]}, nil, 2, pick(3)},
		{"all eight", devs, ids, nil, 8, ids},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Preferred(c.devs, 1, c.available, c.must, c.size); !slices.Equal(got, c.want) {
				t.Errorf("Preferred = %v, want %v", got, c.want)
			}
		})
	}
}

// Allocate names the GPUs as fully qualified CDI devices, both as CDIDevices and in one
// cdi.k8s.io/ annotation that the CDI library parses back to the same names; the same
// request gets the same annotation key; the simulator's answer is labelled simulation.
func TestAllocate(t *testing.T) {
	devs := []Device{{GPU: GPU{UUID: "GPU-a", Index: 0}}, {GPU: GPU{UUID: "GPU-b", Index: 5}}}
	a, err := Allocate(devs, 1, []string{"GPU-b", "GPU-a"}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a"}
	names := cdiNames(a)
	if !slices.Equal(names, want) {
		t.Errorf("CDI devices %v, want %v", names, want)
	}
	keys, annotated, err := cdiapi.ParseAnnotations(a.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || !strings.HasPrefix(keys[0], "cdi.k8s.io/"+CDIPluginName+"_") || !slices.Equal(annotated, want) {
		t.Errorf("CDI annotations %v: keys %v devices %v", a.Annotations, keys, annotated)
	}
	if len(a.Annotations) != 1 || len(a.Envs) != 0 {
		t.Errorf("NVML allocation envs %v annotations %v: want only the CDI annotation", a.Envs, a.Annotations)
	}
	again, _ := Allocate(devs, 1, []string{"GPU-b", "GPU-a"}, false)
	other, _ := Allocate(devs, 1, []string{"GPU-a"}, false)
	if !maps.Equal(again.Annotations, a.Annotations) || maps.Equal(other.Annotations, a.Annotations) {
		t.Errorf("annotation keys: same request %v then %v, other request %v", a.Annotations, again.Annotations, other.Annotations)
	}
	s, err := Allocate(devs, 1, []string{"GPU-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.CDIDevices) != 1 || s.CDIDevices[0].Name != "nvidia.com/gpu=GPU-a" || s.Envs["GPURACK_SIMULATED_GPUS"] != "true" || s.Annotations["gpurack.io/simulated"] != "true" {
		t.Errorf("simulated allocation %+v: want the CDI device and simulation labels", s)
	}
	if _, err := Allocate(devs, 1, []string{"GPU-zzz"}, false); err == nil {
		t.Error("an unknown device ID was allocated")
	}
}

// cdiNames are the names of the CDI devices an Allocation gives, in its order.
func cdiNames(a Allocation) []string {
	var names []string
	for _, d := range a.CDIDevices {
		names = append(names, d.Name)
	}
	return names
}

// NVLink domains come from what each link reaches: on the simulated DGX H100 every link
// reaches an NVSwitch (one domain of 8), on the simulated H100 NVL cards the bridges
// join GPUs 2k and 2k+1 (four domains of 2). GetPreferredAllocation keeps a request
// within one domain when one can hold it.
func TestNVLinkDomainsFromSimulator(t *testing.T) {
	for _, c := range []struct {
		model string
		want  []int
	}{
		{"dgxh100", []int{0, 0, 0, 0, 0, 0, 0, 0}},
		{"h100nvl", []int{0, 0, 2, 2, 4, 4, 6, 6}},
	} {
		t.Run(c.model, func(t *testing.T) {
			s, err := sim.New(c.model, sim.Options{})
			if err != nil {
				t.Fatal(err)
			}
			snap := gpu.Read(s)
			known := Remember(nil, &snap, func(bus string) int { return -1 })
			var got []int
			for _, g := range known {
				got = append(got, g.NVLinkDomain)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("NVLink domains by index %v, want %v", got, c.want)
			}
		})
	}

	s, err := sim.New("h100nvl", sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap := gpu.Read(s)
	var devs []Device
	var ids []string
	for _, g := range Remember(nil, &snap, nil) {
		g.NUMANode = g.Index / 4 // two sockets, four cards each
		devs = append(devs, Device{GPU: g, Healthy: true})
		ids = append(ids, g.UUID)
	}
	pick := func(idx ...int) []string { return picker(ids, idx) }
	for _, c := range []struct {
		name            string
		available, must []string
		size            int
		want            []string
	}{
		{"two from all: one bridged pair", ids, nil, 2, pick(0, 1)},
		{"gpu1 taken: a whole pair, not 0 and 2 (same NUMA node, no NVLink)", pick(0, 2, 3, 4, 5, 6, 7), nil, 2, pick(2, 3)},
		{"must include gpu5: its partner", ids, pick(5), 2, pick(4, 5)},
		{"must include gpu2 with gpu3 taken: the same NUMA node next", pick(0, 1, 2, 4, 5), pick(2), 2, pick(0, 2)},
		{"four: two whole pairs", pick(0, 2, 3, 4, 6, 7), nil, 4, pick(2, 3, 6, 7)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Preferred(devs, 1, c.available, c.must, c.size); !slices.Equal(got, c.want) {
				t.Errorf("Preferred = %v, want %v", got, c.want)
			}
		})
	}
}

// picker returns ids[i] for each i of idx.
func picker(ids []string, idx []int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, ids[i])
	}
	return out
}
