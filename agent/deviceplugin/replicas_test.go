package deviceplugin

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/internal/checkid"
)

// Replica IDs are NVIDIA's <UUID>::<r>; without sharing the ID is the UUID, whatever
// it holds. Anything else is an error that says what the IDs look like.
func TestReplicaIDs(t *testing.T) {
	g := GPU{UUID: "GPU-a", Index: 0}
	if got := DeviceIDs(g, 1); !slices.Equal(got, []string{"GPU-a"}) {
		t.Errorf("DeviceIDs without sharing = %v", got)
	}
	if got := DeviceIDs(g, 0); !slices.Equal(got, []string{"GPU-a"}) {
		t.Errorf("DeviceIDs with replicas unset = %v", got)
	}
	if got := DeviceIDs(g, 3); !slices.Equal(got, []string{"GPU-a::0", "GPU-a::1", "GPU-a::2"}) {
		t.Errorf("DeviceIDs with 3 replicas = %v", got)
	}
	for _, id := range DeviceIDs(g, 3) {
		if uuid, r, err := parseID(id, 3); err != nil || uuid != "GPU-a" || id != DeviceIDs(g, 3)[r] {
			t.Errorf("parseID(%q) = %q, %d, %v", id, uuid, r, err)
		}
	}
	if uuid, r, err := parseID("GPU-a::1", 1); err != nil || uuid != "GPU-a::1" || r != 0 {
		t.Errorf("without sharing parseID takes the ID as the UUID: %q, %d, %v", uuid, r, err)
	}
	for id, want := range map[string]string{
		"GPU-a":     "is not a time-slicing replica ID",
		"GPU-a::":   "is not a time-slicing replica ID",
		"::1":       "is not a time-slicing replica ID",
		"GPU-a::x":  "is not a time-slicing replica ID",
		"GPU-a::01": "is not a time-slicing replica ID",
		"GPU-a::+1": "is not a time-slicing replica ID",
		"GPU-a:1":   "is not a time-slicing replica ID",
		"GPU-a::-1": "names replica -1, but this node advertises each GPU as 4 replicas (0 to 3)",
		"GPU-a::4":  "names replica 4, but this node advertises each GPU as 4 replicas (0 to 3)",
	} {
		_, _, err := parseID(id, 4)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), id) {
			t.Errorf("parseID(%q) = %v, want an error naming it and saying %q", id, err, want)
		}
	}
}

// Every replica has its GPU's health and topology: a withdrawn GPU withdraws all its
// replicas and no other.
func TestListWithReplicas(t *testing.T) {
	known := Remember(nil, snap(true, gpus(4)...), func(string) int { return 1 })
	withdrawn := health.Summarize([]checks.Result{{ID: checkid.ECCUncorrected, Status: checks.Fail, GPU: 2,
		Message: "GPU 2 has 1 uncorrected ECC errors."}}, 4, time.Unix(1, 0))
	list := toAPI(Decide(known, snap(true, gpus(4)...), withdrawn), 4)
	if len(list) != 16 {
		t.Fatalf("%d devices for 4 GPUs of 4 replicas, want 16", len(list))
	}
	var unhealthy []string
	for i, d := range list {
		if want := known[i/4].UUID + "::" + string(rune('0'+i%4)); d.ID != want {
			t.Errorf("device %d is %q, want %q", i, d.ID, want)
		}
		if d.Health != pluginapi.Healthy {
			unhealthy = append(unhealthy, d.ID)
		}
		if d.Topology == nil || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != 1 {
			t.Errorf("device %s topology %v, want its GPU's NUMA node 1", d.ID, d.Topology)
		}
	}
	if want := []string{"GPU-c::0", "GPU-c::1", "GPU-c::2", "GPU-c::3"}; !slices.Equal(unhealthy, want) {
		t.Errorf("unhealthy %v, want every replica of the withdrawn gpu2: %v", unhealthy, want)
	}
	// Without sharing the list is the GPUs by UUID, as before time-slicing.
	plain := toAPI(Decide(known, snap(true, gpus(4)...), withdrawn), 1)
	if len(plain) != 4 || plain[2].ID != "GPU-c" || plain[2].Health != pluginapi.Unhealthy || plain[1].Health != pluginapi.Healthy {
		t.Errorf("list without sharing %v", plain)
	}
}

