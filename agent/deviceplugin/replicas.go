package deviceplugin

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Time-slicing (the profile's gpu.sharing.timeSlicing.replicas, decision 0632): every
// GPU is advertised as replicas devices, so that as many containers share it. The
// decisions stay per GPU (Remember, Decide); only the device IDs multiply.

// replicaSep joins a GPU's UUID and a replica number in a device ID, as NVIDIA's
// device plugin writes time-slicing replicas.
const replicaSep = "::"

// DeviceIDs are the device IDs kubelet knows g by: its UUID, or with replicas > 1 one
// ID per replica, <UUID>::0 to <UUID>::<replicas-1>.
func DeviceIDs(g GPU, replicas int) []string {
	if replicas <= 1 {
		return []string{g.UUID}
	}
	ids := make([]string, replicas)
	for r := range ids {
		ids[r] = g.UUID + replicaSep + strconv.Itoa(r)
	}
	return ids
}

// GPUOfDevice is the UUID of the GPU that device ID id (a UUID, or a time-slicing
// replica <UUID>::<r>) names, for readers of kubelet's allocations.
func GPUOfDevice(id string) string {
	uuid, _, _ := strings.Cut(id, replicaSep)
	return uuid
}

// parseID returns the UUID of the GPU that device ID id names and its replica. With
// replicas <= 1 the ID is the UUID itself (replica 0); with more it must be
// <UUID>::<r>, r written as DeviceIDs writes it and below replicas. Whether the GPU is
// this node's is the caller's question.
func parseID(id string, replicas int) (uuid string, replica int, err error) {
	if replicas <= 1 {
		return id, 0, nil
	}
	uuid, num, ok := strings.Cut(id, replicaSep)
	r, aerr := strconv.Atoi(num)
	if !ok || uuid == "" || aerr != nil || strconv.Itoa(r) != num {
		return "", 0, fmt.Errorf("device %q is not a time-slicing replica ID: this node advertises each GPU as %d devices, <GPU UUID>%s0 to <GPU UUID>%s%d", id, replicas, replicaSep, replicaSep, replicas-1)
	}
	if r < 0 || r >= replicas {
		return "", 0, fmt.Errorf("device %q names replica %d, but this node advertises each GPU as %d replicas (0 to %d)", id, r, replicas, replicas-1)
	}
	return uuid, r, nil
}

// preferredReplicas is Preferred under time-slicing. The must-include replicas come
// first; then it takes one replica at a time, the lowest available one of the GPU that
//  1. has no replica in the answer yet (distinct GPUs first: two replicas of one GPU
//     give the container that one GPU, not two);
//  2. has the most replicas still available (the least shared one, so that pods spread
//     over the GPUs, as NVIDIA's plugin spreads them);
//  3. is on the NUMA node of the first GPU in the answer;
//  4. has the lowest index.
//
// IDs that are not replicas of a GPU the plugin knows are left out. The result is in
// index, then replica order.
func preferredReplicas(devs []Device, replicas int, available, mustInclude []string, size int) []string {
	type replica struct {
		Device
		r  int
		id string
	}
	byUUID := map[string]Device{}
	for _, d := range devs {
		byUUID[d.UUID] = d
	}
	parse := func(id string) (replica, bool) {
		uuid, r, err := parseID(id, replicas)
		d, ok := byUUID[uuid]
		return replica{d, r, id}, err == nil && ok
	}
	var chosen []replica
	inAnswer := map[string]int{} // replicas of each GPU in the answer
	taken := map[string]bool{}
	for _, id := range mustInclude {
		if x, ok := parse(id); ok && !taken[id] && len(chosen) < size {
			chosen, taken[id] = append(chosen, x), true
			inAnswer[x.UUID]++
		}
	}
	free := map[string][]replica{} // each GPU's available replicas not in the answer
	for _, id := range available {
		if x, ok := parse(id); ok && !taken[id] {
			free[x.UUID] = append(free[x.UUID], x)
			taken[id] = true
		}
	}
	for _, f := range free {
		slices.SortFunc(f, func(a, b replica) int { return cmp.Compare(a.r, b.r) })
	}
	// rank orders the GPUs with a free replica by the rules above; lower is better.
	rank := func(uuid string) []int {
		d := free[uuid][0].Device
		near := 1
		if len(chosen) > 0 && chosen[0].NUMANode >= 0 && d.NUMANode == chosen[0].NUMANode {
			near = 0
		}
		return []int{min(inAnswer[uuid], 1), -len(free[uuid]), near, d.Index}
	}
	for len(chosen) < size {
		best := ""
		for uuid, f := range free {
			if len(f) > 0 && (best == "" || cmp.Or(slices.Compare(rank(uuid), rank(best)), strings.Compare(uuid, best)) < 0) {
				best = uuid
			}
		}
		if best == "" {
			break // fewer available than asked for
		}
		chosen = append(chosen, free[best][0])
		free[best] = free[best][1:]
		inAnswer[best]++
	}
	slices.SortFunc(chosen, func(a, b replica) int { return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(a.r, b.r)) })
	ids := make([]string, len(chosen))
	for i, x := range chosen {
		ids[i] = x.id
	}
	return ids
}
