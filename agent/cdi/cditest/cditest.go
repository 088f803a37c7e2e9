// Package cditest reads what a container got of the simulator's GPUs, for the tests
// that run pods on simulated GPU nodes (test/gpupods on this machine, test/qemu in a
// QEMU node).
package cditest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpurack/gpurack/agent/cdi"
)

// SimulatedDevices checks the answer of `probe devices` (test/probe): exactly n GPU
// nodes /dev/nvidiaN plus nvidiactl and nvidia-uvm, each the character device the
// simulation's CDI spec maps (cdi.SimMajor:cdi.SimMinor, the null device), and
// cdi.SimulatedEnv=true in the environment. It returns the GPU indices, sorted, and
// every way the answer differs from that.
func SimulatedDevices(got string, n int) (idx []int, problems []string) {
	ctl, uvm := false, false
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		path, kind, ok := strings.Cut(line, " ")
		if !strings.HasPrefix(path, "/dev/") {
			continue
		}
		if !ok || kind != fmt.Sprintf("c %d:%d", cdi.SimMajor, cdi.SimMinor) {
			problems = append(problems, fmt.Sprintf("%s is %q, want the simulation's character device %d:%d", path, kind, cdi.SimMajor, cdi.SimMinor))
		}
		switch name := strings.TrimPrefix(path, "/dev/"); name {
		case "nvidiactl":
			ctl = true
		case "nvidia-uvm":
			uvm = true
		default:
			i, err := strconv.Atoi(strings.TrimPrefix(name, "nvidia"))
			if err != nil {
				problems = append(problems, "unexpected device node "+path)
				continue
			}
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	if len(idx) != n || !ctl || !uvm || !strings.Contains(got, cdi.SimulatedEnv+"=true") {
		problems = append(problems, fmt.Sprintf("want %d GPU nodes, nvidiactl, nvidia-uvm and %s=true; the container has:\n%s", n, cdi.SimulatedEnv, got))
	}
	return idx, problems
}
