package deviceplugin

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpurack/gpurack/agent/cdi"
	"github.com/gpurack/gpurack/agent/gpu/snapshot"
	"github.com/gpurack/gpurack/agent/health"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GPU is one GPU the plugin has seen: its UUID is the device ID kubelet knows it by.
type GPU struct {
	UUID  string
	Index int
	// NUMANode is the GPU's NUMA node from sysfs, -1 when unknown (the simulator).
	NUMANode int
	// NVLinkDomain numbers the GPUs that NVLink joins, directly or through NVSwitches:
	// the lowest index among them. -1 when the GPU has no active link or its links
	// were not read.
	NVLinkDomain int
}

// CDIGPUs are gpus as agent/cdi names them, for the node's CDI spec.
func CDIGPUs(gpus []GPU) []cdi.GPU {
	out := make([]cdi.GPU, len(gpus))
	for i, g := range gpus {
		out[i] = cdi.GPU{UUID: g.UUID, Index: g.Index}
	}
	return out
}

// Device is one device as kubelet gets it, with why it is unhealthy.
type Device struct {
	GPU
	Healthy bool
	// Reason says why the GPU is unhealthy; empty when healthy.
	Reason string
}

// Remember adds the GPUs of snap that known lacks (matched by UUID) and updates the
// index of those it has; GPUs once seen stay, so a GPU that disappears is reported
// Unhealthy rather than dropped. numa gives a GPU's NUMA node from its PCI bus id
// (-1 unknown); nil means unknown for all. The result is ordered by index.
func Remember(known []GPU, snap *snapshot.Snapshot, numa func(busID string) int) []GPU {
	out := slices.Clone(known)
	if snap == nil || !snap.Driver.Loaded {
		return out
	}
	for _, g := range snap.GPUs {
		if g.UUID == "" {
			continue
		}
		n := -1
		if numa != nil {
			n = numa(g.PCIBusID)
		}
		if i := slices.IndexFunc(out, func(k GPU) bool { return k.UUID == g.UUID }); i >= 0 {
			out[i].Index = g.Index
			if n >= 0 {
				out[i].NUMANode = n
			}
			continue
		}
		out = append(out, GPU{UUID: g.UUID, Index: g.Index, NUMANode: n, NVLinkDomain: -1})
	}
	if domains := NVLinkDomains(snap); domains != nil {
		for i := range out {
			if d, ok := domains[out[i].UUID]; ok {
				out[i].NVLinkDomain = d
			}
		}
	}
	slices.SortStableFunc(out, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// NVLinkDomains groups the GPUs of snap that NVLink joins: two GPUs are in one domain
// when a link of one reaches the other's PCI bus id (NVLink bridges), or when both reach
// an NVSwitch (one node's NVSwitches form one fabric). Each domain is named by its lowest
// GPU index; a GPU with no active link is in none (-1). It returns nil while no GPU's
// links were read, so the caller keeps what it knew.
func NVLinkDomains(snap *snapshot.Snapshot) map[string]int {
	parent := map[string]string{}
	var find func(string) string
	find = func(x string) string {
		if p, ok := parent[x]; ok && p != x {
			r := find(p)
			parent[x] = r
			return r
		}
		parent[x] = x
		return x
	}
	union := func(a, b string) { parent[find(a)] = find(b) }
	byBus := map[string]string{}
	for _, g := range snap.GPUs {
		byBus[strings.ToLower(g.PCIBusID)] = g.UUID
	}
	read, linked := false, map[string]bool{}
	const fabric = "\x00nvswitch"
	for _, g := range snap.GPUs {
		if !g.NVLinks.OK() {
			continue
		}
		read = true
		for _, l := range g.NVLinks.V {
			switch peer, ok := byBus[strings.ToLower(l.RemoteBusID)]; {
			case !l.Active:
			case l.RemoteSwitch:
				union(g.UUID, fabric)
				linked[g.UUID] = true
			case ok && peer != g.UUID:
				union(g.UUID, peer)
				linked[g.UUID], linked[peer] = true, true
			}
		}
	}
	if !read {
		return nil
	}
	lowest := map[string]int{}
	for _, g := range snap.GPUs {
		if linked[g.UUID] {
			if r := find(g.UUID); lowest[r] == 0 || g.Index+1 < lowest[r] {
				lowest[r] = g.Index + 1 // +1: 0 is "none yet"
			}
		}
	}
	out := map[string]int{}
	for _, g := range snap.GPUs {
		out[g.UUID] = -1
		if linked[g.UUID] {
			out[g.UUID] = lowest[find(g.UUID)] - 1
		}
	}
	return out
}

// Decide is the device list for ListAndWatch: every known GPU, Unhealthy when
//   - NVML is not available (the driver unloaded or NVML lost mid-run): every GPU;
//   - the GPU is not in the current snapshot (fell off the bus, not enumerated);
//   - the published health summary lists its index among UnhealthyGPUs: withdrawn
//     alone (a fatal XID of the profile's gpu.xid.withdraw, an uncorrectable ECC
//     error, a pending row remap, a lost GPU; decision 0630), or failing a GPU-level
//     check that taints the whole node. The summary carries the agent's hysteresis,
//     per GPU, so a GPU comes back Healthy only once its own health has cleared.
//
// It is pure: the plugin calls it on every health change.
func Decide(known []GPU, snap *snapshot.Snapshot, sum health.Summary) []Device {
	out := make([]Device, 0, len(known))
	for _, k := range known {
		d := Device{GPU: k, Healthy: true}
		g := find(snap, k)
		switch {
		case snap == nil:
			d.Healthy, d.Reason = false, "no GPU snapshot yet"
		case !snap.Driver.Loaded:
			d.Healthy, d.Reason = false, "NVML unavailable: "+snap.Driver.Error
		case g == nil:
			d.Healthy, d.Reason = false, "GPU not enumerated by NVML"
		case g.Lost:
			d.Healthy, d.Reason = false, "GPU lost (ERROR_GPU_IS_LOST, XID 79)"
		case slices.ContainsFunc(sum.Withdrawn, func(w health.Withdrawal) bool { return w.GPU == k.Index }):
			i := slices.IndexFunc(sum.Withdrawn, func(w health.Withdrawal) bool { return w.GPU == k.Index })
			d.Healthy, d.Reason = false, "withdrawn: "+sum.Withdrawn[i].Reason
		case slices.Contains(sum.UnhealthyGPUs, k.Index):
			d.Healthy, d.Reason = false, "failing GPU checks: "+strings.Join(sum.Failing, ", ")
		}
		out = append(out, d)
	}
	return out
}

// find returns k's entry in snap (same UUID and index), or nil.
func find(snap *snapshot.Snapshot, k GPU) *snapshot.GPU {
	if snap == nil {
		return nil
	}
	for i := range snap.GPUs {
		if g := &snap.GPUs[i]; g.UUID == k.UUID && g.Index == k.Index {
			return g
		}
	}
	return nil
}

// Healthy counts the healthy devices.
func Healthy(devs []Device) int {
	n := 0
	for _, d := range devs {
		if d.Healthy {
			n++
		}
	}
	return n
}

// toAPI is the ListAndWatch form of devs with replicas devices per GPU (DeviceIDs):
// every replica has its GPU's health and NUMA node, so a withdrawn GPU withdraws all
// its replicas.
func toAPI(devs []Device, replicas int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(devs)*max(replicas, 1))
	for _, d := range devs {
		for _, id := range DeviceIDs(d.GPU, replicas) {
			pd := &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
			if !d.Healthy {
				pd.Health = pluginapi.Unhealthy
			}
			if d.NUMANode >= 0 {
				pd.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
			}
			out = append(out, pd)
		}
	}
	return out
}

// Preferred picks size devices from available, keeping mustInclude. With replicas > 1
// (time-slicing) the IDs are replicas and preferredReplicas picks them. Otherwise it
// prefers GPUs of one NVLink domain and, within it, of one NUMA node: at each level the
// group of the first must-include GPU if any, else the smallest group that holds all
// that is still needed, else the largest groups first. Ties and GPUs of unknown domain
// or NUMA node go in index order, so the answer is stable. The result is in index
// order. IDs the plugin does not know are left out.
func Preferred(devs []Device, replicas int, available, mustInclude []string, size int) []string {
	if replicas > 1 {
		return preferredReplicas(devs, replicas, available, mustInclude, size)
	}
	byID := map[string]Device{}
	for _, d := range devs {
		byID[d.UUID] = d
	}
	var chosen []Device
	taken := map[string]bool{}
	for _, id := range mustInclude {
		if d, ok := byID[id]; ok && !taken[id] && len(chosen) < size {
			chosen, taken[id] = append(chosen, d), true
		}
	}
	var free []Device
	for _, id := range available {
		if d, ok := byID[id]; ok && !taken[id] {
			free = append(free, d)
			taken[id] = true
		}
	}
	need := size - len(chosen)
	var first *Device
	if len(chosen) > 0 {
		first = &chosen[0]
	}
	for _, d := range orderByGroup(free, need, first, func(d Device) int { return d.NVLinkDomain }, func(domain []Device) []Device {
		return orderByGroup(domain, need, first, func(d Device) int { return d.NUMANode }, nil)
	}) {
		if len(chosen) >= size {
			break
		}
		chosen = append(chosen, d)
	}
	slices.SortFunc(chosen, func(a, b Device) int { return cmp.Compare(a.Index, b.Index) })
	ids := make([]string, len(chosen))
	for i, d := range chosen {
		ids[i] = d.UUID
	}
	return ids
}

// orderByGroup orders devs by the groups key puts them in, best group first: the group
// of first (when given), then the smallest group that holds need devices, then the
// largest first; ties by lowest index. within, when given, orders each group's devices;
// otherwise they go in index order.
func orderByGroup(devs []Device, need int, first *Device, key func(Device) int, within func([]Device) []Device) []Device {
	groups := map[int][]Device{}
	for _, d := range devs {
		groups[key(d)] = append(groups[key(d)], d)
	}
	var order []int
	for k, g := range groups {
		slices.SortFunc(g, func(a, b Device) int { return cmp.Compare(a.Index, b.Index) })
		order = append(order, k)
	}
	rank := func(k int) (int, int) { // lower is better
		switch l := len(groups[k]); {
		case first != nil && k == key(*first):
			return 0, 0
		case l >= need:
			return 1, l // best fit: the smallest group that suffices
		default:
			return 2, -l // largest first
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		ra, la := rank(a)
		rb, lb := rank(b)
		return cmp.Or(cmp.Compare(ra, rb), cmp.Compare(la, lb), cmp.Compare(groups[a][0].Index, groups[b][0].Index))
	})
	var out []Device
	for _, k := range order {
		g := groups[k]
		if within != nil {
			g = within(g)
		}
		out = append(out, g...)
	}
	return out
}

// Allocation is what a container gets for its GPUs.
type Allocation struct {
	Envs        map[string]string
	CDIDevices  []*pluginapi.CDIDevice
	Annotations map[string]string
}

// CDIPluginName names the plugin in its cdi.k8s.io/ annotation keys ("vendor.device-type").
const CDIPluginName = "gpurack.nvidia-gpu"

// Allocate decides what a container that was given ids gets: its GPUs as fully
// qualified CDI devices, nvidia.com/gpu=<UUID>, both as CDIDevices (kubelet passes them
// to containerd 1.7 with enable_cdi, CRI field) and as one cdi.k8s.io/ annotation
// (containerd 1.6 passes it through container_annotations to nvidia-container-runtime
// in CDI mode). The annotation key is the plugin name and a digest of the IDs, so one
// answer is always the same. The node's CDI spec (agent/cdi) says what each device is:
// no device nodes or NVIDIA_VISIBLE_DEVICES come from here.
//
// With replicas > 1 (time-slicing) the IDs are replicas, <UUID>::<r>, and the container
// gets each of their GPUs once: two replicas of one GPU are that GPU, not two.
//
// On the simulator the devices resolve to the simulated spec's null-device nodes, and
// the container also gets GPURACK_SIMULATED_GPUS=true and the annotation
// gpurack.io/simulated=true, so nothing passes for real GPUs.
//
// An ID the plugin does not know, or not of the form replicas gives, is an error.
func Allocate(devs []Device, replicas int, ids []string, simulated bool) (Allocation, error) {
	known := map[string]bool{}
	for _, d := range devs {
		known[d.UUID] = true
	}
	a := Allocation{}
	var names []string
	for _, id := range ids {
		uuid, _, err := parseID(id, replicas)
		if err != nil {
			return Allocation{}, err
		}
		if !known[uuid] {
			if uuid != id {
				return Allocation{}, fmt.Errorf("device %q is a replica of %s, which is not a GPU of this node (known: %d GPUs by UUID)", id, uuid, len(devs))
			}
			return Allocation{}, fmt.Errorf("device %q is not a GPU of this node (known: %d GPUs by UUID)", id, len(devs))
		}
		n := cdi.QualifiedName(uuid)
		if slices.Contains(names, n) {
			continue
		}
		names = append(names, n)
		a.CDIDevices = append(a.CDIDevices, &pluginapi.CDIDevice{Name: n})
	}
	if len(names) == 0 {
		return a, nil
	}
	sum := sha256.Sum256([]byte(strings.Join(ids, ",")))
	ann, err := cdiapi.UpdateAnnotations(nil, CDIPluginName, hex.EncodeToString(sum[:8]), names)
	if err != nil {
		return Allocation{}, fmt.Errorf("CDI annotation for %v: %w", ids, err)
	}
	a.Annotations = ann
	if simulated {
		a.Envs = map[string]string{cdi.SimulatedEnv: "true"}
		a.Annotations[cdi.SimulatedAnnotation] = "true"
	}
	return a, nil
}