func TestPreferredReplicas(t *testing.T) {
	// Four GPUs of 4 replicas: gpu0 and gpu1 on NUMA node 0, gpu2 and gpu3 on node 1.
	var devs []Device
	for i := range 4 {
		devs = append(devs, Device{GPU: GPU{UUID: "GPU-" + string(rune('a'+i)), Index: i, NUMANode: i / 2}, Healthy: true})
	}
	// ids lists replicas as "a0", "c3": GPU letter and replica number.
	ids := func(short ...string) []string {
		var out []string
		for _, s := range short {
			out = append(out, "GPU-"+s[:1]+"::"+s[1:])
		}
		return out
	}
	all := ids("a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "c0", "c1", "c2", "c3", "d0", "d1", "d2", "d3")
	for _, c := range []struct {
		name            string
		available, must []string
		size            int
		want            []string
	}{
		{"one from all: the lowest GPU and replica", all, nil, 1, ids("a0")},
		{"one: the GPU with the most free replicas", ids("a2", "a3", "b0", "b1", "b2", "c0", "c1", "c2", "c3", "d1", "d3"), nil, 1, ids("c0")},
		{"two: distinct GPUs, the second on the first's NUMA node", all, nil, 2, ids("a0", "b0")},
		{"distinct GPUs before free replicas", ids("a0", "a1", "a2", "a3", "c3"), nil, 2, ids("a0", "c3")},
		{"must-include: its NUMA node breaks the tie", ids("a0", "a1", "a2", "a3", "c0", "d0", "d1", "d2", "d3"), ids("c0"), 2, ids("c0", "d0")},
		{"more free replicas win over NUMA", ids("a0", "a1", "a2", "a3", "c0", "d0"), ids("c0"), 2, ids("a0", "c0")},
		{"four: one replica of each GPU", all, nil, 4, ids("a0", "b0", "c0", "d0")},
		{"five: then the one with the most left", ids("a0", "a1", "a2", "b0", "b1", "b2", "b3", "c0", "d0"), nil, 5, ids("a0", "b0", "b1", "c0", "d0")},
		{"must-include counts as in the answer", ids("a0", "a1", "a2", "b0", "b1"), ids("a0"), 2, ids("a0", "b0")},
		{"unknown and malformed IDs are left out", []string{"GPU-zzz::0", "GPU-a", "GPU-a::9", "GPU-b::x", "GPU-b::1"}, nil, 2, ids("b1")},
		{"more than available", ids("a1", "b2"), nil, 3, ids("a1", "b2")},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Preferred(devs, 4, c.available, c.must, c.size); !slices.Equal(got, c.want) {
				t.Errorf("Preferred = %v, want %v", got, c.want)
			}
		})
	}
}

// Allocate of replicas gives each of their GPUs once, as the same CDI device a whole
// GPU gets; the annotation key follows the requested IDs; IDs of the wrong form are
// errors that name them.
func TestAllocateReplicas(t *testing.T) {
	devs := []Device{{GPU: GPU{UUID: "GPU-a", Index: 0}}, {GPU: GPU{UUID: "GPU-b", Index: 1}}}
	a, err := Allocate(devs, 4, []string{"GPU-b::3", "GPU-a::0", "GPU-b::1"}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a"}
	names := cdiNames(a)
	if !slices.Equal(names, want) {
		t.Errorf("CDI devices %v, want %v (each GPU once)", names, want)
	}
	if _, annotated, err := cdiapi.ParseAnnotations(a.Annotations); err != nil || !slices.Equal(annotated, want) {
		t.Errorf("CDI annotation %v gives %v (%v), want %v", a.Annotations, annotated, err, want)
	}
	same, err := Allocate(devs, 4, []string{"GPU-a::1", "GPU-a::2"}, false)
	if err != nil || len(same.CDIDevices) != 1 || same.CDIDevices[0].Name != "nvidia.com/gpu=GPU-a" {
		t.Errorf("two replicas of one GPU: %+v, %v; want that GPU once", same, err)
	}
	again, _ := Allocate(devs, 4, []string{"GPU-a::1", "GPU-a::2"}, false)
	other, _ := Allocate(devs, 4, []string{"GPU-a::0", "GPU-a::3"}, false)
	if !maps.Equal(again.Annotations, same.Annotations) || maps.Equal(other.Annotations, same.Annotations) {
		t.Errorf("annotation keys: same IDs %v then %v, other IDs of the same GPU %v", same.Annotations, again.Annotations, other.Annotations)
	}
	for _, c := range []struct {
		replicas int
		ids      []string
		want     string
	}{
		{4, []string{"GPU-a::0", "GPU-a"}, `device "GPU-a" is not a time-slicing replica ID`},
		{4, []string{"GPU-a::4"}, `device "GPU-a::4" names replica 4, but this node advertises each GPU as 4 replicas`},
		{4, []string{"GPU-zzz::0"}, `device "GPU-zzz::0" is a replica of GPU-zzz, which is not a GPU of this node`},
		{1, []string{"GPU-a::0"}, `device "GPU-a::0" is not a GPU of this node`},
	} {
		if _, err := Allocate(devs, c.replicas, c.ids, false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Allocate(%d replicas, %v) = %v, want %q", c.replicas, c.ids, err, c.want)
		}
	}
}
